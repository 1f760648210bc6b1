#!/bin/sh
# build.sh TEST... - builds tests/TEST.c (test_cuda_ops, test_cuda_quant,
# test_cuda_forward, ...) against an emulation of CUDA on the host, in
# build-emu/emu_TEST, so the CUDA kernels' own source runs without a GPU;
# TEST "moerun" builds the program itself (build-emu/emu_moerun: `bench
# --backend cuda` and the rest, as on a device, only slower).
# Needs the CPU build (build/, for the rooms' libmoerun_*.a) and g++ with C++20.
# Never part of CI (slow: an OS thread per CUDA thread); README.md says
# what it emulates and what not.
set -e
cd "$(dirname "$0")/../.."
R=$(pwd)
E=$R/tools/cuda-emu
B=$R/build-emu
[ -f "$R/build/libmoerun_cli.a" ] || { echo "build/libmoerun_cli.a missing: build the CPU tree first" >&2; exit 1; }
mkdir -p "$B/src" "$B/obj"
rm -f "$B"/src/*.cc
# the kernels' source, launches and shared memory rewritten for the host
for f in attention/attention_mla_cuda.cu attention/attention_cuda.cu attention/attention_prefill_cuda.cu \
         attention/attention_mma_cuda.cu \
         router/router_cuda.cu runtime/cuda/ops_cuda.cu experts/experts_cuda.cu experts/experts_mma_cuda.cu runtime/backend/device_cuda.cu \
         runtime/cuda/matmul_cuda.cu runtime/cli/bench_cuda.cu; do
  perl -0777 -pe 's/extern __shared__ (\w+) (\w+)\[\];/$1 *$2 = EMU_DYN_SMEM($1);/g;
                  s/__shared__/static/g;
                  s/(\w+(?:<[\w ,]*>)?)<<<(.*?)>>>\(/emu_launch($1, emu_mk($2), /gs' \
    "$f" >"$B/src/$(basename "$f" .cu).cc"
done
CXXF="-std=c++20 -O2 -fno-strict-aliasing -g -I$E/shim -I$R -D__CUDACC__ -DMOERUN_CUDA_EMU -include $E/shim/emu.h -D_GNU_SOURCE -Wno-unknown-pragmas -fopenmp -pthread"
CF="-std=c11 -O1 -g -I$E/shim -I$R -D_GNU_SOURCE -DMOERUN_HAVE_CUDA=1 -DMOERUN_SOURCE_DIR=\"$R\" -DMOERUN_BINARY=\"$R/build/moerun\" -fopenmp $(pkg-config --cflags criterion)"
objs=""
for f in "$B"/src/*.cc "$E/emu_api.cc" "$E/emu_stream.cc"; do
  o=$B/obj/$(basename "$f" .cc).o
  nice -n 19 g++ $CXXF -c "$f" -o "$o"
  objs="$objs $o"
done
for f in runtime/backend/backend_cuda*.c runtime/backend/backend.c tests/testutil.c; do
  o=$B/obj/$(basename "$f" .c).co
  nice -n 19 gcc $CF -c "$f" -o "$o"
  objs="$objs $o"
done
LIBS="$(pkg-config --libs criterion jansson libpcre2-8 libutf8proc libmicrohttpd)"
for t in "$@"; do
  if [ "$t" = moerun ]; then
    # the CLI with the CUDA side of bench (bench_gpu.c) compiled in
    main="$B/obj/main.co $B/obj/bench_gpu.co"
    nice -n 19 gcc $CF -DMOERUN_VERSION=\"emu\" -c runtime/cli/main.c -o "$B/obj/main.co"
    nice -n 19 gcc $CF -c runtime/cli/bench_gpu.c -o "$B/obj/bench_gpu.co"
  else
    main="$B/obj/$t.co"
    nice -n 19 gcc $CF -c "tests/$t.c" -o "$main"
  fi
  nice -n 19 g++ -fopenmp -pthread $objs $main -Wl,--start-group "$R"/build/libmoerun_*.a -Wl,--end-group -lm -o "$B/emu_$t" $LIBS
  echo "$B/emu_$t"
done
