#!/bin/sh
# Installs what is missing, builds moerun and runs the whole test suite.
#   tools/test.sh            default build in build/
#   tools/test.sh --sanitize AddressSanitizer + UBSan build in build-san/
set -e
cd "$(dirname "$0")/.."
tools/deps.sh
BUILD=build
EXTRA=""
if [ "$1" = "--sanitize" ]; then
  BUILD=build-san
  EXTRA="-DMOERUN_SANITIZE=ON -DMOERUN_CUDA=OFF"
fi
cmake -S . -B "$BUILD" $EXTRA >/dev/null
cmake --build "$BUILD" -j"$(nproc)"
# the layering of runtime/rooms.txt: includes and calls go downward only
tools/check-rooms.sh "$BUILD"
if [ "$1" = "--sanitize" ]; then
  # Criterion reports a test that leaks as passed, so sanitizer reports go
  # to files and any report fails the run.
  LOGS="$PWD/$BUILD/sanitizer-logs"
  rm -rf "$LOGS" && mkdir -p "$LOGS"
  ASAN_OPTIONS="detect_leaks=1:log_path=$LOGS/asan" \
  UBSAN_OPTIONS="print_stacktrace=1:log_path=$LOGS/ubsan" \
    ctest --test-dir "$BUILD" --output-on-failure
  if [ -n "$(ls -A "$LOGS")" ]; then
    cat "$LOGS"/* >&2
    echo "sanitizer reports above: failing" >&2
    exit 1
  fi
else
  ctest --test-dir "$BUILD" --output-on-failure
fi
