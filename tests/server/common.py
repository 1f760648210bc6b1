"""Helpers for the server tests: plain HTTP over loopback with the standard
library, bounded by timeouts everywhere."""
import http.client
import json
import time
from urllib.parse import urlparse


def conn(base, timeout=60):
    u = urlparse(base)
    return http.client.HTTPConnection(u.hostname, u.port, timeout=timeout)


def post(base, path, body, timeout=60):
    c = conn(base, timeout)
    c.request("POST", path, json.dumps(body), {"Content-Type": "application/json"})
    r = c.getresponse()
    data = r.read()
    c.close()
    return r.status, data


def get(base, path, timeout=30):
    c = conn(base, timeout)
    c.request("GET", path)
    r = c.getresponse()
    data = r.read()
    c.close()
    return r.status, data


def stream_events(resp):
    """Yields the JSON of each SSE data event until [DONE]."""
    buf = b""
    while True:
        line = resp.fp.readline()
        if not line:
            raise RuntimeError("stream ended without [DONE]")
        line = line.strip()
        if not line.startswith(b"data: "):
            continue
        payload = line[6:]
        if payload == b"[DONE]":
            return
        yield json.loads(payload)


def stream_text(base, body, timeout=120):
    c = conn(base, timeout)
    c.request("POST", "/v1/completions", json.dumps(dict(body, stream=True)),
              {"Content-Type": "application/json"})
    r = c.getresponse()
    assert r.status == 200, (r.status, r.read())
    text, finish = "", None
    for ev in stream_events(r):
        for ch in ev["choices"]:
            text += ch["text"]
            finish = ch["finish_reason"] or finish
    c.close()
    return text, finish


def metrics(base):
    st, data = get(base, "/metrics")
    assert st == 200, st
    out = {}
    for line in data.decode().splitlines():
        if line.startswith("#") or not line.strip():
            continue
        name, _, value = line.rpartition(" ")
        out[name] = float(value)
    return out


def wait_for(pred, seconds, what):
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        v = pred()
        if v:
            return v
        time.sleep(0.1)
    raise AssertionError("timed out waiting for " + what)
