#!/bin/sh
# ci.sh - the CUDA kernels checked without a GPU, as .ci/run does: builds
# the CPU rooms (build-emu/cpu, CUDA off), the GPU test suites against the
# emulator (build.sh), runs the selection in ci-tests.txt one test at a
# time, with MPI the NCCL emulation's self-check (nccl_selftest.cc) and
# ep_check under mpirun, then checks that every launch site and every
# moe_*_cuda launcher of the .cu sources ran under at least one of them
# (the list is printed, with counts).  Exit status 0 only when every test
# passed and nothing is left unlaunched.  Needs what tools/deps.sh
# installs (g++ with C++20, Criterion, perl, Open MPI); no GPU, no nvcc.
# MOERUN_EMU_OUT: the output folder (build-emu by default).
#   tools/cuda-emu/ci.sh            the selection
#   tools/cuda-emu/ci.sh --list     the selection's tests, nothing run
set -e
cd "$(dirname "$0")/../.."
R=$(pwd)
E=$R/tools/cuda-emu
B=${MOERUN_EMU_OUT:-$R/build-emu}  # build.sh reads it too
sel=$E/ci-tests.txt
tests=$(sed -e 's/#.*//' -e '/^[[:space:]]*$/d' "$sel")
if [ "${1:-}" = --list ]; then echo "$tests"; exit 0; fi
t0=$(date +%s)
mkdir -p "$B"
cmake -S . -B "$B/cpu" -DMOERUN_CUDA=OFF -DMOERUN_TESTS=OFF >/dev/null
nice -n 10 cmake --build "$B/cpu" -j"$(nproc)" --target moerun >"$B/cpu-build.log" 2>&1 ||
  { tail -30 "$B/cpu-build.log"; exit 1; }
bins=$(echo "$tests" | awk '{print $1}' | sort -u)
# shellcheck disable=SC2086 # one word per suite
MOERUN_EMU_CPU_BUILD=$B/cpu "$E/build.sh" $bins moerun >/dev/null
t1=$(date +%s)
echo "cuda-emu: built in $((t1 - t0)) s"
log=$B/launches.log
: >"$log"
failed=0
echo "$tests" | while read -r bin filter; do
  s=$(date +%s)
  if EMU_LAUNCH_LOG=$log nice -n 10 "$B/emu_$bin" --jobs=1 --filter="$filter" >"$B/last.out" 2>&1 &&
     grep -q 'Tested: [1-9][0-9]* | Passing: [1-9][0-9]* | Failing: 0 | Crashing: 0' "$B/last.out"; then
    echo "cuda-emu: pass $bin $filter ($(($(date +%s) - s)) s)"
  else
    echo "cuda-emu: FAIL $bin $filter ($(($(date +%s) - s)) s)"
    grep -v '^parity:\|^e2e:' "$B/last.out" | tail -20
    echo "$bin $filter" >>"$B/failed"
  fi
done
# the program itself on the bundled demo model (tools/demo.sh's prompt):
# `moerun run --backend cuda` prints the CPU build's text, greedy, with
# the draft model, with n-gram lookup and sampled with a seed (a
# difference: compare the logits first, test_cuda_forward)
for extra in "" "--draft models/demo-draft" "--spec ngram" "--temperature 0.8 --seed 7"; do
  s=$(date +%s)
  # shellcheck disable=SC2086 # the arguments split on purpose
  a=$("$B/cpu/moerun" run models/demo-moe -p "Once upon a time" -n 32 --backend cpu $extra 2>/dev/null) || a="(cpu failed)"
  # shellcheck disable=SC2086
  b=$("$B/emu_moerun" run models/demo-moe -p "Once upon a time" -n 32 --backend cuda $extra 2>"$B/last.out") ||
    b="(cuda failed: $(tail -1 "$B/last.out"))"
  if [ "$a" = "$b" ]; then
    echo "cuda-emu: pass moerun run demo-moe --backend cuda $extra: the CPU's text ($(($(date +%s) - s)) s)"
  else
    printf 'cuda-emu: FAIL moerun run demo-moe --backend cuda %s\n  cpu:  %s\n  cuda: %s\n' "$extra" "$a" "$b"
    echo "moerun run $extra" >>"$B/failed"
  fi
done
# the NCCL emulation (emu_nccl.cc) on its own, two and three ranks, each
# rank's calls in EMU_NCCL_LOG; then expert and tensor parallelism on the
# CUDA backend: two ranks under mpirun against one process (bit-identical
# logits; --tp within its tolerance) over every fixture family it runs,
# over NCCL (its calls counted) and staged through host memory
if command -v mpirun >/dev/null 2>&1 && nm "$B/cpu/libmoerun_comm.a" 2>/dev/null | grep -q " U MPI_"; then
  MOERUN_EMU_CPU_BUILD=$B/cpu "$E/build.sh" mpi/ep_check nccl_selftest >/dev/null
  nlog=$B/nccl.log
  for n in 2 3; do
    s=$(date +%s)
    rm -f "$nlog"
    if EMU_NCCL_LOG=$nlog timeout 300 sh tests/mpi/mpirun.sh mpirun -x EMU_NCCL_LOG -n $n "$B/emu_nccl_selftest" \
         >"$B/last.out" 2>&1 &&
       [ "$(awk '$3 == "ncclAllReduce" && !($2 in r) { r[$2] = 1; k++ } END { print k + 0 }' "$nlog" 2>/dev/null)" = $n ]; then
      echo "cuda-emu: pass mpirun -n $n nccl_selftest ($(($(date +%s) - s)) s)"
    else
      echo "cuda-emu: FAIL mpirun -n $n nccl_selftest ($(($(date +%s) - s)) s; or a rank missing from EMU_NCCL_LOG)"
      grep -v '^emu nccl:' "$B/last.out" | tail -20
      echo "nccl_selftest -n $n" >>"$B/failed"
    fi
  done
  rm -f "$nlog"
  # Expert parallelism (tests/mpi/ep_check.c) on the CUDA backend, a 40-row
  # first prefill (the grouped path) then decode steps (the device-driven
  # kernels), logits bit-identical to one process (contiguous and with
  # replicas), --tp within its tolerance: every fixture family of CMake's
  # MOERUN_EP_FIXTURES the CUDA backend runs (not llama4's chunked
  # attention, DeepSeek's sparse attention) over NCCL at 2 ranks, and with
  # --tp 2; 4 ranks, plain and --tp 2, over an MLA and a GQA family; the
  # host-staged path (--collectives mpi); act order at a 7-row prefill (the
  # kernels, column orders by slot); last auto with rank 1's NCCL failing to
  # open: every rank must fall back to the host-staged MPI path, rank 0
  # saying why; data-parallel attention (its rows staged through host
  # memory) over a GQA, an MLA, a hybrid and an MXFP4 family; a precision
  # per expert (--plan: each rank's experts in three formats, one stack
  # each) over two GQA families and an MLA one.  Each line:
  # ranks, then ep_check's arguments.
  fx="mixtral qwen2_moe qwen3_moe olmoe glm4_moe gpt_oss gpt_oss_mxfp4 deepseek_v2 deepseek_v3 deepseek_v3_fp8 \
granitemoe granitemoeshared qwen3_moe_fp8 qwen3_moe_ct_w4 qwen3_moe_gptq qwen3_moe_awq minimax_m2 qwen3_next \
qwen3_5_moe deepseek_v3_mtp glm4_moe_mtp"
  printf '%s\n' "2 --collectives nccl $fx" "2 --collectives nccl --tp 2 $fx" \
    "4 --collectives nccl olmoe deepseek_v3 gpt_oss_mxfp4" "4 --collectives nccl --tp 2 olmoe deepseek_v2" \
    "2 --collectives mpi deepseek_v2 mixtral" "2 --collectives nccl --rows 7 qwen3_moe_gptq_actorder" \
    "2 --collectives auto olmoe" "2 --collectives nccl --dp-attention olmoe deepseek_v3 qwen3_next gpt_oss_mxfp4" \
    "2 --collectives nccl --plan qwen3_moe olmoe deepseek_v2" \
    >"$B/ep-lines"
  while read -r n args; do
    s=$(date +%s)
    fail_init=""
    case $args in *auto*) fail_init=1 ;; esac
    # shellcheck disable=SC2086 # the arguments split on purpose
    if EMU_LAUNCH_LOG=$log EMU_NCCL_LOG=$nlog EMU_NCCL_FAIL=$fail_init sh tests/mpi/mpirun.sh mpirun \
         -x EMU_LAUNCH_LOG -x EMU_NCCL_LOG -x EMU_NCCL_FAIL -n "$n" \
         "$B/emu_ep_check" cuda --rows 40 $args >"$B/last.out" 2>&1 </dev/null &&
       { [ -z "$fail_init" ] || { grep -q "staged through host memory and MPI (rank 1: .*EMU_NCCL_FAIL)" "$B/last.out" &&
                                   ! grep -q "collectives on the backend" "$B/last.out"; }; }; then
      echo "cuda-emu: pass mpirun -n $n ep_check cuda --rows 40 $args ($(($(date +%s) - s)) s)"
      grep '^ep_check:\|staged through' "$B/last.out" | sed 's/^/  /'
    else
      echo "cuda-emu: FAIL mpirun -n $n ep_check cuda --rows 40 $args ($(($(date +%s) - s)) s)"
      grep -v 'weights resident\|resident as stored' "$B/last.out" | tail -20
      echo "ep_check -n $n $args" >>"$B/failed"
    fi
  done <"$B/ep-lines"
  # bench on synthetic weights made on the device under expert
  # parallelism (bf16 and MXFP4 experts): each rank makes its own experts
  # (test_cuda_synth checks the values); the run completes over both ranks
  for cfg in configs/tiny-moe.json tests/fixtures/gpt_oss_mxfp4/config.json; do
    s=$(date +%s)
    if timeout 600 sh tests/mpi/mpirun.sh mpirun -n 2 "$B/emu_moerun" bench --synthetic $cfg \
         --backend cuda --prefill 16 --decode 1 --repeat 1 >"$B/last.out" 2>&1 </dev/null &&
       grep -q "expert parallelism over 2 ranks" "$B/last.out"; then
      echo "cuda-emu: pass mpirun -n 2 moerun bench --synthetic $cfg --backend cuda ($(($(date +%s) - s)) s)"
    else
      echo "cuda-emu: FAIL mpirun -n 2 moerun bench --synthetic $cfg --backend cuda ($(($(date +%s) - s)) s)"
      tail -20 "$B/last.out"
      echo "bench --synthetic $cfg -n 2" >>"$B/failed"
    fi
  done
  calls=$(awk '{ n[$3]++ } END { for (c in n) print c, n[c] }' "$nlog" 2>/dev/null | sort | tr '\n' ' ')
  echo "cuda-emu: ep_check's NCCL calls (both ranks): ${calls:-none}"
else
  echo "cuda-emu: no MPI in this build: the NCCL and expert-parallel checks did not run"
fi
t2=$(date +%s)
echo "cuda-emu: tests ran in $((t2 - t1)) s"
[ -f "$B/failed" ] && { failed=1; rm -f "$B/failed"; }
# launch sites and launchers (build.sh's launch-sites.txt) against the counts
awk -F'\t' '
  FILENAME == ARGV[1] && $1 == "site" { split($2, a, ":"); site[$2 " " $3] = 0; order[++ns] = $2 " " $3; next }
  FILENAME == ARGV[1] && $1 == "launcher" { ent[$3] = 0; eorder[++ne] = $3; efile[$3] = $2; next }
  FILENAME == ARGV[2] && $1 == "launch" { site[$3] += $4; if ($2 in ent) ent[$2] += $4; next }
  END {
    bad = 0
    print "cuda-emu: launches per moe_*_cuda launcher"
    for (i = 1; i <= ne; i++) {
      e = eorder[i]
      printf "  %8d  %s (%s)%s\n", ent[e], e, efile[e], ent[e] ? "" : "  NEVER LAUNCHED"
      if (!ent[e]) bad++
    }
    print "cuda-emu: launches per launch site"
    for (i = 1; i <= ns; i++) {
      s = order[i]
      printf "  %8d  %s%s\n", site[s], s, site[s] ? "" : "  NEVER LAUNCHED"
      if (!site[s]) bad++
    }
    if (bad) { printf "cuda-emu: %d launchers or launch sites no test of ci-tests.txt reached\n", bad; exit 1 }
  }' "$B/launch-sites.txt" "$log" || failed=1
echo "cuda-emu: $(($(date +%s) - t0)) s in all"
[ "$failed" = 0 ] || { echo "cuda-emu: FAILED" >&2; exit 1; }
echo "cuda-emu: passed"
