#!/usr/bin/env python3
"""Convert a `moerun synth` checkpoint to GGUF with llama.cpp's own converter.

usage: gguf_from_synth.py LLAMA_CPP_DIR MODEL_DIR OUT.gguf [--outtype bf16|f16|q8_0]

A synthetic checkpoint has no tokenizer, and convert_hf_to_gguf.py needs one.
This writes MODEL_DIR/tokenizer.json when absent: a byte-level BPE with the
checkpoint's vocabulary size (256 byte tokens, then merges of byte pairs),
and tells the converter to treat its pre-tokenizer as GPT-2's (its hash is
not in the converter's table).  Benchmarks feed token ids, so the tokenizer
only has to load.  Nothing of llama.cpp is copied: its converter is run from
the llama.cpp source folder given as the first argument.
"""
import json
import os
import sys


def bytes_to_unicode():
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + \
        list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return [chr(c) for _, c in sorted(zip(bs, cs))]


def write_tokenizer(model_dir):
    path = os.path.join(model_dir, "tokenizer.json")
    if os.path.exists(path):
        return
    with open(os.path.join(model_dir, "config.json")) as f:
        cfg = json.load(f)
    V = cfg["vocab_size"]
    base = bytes_to_unicode()
    vocab = {c: i for i, c in enumerate(base)}
    merges = []
    for a in base:
        for b in base:
            if len(vocab) >= V:
                break
            if a + b not in vocab:
                vocab[a + b] = len(vocab)
                merges.append(f"{a} {b}")
        if len(vocab) >= V:
            break
    tok = {
        "version": "1.0", "truncation": None, "padding": None, "added_tokens": [],
        "normalizer": None,
        "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True,
                          "use_regex": True},
        "post_processor": None,
        "decoder": {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True,
                    "use_regex": True},
        "model": {"type": "BPE", "dropout": None, "unk_token": None,
                  "continuing_subword_prefix": None, "end_of_word_suffix": None,
                  "fuse_unk": False, "byte_fallback": False, "vocab": vocab, "merges": merges},
    }
    with open(path, "w") as f:
        json.dump(tok, f)
    with open(os.path.join(model_dir, "tokenizer_config.json"), "w") as f:
        json.dump({"tokenizer_class": "PreTrainedTokenizerFast", "model_max_length": 4096}, f)


def main():
    if len(sys.argv) < 4:
        sys.exit(__doc__)
    llama_dir, model_dir, out = sys.argv[1:4]
    outtype = "bf16"
    if len(sys.argv) > 5 and sys.argv[4] == "--outtype":
        outtype = sys.argv[5]
    write_tokenizer(model_dir)
    sys.path.insert(0, llama_dir)
    sys.path.insert(1, os.path.join(llama_dir, "gguf-py"))
    import convert_hf_to_gguf as conv
    try:
        from conversion import base
        base.TextModel.get_vocab_base_pre = lambda self, tokenizer: "gpt-2"
    except ImportError:
        conv.TextModel.get_vocab_base_pre = lambda self, tokenizer: "gpt-2"
    sys.argv = ["convert_hf_to_gguf.py", model_dir, "--outfile", out, "--outtype", outtype]
    conv.main()


if __name__ == "__main__":
    main()
