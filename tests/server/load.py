"""Bounded load test: N concurrent streaming completions (greedy, distinct
prompts) all complete, and each output equals the same request served alone.
Usage: load.py BASE_URL [N]"""
import sys
import threading

from common import post, stream_text, metrics, wait_for
import json

base = sys.argv[1]
n = int(sys.argv[2]) if len(sys.argv) > 2 else 16
words = ["the", "river", "garden", "dog", "star", "route", "hello", "experts"]
reqs = [{"prompt": " ".join(words[(i + k) % len(words)] for k in range(1 + i % 5)),
         "max_tokens": 8 + (i * 7) % 24, "temperature": 0, "ignore_eos": True}
        for i in range(n)]
results = [None] * n
errors = []


def worker(i):
    try:
        results[i] = stream_text(base, reqs[i], timeout=120)
    except Exception as e:  # reported below
        errors.append((i, repr(e)))


threads = [threading.Thread(target=worker, args=(i,)) for i in range(n)]
for t in threads:
    t.start()
for t in threads:
    t.join(180)
assert not any(t.is_alive() for t in threads), "a client did not finish in time"
assert not errors, errors
for i, r in enumerate(reqs):
    st, data = post(base, "/v1/completions", r)
    assert st == 200, (st, data)
    solo = json.loads(data)["choices"][0]
    assert results[i][0] == solo["text"], (i, results[i], solo)
    assert results[i][1] == solo["finish_reason"] == "length", (i, results[i], solo)
m = wait_for(lambda: (lambda m: m if m['moerun_kv_blocks{state="used"}'] == 0 else None)(metrics(base)),
             20, "KV blocks to be released")
print("OK %d concurrent streams equal their solo outputs" % n)
