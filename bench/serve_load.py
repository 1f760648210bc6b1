#!/usr/bin/env python3
"""Load on `moerun serve`: C clients, each sending streaming greedy
completions one after another for S seconds; half of them (the odd ones)
with "priority": P when P is given.  Prints requests per second, errors,
and per class of client the time to first token and to the last, p50 and
p99.  Standard library only (tests/server/common.py's HTTP helpers).

Usage: bench/serve_load.py BASE_URL [--clients 64] [--seconds 20]
                           [--max-tokens 16] [--priority P]
Not run by the tests."""
import argparse
import json
import os
import sys
import threading
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "tests", "server"))
from common import conn  # noqa: E402

ap = argparse.ArgumentParser()
ap.add_argument("base")
ap.add_argument("--clients", type=int, default=64)
ap.add_argument("--seconds", type=float, default=20)
ap.add_argument("--max-tokens", type=int, default=16)
ap.add_argument("--priority", type=int, default=None)
a = ap.parse_args()

words = ["the", "river", "garden", "dog", "star", "route", "hello", "experts"]
lock = threading.Lock()
done = {0: [], 1: []}  # class -> [(ttft, total)]
errors = []
stop_at = time.monotonic() + a.seconds


def one(i, k):
    body = {"prompt": " ".join(words[(i + k + j) % len(words)] for j in range(1 + (i + k) % 5)),
            "max_tokens": a.max_tokens, "temperature": 0, "ignore_eos": True, "stream": True}
    cls = i % 2 if a.priority is not None else 0
    if cls:
        body["priority"] = a.priority
    t0 = time.monotonic()
    c = conn(a.base, 120)
    c.request("POST", "/v1/completions", json.dumps(body), {"Content-Type": "application/json"})
    r = c.getresponse()
    if r.status != 200:
        raise RuntimeError("status %d: %r" % (r.status, r.read()[:200]))
    ttft = None
    while True:
        line = r.fp.readline()
        if not line:
            raise RuntimeError("stream ended without [DONE]")
        if line.startswith(b"data: [DONE]"):
            break
        if line.startswith(b"data: ") and ttft is None:
            ttft = time.monotonic() - t0
    c.close()
    with lock:
        done[cls].append((ttft, time.monotonic() - t0))


def client(i):
    k = 0
    while time.monotonic() < stop_at:
        try:
            one(i, k)
        except Exception as e:  # counted and reported
            with lock:
                errors.append(repr(e))
        k += 1


t_start = time.monotonic()
threads = [threading.Thread(target=client, args=(i,)) for i in range(a.clients)]
for t in threads:
    t.start()
for t in threads:
    t.join()
wall = time.monotonic() - t_start


def pct(xs, p):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(p * len(xs)))] if xs else float("nan")


n = len(done[0]) + len(done[1])
print("clients %d, %.1f s, max_tokens %d: %d requests, %.1f req/s, %d errors"
      % (a.clients, wall, a.max_tokens, n, n / wall, len(errors)))
for cls in (0, 1):
    xs = done[cls]
    if not xs:
        continue
    name = "all" if a.priority is None else ("priority 0" if cls == 0 else "priority %d" % a.priority)
    print("  %-12s %5d requests  TTFT p50 %.3f s p99 %.3f s  total p50 %.3f s p99 %.3f s"
          % (name, len(xs), pct([x[0] for x in xs], 0.5), pct([x[0] for x in xs], 0.99),
             pct([x[1] for x in xs], 0.5), pct([x[1] for x in xs], 0.99)))
if errors:
    print("  first error:", errors[0])
