#!/bin/sh
# mpirun.sh MPIEXEC ARGS... - mpirun as the tests run it: ranks may
# outnumber the cores, root may run them (CI), one OpenMP thread a rank.
# In a sanitizer build LeakSanitizer is off for the ranks: Open MPI leaves
# buffers of its own allocated at exit, in components it has unloaded by
# then (unnamed frames no suppression can match); every other ASan and
# UBSan check stays on.
MPIEXEC=$1
shift
export ASAN_OPTIONS="${ASAN_OPTIONS:+$ASAN_OPTIONS:}detect_leaks=0"
exec "$MPIEXEC" --oversubscribe --allow-run-as-root -x OMP_NUM_THREADS=1 "$@"
