#!/bin/sh
# build.sh TEST... - builds tests/TEST.c (test_cuda_ops, test_cuda_quant,
# test_cuda_forward, ..., mpi/ep_check) against an emulation of CUDA on the
# host, in build-emu/emu_TEST (of TEST's last part), so the CUDA kernels'
# own source runs without a GPU;
# TEST "moerun" builds the program itself (build-emu/emu_moerun: `bench
# --backend cuda` and the rest, as on a device, only slower); TEST
# "nccl_selftest" the NCCL emulation's own check (emu_nccl_selftest, run
# under mpirun: ci.sh), which needs neither the kernels nor the backend.
# Needs a CPU build (MOERUN_CUDA=OFF) for the rooms' libmoerun_*.a, in
# build/ or where MOERUN_EMU_CPU_BUILD says, and g++ with C++20.
# MOERUN_EMU_OUT names the output folder (build-emu by default).  NCCL is
# emulated over Open MPI when pkg-config finds ompi-c (MOERUN_EMU_MPI=0:
# built without, every NCCL call then failing).
# Scalar host code, one CUDA thread after another: CI runs a selection (ci.sh);
# README.md says what it emulates and what not.
set -e
cd "$(dirname "$0")/../.."
R=$(pwd)
E=$R/tools/cuda-emu
B=${MOERUN_EMU_OUT:-$R/build-emu}
C=${MOERUN_EMU_CPU_BUILD:-$R/build}  # a CPU build (MOERUN_CUDA=OFF)
[ -f "$C/libmoerun_cli.a" ] || { echo "$C/libmoerun_cli.a missing: build the CPU tree first" >&2; exit 1; }
mkdir -p "$B/src" "$B/obj"
# nccl_selftest alone needs only the emulation
tree=0
for t in "$@"; do [ "$t" = nccl_selftest ] || tree=1; done
# the kernels' source: every .cu file of the tree, launches and shared
# memory rewritten for the host (rewrite.pl), its launch sites and
# launchers listed in launch-sites.txt for ci.sh's check
if [ $tree = 1 ]; then
  rm -f "$B"/src/*.cc "$B/launch-sites.txt"
  if git rev-parse --is-inside-work-tree >/dev/null 2>&1; then
    cus=$(git ls-files '*.cu')
  else
    cus=$(find . -name '*.cu' -not -path './build*' -not -path './tools/*' | sed 's|^\./||' | sort)
  fi
  [ -n "$cus" ] || { echo "no .cu sources found" >&2; exit 1; }
  for f in $cus; do
    perl "$E/rewrite.pl" "$f" "$B/src/$(echo "${f%.cu}" | tr / _).cc" "$B/launch-sites.txt"
  done
fi
# NCCL over MPI (emu_nccl.cc) when Open MPI is there
MPIF=""
if [ "${MOERUN_EMU_MPI:-1}" != 0 ] && pkg-config --exists ompi-c; then
  MPIF="-DEMU_HAVE_MPI=1 -DOMPI_SKIP_MPICXX=1 $(pkg-config --cflags ompi-c)"  # the C API only
fi
CXXF="-std=c++20 -O2 -fno-strict-aliasing -g -I$E/shim -I$R -D__CUDACC__ -include $E/shim/emu.h -D_GNU_SOURCE -Wno-unknown-pragmas -fopenmp -pthread $MPIF"
# (MOERUN_HAVE_NCCL: the shim's nccl.h is always there)
CF="-std=c11 -O1 -g -I$E/shim -I$R -D_GNU_SOURCE -DMOERUN_HAVE_CUDA=1 -DMOERUN_HAVE_NCCL=1 -DMOERUN_SOURCE_DIR=\"$R\" -DMOERUN_BINARY=\"$C/moerun\" -fopenmp $(pkg-config --cflags criterion)"
emu=""  # the emulation's objects
for f in "$E"/emu_*.cc; do
  o=$B/obj/$(basename "$f" .cc).o
  nice -n 19 g++ $CXXF -c "$f" -o "$o"
  emu="$emu $o"
done
objs=$emu  # and the kernels' and the backend's (C: runtime/cuda/*.c, none or more)
if [ $tree = 1 ]; then
  for f in "$B"/src/*.cc; do
    o=$B/obj/$(basename "$f" .cc).o
    nice -n 19 g++ $CXXF -c "$f" -o "$o"
    objs="$objs $o"
  done
  for f in runtime/backend/backend_cuda*.c runtime/backend/backend.c runtime/cuda/*.c tests/testutil.c tests/spec_harness.c; do
    [ -f "$f" ] || continue
    o=$B/obj/$(basename "$f" .c).co
    nice -n 19 gcc $CF -c "$f" -o "$o"
    objs="$objs $o"
  done
fi
LIBS="$(pkg-config --libs criterion jansson libpcre2-8 libutf8proc libmicrohttpd)"
# MPI: the comm room's transport, when the CPU build has it, and the NCCL
# emulation's
if [ -n "$MPIF" ] || nm "$C/libmoerun_comm.a" 2>/dev/null | grep -q " U MPI_"; then
  LIBS="$LIBS $(pkg-config --libs ompi-c)"
fi
for t in "$@"; do
  if [ "$t" = nccl_selftest ]; then
    [ -n "$MPIF" ] || { echo "nccl_selftest needs MPI (pkg-config ompi-c)" >&2; exit 1; }
    nice -n 19 g++ $CXXF -c "$E/nccl_selftest.cc" -o "$B/obj/nccl_selftest.o"
    out=$B/emu_nccl_selftest
    nice -n 19 g++ -fopenmp -pthread $emu "$B/obj/nccl_selftest.o" -Wl,--start-group "$C"/libmoerun_*.a \
      -Wl,--end-group -lm -o "$out" $LIBS
    echo "$out"
    continue
  fi
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
