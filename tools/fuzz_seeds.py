#!/usr/bin/env python3
"""Writes the seed corpora for tools/fuzz.sh into OUT/<target>/, from the
repository's own files: fixtures, models/demo-moe, configs.  Seeds are
regenerated every run and never committed.

Safetensors fixtures are shrunk (each tensor reshaped to a few elements,
offsets recomputed) so the fuzzer mutates headers rather than megabytes of
weights.  Statistics seeds are small hand-written files in the documented
formats (docs/stats-format.md)."""
import glob, json, os, struct, sys

repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
out = sys.argv[1]
SEP = b"\n--8<--\n"


def put(target, name, data):
    d = os.path.join(out, target)
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, name), "wb") as f:
        f.write(data if isinstance(data, bytes) else data.encode())


def read(path):
    with open(os.path.join(repo, path), "rb") as f:
        return f.read()


def rel(pattern):
    return sorted(os.path.relpath(p, repo) for p in glob.glob(os.path.join(repo, pattern), recursive=True))


def st_file(header, data=b""):
    h = json.dumps(header).encode()
    return struct.pack("<Q", len(h)) + h + data


SIZES = {"F64": 8, "I64": 8, "U64": 8, "F32": 4, "I32": 4, "U32": 4, "F16": 2, "BF16": 2,
         "I16": 2, "U16": 2, "I8": 1, "U8": 1, "BOOL": 1, "F8_E4M3": 1, "F8_E5M2": 1}

# safetensors: shrunk fixtures plus a few hand-made edge cases
for p in rel("tests/fixtures/*/model.safetensors") + ["models/demo-moe/model.safetensors"]:
    raw = read(p)
    n = struct.unpack("<Q", raw[:8])[0]
    hdr = json.loads(raw[8:8 + n])
    off = 0
    for k, t in hdr.items():
        if k == "__metadata__":
            continue
        t["shape"] = [2] * min(len(t["shape"]), 2)
        nb = SIZES.get(t["dtype"], 1) * (2 ** len(t["shape"]))
        t["data_offsets"] = [off, off + nb]
        off += nb
    put("fuzz_safetensors", p.replace("/", "_"), st_file(hdr, bytes(off)))
put("fuzz_safetensors", "empty", st_file({}))
put("fuzz_safetensors", "meta", st_file({"__metadata__": {"format": "pt"},
                                        "a": {"dtype": "F32", "shape": [0, 3], "data_offsets": [0, 0]},
                                        "b": {"dtype": "BF16", "shape": [3], "data_offsets": [0, 6]}},
                                       bytes(6)))

for p in rel("tests/fixtures/*/config.json") + rel("configs/*.json") + ["models/demo-moe/config.json"]:
    put("fuzz_config", p.replace("/", "_"), read(p))

toks = rel("tests/fixtures/tokenizers/*/tokenizer.json") + rel("tests/fixtures/*/tokenizer.json") + \
    ["models/demo-moe/tokenizer.json"]
for i, p in enumerate(toks):
    put("fuzz_tokenizer_json", p.replace("/", "_"), read(p) + (b"\0Hello world, 123 \xc3\xa9!" if i % 2 else b""))

texts = ["Hello, world!", "The quick brown fox\n\n  jumps.", "日本語のテキスト 🙂", "<|im_start|>user\nhi<|im_end|>",
         "\xff\xfe invalid", "   ", "don't 1234567 x\ty"]
for i, t in enumerate(texts):
    put("fuzz_tokenizer_real", "text%d" % i, t.encode("utf-8", "surrogateescape"))
put("fuzz_tokenizer_real", "ids", struct.pack("<8i", 1, 2, 3, 100, 200, 300, 0, 5))

for p in rel("tests/fixtures/chat/*.jinja"):
    put("fuzz_chat_template", os.path.basename(p), read(p))
snip = json.loads(read("tests/fixtures/chat/snippets.json"))
for i, c in enumerate(snip.get("snippets", [])):
    src = c.get("template") if isinstance(c, dict) else None
    if isinstance(src, str):
        put("fuzz_chat_template", "snippet%d" % i, src)

n = 0
for p in rel("tests/fixtures/chat/*.json"):
    d = json.loads(read(p))
    for c in d.get("cases", []) if isinstance(d, dict) else []:
        if "messages" in c:
            extra = json.dumps(c.get("extra") or {}).encode()
            put("fuzz_chat_messages", "case%d" % n, json.dumps(c["messages"]).encode() + b"\0" + extra)
            chat = {"model": "demo-moe", "messages": c["messages"], "max_tokens": 8, "temperature": 0.5,
                    "stop": ["\n"], "logprobs": True, "top_logprobs": 2, "stream": True}
            put("fuzz_server_request", "chat%d" % n, b"\1" + json.dumps(chat).encode())
            n += 1
for i, body in enumerate([{"prompt": "Hello", "max_tokens": 4, "seed": 3, "n": 2, "logprobs": 1},
                          {"prompt": [1, 2, 3], "top_p": 0.9, "top_k": 5, "stop": "x", "echo": False},
                          {"prompt": ["Once upon"], "stream_options": {"include_usage": True},
                           "moerun": {"expert_load": True}, "presence_penalty": 1}]):
    put("fuzz_server_request", "cmpl%d" % i, b"\0" + json.dumps(body).encode())


def npy(descr, shape, data):
    h = "{'descr': '%s', 'fortran_order': False, 'shape': (%s), }" % (
        descr, "".join("%d, " % s for s in shape) if len(shape) != 1 else "%d," % shape[0])
    h += " " * (63 - (10 + len(h)) % 64) + "\n"
    return b"\x93NUMPY\x01\x00" + struct.pack("<H", len(h)) + h.encode() + data


stats = {"format": "moerun-expert-stats", "version": 1,
         "model": {"experts": 4, "top_k": 2, "d_model": 8, "d_expert": 16, "weight_bytes": 2},
         "tokens": {"total": 10}, "window": {"steps": 3},
         "layers": [{"layer": 0, "tokens": [5, 5, 6, 4], "top1": [3, 2, 3, 2], "router_entropy_norm": 0.9,
                     "coactivation": [[0, 1, 2], [2, 3, 4]]},
                    {"layer": 1, "tokens": [10, 0, 10, 0], "top1": [5, 0, 5, 0], "coactivation": [[0, 2, 10]]}]}
put("fuzz_stats", "stats", json.dumps(stats))
trace = {"format": "moerun-routing-trace", "version": 1, "experts": 4, "top_k": 2, "moe_layers": [0, 1],
         "tokens": 3, "truncated": False, "d_model": 8, "d_expert": 16, "weight_bytes": 2}
ids = struct.pack("<12h", 0, 1, 2, 3, 1, 0, 3, 2, 0, 3, 1, 2)
w = struct.pack("<12f", *([0.5] * 12))
tk = struct.pack("<12q", 0, 0, 0, 0, 0, 1, 0, 0, 1, 0, 1, 1)
put("fuzz_stats", "trace", json.dumps(trace).encode() + SEP + npy("<i2", (3, 2, 2), ids) + SEP +
    npy("<f4", (3, 2, 2), w) + SEP + npy("<i8", (3, 4), tk))

placement = {"format": "moerun-ep-placement", "version": 1, "ranks": 2, "experts": 4,
             "layers": {"1": [[0, 1, 3], [2, 3]], "3": [[0, 2], [1, 3]]}}
put("fuzz_placement", "file", bytes([0, 3]) + json.dumps(placement).encode())
put("fuzz_placement", "loads", bytes([0, 7]) + struct.pack("<24d", *[float(i % 5) for i in range(24)]))

for i, s in enumerate(["8GiB", "512MiB", "0.25", "1e3 k", "12,3, 4", "0", "2147483647,1"]):
    put("fuzz_cli", "arg%d" % i, bytes([1 if i < 4 else 0]) + s.encode())

# tool calls: byte 0 the format (hermes, mistral, deepseek_v3, glm45,
# kimi_k2), byte 1 the piece size, then a model's answer
for i, (fmt, text) in enumerate([
        (0, 'Let me check.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'),
        (1, 'Sure.[TOOL_CALLS] [{"name": "a", "arguments": {"x": [1, "\u00e9"]}, "id": "abcDEF123"}] ok'),
        (2, "Hi" + "<\uff5ctool\u2581calls\u2581begin\uff5c><\uff5ctool\u2581call\u2581begin\uff5c>function"
            "<\uff5ctool\u2581sep\uff5c>add\n```json\n{\"a\": 1}\n```<\uff5ctool\u2581call\u2581end\uff5c>"
            "<\uff5ctool\u2581call\u2581begin\uff5c>f<\uff5ctool\u2581sep\uff5c>{}<\uff5ctool\u2581call\u2581end\uff5c>"
            "<\uff5ctool\u2581calls\u2581end\uff5c>"),
        (3, "\n<tool_call>get_weather\n<arg_key>city</arg_key>\n<arg_value>Paris</arg_value>\n"
            "<arg_key>days</arg_key>\n<arg_value>2</arg_value>\n</tool_call>"),
        (4, "x<|tool_calls_section_begin|><|tool_call_begin|>functions.get_weather:0<|tool_call_argument_begin|>"
            '{"city": "Paris"}<|tool_call_end|><|tool_calls_section_end|>y')]):
    put("fuzz_toolcall", "calls%d" % i, bytes([fmt, i + 1]) + text.encode())
