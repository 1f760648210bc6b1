#!/bin/sh
# Builds the libFuzzer harnesses (tests/fuzz/) with clang in build-fuzz/ and
# runs each for SECONDS (default 60), one after another, at the lowest CPU
# priority, on one core.  Never part of CI; docs/fuzzing.md explains.
#   tools/fuzz.sh [SECONDS_PER_TARGET] [TARGET...]     e.g. tools/fuzz.sh 300 fuzz_stats
# Seeds come from the repository's own files (tools/fuzz_seeds.py) and are
# written to a temporary folder each run; the growing corpus is kept in
# build-fuzz/corpus/TARGET and crash/timeout/OOM inputs in
# build-fuzz/artifacts/.  Exits non-zero when a target found something.
set -e
cd "$(dirname "$0")/.."
SECS=${1:-60}
[ $# -gt 0 ] && shift
BUILD=build-fuzz
CC=${CC_FUZZ:-clang} nice -n 19 cmake -S . -B "$BUILD" -DCMAKE_C_COMPILER="${CC_FUZZ:-clang}" \
  -DMOERUN_FUZZ=ON -DMOERUN_TESTS=OFF -DMOERUN_CUDA=OFF -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
nice -n 19 cmake --build "$BUILD" --target fuzz -j1
SEEDS=$(mktemp -d /tmp/moerun-fuzz-seeds.XXXXXX)
trap 'rm -rf "$SEEDS"' EXIT
python3 tools/fuzz_seeds.py "$SEEDS"
TARGETS=${*:-$(cd tests/fuzz && ls fuzz_*.c | sed 's/\.c$//')}
mkdir -p "$BUILD/artifacts" "$BUILD/logs"
found=0
printf '%-22s %10s %9s %7s  %s\n' target runs exec/s cov finding
for t in $TARGETS; do
  case $t in fuzz_*) ;; *) t=fuzz_$t ;; esac  # "stats" or "fuzz_stats"
  mkdir -p "$BUILD/corpus/$t" "$SEEDS/$t"
  log="$BUILD/logs/$t.log"
  rc=0
  dict=""
  [ -f "tests/fuzz/$t.dict" ] && dict="-dict=tests/fuzz/$t.dict"
  ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1} nice -n 19 "$BUILD/$t" -max_total_time="$SECS" \
    -rss_limit_mb=4096 -timeout=10 -print_final_stats=1 -artifact_prefix="$BUILD/artifacts/$t-" $dict \
    "$BUILD/corpus/$t" "$SEEDS/$t" >"$log" 2>&1 || rc=$?
  runs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -1)
  eps=$(sed -n 's/^stat::average_exec_per_sec: *//p' "$log" | tail -1)
  cov=$(grep -o 'cov: [0-9]*' "$log" | tail -1 | cut -d' ' -f2)
  art=$(sed -n 's/.*Test unit written to \(.*\)$/\1/p' "$log" | tail -1)
  [ $rc -ne 0 ] && found=1
  printf '%-22s %10s %9s %7s  %s\n' "$t" "${runs:-?}" "${eps:-?}" "${cov:-?}" \
    "$( [ $rc -ne 0 ] && echo "exit $rc: ${art:-see $log}" || echo none)"
done
exit $found
