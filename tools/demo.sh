#!/bin/sh
# Installs what is missing, builds moerun and generates from the bundled
# demo MoE checkpoint.
set -e
cd "$(dirname "$0")/.."
tools/deps.sh
cmake -S . -B build >/dev/null
cmake --build build -j"$(nproc)" --target moerun
MODEL=models/demo-moe
build/moerun inspect "$MODEL"
PROMPT="Once upon a time"
# the GPU when there is one, so no fallback notice breaks the text below
BACKEND=cpu
if nvidia-smi -L >/dev/null 2>&1 && build/moerun run "$MODEL" -p "a" -n 1 --backend cuda >/dev/null 2>&1; then
  BACKEND=cuda
fi
printf '%s' "$PROMPT"   # moerun run prints only the continuation
build/moerun run "$MODEL" -p "$PROMPT" -n 48 --backend "$BACKEND"
# the same with speculative decoding: models/demo-draft (a tenth of the
# size) drafts 4 tokens a step and the model verifies them; the text is the
# same, and the summary gives how many drafts it accepted
printf '\n%s' "$PROMPT"
build/moerun run "$MODEL" -p "$PROMPT" -n 48 --backend "$BACKEND" --draft models/demo-draft
