#!/bin/bash
# run.sh - the CUDA backend proven on one GPU, in one go (about 3 to 5
# minutes on an H200).  Needs only the repository, the .deb files that
# tests/gpu/fetch-debs.sh downloaded into gpu-debs/ (carried with the call),
# and an image with nvcc, CMake and python3.
#
#  1. unpacks the .debs into a private prefix and builds (Release, CUDA on);
#  2. runs every CUDA op against the CPU op (tests/test_backend_ops.c, tests/test_cuda_ops.c,
#     tests/test_cuda_attention.c, tests/test_cuda_quant.c) and
#     tabulates the worst relative error per op and dtype;
#  3. runs every fixture model end to end on both backends
#     (tests/test_cuda_forward.c: fp32 greedy tokens identical, bf16 logits
#     within 1e-2) and `moerun run --backend cuda` against the CPU;
#     speculative decoding's greedy output against plain decoding on the
#     device (tests/test_spec.c, suite spec_cuda);
#  4. benchmarks `moerun bench --synthetic --backend cuda` on the Mixtral
#     8x7B, OLMoE and gpt-oss-120b (MXFP4 experts) shapes (random weights
#     made on the device): batch-1
#     decode against the HBM roofline (bandwidth measured here), prefill at
#     512 and 4096 tokens, grouped expert GEMM against dense cuBLAS, decode
#     step time at batch 1, 8, 64 and 256; Mixtral prefill again with the
#     per-row attention kernel (MOERUN_CUDA_PREFILL_ATTN=rows) beside the
#     tiled one; the decode expert kernels alone with bf16, MXFP4, FP8, Q8_0
#     weights (moerun bench --expert-kernels); Mixtral with its weights
#     quantized to Q8_0 on the device (--quantize q8_0) against bf16;
#     speculative decoding: a verification step's cost on the Mixtral shape
#     (bench verify) and the demo model with its draft and with n-gram
#     lookup (bench --spec);
#  5. prints a short table last; everything is written under $OUT.
#
# Environment: OUT (default gpu-out/), MOERUN_GPU_ARCHS (CUDA architectures,
# default 90a-real: the H200 only, to keep the build short), JOBS, PHASES
# (default build,tests,bench: a comma list, so the work can be split over
# calls on one warm machine; build-gpu/ stays between them).  The CUDA
# tests run with MOERUN_REQUIRE_GPU=1 (a suite that finds no device fails
# instead of skipping) and MOERUN_CUDA_STRICT=1 (a grouped GEMM cuBLAS
# rejects as an invalid value is an error, not a quiet fallback).
# Exit status: 0 when every step passed, 1 otherwise (each step still runs).
set -uo pipefail

root=$(cd "$(dirname "$0")/../.." && pwd)
out=${OUT:-$root/gpu-out}
mkdir -p "$out"
log=$out/run.log
: >"$log"
jobs=${JOBS:-$(nproc)}
archs=${MOERUN_GPU_ARCHS:-90a-real}
build=$root/build-gpu
prefix=${TMPDIR:-/tmp}/moerun-gpu-deps
status=0
t_start=$(date +%s)

say() { echo "== $* ($(($(date +%s) - t_start)) s)" | tee -a "$log"; }
fail() { echo "FAILED: $*" | tee -a "$log"; status=1; }

export PATH=/usr/local/cuda/bin:$PATH
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:/usr/local/cuda/lib:${LD_LIBRARY_PATH:-}
phases=,${PHASES:-build,tests,bench},
phase() { case $phases in *",$1,"*) return 0 ;; esac; return 1; }
{   # what this machine is: the first thing to read when something fails
    nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
    nvcc --version | tail -2
    cmake --version | head -1
    ldd --version | head -1
    echo "phases: $phases"
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
if phase build && ! cmake -S "$root" -B "$build" -DCMAKE_BUILD_TYPE=Release -DMOERUN_CUDA=ON \
        -DMOERUN_WERROR=OFF -DCMAKE_CUDA_ARCHITECTURES="$archs" -DCMAKE_EXE_LINKER_FLAGS="$linkflags" \
        >>"$log" 2>&1; then
    fail "cmake configure"
    tail -30 "$log"
    exit 1
fi
if phase build && ! cmake --build "$build" -j "$jobs" --target moerun test_backend_ops_cuda test_cuda_ops \
        test_cuda_attention test_cuda_quant test_cuda_forward test_cuda_offload test_spec test_spec_mtp >>"$log" 2>&1; then
    fail "build"
    grep -E "error|Error" "$log" | head -30
    exit 1
fi
grep -iE "warning" "$log" | head -10
if [ ! -x "$build/moerun" ]; then fail "no build in $build (PHASES without build on a fresh machine?)"; exit 1; fi

cd "$root"
if phase tests; then
# ---- 2. every CUDA op against the CPU op ----
say "2. op parity"
if ! timeout 150 "$build/test_backend_ops_cuda" --jobs=1 --filter='backend_ops_cuda/*' >"$out/parity.txt" 2>&1; then
    fail "test_backend_ops_cuda"; fi
if ! timeout 150 "$build/test_cuda_ops" --jobs=1 >>"$out/parity.txt" 2>&1; then fail "test_cuda_ops"; fi
if ! timeout 150 "$build/test_cuda_attention" --jobs=1 >>"$out/parity.txt" 2>&1; then fail "test_cuda_attention"; fi
if ! timeout 150 "$build/test_cuda_quant" --jobs=1 >>"$out/parity.txt" 2>&1; then fail "test_cuda_quant"; fi
grep -q "^parity:" "$out/parity.txt" || fail "no parity lines: the CUDA op tests did not run"
grep -E "^\[FAIL\]|^\[SKIP\]|Assertion|mismatch|DIFFERS| FAIL$" "$out/parity.txt" | head -20 | tee -a "$log"
# worst error per op and dtype
awk '/^parity:/ { k = $2 " " $3; if ($NF == "identical" || $NF == "DIFFERS") v = ($NF == "DIFFERS"); else v = $NF + 0;
                  if (!(k in w) || v > w[k]) w[k] = v }
     /^backend-ops: cuda / { k = $3 " " $4; v = 0; for (i = 5; i < NF; i++) if ($i == "err") v = $(i + 1) + 0;
                  if (!(k in w) || v > w[k]) w[k] = v }
     END { for (k in w) printf "  %-24s %.3g\n", k, w[k] }' "$out/parity.txt" | sort >"$out/parity_worst.txt"
tail -3 "$out/parity.txt" | tee -a "$log"

# ---- 3. fixtures end to end ----
say "3. fixture models end to end"
if ! timeout 200 "$build/test_cuda_forward" --jobs=1 >"$out/e2e.txt" 2>&1; then fail "test_cuda_forward"; fi
if ! timeout 200 "$build/test_cuda_offload" --jobs=1 >>"$out/e2e.txt" 2>&1; then fail "test_cuda_offload"; fi
grep -E "^e2e:|^\[FAIL\]|Assertion" "$out/e2e.txt" | tee -a "$log"
for fx in mixtral qwen3_moe olmoe deepseek_v2; do
    a=$(timeout 60 "$build/moerun" run "tests/fixtures/$fx" --prompt-ids 1,2,3,4,5 -n 16 --backend cpu 2>/dev/null)
    b=$(timeout 60 "$build/moerun" run "tests/fixtures/$fx" --prompt-ids 1,2,3,4,5 -n 16 --backend cuda 2>>"$out/e2e.txt")
    echo "moerun run $fx: cpu [$a] cuda [$b] $([ "$a" = "$b" ] && echo same || echo DIFFERENT)" | tee -a "$out/e2e.txt" "$log"
done
# speculative decoding on the device: greedy output with verification
# chunks (multi-row kernels) against plain decoding (one-row kernels)
if ! timeout 200 "$build/test_spec" --jobs=1 --verbose --filter='spec_cuda/*' >"$out/spec.txt" 2>&1; then
    fail "test_spec (cuda)"; fi
grep -E "accepted|^\[FAIL\]|Assertion|Synthesis" "$out/spec.txt" | head -30 | tee -a "$log"
# the multi-token-prediction module on the device: its logits and drafts
# against the fixtures' references, greedy output through the engine
if ! timeout 120 "$build/test_spec_mtp" --jobs=1 --verbose --filter='spec_mtp_cuda/*' >"$out/spec_mtp.txt" 2>&1; then
    fail "test_spec_mtp (cuda)"; fi
grep -E "^\[FAIL\]|Assertion|Synthesis" "$out/spec_mtp.txt" | head -20 | tee -a "$log"
# the whole model's output distribution: perplexity of the demo model on
# the CPU as the base, then CUDA against it (KL, same top-1)
ppl="models/demo-moe tests/fixtures/ppl/stories.txt --ctx 128"
if ! timeout 120 "$build/moerun" ppl $ppl --backend cpu --save-base "$out/ppl_base.st" --json \
        >"$out/ppl_cpu.json" 2>>"$log"; then fail "ppl cpu"; fi
for kv in f32 bf16; do
    if ! timeout 120 "$build/moerun" ppl $ppl --backend cuda --kv-dtype $kv --kl-base "$out/ppl_base.st" \
            --json >"$out/ppl_cuda_$kv.json" 2>>"$log"; then fail "ppl cuda kv $kv"; fi
done
fi # tests

# ---- 4. benchmarks ----
if phase bench; then
say "4. benchmarks"
bench() { # name config options...
    local name=$1 cfg=$2
    shift 2
    if ! timeout 240 "$build/moerun" bench --synthetic "$cfg" --dtype bf16 --backend cuda \
            --ctx 128 --steps 16 --repeat 2 --copy-bandwidth --json "$@" \
            >"$out/bench_$name.json" 2>>"$log"; then
        fail "bench $name"
    fi
}
full="--prefill 512,4096 --chunk 4096 --decode 1,8,64,256 --gemm-compare 4096"
bench mixtral configs/mixtral-8x7b.json $full --expert-kernels 1,8,64
say "   mixtral done"
bench olmoe configs/olmoe-1b-7b.json $full
say "   olmoe done"
# gpt-oss-120b whole, its experts MXFP4 as released (56.7 GiB), read in place
bench gptoss120b configs/gpt-oss-120b.json $full
say "   gpt-oss-120b done"
# decode steps recorded once as CUDA graphs and replayed (opt-in)
MOERUN_CUDA_GRAPHS=1 bench mixtral_graphs configs/mixtral-8x7b.json --prefill 64 --decode 1,8,32
say "   mixtral with graphs done"
# prefill attention A/B: the per-row kernel for prefill steps too (the
# tiled kernel is the default, measured by bench_mixtral.json)
MOERUN_CUDA_PREFILL_ATTN=rows bench mixtral_pf_rows configs/mixtral-8x7b.json \
    --prefill 512,4096 --chunk 4096 --decode 1
say "   mixtral prefill with per-row attention done"
# prefill attention on tensor cores (opt-in), against the tiled SIMT kernel,
# both over a bf16 cache (the mma kernel takes half caches only)
bench mixtral_pf_bf16kv configs/mixtral-8x7b.json --prefill 512,4096 --chunk 4096 --decode 1 --kv-dtype bf16
MOERUN_CUDA_PREFILL_ATTN=mma bench mixtral_pf_mma configs/mixtral-8x7b.json \
    --prefill 512,4096 --chunk 4096 --decode 1 --kv-dtype bf16
say "   mixtral prefill with tensor-core attention done"
# the decode expert kernels alone with bf16, MXFP4, FP8 and Q8_0 weights, at the
# expert shapes of gpt-oss-120b (128 x 2880 x 2880, top-4; FP8 does not
# divide) and Qwen3-30B-A3B (128 x 2048 x 768, top-8): one-layer models
for shape in "gptoss120b 2880 2880 4" "qwen3moe30b 2048 768 8"; do
    set -- $shape
    python3 - "$out/shape_$1.json" "$2" "$3" "$4" <<'PY'
import json, sys
p, d, f, k = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
json.dump({"architectures": ["Qwen3MoeForCausalLM"], "hidden_size": d, "moe_intermediate_size": f,
           "num_hidden_layers": 1, "num_attention_heads": 32, "num_key_value_heads": 4, "head_dim": 64,
           "vocab_size": 1024, "max_position_embeddings": 4096, "rope_theta": 1e6, "rms_norm_eps": 1e-6,
           "num_experts": 128, "num_experts_per_tok": k, "norm_topk_prob": True,
           "tie_word_embeddings": False}, open(p, "w"))
PY
    bench "experts_$1" "$out/shape_$1.json" --prefill 16 --decode 1 --steps 2 --expert-kernels 1,8,64
done
say "   expert kernels done"
# the experts' GEMMs on the tensor-core kernels driven from the device
# (opt-in), against the default (cuBLAS grouped GEMMs; MXFP4 widened; the
# decode kernels up to 32 rows) measured above: the steps where they differ
MOERUN_CUDA_EXPERTS=mma bench mixtral_xmma configs/mixtral-8x7b.json --prefill 512,4096 --chunk 4096 \
    --decode 8,64,256
MOERUN_CUDA_EXPERTS=mma bench olmoe_xmma configs/olmoe-1b-7b.json --prefill 512,4096 --chunk 4096 \
    --decode 8,64,256
MOERUN_CUDA_EXPERTS=mma bench gptoss120b_xmma configs/gpt-oss-120b.json --prefill 512,4096 --chunk 4096 \
    --decode 8,64
say "   tensor-core expert kernels done"
# expert offload: 4 of Mixtral's 8 experts per layer on the device, the rest
# copied in over PCIe when routed to (--gpu-experts)
bench mixtral_offload4 configs/mixtral-8x7b.json --prefill 512 --chunk 512 --decode 1,8 --steps 8 \
    --gpu-experts 4
say "   mixtral with expert offload done"
# missed experts computed on the CPU from host memory (--gpu-experts-cpu-rows)
# against copied in: OLMoE with 16 of its 64 experts per layer on the device
# (decode misses have 1-2 rows: the CPU takes them; prefill's go over PCIe)
bench olmoe_offload16 configs/olmoe-1b-7b.json --prefill 512 --chunk 512 --decode 1,8 --steps 8 \
    --gpu-experts 16
bench olmoe_offload16_cpu configs/olmoe-1b-7b.json --prefill 512 --chunk 512 --decode 1,8 --steps 8 \
    --gpu-experts 16 --gpu-experts-cpu-rows 2
say "   olmoe with expert offload, misses copied and on the CPU, done"
# --quantize q8_0: Mixtral's weights quantized on the device (53 GB instead
# of 93), read in place at 1.125 bytes a weight
bench mixtral_q8 configs/mixtral-8x7b.json --prefill 512 --chunk 512 --decode 1,8,64 --quantize q8_0
say "   mixtral with Q8_0 weights done"
# speculative decoding on the device: a verification step of K + 1 rows
# against a decode row on the Mixtral shape (where decode is bound by
# reading weights, so extra rows should cost little), then the demo model
# with its draft and with n-gram lookup, with and without speculation
timeout 300 "$build/moerun" bench verify --synthetic configs/mixtral-8x7b.json --backend cuda --ctx 512 \
    --max-k 8 --steps 8 >"$out/spec_verify_mixtral.txt" 2>>"$log" || fail "bench verify mixtral"
for p in "--draft models/demo-draft" "--spec ngram"; do
    timeout 300 "$build/moerun" bench models/demo-moe --backend cuda $p --prompts bench/spec-prompts.txt \
        --decode 1,8,32 --repeat 5 --output-len 48 --spec-max-batch 0 >>"$out/spec_demo.txt" 2>>"$log" \
        || fail "bench $p"
done
say "   speculative decoding done"
fi # bench

# ---- 5. the table ----
say "5. summary"
python3 - "$out" >"$out/summary.txt" 2>>"$log" <<'PY'
import json, os, sys
out = sys.argv[1]
print("op parity: worst max-relative error per op and dtype")
try:
    print(open(os.path.join(out, "parity_worst.txt")).read().rstrip())
except Exception as e:
    print("  no result (%s)" % e)
print()
print("%-8s %10s %8s %10s %10s %9s %9s %9s %9s %8s %8s" % (
    "model", "dec1 tok/s", "roofl%", "pf512 t/s", "pf4096 t/s", "gemm%", "b1 ms", "b8 ms",
    "b64 ms", "b256 ms", "b64/exp"))
for name in ("mixtral", "olmoe", "gptoss120b"):
    try:
        j = json.load(open(os.path.join(out, "bench_%s.json" % name)))
    except Exception as e:
        print("%-8s (no result: %s)" % (name, e))
        continue
    dec = {d["batch"]: d for d in j["decode"]}
    pf = {p["tokens"]: p for p in j["prefill"]}
    g = j.get("gpu", {})
    gd = {d["batch"]: d for d in g.get("decode", [])}
    gg = g.get("grouped_gemm", [{}])[0]
    roof = gd.get(1, {}).get("roofline_fraction", 0) * 100
    print("%-8s %10.1f %7.1f%% %10.1f %10.1f %8.0f%% %9.2f %9.2f %9.2f %9.2f %7.2fx" % (
        name, dec[1]["tokens_per_s"], roof, pf[512]["tokens_per_s"], pf[4096]["tokens_per_s"],
        100 * gg.get("ratio", 0), dec[1]["step_ms"], dec[8]["step_ms"], dec[64]["step_ms"],
        dec[256]["step_ms"], gd.get(64, {}).get("step_over_read_all_experts", 0)))
    print("%-8s copy bandwidth %.0f GB/s; grouped %.0f vs dense %.0f TFLOP/s at 4096 tokens" % (
        "", g.get("copy_bandwidth_GBps", 0), gg.get("grouped_tflops", 0), gg.get("dense_tflops", 0)))
try:
    j = json.load(open(os.path.join(out, "bench_mixtral_graphs.json")))
    g = {d["batch"]: d for d in j.get("gpu", {}).get("decode", [])}
    print("mixtral with CUDA graphs: " + ", ".join(
        "b%d %.1f tok/s (%.2f ms)" % (d["batch"], d["tokens_per_s"], d["step_ms"]) for d in j["decode"])
        + "; b1 %.1f%% of roofline" % (100 * g.get(1, {}).get("roofline_fraction", 0)))
except Exception as e:
    print("mixtral with CUDA graphs: no result (%s)" % e)
try:
    pf = {}
    for kind, name in (("tiled", "bench_mixtral.json"), ("rows", "bench_mixtral_pf_rows.json")):
        j = json.load(open(os.path.join(out, name)))
        pf[kind] = {p["tokens"]: p["tokens_per_s"] for p in j["prefill"]}
    print("mixtral prefill attention: " + "; ".join(
        "%d tokens tiled %.1f t/s, per-row %.1f t/s (%.2fx)" % (
            n, pf["tiled"][n], pf["rows"][n], pf["tiled"][n] / pf["rows"][n])
        for n in (512, 4096)))
except Exception as e:
    print("mixtral prefill attention: no result (%s)" % e)
try:
    pf = {}
    for kind, name in (("tiled", "bench_mixtral_pf_bf16kv.json"), ("mma", "bench_mixtral_pf_mma.json")):
        j = json.load(open(os.path.join(out, name)))
        pf[kind] = {p["tokens"]: p["tokens_per_s"] for p in j["prefill"]}
    print("mixtral prefill, bf16 KV: " + "; ".join(
        "%d tokens tiled %.1f t/s, tensor cores %.1f t/s (%.2fx)" % (
            n, pf["tiled"][n], pf["mma"][n], pf["mma"][n] / pf["tiled"][n])
        for n in (512, 4096)))
except Exception as e:
    print("mixtral prefill, bf16 KV, tensor cores: no result (%s)" % e)
print("tensor-core expert kernels (MOERUN_CUDA_EXPERTS=mma) against the default, tokens/s:")
for name in ("mixtral", "olmoe", "gptoss120b"):
    try:
        a = json.load(open(os.path.join(out, "bench_%s.json" % name)))
        b = json.load(open(os.path.join(out, "bench_%s_xmma.json" % name)))
        pa = {p["tokens"]: p["tokens_per_s"] for p in a["prefill"]}
        da = {d["batch"]: d["tokens_per_s"] for d in a["decode"]}
        cells = ["pf%d %.0f vs %.0f (%.2fx)" % (p["tokens"], p["tokens_per_s"], pa[p["tokens"]],
                                                 p["tokens_per_s"] / pa[p["tokens"]]) for p in b["prefill"]]
        cells += ["b%d %.0f vs %.0f (%.2fx)" % (d["batch"], d["tokens_per_s"], da[d["batch"]],
                                                 d["tokens_per_s"] / da[d["batch"]]) for d in b["decode"]]
        print("  %-10s %s" % (name, "; ".join(cells)))
    except Exception as e:
        print("  %-10s no result (%s)" % (name, e))
print("decode expert kernels alone: us per call, GB/s of weights read, % of the copy bandwidth")
for name in ("mixtral", "experts_gptoss120b", "experts_qwen3moe30b"):
    try:
        j = json.load(open(os.path.join(out, "bench_%s.json" % name)))
        for r in j["gpu"]["expert_kernels"]:
            print("  %-20s b%-3d %-8s %8.1f us %7.0f GB/s %4.0f%%" % (
                name, r["batch"], r["dtype"], r["us"], r["GBps"], 100 * r["copy_bandwidth_fraction"]))
    except Exception as e:
        print("  %-20s no result (%s)" % (name, e))
for name, what in (("mixtral_offload4", "mixtral, 4 of 8 experts on the GPU"),
                   ("olmoe_offload16", "olmoe, 16 of 64 experts on the GPU, misses copied in"),
                   ("olmoe_offload16_cpu", "olmoe, 16 of 64 on the GPU, misses of <= 2 rows on the CPU")):
    try:
        j = json.load(open(os.path.join(out, "bench_%s.json" % name)))
        rows = [("pf%d" % p["tokens"], p) for p in j["prefill"]] + [("b%d" % d["batch"], d) for d in j["decode"]]
        print(what + ": " + "; ".join(
            "%s %.1f t/s, %.0f%% found, %.1f MB/token in, %.1f experts/token on the CPU" % (
                n, r["tokens_per_s"], 100 * r.get("offload", {}).get("hit_rate", 0),
                r.get("offload", {}).get("mb_in_per_token", 0),
                r.get("offload", {}).get("cpu_experts_per_token", 0)) for n, r in rows))
    except Exception as e:
        print("%s: no result (%s)" % (name, e))
try:
    a = json.load(open(os.path.join(out, "bench_mixtral.json")))
    q = json.load(open(os.path.join(out, "bench_mixtral_q8.json")))
    da = {d["batch"]: d["tokens_per_s"] for d in a["decode"]}
    pa = {p["tokens"]: p["tokens_per_s"] for p in a["prefill"]}
    roof = {d["batch"]: d.get("roofline_fraction", 0) for d in q.get("gpu", {}).get("decode", [])}
    print("mixtral Q8_0 against bf16, tokens/s: " + "; ".join(
        ["pf%d %.0f vs %.0f (%.2fx)" % (p["tokens"], p["tokens_per_s"], pa[p["tokens"]],
                                         p["tokens_per_s"] / pa[p["tokens"]]) for p in q["prefill"]] +
        ["b%d %.1f vs %.1f (%.2fx)" % (d["batch"], d["tokens_per_s"], da[d["batch"]],
                                        d["tokens_per_s"] / da[d["batch"]]) for d in q["decode"]])
        + "; b1 %.1f%% of its roofline" % (100 * roof.get(1, 0)))
except Exception as e:
    print("mixtral Q8_0: no result (%s)" % e)
for kv in ("f32", "bf16"):
    try:
        c = json.load(open(os.path.join(out, "ppl_cuda_%s.json" % kv)))
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
print()
print("targets: decode b1 >= 80% of roofline (mixtral); grouped GEMM >= 70% of dense at 4096;")
print("         b64 step <= 1.5x the time to read every expert once (b64/exp)")
PY
say "done, status $status"
cat "$out/summary.txt"
exit $status
