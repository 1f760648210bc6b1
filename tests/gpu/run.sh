#!/bin/bash
# run.sh - the CUDA backend proven on one GPU, in one go (several minutes
# on an H200; PHASES splits it over calls).  Needs only the repository, the
# .deb files that tests/gpu/fetch-debs.sh downloaded into gpu-debs/
# (carried with the call), and an image with nvcc, CMake and python3.
#
#  1. unpacks the .debs into a private prefix and builds (Release, CUDA on);
#  2. runs every CUDA op against the CPU op (tests/test_backend_ops.c, tests/test_cuda_ops.c,
#     tests/test_cuda_attention.c, tests/test_cuda_quant.c, tests/test_cuda_plan.c) and
#     tabulates the worst relative error per op and dtype;
#  3. runs every fixture model end to end on both backends
#     (tests/test_cuda_forward.c: fp32 greedy tokens identical, bf16 logits
#     within 1e-2) and `moerun run --backend cuda` against the CPU;
#     speculative decoding's greedy output against plain decoding on the
#     device (tests/test_spec.c, suite spec_cuda); with two GPUs or more
#     and Open MPI present, expert and tensor parallelism over NCCL and over
#     host-staged MPI (tests/mpi/ep_check.c), skipped otherwise;
#  4. benchmarks `moerun bench --synthetic --backend cuda` on the Mixtral
#     8x7B, OLMoE and gpt-oss-120b (MXFP4 experts) shapes (random weights
#     made on the device): batch-1
#     decode against the HBM roofline (bandwidth measured here), prefill at
#     512 and 4096 tokens, grouped expert GEMM against dense cuBLAS, decode
#     step time at batch 1, 8, 64 and 256 (gpt-oss-120b in four separate
#     runs, each with its own timeout and JSON, so a hang names its part);
#     Mixtral prefill again with the
#     per-row attention kernel (MOERUN_CUDA_PREFILL_ATTN=rows) beside the
#     tiled one; the decode expert kernels alone with bf16, MXFP4, FP8, Q8_0,
#     Q4_1, Q4_G128 and Q4_K weights (moerun bench --expert-kernels); Mixtral
#     with its weights quantized to Q8_0 and to Q4_K on the device (--quantize
#     q8_0, q4) against bf16;
#     speculative decoding: a verification step's cost on the Mixtral shape
#     (bench verify) and the demo model with its draft and with n-gram
#     lookup (bench --spec); last, when ncu is installed, the kernel time of
#     OLMoE batch-1 decode per kernel (ncu), beside the same run's step time
#     without the profiler, to tell kernel time from the gaps between kernels;
#  5. prints a short table last.
#
# Every command's wall time is in run.log (a say line before and after it).
# All results are written to a scratch folder, ${TMPDIR:-/tmp}/moerun-gpu-out
# (emptied at the start), and packed into $OUT as exactly three files, since
# the device tool brings back only a few: summary.txt, run.log and all.tgz
# (the whole scratch folder: every JSON and text file).  They are packed
# after each step and phase and on exit, a failed or interrupted one
# (SIGTERM, SIGINT, SIGHUP) included, so a timeout still leaves what was
# measured until then.  Under a device call's time limit, run it as
# `timeout N tests/gpu/run.sh` with N some seconds below the limit, so that
# this script gets the SIGTERM itself and packs before the call ends.
#
# Environment: OUT (default gpu-out/), MOERUN_GPU_ARCHS (CUDA architectures,
# default 90a-real: the H200 only, to keep the build short), JOBS, PHASES
# (default build,tests,bench: a comma list, so the work can be split over
# calls on one warm machine; build-gpu/ stays between them, the scratch
# folder does not: each call's all.tgz holds its own phases).  The CUDA
# tests run with MOERUN_REQUIRE_GPU=1 (a suite that finds no device fails
# instead of skipping) and MOERUN_CUDA_STRICT=1 (a grouped GEMM cuBLAS
# rejects as an invalid value is an error, not a quiet fallback).
# Exit status: 0 when every step passed, 1 otherwise (each step still runs).
set -uo pipefail

root=$(cd "$(dirname "$0")/../.." && pwd)
out=${OUT:-$root/gpu-out}
mkdir -p "$out"
out=$(cd "$out" && pwd)
# the scratch folder: every step writes here; pack copies the three files
# into $out.  Neither may hold the other (the scratch folder is emptied).
work=$(realpath -m "${TMPDIR:-/tmp}/moerun-gpu-out")
case $out/ in "$work"/*) echo "run.sh: OUT ($out) lies in the scratch folder $work" >&2; exit 1 ;; esac
case $work/ in "$out"/*) echo "run.sh: the scratch folder $work lies in OUT ($out)" >&2; exit 1 ;; esac
rm -rf "$work"
mkdir -p "$work"
log=$work/run.log
: >"$log"
jobs=${JOBS:-$(nproc)}
archs=${MOERUN_GPU_ARCHS:-90a-real}
build=$root/build-gpu
prefix=${TMPDIR:-/tmp}/moerun-gpu-deps
status=0
t_start=$(date +%s)

say() { echo "== $* ($(($(date +%s) - t_start)) s)" | tee -a "$log"; }
fail() { echo "FAILED: $*" | tee -a "$log"; status=1; }

# ---- 5. the table (a function: every pack writes it, from what is there) ----
summarize() {
python3 - "$work" <<'PY'
import json, os, re, sys
out = sys.argv[1]


def load(name):
    with open(os.path.join(out, name)) as f:
        return json.load(f)


print("op parity: worst max-relative error per op and dtype")
try:
    print(open(os.path.join(out, "parity_worst.txt")).read().rstrip())
except Exception as e:
    print("  no result (%s)" % e)
print()
# gpt-oss-120b's default bench is four runs (run.sh step 4): the first file
# that holds a size gives it
SPLITS = {"gptoss120b": ("gptoss120b_pf512", "gptoss120b_pf4096", "gptoss120b_dec", "gptoss120b_gemm")}


def why(e):
    """An unreadable JSON's reason, short."""
    if isinstance(e, FileNotFoundError):
        return "no file"
    if isinstance(e, ValueError):
        return "empty or not JSON: %s" % e
    return str(e)


def merged(name):
    """A model's bench JSONs as one: prefill by tokens, decode by batch, the
    GPU's decode and grouped GEMM; the parts without a result in missing."""
    m = {"prefill": {}, "decode": {}, "gpu_decode": {}, "gemm": None, "copy_bw": None, "missing": []}
    found = False
    for part in SPLITS.get(name, (name,)):
        try:
            j = load("bench_%s.json" % part)
        except Exception as e:
            m["missing"].append("bench_%s.json (%s)" % (part, why(e)))
            continue
        found = True
        for p in j.get("prefill", []):
            m["prefill"].setdefault(p["tokens"], p)
        for d in j.get("decode", []):
            m["decode"].setdefault(d["batch"], d)
        g = j.get("gpu") or {}
        for d in g.get("decode", []):
            m["gpu_decode"].setdefault(d["batch"], d)
        if m["gemm"] is None and g.get("grouped_gemm"):
            m["gemm"] = g["grouped_gemm"][0]
        if m["copy_bw"] is None and "copy_bandwidth_GBps" in g:
            m["copy_bw"] = g["copy_bandwidth_GBps"]
    if not found:
        raise ValueError("; ".join(m["missing"]))
    return m


def cell(fmt, get):
    """fmt % get(), or 'no result' as wide when get fails."""
    try:
        return fmt % get()
    except Exception:
        return "no result".rjust(len(fmt % 0))


print("%-8s %10s %8s %10s %10s %9s %9s %9s %9s %8s %8s" % (
    "model", "dec1 tok/s", "roofl%", "pf512 t/s", "pf4096 t/s", "gemm%", "b1 ms", "b8 ms",
    "b64 ms", "b256 ms", "b64/exp"))
for name in ("mixtral", "olmoe", "gptoss120b"):
    try:
        m = merged(name)
    except Exception as e:
        print("%-8s (no result: %s)" % (name, e))
        continue
    dec, pf, gd, gg = m["decode"], m["prefill"], m["gpu_decode"], m["gemm"]
    print("%-8s %s %s %s %s %s %s %s %s %s %s" % (
        name, cell("%10.1f", lambda: dec[1]["tokens_per_s"]),
        cell("%7.1f%%", lambda: gd[1]["roofline_fraction"] * 100),
        cell("%10.1f", lambda: pf[512]["tokens_per_s"]), cell("%10.1f", lambda: pf[4096]["tokens_per_s"]),
        cell("%8.0f%%", lambda: 100 * gg["ratio"]),
        cell("%9.2f", lambda: dec[1]["step_ms"]), cell("%9.2f", lambda: dec[8]["step_ms"]),
        cell("%9.2f", lambda: dec[64]["step_ms"]), cell("%9.2f", lambda: dec[256]["step_ms"]),
        cell("%7.2fx", lambda: gd[64]["step_over_read_all_experts"])))
    print("%-8s copy bandwidth %s GB/s; %s" % (
        "", cell("%.0f", lambda: m["copy_bw"]),
        "grouped %.0f, a GEMM per expert %.0f, dense %.0f TFLOP/s at 4096 tokens" % (
            gg.get("grouped_tflops", 0), gg.get("loop_tflops", 0), gg.get("dense_tflops", 0))
        if gg else "grouped GEMM: no result"))
    if m["missing"]:
        print("%-8s no result from %s" % ("", "; ".join(m["missing"])))
try:
    j = load("bench_mixtral_graphs.json")
    g = {d["batch"]: d for d in j.get("gpu", {}).get("decode", [])}
    print("mixtral with CUDA graphs: " + ", ".join(
        "b%d %.1f tok/s (%.2f ms)" % (d["batch"], d["tokens_per_s"], d["step_ms"]) for d in j["decode"])
        + "; b1 %.1f%% of roofline" % (100 * g.get(1, {}).get("roofline_fraction", 0)))
except Exception as e:
    print("mixtral with CUDA graphs: no result (%s)" % e)
# a variant's bench run against the default one: prefill rows by tokens
# (labelled pf512), decode rows by batch (b8)
SIZE = {"prefill": ("tokens", "pf%d"), "decode": ("batch", "b%d")}


def by_size(j, section, field):
    """{size: field} of a bench JSON's prefill or decode rows, or of merged()'s."""
    rows = j[section]
    if isinstance(rows, dict):
        return {n: r[field] for n, r in rows.items()}
    return {r[SIZE[section][0]]: r[field] for r in rows}


def compare(base, variant, cells, sep="; ", absent=None, sizes=None):
    """The variant's rows against the default's of the same size, joined by sep.
    base: the default's bench JSON (its name, read first, or merged()'s result);
    variant: a bench JSON's name.  cells: (section, field, fmt) per section, in
    order; its rows in the variant's order, or those of sizes.  fmt takes n,
    label, new (the variant's field), base (the default's), ratio (new / base)
    and inverse (base / new).  A size the default lacks: absent % (n, label,
    new), no cell when absent is "", a KeyError when absent is None."""
    a = base if isinstance(base, dict) else load(base)
    b = load(variant)
    out = []
    for section, field, fmt in cells:
        key, label = SIZE[section]
        old = by_size(a, section, field)
        if sizes is None:
            new = [(r[key], r[field]) for r in b[section]]
        else:
            got = by_size(b, section, field)
            new = [(n, got[n]) for n in sizes]
        for n, v in new:
            c = {"n": n, "label": label % n, "new": v}
            if n in old:
                c.update(base=old[n], ratio=v / old[n], inverse=old[n] / v)
                out.append(fmt % c)
            elif absent is None:
                raise KeyError(n)
            elif absent:
                out.append(absent % c)
    return sep.join(out)


def line(head, get, fail):
    """Prints head + get(), or fail + 'no result (why)' when get raises."""
    try:
        print(head + get())
    except Exception as e:
        print("%sno result (%s)" % (fail, e))


VS = "%(label)s %(new).0f vs %(base).0f (%(ratio).2fx)"
TOKENS_PER_S = (("prefill", "tokens_per_s", VS), ("decode", "tokens_per_s", VS))
for name in ("mixtral", "olmoe"):
    line("%s, a GEMM per expert against the grouped call, tokens/s: " % name,
         lambda: compare("bench_%s.json" % name, "bench_%s_gloop.json" % name, TOKENS_PER_S, absent=""),
         "%s, a GEMM per expert: " % name)
for name in ("mixtral", "olmoe"):
    line("%s small-step projections, row kernel against cuBLAS, step ms: " % name,
         lambda: compare("bench_%s.json" % name, "bench_%s_small_cublas.json" % name,
                         [("decode", "step_ms", "%(label)s %(base).2f vs %(new).2f (cuBLAS / row %(ratio).2fx)")],
                         sep=", ", absent=""),
         "%s small-step projections: " % name)
line("mixtral prefill attention: ",
     lambda: compare("bench_mixtral.json", "bench_mixtral_pf_rows.json",
                     [("prefill", "tokens_per_s",
                       "%(n)d tokens tiled %(base).1f t/s, per-row %(new).1f t/s (%(inverse).2fx)")],
                     sizes=(512, 4096)),
     "mixtral prefill attention: ")
line("mixtral prefill, bf16 KV: ",
     lambda: compare("bench_mixtral_pf_bf16kv.json", "bench_mixtral_pf_mma.json",
                     [("prefill", "tokens_per_s",
                       "%(n)d tokens tiled %(base).1f t/s, tensor cores %(new).1f t/s (%(ratio).2fx)")],
                     sizes=(512, 4096)),
     "mixtral prefill, bf16 KV, tensor cores: ")
print("tensor-core expert kernels (MOERUN_CUDA_EXPERTS=mma) against the default, tokens/s:")
for name in ("mixtral", "olmoe", "gptoss120b"):
    line("  %-10s " % name,
         lambda: compare(merged(name), "bench_%s_xmma.json" % name, TOKENS_PER_S,
                         absent="%(label)s %(new).0f vs no result"),
         "  %-10s " % name)
print("decode expert kernels alone: us per call, GB/s of weights read, % of the copy bandwidth")
for name in ("mixtral", "experts_gptoss120b", "experts_qwen3moe30b"):
    try:
        j = load("bench_%s.json" % name)
        for r in j["gpu"]["expert_kernels"]:
            print("  %-20s b%-3d %-8s %8.1f us %7.0f GB/s %4.0f%%" % (
                name, r["batch"], r["dtype"], r["us"], r["GBps"], 100 * r["copy_bandwidth_fraction"]))
    except Exception as e:
        print("  %-20s no result (%s)" % (name, e))
for name, what in (("mixtral_offload4", "mixtral, 4 of 8 experts on the GPU"),
                   ("olmoe_offload16", "olmoe, 16 of 64 experts on the GPU, misses copied in"),
                   ("olmoe_offload16_cpu", "olmoe, 16 of 64 on the GPU, misses of <= 2 rows on the CPU")):
    try:
        j = load("bench_%s.json" % name)
        rows = [("pf%d" % p["tokens"], p) for p in j["prefill"]] + [("b%d" % d["batch"], d) for d in j["decode"]]
        print(what + ": " + "; ".join(
            "%s %.1f t/s, %.0f%% found, %.1f MB/token in, %.1f experts/token on the CPU" % (
                n, r["tokens_per_s"], 100 * r.get("offload", {}).get("hit_rate", 0),
                r.get("offload", {}).get("mb_in_per_token", 0),
                r.get("offload", {}).get("cpu_experts_per_token", 0)) for n, r in rows))
    except Exception as e:
        print("%s: no result (%s)" % (name, e))


def quant_line(tag):
    """Mixtral quantized on the device (bench_mixtral_TAG.json) against
    bf16, then its batch-1 roofline fraction."""
    cells = compare("bench_mixtral.json", "bench_mixtral_%s.json" % tag,
                    (("prefill", "tokens_per_s", VS),
                     ("decode", "tokens_per_s", "%(label)s %(new).1f vs %(base).1f (%(ratio).2fx)")))
    q = load("bench_mixtral_%s.json" % tag)
    roof = {d["batch"]: d.get("roofline_fraction", 0) for d in q.get("gpu", {}).get("decode", [])}
    return cells + "; b1 %.1f%% of its roofline" % (100 * roof.get(1, 0))


line("mixtral Q8_0 against bf16, tokens/s: ", lambda: quant_line("q8"), "mixtral Q8_0: ")
line("mixtral Q4_K (--quantize q4) against bf16, tokens/s: ", lambda: quant_line("q4"), "mixtral Q4_K: ")
for kv in ("f32", "bf16"):
    try:
        c = load("ppl_cuda_%s.json" % kv)
        b = c["base"]
        print("ppl demo-moe, CUDA (KV %s) vs CPU: ppl %.4f vs %.4f, mean KL %.3g, max KL %.3g, same top-1 %.2f%%"
              % (kv, c["ppl"], b["ppl"], b["kl_mean"], b["kl_max"], 100 * b["same_top1"]))
    except Exception as e:
        print("ppl demo-moe, CUDA (KV %s): no result (%s)" % (kv, e))
for f in ("spec_verify_mixtral.txt", "spec_demo.txt"):
    try:
        print(open(os.path.join(out, f)).read().rstrip())
    except Exception as e:
        print("%s: no result (%s)" % (f, e))

# the kernel-time profile of OLMoE batch-1 decode (ncu --print-summary
# per-kernel): a block per kernel, a header line naming it (and its launch
# shape, context, stream, device), maybe an Invocations line, then the
# gpu__time_duration.sum row: unit, then one value or minimum, maximum,
# average.  Parsed defensively: if nothing parses, the file's last 30 lines.
NS = {"nsecond": 1.0, "usecond": 1e3, "msecond": 1e6, "second": 1e9, "ns": 1.0, "us": 1e3, "ms": 1e6, "s": 1e9}
HEADER = re.compile(r"^\s{0,4}(\S.*?)(?: \(\d+, \d+, \d+\)x\(\d+, \d+, \d+\))?, (?:Context|Device) \d+")


def ncu_kernels(path):
    """{name: [invocations or None, average ns, total ns or None]} over the blocks of path."""
    kernels, cur = {}, None
    for line in open(path, errors="replace"):
        h = HEADER.match(line)
        if h and not line.lstrip().startswith("=="):
            cur = {"name": h.group(1).strip(), "inv": None}
            continue
        if cur is None:
            continue
        s = line.split()
        if s[:1] == ["Invocations"] and len(s) >= 2:
            cur["inv"] = int(float(s[-1].replace(",", "")))
        elif s[:1] == ["gpu__time_duration.sum"] and len(s) >= 3 and s[1] in NS:
            avg = float(s[-1].replace(",", "")) * NS[s[1]]
            k = kernels.setdefault(cur["name"], [0, 0.0, 0.0])
            if cur["inv"] is None or k[0] is None:
                k[0] = None  # the count unknown: no totals
            else:
                k[0] += cur["inv"]
                k[2] += cur["inv"] * avg
            k[1] = avg if k[0] is None else (k[2] / k[0] if k[0] else avg)
            cur = None
    return {n: [k[0], k[1], k[2] if k[0] is not None else None] for n, k in kernels.items()}


print("kernel time of OLMoE batch-1 decode (ncu; prefill 16, then a warm-up run and a timed run of")
print("  128 tokens of context and 4 decode steps: 8 decode steps in the profiled run):")
try:
    j = load("ncu_olmoe_b1_plain.json")
    d = {x["batch"]: x for x in j["decode"]}[1]
    print("  without the profiler: b1 step %.3f ms (%.1f tok/s)" % (d["step_ms"], d["tokens_per_s"]))
except Exception as e:
    print("  without the profiler: no result (%s)" % e)
ncu = os.path.join(out, "ncu_olmoe_b1.txt")
if not os.path.exists(ncu):
    print("  ncu: no result (no ncu_olmoe_b1.txt: ncu not installed?)")
else:
    try:
        k = ncu_kernels(ncu)
        if not k:
            raise ValueError("no gpu__time_duration.sum rows")
        totals = all(v[2] is not None for v in k.values())
        if totals:
            top = sorted(k.items(), key=lambda kv: -kv[1][2])[:15]
            all_ns = sum(v[2] for v in k.values())
            print("  all kernels: %.3f ms in %d launches of %d kernels; / 8 decode steps = %.3f ms (an upper"
                  % (all_ns / 1e6, sum(v[0] for v in k.values()), len(k), all_ns / 8e6))
            print("  bound on kernel time per decode step: it holds prefill and weight-making kernels too)")
            print("  %10s %8s %10s  %s" % ("total ms", "calls", "mean us", "kernel (15 of most total time)"))
            for n, (inv, avg, tot) in top:
                print("  %10.3f %8d %10.2f  %s" % (tot / 1e6, inv, avg / 1e3, n[:150]))
        else:
            top = sorted(k.items(), key=lambda kv: -kv[1][1])[:15]
            print("  (no invocation counts in the summary: the 15 kernels of longest mean time)")
            print("  %10s  %s" % ("mean us", "kernel"))
            for n, (inv, avg, tot) in top:
                print("  %10.2f  %s" % (avg / 1e3, n[:150]))
    except Exception as e:
        print("  ncu summary not parsed (%s); the last 30 lines of ncu_olmoe_b1.txt:" % e)
        try:
            for line in open(ncu, errors="replace").read().splitlines()[-30:]:
                print("    " + line)
        except Exception as e2:
            print("    (unreadable: %s)" % e2)
print()
print("targets: decode b1 >= 80% of roofline (mixtral); grouped GEMM >= 70% of dense at 4096;")
print("         b64 step <= 1.5x the time to read every expert once (b64/exp)")
PY
}

# pack: summary.txt, run.log and all.tgz (a tar.gz of the whole scratch
# folder) into $out, and nothing else there: the device tool brings back
# only a few files.  Each is written beside its name and renamed, so a kill
# mid-way leaves the previous whole one.
pack() {
    if summarize >"$work/summary.txt.part" 2>>"$log"; then
        mv -f "$work/summary.txt.part" "$work/summary.txt"
    else
        echo "the summary failed (its Python is above)" >>"$log"
    fi
    if [ -f "$work/summary.txt" ]; then
        cp -f "$work/summary.txt" "$out/summary.txt.part" && mv -f "$out/summary.txt.part" "$out/summary.txt"
    fi
    cp -f "$log" "$out/run.log.part" && mv -f "$out/run.log.part" "$out/run.log"
    # 1: a file changed as it was read (the log of a command still ending)
    local rc=0
    tar -czf "$out/all.tgz.part" -C "$work" --exclude='*.part' . || rc=$?
    if [ "$rc" -le 1 ]; then mv -f "$out/all.tgz.part" "$out/all.tgz"; fi
}

# timed NAME SECONDS FILE COMMAND...: COMMAND under a timeout (SIGKILL 10 s
# after the SIGTERM if that does not end it), its stdout to FILE (appended
# when FILE starts with +), its stderr to the log (to FILE too with both=1),
# a say line before and after (the wall time of each step is in the log),
# then a pack.  The command runs in the background and is waited for, so a
# signal to this script is taken at once (on_signal).  Returns the
# command's exit status; the caller reports a failure: fail "$last".
child=
last=
timed() {
    local name=$1 secs=$2 file=$3 t0 rc
    shift 3
    say "   $name: start (limit $secs s)"
    t0=$(date +%s)
    case $file in
        +*) exec 3>>"${file#+}" ;;
        *) exec 3>"$file" ;;
    esac
    if [ -n "${both:-}" ]; then exec 4>&3; else exec 4>>"$log"; fi
    timeout -k 10 "$secs" "$@" >&3 2>&4 &
    child=$!
    exec 3>&- 4>&-
    wait "$child"
    rc=$?
    child=
    last="$name: exit $rc after $(($(date +%s) - t0)) s"
    case $rc in 124 | 137) last="$last, past its limit of $secs s" ;; esac
    say "   $last"
    pack
    return "$rc"
}

# On exit, whatever the cause (a failed build's exit 1 included): pack.  On
# SIGTERM, SIGINT or SIGHUP (a device call's time limit): end the running
# command, say so, and exit, which packs.
# shellcheck disable=SC2317 # called by the traps below
on_exit() {
    local rc=$?
    trap - EXIT
    if [ "$rc" != 0 ] && [ -z "${finished:-}" ]; then
        echo "== ended early, exit $rc ($(($(date +%s) - t_start)) s)" >>"$log"
    fi
    pack
    exit "$rc"
}
# shellcheck disable=SC2317
on_signal() {
    trap - "$1"
    echo "== killed by SIG$1 ($(($(date +%s) - t_start)) s)${child:+: ending pid $child}" | tee -a "$log"
    if [ -n "$child" ]; then kill -TERM "$child" 2>/dev/null; fi
    status=1
    exit $((128 + $(kill -l "$1")))
}
trap on_exit EXIT
trap 'on_signal TERM' TERM
trap 'on_signal INT' INT
trap 'on_signal HUP' HUP

export PATH=/usr/local/cuda/bin:$PATH
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:/usr/local/cuda/lib:${LD_LIBRARY_PATH:-}
phases=,${PHASES:-build,tests,bench},
phase() { case $phases in *",$1,"*) return 0 ;; esac; return 1; }
{   # what this machine is: the first thing to read when something fails
    nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
    nvcc --version | tail -2
    cmake --version | head -1
    ldd --version | head -1
    echo "phases: $phases; results: $work, packed into $out"
} >>"$log" 2>&1
export MOERUN_REQUIRE_GPU=1 MOERUN_CUDA_STRICT=1

# ---- 1. dependencies and build ----
say "1. dependencies and build"
if ls "$root"/gpu-debs/*.deb >/dev/null 2>&1; then
    rm -rf "$prefix"
    mkdir -p "$prefix"
    for f in "$root"/gpu-debs/*.deb; do dpkg -x "$f" "$prefix" || fail "dpkg -x $f"; done
    lib=$prefix/usr/lib/x86_64-linux-gnu
    # the .pc files name /usr: point them into the prefix; private
    # requirements are for static links only, and name packages not carried
    for pc in "$lib"/pkgconfig/*.pc "$prefix"/usr/share/pkgconfig/*.pc; do
        [ -f "$pc" ] || continue
        sed -i -e "s|^prefix=/usr|prefix=$prefix/usr|" -e "s|=/usr/|=$prefix/usr/|" \
            -e '/^Requires.private:/d' -e '/^Libs.private:/d' "$pc"
    done
    export PKG_CONFIG_LIBDIR=$lib/pkgconfig:$prefix/usr/share/pkgconfig
    export LD_LIBRARY_PATH=$lib:${LD_LIBRARY_PATH:-}
    export CMAKE_PREFIX_PATH=$prefix/usr
    if [ -x "$prefix/usr/bin/pkgconf" ]; then export PKG_CONFIG=$prefix/usr/bin/pkgconf; fi
    linkflags="-Wl,-rpath-link,$lib -Wl,-rpath,$lib"
else
    echo "no gpu-debs/: using the system's libraries" | tee -a "$log"
    linkflags=""
fi
# warnings are not errors here: another host compiler may warn anew
if phase build && ! both=1 timed "cmake configure" 300 "+$log" cmake -S "$root" -B "$build" \
        -DCMAKE_BUILD_TYPE=Release -DMOERUN_CUDA=ON -DMOERUN_WERROR=OFF -DCMAKE_CUDA_ARCHITECTURES="$archs" \
        -DCMAKE_EXE_LINKER_FLAGS="$linkflags"; then
    fail "$last"
    tail -30 "$log"
    exit 1
fi
if phase build && ! both=1 timed "build" 1500 "+$log" cmake --build "$build" -j "$jobs" --target moerun \
        test_backend_ops_cuda test_cuda_ops test_cuda_attention test_cuda_quant test_cuda_plan test_cuda_forward \
        test_cuda_offload test_spec test_spec_mtp; then
    fail "$last"
    grep -E "error|Error" "$log" | head -30
    exit 1
fi
grep -iE "warning" "$log" | head -10
if [ ! -x "$build/moerun" ]; then fail "no build in $build (PHASES without build on a fresh machine?)"; exit 1; fi

cd "$root" || exit 1
if phase tests; then
# ---- 2. every CUDA op against the CPU op ----
say "2. op parity"
both=1 timed test_backend_ops_cuda 150 "$work/parity.txt" "$build/test_backend_ops_cuda" --jobs=1 \
    --filter='backend_ops_cuda/*' || fail "$last"
both=1 timed test_cuda_ops 150 "+$work/parity.txt" "$build/test_cuda_ops" --jobs=1 || fail "$last"
both=1 timed test_cuda_attention 150 "+$work/parity.txt" "$build/test_cuda_attention" --jobs=1 || fail "$last"
both=1 timed test_cuda_quant 150 "+$work/parity.txt" "$build/test_cuda_quant" --jobs=1 || fail "$last"
both=1 timed test_cuda_plan 100 "+$work/parity.txt" "$build/test_cuda_plan" --jobs=1 || fail "$last"
grep -q "^parity:" "$work/parity.txt" || fail "no parity lines: the CUDA op tests did not run"
grep -E "^\[FAIL\]|^\[SKIP\]|Assertion|mismatch|DIFFERS| FAIL$" "$work/parity.txt" | head -20 | tee -a "$log"
# worst error per op and dtype
awk '/^parity:/ { k = $2 " " $3; if ($NF == "identical" || $NF == "DIFFERS") v = ($NF == "DIFFERS"); else v = $NF + 0;
                  if (!(k in w) || v > w[k]) w[k] = v }
     /^backend-ops: cuda / { k = $3 " " $4; v = 0; for (i = 5; i < NF; i++) if ($i == "err") v = $(i + 1) + 0;
                  if (!(k in w) || v > w[k]) w[k] = v }
     END { for (k in w) printf "  %-24s %.3g\n", k, w[k] }' "$work/parity.txt" | sort >"$work/parity_worst.txt"
tail -3 "$work/parity.txt" | tee -a "$log"
pack

# ---- 3. fixtures end to end ----
say "3. fixture models end to end"
both=1 timed test_cuda_forward 200 "$work/e2e.txt" "$build/test_cuda_forward" --jobs=1 || fail "$last"
both=1 timed test_cuda_offload 200 "+$work/e2e.txt" "$build/test_cuda_offload" --jobs=1 || fail "$last"
grep -E "^e2e:|^\[FAIL\]|Assertion" "$work/e2e.txt" | tee -a "$log"
for fx in mixtral qwen3_moe olmoe deepseek_v2; do
    a=$(timeout 60 "$build/moerun" run "tests/fixtures/$fx" --prompt-ids 1,2,3,4,5 -n 16 --backend cpu 2>/dev/null)
    b=$(timeout 60 "$build/moerun" run "tests/fixtures/$fx" --prompt-ids 1,2,3,4,5 -n 16 --backend cuda 2>>"$work/e2e.txt")
    echo "moerun run $fx: cpu [$a] cuda [$b] $([ "$a" = "$b" ] && echo same || echo DIFFERENT)" | tee -a "$work/e2e.txt" "$log"
done
# speculative decoding on the device: greedy output with verification
# chunks (multi-row kernels) against plain decoding (one-row kernels)
both=1 timed "test_spec (cuda)" 200 "$work/spec.txt" "$build/test_spec" --jobs=1 --verbose \
    --filter='spec_cuda/*' || fail "$last"
grep -E "accepted|^\[FAIL\]|Assertion|Synthesis" "$work/spec.txt" | head -30 | tee -a "$log"
# the multi-token-prediction module on the device: its logits and drafts
# against the fixtures' references, greedy output through the engine
both=1 timed "test_spec_mtp (cuda)" 120 "$work/spec_mtp.txt" "$build/test_spec_mtp" --jobs=1 --verbose \
    --filter='spec_mtp_cuda/*' || fail "$last"
grep -E "^\[FAIL\]|Assertion|Synthesis" "$work/spec_mtp.txt" | head -20 | tee -a "$log"
# the whole model's output distribution: perplexity of the demo model on
# the CPU as the base, then CUDA against it (KL, same top-1)
ppl=(models/demo-moe tests/fixtures/ppl/stories.txt --ctx 128)
timed "ppl cpu" 120 "$work/ppl_cpu.json" "$build/moerun" ppl "${ppl[@]}" --backend cpu \
    --save-base "$work/ppl_base.st" --json || fail "$last"
for kv in f32 bf16; do
    timed "ppl cuda kv $kv" 120 "$work/ppl_cuda_$kv.json" "$build/moerun" ppl "${ppl[@]}" --backend cuda \
        --kv-dtype $kv --kl-base "$work/ppl_base.st" --json || fail "$last"
done
# two GPUs or more: expert and tensor parallelism with NCCL carrying the
# expert rows and sums (tests/mpi/ep_check.c: bit-identical to one process,
# TP within its tolerance), and the host-staged MPI path beside it; needs
# Open MPI (mpirun) on the machine, which the single-GPU image lacks
gpus=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | wc -l)
if [ "$gpus" -ge 2 ] && command -v mpirun >/dev/null; then
    say "3b. two GPUs: expert parallelism over NCCL"
    if timed "build ep_check" 300 "+$log" cmake --build "$build" -j "$jobs" --target ep_check; then
        mpi=(mpirun --oversubscribe --allow-run-as-root -n 2)
        for c in nccl mpi; do
            both=1 timed "ep_check cuda $c" 300 "+$work/ep.txt" "${mpi[@]}" "$build/ep_check" cuda --collectives $c \
                --rows 40 olmoe qwen3_moe mixtral || fail "$last"
            both=1 timed "ep_check cuda $c --tp 2" 300 "+$work/ep.txt" "${mpi[@]}" "$build/ep_check" cuda \
                --collectives $c --tp 2 olmoe mixtral || fail "$last"
        done
        grep -E "^ep_check" "$work/ep.txt" | head -30 | tee -a "$log"
    else
        fail "$last (ep_check needs MPI found at configure time)"
    fi
else
    echo "two-GPU section skipped: $gpus GPU(s), mpirun $(command -v mpirun >/dev/null && echo found || echo missing)" \
        | tee -a "$log"
fi
pack
fi # tests

# ---- 4. benchmarks ----
if phase bench; then
say "4. benchmarks"
# bench NAME CONFIG OPTIONS...: one `moerun bench --synthetic` into
# bench_NAME.json, under a limit of bench_timeout seconds (default 240);
# the options given after the common ones override them
bench() {
    local name=$1 cfg=$2
    shift 2
    timed "bench $name" "${bench_timeout:-240}" "$work/bench_$name.json" "$build/moerun" bench --synthetic "$cfg" \
        --dtype bf16 --backend cuda --ctx 128 --steps 16 --repeat 2 --copy-bandwidth --json "$@" || fail "$last"
}
full=(--prefill "512,4096" --chunk 4096 --decode "1,8,64,256" --gemm-compare 4096)
bench mixtral configs/mixtral-8x7b.json "${full[@]}" --expert-kernels 1,8,64
bench olmoe configs/olmoe-1b-7b.json "${full[@]}"
# gpt-oss-120b whole, its experts MXFP4 as released (56.7 GiB), read in
# place: in four runs, each with its own shorter limit and JSON.  The first
# GPU run's one call with all of the above hung until its 240 s limit and
# left an empty JSON (while the tensor-core expert run below, prefill
# 512,4096 and decode 8,64, took seconds): now a hang names its part.
# (a) prefill 512 and batch-1 decode (the roofline); (b) prefill 4096 in one
# chunk and batch-8 decode; (c) decode at batch 64 and 256 after the
# smallest prefill; (d) the grouped GEMM against dense cuBLAS at 4096
# tokens (bench takes a prefill and a decode size always: the smallest,
# one step, one timed run)
bench_timeout=75 bench gptoss120b_pf512 configs/gpt-oss-120b.json --prefill 512 --decode 1
bench_timeout=75 bench gptoss120b_pf4096 configs/gpt-oss-120b.json --prefill 4096 --chunk 4096 --decode 8
bench_timeout=75 bench gptoss120b_dec configs/gpt-oss-120b.json --prefill 16 --decode 64,256
bench_timeout=75 bench gptoss120b_gemm configs/gpt-oss-120b.json --prefill 16 --decode 1 --steps 1 --repeat 1 \
    --gemm-compare 4096
# decode steps recorded once as CUDA graphs and replayed (opt-in)
MOERUN_CUDA_GRAPHS=1 bench mixtral_graphs configs/mixtral-8x7b.json --prefill 64 --decode 1,8,32
# small steps' projections A/B: cuBLAS (MOERUN_CUDA_SMALL_MATMUL=cublas)
# against the row kernel (the default, measured by bench_mixtral.json and
# bench_olmoe.json: a row independent of the other rows of its step)
MOERUN_CUDA_SMALL_MATMUL=cublas bench mixtral_small_cublas configs/mixtral-8x7b.json --prefill 16 --decode 1,8
MOERUN_CUDA_SMALL_MATMUL=cublas bench olmoe_small_cublas configs/olmoe-1b-7b.json --prefill 16 --decode 1,8
# prefill attention A/B: the per-row kernel for prefill steps too (the
# tiled kernel is the default, measured by bench_mixtral.json)
MOERUN_CUDA_PREFILL_ATTN=rows bench mixtral_pf_rows configs/mixtral-8x7b.json \
    --prefill 512,4096 --chunk 4096 --decode 1
# prefill attention on tensor cores (opt-in), against the tiled SIMT kernel,
# both over a bf16 cache (the mma kernel takes half caches only)
bench mixtral_pf_bf16kv configs/mixtral-8x7b.json --prefill 512,4096 --chunk 4096 --decode 1 --kv-dtype bf16
MOERUN_CUDA_PREFILL_ATTN=mma bench mixtral_pf_mma configs/mixtral-8x7b.json \
    --prefill 512,4096 --chunk 4096 --decode 1 --kv-dtype bf16
# the decode expert kernels alone with bf16, MXFP4, FP8, Q8_0, Q4_1, Q4_G128 and Q4_K (rows of 256s) weights, at the
# expert shapes of gpt-oss-120b (128 x 2880 x 2880, top-4; FP8 does not
# divide) and Qwen3-30B-A3B (128 x 2048 x 768, top-8): one-layer models
for shape in "gptoss120b 2880 2880 4" "qwen3moe30b 2048 768 8"; do
    read -r sname d f k <<<"$shape"
    python3 - "$work/shape_$sname.json" "$d" "$f" "$k" <<'PY'
import json, sys
p, d, f, k = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
json.dump({"architectures": ["Qwen3MoeForCausalLM"], "hidden_size": d, "moe_intermediate_size": f,
           "num_hidden_layers": 1, "num_attention_heads": 32, "num_key_value_heads": 4, "head_dim": 64,
           "vocab_size": 1024, "max_position_embeddings": 4096, "rope_theta": 1e6, "rms_norm_eps": 1e-6,
           "num_experts": 128, "num_experts_per_tok": k, "norm_topk_prob": True,
           "tie_word_embeddings": False}, open(p, "w"))
PY
    bench "experts_$sname" "$work/shape_$sname.json" --prefill 16 --decode 1 --steps 2 --expert-kernels 1,8,64
done
# the experts' GEMMs on the tensor-core kernels driven from the device
# (opt-in), against the default (cuBLAS grouped GEMMs; MXFP4 widened; the
# decode kernels up to 32 rows) measured above: the steps where they differ
MOERUN_CUDA_EXPERTS=mma bench mixtral_xmma configs/mixtral-8x7b.json --prefill 512,4096 --chunk 4096 \
    --decode 8,64,256
MOERUN_CUDA_EXPERTS=mma bench olmoe_xmma configs/olmoe-1b-7b.json --prefill 512,4096 --chunk 4096 \
    --decode 8,64,256
MOERUN_CUDA_EXPERTS=mma bench gptoss120b_xmma configs/gpt-oss-120b.json --prefill 512,4096 --chunk 4096 \
    --decode 8,64
# the grouped path's GEMMs as one cublasGemmEx per expert
# (MOERUN_CUDA_GROUPED=loop) against one cublasGemmGroupedBatchedEx (the
# default, above): the first run measured the grouped call at 35-41% of
# dense cuBLAS
MOERUN_CUDA_GROUPED=loop bench mixtral_gloop configs/mixtral-8x7b.json --prefill 512,4096 --chunk 4096 \
    --decode 64,256
MOERUN_CUDA_GROUPED=loop bench olmoe_gloop configs/olmoe-1b-7b.json --prefill 512,4096 --chunk 4096 \
    --decode 64,256
# expert offload: 4 of Mixtral's 8 experts per layer on the device, the rest
# copied in over PCIe when routed to (--gpu-experts)
bench mixtral_offload4 configs/mixtral-8x7b.json --prefill 512 --chunk 512 --decode 1,8 --steps 8 \
    --gpu-experts 4
# missed experts computed on the CPU from host memory (--gpu-experts-cpu-rows)
# against copied in: OLMoE with 16 of its 64 experts per layer on the device
# (decode misses have 1-2 rows: the CPU takes them; prefill's go over PCIe)
bench olmoe_offload16 configs/olmoe-1b-7b.json --prefill 512 --chunk 512 --decode 1,8 --steps 8 \
    --gpu-experts 16
bench olmoe_offload16_cpu configs/olmoe-1b-7b.json --prefill 512 --chunk 512 --decode 1,8 --steps 8 \
    --gpu-experts 16 --gpu-experts-cpu-rows 2
# --quantize q8_0: Mixtral's weights quantized on the device (53 GB instead
# of 93), read in place at 1.125 bytes a weight
bench mixtral_q8 configs/mixtral-8x7b.json --prefill 512 --chunk 512 --decode 1,8,64 --quantize q8_0
# --quantize q4: Q4_K on the device (Mixtral's rows are multiples of 256;
# the LM head Q8_0), 0.5625 bytes a weight
bench mixtral_q4 configs/mixtral-8x7b.json --prefill 512 --chunk 512 --decode 1,8,64 --quantize q4
# speculative decoding on the device: a verification step of K + 1 rows
# against a decode row on the Mixtral shape (where decode is bound by
# reading weights, so extra rows should cost little), then the demo model
# with its draft and with n-gram lookup, with and without speculation
timed "bench verify mixtral" 300 "$work/spec_verify_mixtral.txt" "$build/moerun" bench verify --synthetic \
    configs/mixtral-8x7b.json --backend cuda --ctx 512 --max-k 8 --steps 8 || fail "$last"
for p in "--draft models/demo-draft" "--spec ngram"; do
    read -ra popt <<<"$p"
    timed "bench $p" 300 "+$work/spec_demo.txt" "$build/moerun" bench models/demo-moe --backend cuda "${popt[@]}" \
        --prompts bench/spec-prompts.txt --decode 1,8,32 --repeat 5 --output-len 48 --spec-max-batch 0 \
        || fail "$last"
done
# the kernel time of OLMoE batch-1 decode: the first GPU run measured it at
# 3.9 ms a step against a 0.56 ms memory roofline; is the time in the
# kernels or in the gaps between them?  ncu times every kernel of a small
# run (prefill 16 tokens, then a warm-up and a timed run, each of 128 tokens
# of context and 4 batch-1 decode steps: 8 decode steps in all) and prints
# the time per kernel summed over its calls (ncu_olmoe_b1.txt); the same
# run without the profiler gives the step time (ncu_olmoe_b1_plain.json).
# --clock-control none: the clocks as in the benchmarks, not ncu's base
# clocks.  A profile, not a check: ncu failing (no access to the counters,
# say) is noted, not a failure of the run.
small=(--synthetic configs/olmoe-1b-7b.json --dtype bf16 --backend cuda --ctx 128 --steps 4 --repeat 1
       --prefill 16 --decode 1)
if command -v ncu >/dev/null; then
    timed "olmoe b1 without the profiler" 120 "$work/ncu_olmoe_b1_plain.json" "$build/moerun" bench \
        "${small[@]}" --json || fail "$last"
    both=1 timed "ncu olmoe b1" 120 "$work/ncu_olmoe_b1.txt" ncu --clock-control none \
        --metrics gpu__time_duration.sum --print-summary per-kernel "$build/moerun" bench "${small[@]}" \
        || say "   ncu failed (a profile, not a check: see ncu_olmoe_b1.txt)"
else
    say "   no ncu on this machine: no kernel-time profile"
fi
pack
fi # bench

say "5. summary"
finished=1
pack
say "done, status $status"
cat "$work/summary.txt"
exit $status
