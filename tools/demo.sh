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
printf '%s' "$PROMPT"   # moerun run prints only the continuation
build/moerun run "$MODEL" -p "$PROMPT" -n 48
