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
ctest --test-dir "$BUILD" --output-on-failure
