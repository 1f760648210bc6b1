#!/bin/bash
# check-doc-links.sh - checks the references between the docs:
#  - every relative markdown link [text](path) in README.md and docs/ names
#    a file or folder that exists (relative to the file that holds it);
#  - every docs/NAME.md named in plain text exists (relative to the root);
#  - every section a doc cites as NAME.md, "Section" or NAME.md ("Section")
#    is a heading of NAME.md, or the bold title of one of its bullets.
# Prints each broken reference as FILE:LINE: what, and exits 1 when there
# is one.  A developer's check: tools/test.sh does not run it.
set -u
cd "$(dirname "$0")/.."
fail=0
files=$(git ls-files README.md 'docs/*.md' 'docs/**/*.md'; git ls-files --others --exclude-standard 'docs/*.md' 'docs/**/*.md')
files=$(echo "$files" | sort -u)

heading_has() { # FILE TEXT: a heading, or a bullet's bold title, holds TEXT
  grep -E '^#+ |^- \*\*' "$1" | grep -qF -- "$2"
}

for f in $files; do
  dir=$(dirname "$f")
  # markdown links
  while IFS=: read -r line link; do
    target=${link%%#*}
    case $target in ''|http:*|https:*|mailto:*) continue ;; esac
    [ -e "$dir/$target" ] || { echo "$f:$line: link to missing $target"; fail=1; }
  done < <(grep -noP '\]\(\K[^)\s]+(?=\))' "$f")
  # plain docs/NAME.md
  while IFS=: read -r line name; do
    [ -e "$name" ] || { echo "$f:$line: names missing $name"; fail=1; }
  done < <(grep -noP '(?<![\w./-])docs/[\w./-]+\.md' "$f")
  # NAME.md, "Section" and NAME.md ("Section")
  while IFS=: read -r line ref; do
    name=$(echo "$ref" | grep -oP '^[\w./-]+\.md')
    sect=$(echo "$ref" | grep -oP '"\K[^"]+(?=")')
    case $name in
      docs/*) path=$name ;;
      */*) path=$dir/$name ;;
      *) path=$dir/$name; [ -e "$path" ] || path=docs/$name ;;
    esac
    [ -e "$path" ] || continue # reported above, or not a doc
    heading_has "$path" "$sect" || { echo "$f:$line: $name has no section \"$sect\""; fail=1; }
  done < <(grep -noP '[\w./-]+\.md\)?,? \(?"[^"]+"' "$f")
done
exit $fail
