#!/bin/sh
# build.sh TEST... - builds tests/TEST.c (test_cuda_ops, test_cuda_quant,
# test_cuda_forward, ..., mpi/ep_check) against an emulation of CUDA on the
# host, in build-emu/emu_TEST (of TEST's last part), so the CUDA kernels'
# own source runs without a GPU;
# TEST "moerun" builds the program itself (build-emu/emu_moerun: `bench
# --backend cuda` and the rest, as on a device, only slower).
# Needs a CPU build (MOERUN_CUDA=OFF) for the rooms' libmoerun_*.a, in
# build/ or where MOERUN_EMU_CPU_BUILD says, and g++ with C++20.
# Slow (an OS thread per CUDA thread): CI runs a selection (ci.sh);
# README.md says what it emulates and what not.
set -e
cd "$(dirname "$0")/../.."
R=$(pwd)
E=$R/tools/cuda-emu
B=$R/build-emu
C=${MOERUN_EMU_CPU_BUILD:-$R/build}  # a CPU build (MOERUN_CUDA=OFF)
[ -f "$C/libmoerun_cli.a" ] || { echo "$C/libmoerun_cli.a missing: build the CPU tree first" >&2; exit 1; }
mkdir -p "$B/src" "$B/obj"
rm -f "$B"/src/*.cc "$B/launch-sites.txt"
# the kernels' source: every .cu file of the tree, launches and shared
# memory rewritten for the host (rewrite.pl), its launch sites and
# launchers listed in launch-sites.txt for ci.sh's check
if git rev-parse --is-inside-work-tree >/dev/null 2>&1; then
  cus=$(git ls-files '*.cu')
else
  cus=$(find . -name '*.cu' -not -path './build*' -not -path './tools/*' | sed 's|^\./||' | sort)
fi
[ -n "$cus" ] || { echo "no .cu sources found" >&2; exit 1; }
for f in $cus; do
  perl "$E/rewrite.pl" "$f" "$B/src/$(echo "${f%.cu}" | tr / _).cc" "$B/launch-sites.txt"
done
CXXF="-std=c++20 -O2 -fno-strict-aliasing -g -I$E/shim -I$R -D__CUDACC__ -include $E/shim/emu.h -D_GNU_SOURCE -Wno-unknown-pragmas -fopenmp -pthread"
CF="-std=c11 -O1 -g -I$E/shim -I$R -D_GNU_SOURCE -DMOERUN_HAVE_CUDA=1 -DMOERUN_SOURCE_DIR=\"$R\" -DMOERUN_BINARY=\"$C/moerun\" -fopenmp $(pkg-config --cflags criterion)"
objs=""
for f in "$B"/src/*.cc "$E"/emu_*.cc; do
  o=$B/obj/$(basename "$f" .cc).o
  nice -n 19 g++ $CXXF -c "$f" -o "$o"
  objs="$objs $o"
done
for f in runtime/backend/backend_cuda*.c runtime/backend/backend.c tests/testutil.c tests/spec_harness.c; do
  o=$B/obj/$(basename "$f" .c).co
  nice -n 19 gcc $CF -c "$f" -o "$o"
  objs="$objs $o"
done
LIBS="$(pkg-config --libs criterion jansson libpcre2-8 libutf8proc libmicrohttpd)"
# the comm room's MPI transport, when the CPU build has it
if nm "$C/libmoerun_comm.a" 2>/dev/null | grep -q " U MPI_"; then LIBS="$LIBS $(pkg-config --libs ompi-c)"; fi
for t in "$@"; do
  if [ "$t" = moerun ]; then
    # the CLI with the CUDA side of bench (bench_gpu.c) compiled in
    main="$B/obj/main.co $B/obj/bench_gpu.co"
    nice -n 19 gcc $CF -DMOERUN_VERSION=\"emu\" -c runtime/cli/main.c -o "$B/obj/main.co"
    nice -n 19 gcc $CF -c runtime/cli/bench_gpu.c -o "$B/obj/bench_gpu.co"
  else
    main="$B/obj/$(basename "$t").co"
    nice -n 19 gcc $CF -c "tests/$t.c" -o "$main"
  fi
  # mpi/ep_check (tests/mpi/ep_check.c, the program under mpirun): emu_ep_check
  out=$B/emu_$(basename "$t")
  nice -n 19 g++ -fopenmp -pthread $objs $main -Wl,--start-group "$C"/libmoerun_*.a -Wl,--end-group -lm -o "$out" $LIBS
  echo "$out"
done
