#!/usr/bin/env bash
# cpu_vs_llamacpp.sh - moerun's CPU backend against llama.cpp, side by side.
#
# usage: bench/cpu_vs_llamacpp.sh LLAMA_CPP_BUILD_DIR MODEL_DIR [MODEL_DIR ...]
#
# LLAMA_CPP_BUILD_DIR is an already-built llama.cpp (its bin/llama-bench);
# its source folder (for convert_hf_to_gguf.py) is LLAMA_CPP_SRC, by default
# the build folder's parent.  Each MODEL_DIR is a safetensors checkpoint
# (e.g. from `moerun synth CONFIG DIR --dtype bf16 --layout per-expert`); it
# is converted once to MODEL_DIR/model-$DTYPE.gguf at the same precision.
# For every model both programs run with the same threads, a prompt of
# PROMPT tokens (prefill) and GEN generated tokens at batch 1 (decode, from
# an empty context for llama-bench, from a 1-token context for moerun).  The
# two programs alternate for ROUNDS rounds of REPEAT runs each, so both see
# the same load on a shared machine, and the best run of each is kept.  The
# table gives tokens/s, the ratio moerun / llama.cpp, and moerun's decode
# against the memory-bandwidth rooflines that `moerun bench` measures (bytes
# per token / copy bandwidth, and / read bandwidth, at the best measured).
#
# Environment: MOERUN (default build/moerun), THREADS (2), PROMPT (512),
# GEN (64), REPEAT (2), ROUNDS (3), DTYPE (bf16 or f16; the checkpoint's own
# dtype), QUANT (moerun --quantize QUANT: q8_0 against a Q8_0 GGUF made by
# llama.cpp's converter, or q4), LLAMA_QUANT (llama.cpp's side made by its
# llama-quantize from the DTYPE GGUF instead: Q4_0, Q4_K_M, ...; with QUANT
# q4, say), LLAMA_CPP_SRC, WAIT (default, or passive: idle threads sleep at
# once instead of spinning, OMP_WAIT_POLICY=passive for moerun and --poll 0
# for llama-bench; better on a machine shared with other work).
set -euo pipefail

if [ $# -lt 2 ]; then
    sed -n '2,27p' "$0" | sed 's/^# \{0,1\}//'
    exit 2
fi
here=$(cd "$(dirname "$0")" && pwd)
llama_build=$(cd "$1" && pwd)
shift
llama_src=${LLAMA_CPP_SRC:-$(dirname "$llama_build")}
moerun=${MOERUN:-$here/../build/moerun}
threads=${THREADS:-2}
prompt=${PROMPT:-512}
gen=${GEN:-64}
repeat=${REPEAT:-2}
rounds=${ROUNDS:-3}
wait_policy=${WAIT:-default}
moerun_env=()
llama_extra=()
if [ "$wait_policy" = passive ]; then
    moerun_env=(OMP_WAIT_POLICY=passive)
    llama_extra=(--poll 0)
fi
dtype=${DTYPE:-bf16}
quant=${QUANT:-}
llama_quant=${LLAMA_QUANT:-}
moerun_quant=()
gguf_type=$dtype
if [ -n "$quant" ]; then
    moerun_quant=(--quantize "$quant")
    gguf_type=$quant
fi
[ -n "$llama_quant" ] && gguf_type=$llama_quant
llama_bench=$llama_build/bin/llama-bench
[ -x "$llama_bench" ] || { echo "no $llama_bench" >&2; exit 1; }
[ -x "$moerun" ] || { echo "no $moerun (build moerun first or set MOERUN)" >&2; exit 1; }

results=$(mktemp -d)
trap 'rm -rf "$results"' EXIT

echo "machine: $(lscpu | sed -n 's/^Model name: *//p'), $(nproc) cores; threads $threads;" \
     "wait policy $wait_policy; load average $(cut -d' ' -f1-3 /proc/loadavg)"
echo "moerun: $(git -C "$here/.." rev-parse --short HEAD 2>/dev/null || echo unknown)," \
     "llama.cpp: $("$llama_bench" --version 2>&1 | head -1 || true)"

i=0
for model in "$@"; do
    model=$(cd "$model" && pwd)
    gguf=$model/model-$gguf_type.gguf
    conv=$gguf
    [ -n "$llama_quant" ] && conv=$model/model-$dtype.gguf
    if [ ! -f "$conv" ]; then
        echo "converting $model to $conv" >&2
        python3 "$here/gguf_from_synth.py" "$llama_src" "$model" "$conv" \
            --outtype "$([ -n "$llama_quant" ] && echo "$dtype" || echo "$gguf_type")" \
            > "$results/convert.log" 2>&1 || { tail -20 "$results/convert.log" >&2; exit 1; }
    fi
    if [ ! -f "$gguf" ]; then
        echo "quantizing $conv to $gguf ($llama_quant)" >&2
        "$llama_build/bin/llama-quantize" "$conv" "$gguf" "$llama_quant" "$threads" \
            > "$results/quantize.log" 2>&1 || { tail -20 "$results/quantize.log" >&2; exit 1; }
    fi
    # alternate the two programs so both see the same machine load
    for r in $(seq "$rounds"); do
        env "${moerun_env[@]}" "$moerun" bench "$model" --backend cpu --threads "$threads" \
            --prefill "$prompt" --chunk "$prompt" --decode 1 --ctx 1 --steps "$gen" --repeat "$repeat" \
            "${moerun_quant[@]}" --json \
            > "$results/moerun.$i.$r.json"
        "$llama_bench" -m "$gguf" -t "$threads" -p "$prompt" -n "$gen" -r "$repeat" \
            "${llama_extra[@]}" -o json \
            > "$results/llama.$i.$r.json" 2> "$results/llama.$i.log" ||
            { tail -20 "$results/llama.$i.log" >&2; exit 1; }
    done
    echo "$model" > "$results/name.$i"
    i=$((i + 1))
done

python3 - "$results" "$i" "$rounds" <<'EOF'
import json, os, sys
d, n, rounds = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
hdr = ("model", "prefill moerun", "llama.cpp", "ratio", "decode moerun", "llama.cpp", "ratio",
       "copy roofline", "% copy", "read roofline", "% read")
rows = []
for i in range(n):
    ms = [json.load(open(f"{d}/moerun.{i}.{r}.json")) for r in range(1, rounds + 1)]
    ll = [x for r in range(1, rounds + 1) for x in json.load(open(f"{d}/llama.{i}.{r}.json"))]
    name = os.path.basename(open(f"{d}/name.{i}").read().strip())
    mp = max(m["prefill"][0]["tokens_per_s"] for m in ms)
    md = max(m["decode"][0]["tokens_per_s"] for m in ms)
    # the rooflines at the best bandwidths seen
    m = max(ms, key=lambda m: m["roofline"]["copy_bytes_per_s"])
    roof = m["roofline"]["decode_tokens_per_s"]
    mr = max(ms, key=lambda m: m["roofline"]["read_bytes_per_s"])
    rroof = mr["roofline"]["read_decode_tokens_per_s"]
    lp = max(max(r["samples_ts"]) for r in ll if r["n_prompt"] > 0)
    lg = max(max(r["samples_ts"]) for r in ll if r["n_gen"] > 0)
    rows.append((name, f"{mp:.1f}", f"{lp:.1f}", f"{mp / lp:.2f}", f"{md:.2f}", f"{lg:.2f}",
                 f"{md / lg:.2f}", f"{roof:.1f}", f"{100 * md / roof:.0f}%", f"{rroof:.1f}",
                 f"{100 * md / rroof:.0f}%"))
    print(f"# {name}: decode reads {m['roofline']['decode_bytes_per_token'] / 1e6:.1f} MB/token,"
          f" copy bandwidth {m['roofline']['copy_bytes_per_s'] / 1e9:.2f} GB/s,"
          f" read bandwidth {mr['roofline']['read_bytes_per_s'] / 1e9:.2f} GB/s", file=sys.stderr)
print("| " + " | ".join(hdr) + " |")
print("|" + "---|" * len(hdr))
for r in rows:
    print("| " + " | ".join(r) + " |")
EOF
