#!/usr/bin/perl
# rewrite.pl SRC.cu OUT.cc SITES - a .cu file made host C++ for the
# emulator (build.sh):
#   k<<<grid, block, smem, st>>>(args)  ->  emu_launch(EMU_SITE(n), k, emu_mk(grid, ...), args)
#   extern __shared__ T name[];        ->  T *name = EMU_DYN_SMEM(T);
#   __shared__                         ->  static (blocks run one at a time)
# and an EMU_ENTRY at the top of each extern "C" moe_*_cuda function, so
# the launch counts (emu_launch.cc) know which entry point launched.
# Appends to SITES one line per launch site and per launcher:
#   site <TAB> SRC:LINE <TAB> kernel <TAB> enclosing function
#   launcher <TAB> SRC <TAB> moe_*_cuda entry point that launches a kernel,
#                           itself or through the file's static helpers
use strict;
use warnings;

my ($src, $out, $sites) = @ARGV;
open my $in, '<', $src or die "$src: $!\n";
my $s = do { local $/; <$in> };
close $in;
my $orig = $s;
my $site_tag = $src;
$site_tag =~ s/[^\w]/_/g;

# top-level functions: a column-0 line that names one before '(' and does
# not end a declaration; its text runs to the next such line
my @fn;  # [name, start offset, extern "C"?]
while ($orig =~ /^(?![#\/ \t}{])([^\n;]*?)\b(\w+)\s*\((?![^\n]*;\s*$)/mg) {
    my ($head, $name, $at) = ($1, $2, $-[0]);
    $name = $1 if $name eq '__launch_bounds__' && substr($orig, $+[0]) =~ /^[^)]*\)\s*(\w+)\s*\(/;
    next if $head =~ /^(?:typedef|struct|enum|union|return)\b/;
    push @fn, [$name, $at, $head =~ /extern "C"/ ? 1 : 0];
}
sub fn_at {
    my ($off) = @_;
    my $f = '?';
    for my $x (@fn) { last if $x->[1] > $off; $f = $x->[0]; }
    return $f;
}

my @site_lines;
my $n = 0;
$s =~ s{(\w+)((?:<[\w ,]*>)?)<<<(.*?)>>>\(}{
    my ($k, $targs, $cfg, $at) = ($1, $2, $3, $-[0]);
    my $line = 1 + (substr($orig, 0, $at) =~ tr/\n//);
    push @site_lines, "site\t$src:$line\t$k\t" . fn_at($at) . "\n";
    $n++;
    "emu_launch(\"$src:$line $k\", $k$targs, emu_mk($cfg), "
}gse;

# launchers: a function whose text launches, or calls one that does
my %text;
for my $i (0 .. $#fn) {
    my $end = $i < $#fn ? $fn[$i + 1][1] : length $orig;
    $text{$fn[$i][0]} .= substr($orig, $fn[$i][1], $end - $fn[$i][1]);
}
my %launches = map { $_ => 1 } grep { $text{$_} =~ /<<</ } keys %text;
for (my $more = 1; $more;) {
    $more = 0;
    for my $f (keys %text) {
        next if $launches{$f};
        for my $g (keys %launches) {
            if ($text{$f} =~ /(?<![\w.>])\Q$g\E\s*[<(]/) { $launches{$f} = 1; $more = 1; last; }
        }
    }
}
my @launchers = grep { $_->[2] && $_->[0] =~ /^moe_\w+_cuda$/ && $launches{$_->[0]} } @fn;

$s =~ s/extern __shared__ (\w+) (\w+)\[\];/$1 *$2 = EMU_DYN_SMEM($1);/g;
$s =~ s/__shared__/static/g;
$s =~ s#^(extern "C" [^;{]*?\b(moe_\w+_cuda)\s*\([^;{]*?\)\s*\{)#$1 EMU_ENTRY;#mg;

open my $o, '>', $out or die "$out: $!\n";
print $o $s;
close $o;
open my $l, '>>', $sites or die "$sites: $!\n";
print $l @site_lines;
print $l "launcher\t$src\t$_->[0]\n" for @launchers;
close $l;
