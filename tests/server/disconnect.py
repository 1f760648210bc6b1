"""Disconnect storm: clients that hang up mid-prefill or mid-stream.  Every
request is cancelled and afterwards no KV block is in use (read from
/metrics), and the server still answers.
Usage: disconnect.py BASE_URL [N]"""
import json
import socket
import sys
import threading
from urllib.parse import urlparse

from common import metrics, post, wait_for

base = sys.argv[1]
n = int(sys.argv[2]) if len(sys.argv) > 2 else 24
u = urlparse(base)
before = metrics(base)


def client(i):
    body = json.dumps({"prompt": "the garden " * (4 + 40 * (i % 3)), "max_tokens": 1200,
                       "temperature": 0.8, "seed": i, "ignore_eos": True,
                       "stream": i % 4 != 3}).encode()
    s = socket.create_connection((u.hostname, u.port), timeout=30)
    s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
              b"Content-Length: %d\r\n\r\n" % len(body) + body)
    if i % 2 == 0:  # read a little of the stream first
        got = b""
        while got.count(b"data:") < 1 + i % 5:
            chunk = s.recv(4096)
            if not chunk:
                break
            got += chunk
    s.close()


threads = [threading.Thread(target=client, args=(i,)) for i in range(n)]
for t in threads:
    t.start()
for t in threads:
    t.join(60)
assert not any(t.is_alive() for t in threads)


def settled():
    m = metrics(base)
    if m['moerun_kv_blocks{state="used"}'] == 0 and m["moerun_requests_running"] == 0 \
            and m["moerun_requests_waiting"] == 0:
        return m
    return None


m = wait_for(settled, 30, "every request to be cancelled")
total = m["moerun_kv_blocks_capacity"]
assert m['moerun_kv_blocks{state="free"}'] + m['moerun_kv_blocks{state="cached"}'] == total, m
aborted = m["moerun_requests_aborted_total"] - before["moerun_requests_aborted_total"]
assert aborted == n, "aborted %d of %d" % (aborted, n)
st, data = post(base, "/v1/completions", {"prompt": "hello", "max_tokens": 4, "temperature": 0})
assert st == 200, (st, data)
print("OK %d disconnects, %d requests aborted, all %d KV blocks free" % (n, aborted, total))
