#!/bin/sh
# torchrun.sh - a torchrun-style launch: processes started without mpirun,
# each told only RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR and MASTER_PORT
# (what torchrun --no-python gives its workers), join one MPI world over
# moerun's rendezvous (runtime/comm/comm_rdzv_mpi.c):
#   1. run, greedy, on the demo model: worlds of 2 and 4 (and --tp 2 in 4)
#      print one process's text, on rank 0 only;
#   2. torchrun's agent holding MASTER_PORT for its own store
#      (TORCHELASTIC_USE_AGENT_STORE=True): the ranks meet on MASTER_PORT+1;
#      without that variable rank 0 names the port in use;
#   3. refusals, each within --comm-timeout and naming the fault: a rank
#      that never comes, a rank of another world size, a rank that takes
#      the MPI port and never connects, no MASTER_ADDR;
#   4. serve: a completion equal to run's; rank 0 killed: rank 1 ends by
#      itself (no launcher to end it) naming rank 0, and the ompi-server
#      rank 0 started is gone with it.
# usage: torchrun.sh MOERUN   (from the source folder)
set -u
MOERUN=$1
MODEL=models/demo-moe
TMP=$(mktemp -d)
trap 'pkill -9 -f "$TMP" 2>/dev/null; rm -rf "$TMP"' EXIT
fail=0
no() { echo "torchrun: FAIL: $*" >&2; fail=1; }
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMP_NUM_THREADS=1
export ASAN_OPTIONS="${ASAN_OPTIONS:+$ASAN_OPTIONS:}detect_leaks=0" # as tests/mpi/mpirun.sh says
free_port() {
    python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}

ARGS="-n 24 --temperature 0 --threads 1"
P="Once upon a time"
"$MOERUN" run $MODEL -p "$P" $ARGS > "$TMP/one.txt" 2>/dev/null || no "run alone failed"
[ -s "$TMP/one.txt" ] || no "run printed nothing"

# launch N PORT ARGS...: N ranks as torchrun starts them; rank r's output in
# $TMP/out.r and $TMP/err.r; the status is rank 0's
launch() {
    n=$1 port=$2
    shift 2
    r=$((n - 1)) pids=
    while [ $r -gt 0 ]; do
        RANK=$r WORLD_SIZE=$n LOCAL_RANK=$r MASTER_ADDR=127.0.0.1 MASTER_PORT=$port \
            timeout -s KILL 120 "$MOERUN" "$@" > "$TMP/out.$r" 2> "$TMP/err.$r" &
        pids="$pids $!"
        r=$((r - 1))
    done
    RANK=0 WORLD_SIZE=$n LOCAL_RANK=0 MASTER_ADDR=127.0.0.1 MASTER_PORT=$port \
        timeout -s KILL 120 "$MOERUN" "$@" > "$TMP/out.0" 2> "$TMP/err.0"
    rc=$?
    wait $pids
    return $rc
}

for a in "2" "4" "4 --tp 2"; do
    set -- $a
    n=$1
    shift
    launch $n "$(free_port)" run $MODEL -p "$P" $ARGS "$@" || no "world $a failed: $(tail -3 "$TMP/err.0")"
    cmp -s "$TMP/one.txt" "$TMP/out.0" || no "world $a printed other text: $(cat "$TMP/out.0")"
    grep -q "expert parallelism over $n ranks" "$TMP/err.0" ||
        no "world $a: rank 0 says $(grep moerun: "$TMP/err.0")"
    [ -z "${2:-}" ] || grep -q "tensor parallelism in groups of $2 ranks" "$TMP/err.0" ||
        no "world $a: rank 0 says $(grep moerun: "$TMP/err.0")"
    r=1
    while [ $r -lt $n ]; do
        [ -s "$TMP/out.$r" ] && no "world $a: rank $r printed $(cat "$TMP/out.$r")"
        r=$((r + 1))
    done
done

# torchrun's agent serves its store on MASTER_PORT
port=$(free_port)
python3 -c 'import socket, sys, time
s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("", int(sys.argv[1]))); s.listen(); open(sys.argv[2], "w").close(); time.sleep(60)' $port "$TMP/held" &
holder=$!
i=0
while [ ! -e "$TMP/held" ] && [ $i -lt 100 ]; do sleep 0.1; i=$((i + 1)); done
export TORCHELASTIC_USE_AGENT_STORE=True
launch 2 $port run $MODEL -p "$P" $ARGS || no "beside the agent's store: $(tail -3 "$TMP/err.0")"
unset TORCHELASTIC_USE_AGENT_STORE
cmp -s "$TMP/one.txt" "$TMP/out.0" || no "beside the agent's store: other text"
launch 2 $port run $MODEL -p "$P" $ARGS --comm-timeout 3 && no "a rendezvous port in use was not refused"
grep -q "rank 0 cannot listen on rendezvous port $port: Address already in use.*MOERUN_RDZV_PORT" "$TMP/err.0" ||
    no "port in use: $(tail -2 "$TMP/err.0")"
kill $holder 2>/dev/null

# lone_rank0 PORT WHAT MESSAGE: rank 0 of 2 alone (at --comm-timeout 3)
# must fail within 10 s saying MESSAGE
lone_rank0() {
    start=$(date +%s)
    RANK=0 WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=$1 timeout -s KILL 60 \
        "$MOERUN" run $MODEL -p "$P" $ARGS --comm-timeout 3 > /dev/null 2> "$TMP/lone.err" && no "$2 was not refused"
    [ $(($(date +%s) - start)) -le 10 ] || no "$2 took $(($(date +%s) - start)) s to be refused"
    grep -q "$3" "$TMP/lone.err" || no "$2: $(cat "$TMP/lone.err")"
}

# refusals
lone_rank0 "$(free_port)" "a missing rank" "rank 0: launch: 1 of 2 ranks reached rank 0 within 3 s (rank 1 did not)"
port=$(free_port)
RANK=0 WORLD_SIZE=3 MASTER_ADDR=127.0.0.1 MASTER_PORT=$port timeout -s KILL 60 \
    "$MOERUN" run $MODEL -p "$P" $ARGS --comm-timeout 5 > /dev/null 2> "$TMP/r2.err" &
r0=$!
RANK=1 WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=$port timeout -s KILL 60 \
    "$MOERUN" run $MODEL -p "$P" $ARGS --comm-timeout 5 > /dev/null 2> "$TMP/r3.err" && no "WORLD_SIZE 2 beside 3 was not refused"
wait $r0
grep -q "rank 1 of 2 is another world size (rank 0: WORLD_SIZE=3)" "$TMP/r2.err" || no "world sizes (rank 0): $(cat "$TMP/r2.err")"
grep -q "rank 1: launch: rank 0 says: rank 1 of 2 is another world size" "$TMP/r3.err" ||
    no "world sizes (rank 1): $(cat "$TMP/r3.err")"
# a rank that says its line and takes the MPI port, then never connects
# (MPI_Comm_accept has no timeout of its own: the alarm ends rank 0)
port=$(free_port)
python3 -c 'import socket, sys, time
for i in range(300):
    try:
        s = socket.create_connection(("127.0.0.1", int(sys.argv[1])))
        if s.getsockname() != s.getpeername(): break  # not met itself on the port
        s.close()
    except OSError: pass
    time.sleep(0.1)
s.sendall(b"moerun-rdzv 1 1 2\n"); f = s.makefile("rb"); f.readline(); f.readline(); time.sleep(30)' $port &
mute=$!
lone_rank0 $port "a rank that never connects" "rank 0: launch: the ranks did not all join MPI's world within the timeout"
kill $mute 2>/dev/null
RANK=1 WORLD_SIZE=2 "$MOERUN" run $MODEL -p "$P" $ARGS > /dev/null 2> "$TMP/r4.err" && no "no MASTER_ADDR was not refused"
grep -q "needs MASTER_ADDR and MASTER_PORT" "$TMP/r4.err" || no "no MASTER_ADDR: $(cat "$TMP/r4.err")"

# serve, then rank 0 killed
port=$(free_port)
for r in 1 0; do
    RANK=$r WORLD_SIZE=2 LOCAL_RANK=$r MASTER_ADDR=localhost MASTER_PORT=$port timeout -s KILL 120 \
        "$MOERUN" serve $MODEL --port 0 --port-file "$TMP/port" --threads 1 --comm-timeout 3 \
        > /dev/null 2> "$TMP/serve.$r" &
    echo $! > "$TMP/pid.$r"
done
i=0
while [ ! -s "$TMP/port" ] && [ $i -lt 300 ]; do sleep 0.1; i=$((i + 1)); done
if [ -s "$TMP/port" ]; then
    body='{"model":"demo-moe","prompt":"Once upon a time","max_tokens":24,"temperature":0}'
    curl -s -m 60 -H 'Content-Type: application/json' -d "$body" "http://127.0.0.1:$(cat "$TMP/port")/v1/completions" \
        > "$TMP/resp.json" || no "serve: no answer"
    want=$(head -c 60 "$TMP/one.txt")
    grep -qF "$want" "$TMP/resp.json" || no "serve answered $(cat "$TMP/resp.json"), run said $want"
    # timeout's child is moerun; ompi-server is moerun's child
    rank0=$(pgrep -P "$(cat "$TMP/pid.0")" moerun)
    server=$(pgrep -P "$rank0" ompi-server)
    [ -n "$server" ] || no "serve: rank 0 started no ompi-server"
    kill -9 "$rank0"
    i=0
    while kill -0 "$(cat "$TMP/pid.1")" 2>/dev/null && [ $i -lt 150 ]; do sleep 0.1; i=$((i + 1)); done
    kill -0 "$(cat "$TMP/pid.1")" 2>/dev/null && no "rank 1 still runs 15 s after rank 0 was killed"
    grep -q "rank 1: rank 0 is gone" "$TMP/serve.1" || no "rank 1 after rank 0 died: $(tail -3 "$TMP/serve.1")"
    sleep 0.5
    [ -n "$server" ] && kill -0 "$server" 2>/dev/null && [ "$(ps -o stat= -p "$server")" != Z ] &&
        no "rank 0's ompi-server outlived it"
else
    no "serve did not start: $(tail -5 "$TMP/serve.0")"
fi
[ $fail -eq 0 ] && echo "torchrun: all checks passed"
exit $fail
