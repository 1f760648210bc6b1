"""The demo model's tokenizer with its last merged token (id 511) given up
for Mistral's "[TOOL_CALLS]" control token, so that a server test can run
the demo model with a tool-call marker that is one token (strict tools
trigger their grammar on it).  Checked with the tokenizers package: the
marker encodes to [511], other text never produces 511.

Usage: make_toolcall_tokenizer.py  (writes tests/fixtures/toolcall_tokenizer/tokenizer.json)"""
import json
import os

from tokenizers import Tokenizer

root = os.path.join(os.path.dirname(__file__), "..", "..")
src = os.path.join(root, "models", "demo-moe", "tokenizer.json")
out_dir = os.path.join(root, "tests", "fixtures", "toolcall_tokenizer")
t = json.load(open(src))
m = t["model"]
inv = {v: k for k, v in m["vocab"].items()}
gone = inv[511]
assert max(m["vocab"].values()) == 511
del m["vocab"][gone]
m["merges"] = [mg for mg in m["merges"] if "".join(mg) != gone]
t["added_tokens"].append({"id": 511, "content": "[TOOL_CALLS]", "single_word": False, "lstrip": False,
                          "rstrip": False, "normalized": False, "special": True})
os.makedirs(out_dir, exist_ok=True)
path = os.path.join(out_dir, "tokenizer.json")
with open(path, "w") as f:
    json.dump(t, f, ensure_ascii=False, indent=1)
    f.write("\n")
tok = Tokenizer.from_file(path)
assert tok.encode("[TOOL_CALLS]", add_special_tokens=False).ids == [511]
text = "Once upon a time, there was a happy dog named Leo. " + gone.replace("\u0120", " ") * 3
assert 511 not in tok.encode(text, add_special_tokens=False).ids
print("wrote tests/fixtures/toolcall_tokenizer/tokenizer.json (id 511 was %r)" % gone)
