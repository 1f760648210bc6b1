#!/usr/bin/env python3
"""Give the fixture models (and the demo model) tokenizers, and record what
transformers generates from text prompts, so moerun's text path (tokenizer ->
engine -> streaming decode) is checked end to end against transformers.

Python is only a fixture-making tool; nothing in the runtime or build needs it.

* Every tests/fixtures/<model>/ (vocabulary 256) gets a SentencePiece-style
  BPE tokenizer trained here (Metaspace pre-tokenizer, <unk>, <s> added by a
  TemplateProcessing post-processor, Metaspace decoder) with exactly 256 ids,
  and text_reference.json: for a few prompts, the prompt ids, the 24 greedy
  ids transformers' generate() produces (no EOS stop) and their text decoded
  with skip_special_tokens=True.  A prompt is used only if every greedy step
  has a top1-top2 logit gap >= 1e-4.
(models/demo-moe and its tokenizer come from models/make_demo_model.py.)

Usage: python tests/reference/make_text_fixtures.py
"""
import json
import os
import random

import torch
import transformers
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
from transformers import AutoModelForCausalLM, PreTrainedTokenizerFast

torch.set_num_threads(2)
transformers.logging.set_verbosity_error()

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
FIXTURES = os.path.join(REPO, "tests", "fixtures")
DEMO = os.path.join(REPO, "models", "demo-moe")
MODELS = ["mixtral", "qwen2_moe", "qwen3_moe", "olmoe", "llama", "qwen2", "qwen3"]
PROMPTS = ["Once upon a time", "The quick brown fox", "hello world", "a b c", "Mixture of experts",
           "small models can", "the cat sat on the mat", "We route tokens"]
N_NEW = 24

WORDS = ("the a of and to in is was he she it they we you that with for on at by from this "
         "time once upon there lived small large model expert experts token tokens route mixture "
         "quick brown fox jumps over lazy dog cat sat mat hello world story king queen garden "
         "river mountain light dark day night sun moon star water fire stone tree bird song "
         "can will may must should could would very more most less good bad new old first last").split()


def corpus(n, seed):
    rng = random.Random(seed)
    lines = []
    for _ in range(n):
        words = [rng.choice(WORDS) for _ in range(rng.randint(4, 14))]
        s = " ".join(words)
        lines.append(s[0].upper() + s[1:] + rng.choice([".", ".", "!", "?", ","]))
    return lines


def sentencepiece_style(vocab_size):
    tok = Tokenizer(models.BPE(unk_token="<unk>", fuse_unk=True))
    tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="\u2581", prepend_scheme="always")
    tok.decoder = decoders.Metaspace(replacement="\u2581", prepend_scheme="always")
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=["<unk>", "<s>", "</s>"],
                                  show_progress=False)
    tok.train_from_iterator(corpus(4000, 1), trainer)
    assert tok.get_vocab_size() == vocab_size, tok.get_vocab_size()
    bos = tok.token_to_id("<s>")
    tok.post_processor = processors.TemplateProcessing(single="<s> $A", pair="<s> $A <s> $B",
                                                       special_tokens=[("<s>", bos)])
    return tok


def write_config(path, obj):
    with open(path, "w", encoding="utf-8") as f:
        json.dump(obj, f, indent=2, ensure_ascii=False)
        f.write("\n")


def greedy_margin(model, ids):
    with torch.no_grad():
        out = model.generate(torch.tensor([ids]), max_new_tokens=N_NEW, min_new_tokens=N_NEW,
                             do_sample=False, output_scores=True, return_dict_in_generate=True,
                             eos_token_id=None, pad_token_id=0)
    margin = 1e9
    for s in out.scores:
        top = torch.topk(s[0].float(), 2).values
        margin = min(margin, float(top[0] - top[1]))
    return out.sequences[0, len(ids):].tolist(), margin


def fixture_text(name):
    d = os.path.join(FIXTURES, name)
    tok = sentencepiece_style(256)
    tok.save(os.path.join(d, "tokenizer.json"))
    write_config(os.path.join(d, "tokenizer_config.json"), {
        "tokenizer_class": "PreTrainedTokenizerFast", "bos_token": "<s>", "eos_token": "</s>",
        "unk_token": "<unk>", "add_bos_token": True})
    hf_tok = PreTrainedTokenizerFast.from_pretrained(d)
    cfg = json.load(open(os.path.join(d, "config.json")))
    model = AutoModelForCausalLM.from_pretrained(d, dtype=torch.float32, attn_implementation="eager")
    model.eval()
    refs = []
    for p in PROMPTS:
        ids = hf_tok(p, add_special_tokens=True)["input_ids"]
        new, margin = greedy_margin(model, ids)
        if margin < 1e-4:
            print(f"  {name}: prompt {p!r} skipped (margin {margin:.2g})")
            continue
        refs.append({"prompt": p, "prompt_ids": ids, "ids": new,
                     "text": hf_tok.decode(new, skip_special_tokens=True), "min_logit_margin": margin})
        if len(refs) == 3:
            break
    assert len(refs) == 3, f"{name}: not enough decisive prompts"
    write_config(os.path.join(d, "text_reference.json"), {
        "transformers_version": transformers.__version__, "dtype": cfg.get("dtype"),
        "max_new_tokens": N_NEW, "cases": refs})
    print(f"{name}: {len(refs)} text cases")


if __name__ == "__main__":
    for n in MODELS:
        fixture_text(n)
