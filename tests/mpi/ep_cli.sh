#!/bin/sh
# ep_cli.sh - the moerun command line under mpirun (expert parallelism):
#   1. run, greedy, on the demo model: the text of mpirun -n 2 and -n 4 equals
#      one process's, and only rank 0 prints it;
#      the same for a synthetic model (--synthetic, also with --router-skew);
#   2. n-gram and draft-model speculation give the same text under -n 2;
#      the imbalance measured equals `moerun stats --ep 2`'s prediction from
#      the same run's trace; a placement with replicas written by
#      `moerun stats --placement-out` from that run gives the same text, and
#      a malformed one is refused naming the entry;
#      --spec mtp gives the same ids and drafts under -n 2, the same ids
#      with --tp 2;
#      refusals: --ep 3 under -n 2, --ep 2 without mpirun;
#      tensor parallelism (--tp 2 and 4, experts over every rank or over
#      the groups) prints one process's text; its refusals (--tp alone,
#      --tp not dividing the ranks or the heads, --ep not fitting,
#      act-order four-bit attention);
#      data-parallel attention (--dp-attention): run's text and a batch's
#      tokens and expert statistics equal one process's (the tokens also
#      with a pool so small that requests are preempted), rank 0 computing
#      part of the attention rows;
#      refused alone and with --tp;
#   3. serve under mpirun -n 2 answers a completion equal to run's; then
#      rank 1 is killed (or stopped, also with --tp 2): the job ends within
#      the timeout, naming the collective, and no moerun process of it is
#      left.
# usage: ep_cli.sh MOERUN MPIEXEC   (from the source folder)
set -u
MOERUN=$1
MPIRUN="sh $(dirname "$0")/mpirun.sh $2"
MODEL=models/demo-moe
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
fail=0
no() { echo "ep_cli: FAIL: $*" >&2; fail=1; }

ARGS="-n 24 --temperature 0 --threads 1"
P="Once upon a time"
"$MOERUN" run $MODEL -p "$P" $ARGS > "$TMP/one.txt" 2>/dev/null || no "run alone failed"
for n in 2 4; do
    $MPIRUN -n $n "$MOERUN" run $MODEL -p "$P" $ARGS > "$TMP/ep$n.txt" 2> "$TMP/ep$n.err" || no "run under -n $n failed: $(tail -3 "$TMP/ep$n.err")"
    cmp -s "$TMP/one.txt" "$TMP/ep$n.txt" || no "run under -n $n printed other text: $(cat "$TMP/ep$n.txt") vs $(cat "$TMP/one.txt")"
done
[ -s "$TMP/one.txt" ] || no "run printed nothing"
# synthetic weights (each rank makes its experts only), with and without a
# skewed router: one process's ids under -n 2
SYN="--synthetic configs/tiny-moe.json --prompt-ids 1,2,3,4,5,6,7 -n 12 --ignore-eos --threads 1"
for sk in "" "--router-skew zipf:1.2"; do
    "$MOERUN" run $SYN $sk > "$TMP/syn1.txt" 2>/dev/null || no "run --synthetic $sk alone failed"
    $MPIRUN -n 2 "$MOERUN" run $SYN $sk > "$TMP/syn2.txt" 2> "$TMP/syn2.err" ||
        no "run --synthetic $sk under -n 2 failed: $(tail -3 "$TMP/syn2.err")"
    [ -s "$TMP/syn1.txt" ] && cmp -s "$TMP/syn1.txt" "$TMP/syn2.txt" ||
        no "run --synthetic $sk under -n 2 printed $(cat "$TMP/syn2.txt") vs $(cat "$TMP/syn1.txt")"
done
# tensor parallelism: the group adds its parts in another order than one
# process, which leaves the demo's greedy text as it is
for a in "2 --tp 2" "2 --tp 2 --ep 1" "4 --tp 2" "4 --tp 2 --ep 2" "4 --tp 4"; do
    set -- $a
    n=$1
    shift
    $MPIRUN -n $n "$MOERUN" run $MODEL -p "$P" $ARGS "$@" > "$TMP/tp.txt" 2> "$TMP/tp.err" ||
        no "run -n $a failed: $(tail -3 "$TMP/tp.err")"
    cmp -s "$TMP/one.txt" "$TMP/tp.txt" || no "run -n $a printed other text: $(cat "$TMP/tp.txt")"
    grep -q "tensor parallelism in groups of $2 ranks" "$TMP/tp.err" || no "run -n $a: $(grep moerun: "$TMP/tp.err")"
done
"$MOERUN" run $MODEL -p "$P" $ARGS --tp 2 > /dev/null 2> "$TMP/r.err" && no "--tp 2 without mpirun was not refused"
grep -q "needs 2 ranks" "$TMP/r.err" || no "--tp 2 alone: $(head -3 "$TMP/r.err")"
for a in "4 --tp 3:does not divide" "4 --tp 2 --ep 3:--ep 3 with --tp" "3 --tp 3:do not split evenly"; do
    set -- ${a%%:*}
    n=$1
    shift
    $MPIRUN -n $n "$MOERUN" run $MODEL -p "$P" $ARGS "$@" > /dev/null 2> "$TMP/r.err" &&
        no "$* under -n $n was not refused"
    grep -q -- "${a#*:}" "$TMP/r.err" || no "$* under -n $n: $(grep -v '^--\|^ *$' "$TMP/r.err" | head -2)"
done
$MPIRUN -n 2 "$MOERUN" run tests/fixtures/qwen3_moe_gptq_actorder -p "$P" $ARGS --tp 2 > /dev/null 2> "$TMP/r.err" &&
    no "--tp 2 of act-order four-bit attention was not refused"
grep -q "reads its inputs out of order" "$TMP/r.err" || no "--tp 2 of act-order attention: $(head -3 "$TMP/r.err")"
# data-parallel attention: each sequence's attention on one rank; run's
# text, and a batch of four greedy requests (over both ranks) gives one
# process's tokens
$MPIRUN -n 2 "$MOERUN" run $MODEL -p "$P" $ARGS --dp-attention > "$TMP/dp.txt" 2> "$TMP/dp.err" ||
    no "run --dp-attention under -n 2 failed: $(tail -3 "$TMP/dp.err")"
cmp -s "$TMP/one.txt" "$TMP/dp.txt" || no "run --dp-attention under -n 2 printed other text: $(cat "$TMP/dp.txt")"
for p in "Once upon a time" "The little dog" "She said that" "In the morning"; do
    printf '{"prompt": "%s", "max_tokens": 20, "temperature": 0}\n' "$p"
done > "$TMP/req.jsonl"
"$MOERUN" batch $MODEL "$TMP/req.jsonl" -o "$TMP/b1.jsonl" --threads 1 --stats-out "$TMP/s1.json" 2>/dev/null ||
    no "batch alone failed"
$MPIRUN -n 2 "$MOERUN" batch $MODEL "$TMP/req.jsonl" -o "$TMP/b2.jsonl" --threads 1 --dp-attention \
    --stats-out "$TMP/s2.json" 2> "$TMP/b2.err" || no "batch --dp-attention under -n 2 failed: $(tail -3 "$TMP/b2.err")"
# every rank's routing reaches rank 0's statistics: the expert counts, weights
# and router entropy of one process
python3 -c "
import json, sys
a, b = (json.load(open(f))['layers'] for f in sys.argv[1:3])
keys = ['tokens', 'tokens_prefill', 'tokens_decode', 'weight_sum', 'top1', 'router_entropy_mean', 'coactivation']
sys.exit(0 if len(a) == len(b) > 0 and all(x[k] == y[k] for x, y in zip(a, b) for k in keys) else 1)" \
    "$TMP/s1.json" "$TMP/s2.json" || no "batch --dp-attention: statistics other than one process's"
grep -o '"token_ids": *\[[^]]*\]' "$TMP/b1.jsonl" > "$TMP/b1.ids"
grep -o '"token_ids": *\[[^]]*\]' "$TMP/b2.jsonl" > "$TMP/b2.ids"
[ "$(wc -l < "$TMP/b1.ids")" -eq 4 ] && cmp -s "$TMP/b1.ids" "$TMP/b2.ids" ||
    no "batch --dp-attention under -n 2: other tokens than one process's"
# ... with a pool of a few blocks a rank: requests preempted within their
# rank's part of the pool, the same tokens
$MPIRUN -n 2 "$MOERUN" batch $MODEL "$TMP/req.jsonl" -o "$TMP/b3.jsonl" --threads 1 --dp-attention --kv-budget 40KiB \
    2> "$TMP/b3.err" || no "batch --dp-attention --kv-budget 40KiB under -n 2 failed: $(tail -3 "$TMP/b3.err")"
grep -o '"token_ids": *\[[^]]*\]' "$TMP/b3.jsonl" > "$TMP/b3.ids"
cmp -s "$TMP/b1.ids" "$TMP/b3.ids" || no "batch --dp-attention with a small pool: other tokens than one process's"
grep -Eq " [1-9][0-9]* preemptions" "$TMP/b3.err" || no "batch --dp-attention --kv-budget 40KiB: no preemption ($(grep preemptions "$TMP/b3.err"))"
# ... a hybrid model (recurrent states in each rank's part: 2 slots a rank
# for --max-seqs 3): one process's tokens
for i in 1 2 3 4; do printf '{"prompt": [%d, 5, 9, 2, 7], "max_tokens": 12, "temperature": 0}\n' $i; done > "$TMP/reqh.jsonl"
H="tests/fixtures/qwen3_next $TMP/reqh.jsonl --threads 1 --max-seqs 3 --no-prefix-cache"
"$MOERUN" batch $H -o "$TMP/h1.jsonl" 2>/dev/null || no "batch of the hybrid alone failed"
$MPIRUN -n 2 "$MOERUN" batch $H -o "$TMP/h2.jsonl" --dp-attention 2> "$TMP/h2.err" ||
    no "batch of the hybrid --dp-attention under -n 2 failed: $(tail -3 "$TMP/h2.err")"
[ "$(grep -o '"token_ids": *\[[^]]*\]' "$TMP/h1.jsonl")" = "$(grep -o '"token_ids": *\[[^]]*\]' "$TMP/h2.jsonl")" ] &&
    [ "$(grep -c token_ids "$TMP/h2.jsonl")" -eq 4 ] || no "batch of the hybrid --dp-attention: other tokens than one process's"
# rank 0 computed some of the attention rows, not all
grep "data-parallel attention over 2 ranks" "$TMP/b2.err" | grep -Eq "computed [1-9][0-9]* of [0-9]+ attention" &&
    ! grep "data-parallel attention over 2 ranks" "$TMP/b2.err" | grep -Eq "computed ([0-9]+) of \1 attention" ||
    no "batch --dp-attention: $(grep 'data-parallel' "$TMP/b2.err")"
"$MOERUN" run $MODEL -p "$P" $ARGS --dp-attention > /dev/null 2> "$TMP/r.err" && no "--dp-attention alone was not refused"
grep -q "needs several ranks" "$TMP/r.err" || no "--dp-attention alone: $(head -3 "$TMP/r.err")"
$MPIRUN -n 2 "$MOERUN" run $MODEL -p "$P" $ARGS --dp-attention --tp 2 > /dev/null 2> "$TMP/r.err" &&
    no "--dp-attention --tp 2 was not refused"
grep -q "choose one" "$TMP/r.err" || no "--dp-attention --tp 2: $(grep -v '^--\|^ *$' "$TMP/r.err" | head -2)"
# speculative decoding under expert parallelism: the draft runs on rank 0
for spec in "--spec ngram" "--draft models/demo-draft"; do
    "$MOERUN" run $MODEL -p "$P" $ARGS $spec > "$TMP/s1.txt" 2>/dev/null || no "run $spec alone failed"
    $MPIRUN -n 2 "$MOERUN" run $MODEL -p "$P" $ARGS $spec > "$TMP/s2.txt" 2> "$TMP/s2.err" ||
        no "run $spec under -n 2 failed: $(tail -3 "$TMP/s2.err")"
    cmp -s "$TMP/s1.txt" "$TMP/s2.txt" || no "run $spec under -n 2 printed other text"
done
# multi-token prediction: the module runs whole on rank 0; the same text
# and the same drafts (their counts) as one process
MTP="tests/fixtures/deepseek_v3_mtp --prompt-ids 1,5,9,13,2,7 -n 24 --temperature 0 --threads 1 --spec mtp"
"$MOERUN" run $MTP > "$TMP/m1.txt" 2> "$TMP/m1.err" || no "run --spec mtp alone failed: $(tail -2 "$TMP/m1.err")"
$MPIRUN -n 2 "$MOERUN" run $MTP > "$TMP/m2.txt" 2> "$TMP/m2.err" ||
    no "run --spec mtp under -n 2 failed: $(tail -3 "$TMP/m2.err")"
cmp -s "$TMP/m1.txt" "$TMP/m2.txt" || no "run --spec mtp under -n 2 printed other ids"
[ -n "$(grep speculation: "$TMP/m1.err")" ] && [ "$(grep speculation: "$TMP/m1.err")" = "$(grep speculation: "$TMP/m2.err")" ] ||
    no "--spec mtp under -n 2: $(grep speculation: "$TMP/m2.err"), alone $(grep speculation: "$TMP/m1.err")"
# ... and with the target's heads split by --tp 2 (the module whole on rank 0)
$MPIRUN -n 2 "$MOERUN" run $MTP --tp 2 > "$TMP/m3.txt" 2> "$TMP/m3.err" ||
    no "run --spec mtp --tp 2 failed: $(tail -3 "$TMP/m3.err")"
cmp -s "$TMP/m1.txt" "$TMP/m3.txt" || no "run --spec mtp --tp 2 printed other ids"
grep -q "speculation: mean accepted length" "$TMP/m3.err" || no "--spec mtp --tp 2 did not speculate: $(grep speculation: "$TMP/m3.err")"

# the imbalance the ranks measured equals what `moerun stats --ep 2` predicts
# from the same run's trace (contiguous placement's max/mean)
$MPIRUN -n 2 "$MOERUN" run $MODEL -p "$P" $ARGS --trace-out "$TMP/tr" --stats-out "$TMP/st.json" \
    > /dev/null 2> "$TMP/tr.err" || no "run --trace-out under -n 2 failed: $(tail -3 "$TMP/tr.err")"
measured=$(python3 -c "import json,sys; print('%.3f' % json.load(open(sys.argv[1]))['parallel']['imbalance'])" \
    "$TMP/st.json" 2>/dev/null)
predicted=$("$MOERUN" stats "$TMP/tr" --ep 2 2>/dev/null | awk '$1 == "contiguous" {print $2}')
[ -n "$measured" ] && [ "$measured" = "$predicted" ] ||
    no "imbalance measured under -n 2 ($measured) is not the one stats --ep 2 predicts ($predicted)"

# a placement with replicas written from that run's statistics: the same text
"$MOERUN" stats "$TMP/st.json" --ep 2 --placement-out "$TMP/pl.json" --placement-replicas 2 --no-plot \
    > "$TMP/pl.out" 2>&1 || no "stats --placement-out failed: $(tail -3 "$TMP/pl.out")"
$MPIRUN -n 2 "$MOERUN" run $MODEL -p "$P" $ARGS --ep-placement "$TMP/pl.json" > "$TMP/pl.txt" 2> "$TMP/pl.err" ||
    no "run --ep-placement under -n 2 failed: $(tail -3 "$TMP/pl.err")"
cmp -s "$TMP/one.txt" "$TMP/pl.txt" || no "run --ep-placement under -n 2 printed other text"
grep -q "file placement, 18 slots" "$TMP/pl.err" || no "run --ep-placement: $(grep parallelism "$TMP/pl.err")"
$MPIRUN -n 2 "$MOERUN" run $MODEL -p "$P" $ARGS --ep-placement "balanced:$TMP/st.json" > "$TMP/pb.txt" \
    2> "$TMP/pb.err" || no "run --ep-placement balanced: under -n 2 failed: $(tail -3 "$TMP/pb.err")"
cmp -s "$TMP/one.txt" "$TMP/pb.txt" || no "run --ep-placement balanced: under -n 2 printed other text"
grep -q "file placement, 16 slots" "$TMP/pb.err" || no "balanced: $(grep parallelism "$TMP/pb.err")"
tr -d ' \n' < "$TMP/pl.json" | sed 's/"0":\[\[/"0":[[99,/' > "$TMP/bad.json"
$MPIRUN -n 2 "$MOERUN" run $MODEL -p "$P" $ARGS --ep-placement "$TMP/bad.json" > /dev/null 2> "$TMP/bad.err" &&
    no "a placement naming expert 99 was not refused"
grep -q "layer 0, rank 0, entry 0: not an expert of 0..15" "$TMP/bad.err" || no "bad placement: $(tail -2 "$TMP/bad.err")"

$MPIRUN -n 2 "$MOERUN" run $MODEL -p "$P" $ARGS --ep 3 > /dev/null 2> "$TMP/r1.err" && no "--ep 3 under -n 2 was not refused"
grep -q "the launch has 2 ranks" "$TMP/r1.err" || no "--ep 3: $(cat "$TMP/r1.err")"
"$MOERUN" run $MODEL -p "$P" $ARGS --ep 2 > /dev/null 2> "$TMP/r2.err" && no "--ep 2 alone was not refused"
grep -q "mpirun -n 2" "$TMP/r2.err" || no "--ep 2 alone: $(cat "$TMP/r2.err")"

# serve: one completion, then rank 1 killed (SIGKILL: mpirun ends the job)
# or stopped (SIGSTOP: the next collective times out and ends it)
serve_fault() {
    sig=$1
    tp=${2:-1}
    PORTF="$TMP/port.$sig.$tp"
    $MPIRUN -n 2 "$MOERUN" serve $MODEL --port 0 --port-file "$PORTF" --threads 1 --comm-timeout 3 --tp $tp \
        > "$TMP/serve.out" 2> "$TMP/serve.$sig.err" &
    job=$!
    i=0
    while [ ! -s "$PORTF" ] && [ $i -lt 300 ]; do sleep 0.1; i=$((i + 1)); done
    if [ -s "$PORTF" ]; then
        port=$(cat "$PORTF")
        body='{"model":"demo-moe","prompt":"Once upon a time","max_tokens":24,"temperature":0}'
        curl -s -m 60 -H 'Content-Type: application/json' -d "$body" "http://127.0.0.1:$port/v1/completions" \
            > "$TMP/resp.json" || no "serve: no answer"
        want=$(head -c 60 "$TMP/one.txt")
        grep -qF "$want" "$TMP/resp.json" || no "serve under -n 2 answered $(cat "$TMP/resp.json"), run said $want"
        # /metrics: both ranks' expert rows add up to the routed pairs the
        # statistics counted, less the last layer's prompt rows without
        # logits (routed, their FFN skipped; the demo routes to 4 experts)
        curl -s -m 20 "http://127.0.0.1:$port/metrics" > "$TMP/metrics.txt" || no "serve: no /metrics"
        grep -q '^moerun_ep_ranks 2$' "$TMP/metrics.txt" || no "/metrics: no moerun_ep_ranks 2"
        [ $tp = 1 ] || grep -q "^moerun_tp_ranks $tp\$" "$TMP/metrics.txt" || no "/metrics: no moerun_tp_ranks $tp"
        ep_rows=$(awk '/^moerun_ep_expert_rows_total/ {s += $2} END {print s + 0}' "$TMP/metrics.txt")
        routed=$(awk '/^moerun_expert_tokens_total/ {s += $2} END {print s + 0}' "$TMP/metrics.txt")
        n=$("$MOERUN" tokenize $MODEL "Once upon a time" | tr ',' '\n' | grep -c .)
        skipped=$(((n - 1) * 4))
        [ "$ep_rows" -gt 0 ] && [ "$ep_rows" = "$((routed - skipped))" ] ||
            no "/metrics: the ranks' expert rows ($ep_rows) are not the routed pairs ($routed) less $skipped skipped"
        victim=$(for p in $(pgrep -f "port-file $PORTF"); do
            tr '\0' '\n' < /proc/$p/environ 2>/dev/null | grep -q '^OMPI_COMM_WORLD_RANK=1$' && echo $p; done | head -1)
        [ -n "$victim" ] || no "serve: rank 1 not found"
        [ -n "$victim" ] && kill -$sig "$victim"
        # the next request's step needs rank 1: the job ends
        curl -s -m 20 -H 'Content-Type: application/json' -d "$body" "http://127.0.0.1:$port/v1/completions" \
            > /dev/null 2>&1
    else
        no "serve under -n 2 did not start: $(tail -5 "$TMP/serve.$sig.err")"
    fi
    i=0
    while kill -0 $job 2>/dev/null && [ $i -lt 300 ]; do sleep 0.1; i=$((i + 1)); done
    if kill -0 $job 2>/dev/null; then
        no "$sig: serve job still running 30 s after rank 1 was hit"
        kill -9 $job 2>/dev/null
    fi
    if [ "$sig" = STOP ]; then
        what="all-reduce (the embedding)" # a step's first collective: the ranks' embedding rows added
        grep -q "rank 0: $what: no answer from the other ranks within 3 s" \
            "$TMP/serve.$sig.err" || no "STOP (--tp $tp): rank 0 did not name the collective: $(cat "$TMP/serve.$sig.err")"
    fi
    sleep 0.5
    pgrep -f "port-file $PORTF" > /dev/null && no "$sig: moerun processes left after the job: $(pgrep -af "port-file $PORTF")"
    pkill -9 -f "port-file $PORTF" 2>/dev/null
}
serve_fault KILL
serve_fault STOP
serve_fault STOP 2
[ $fail -eq 0 ] && echo "ep_cli: all checks passed"
exit $fail
