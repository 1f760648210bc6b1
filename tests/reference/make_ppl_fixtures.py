#!/usr/bin/env python3
"""Reference figures for `moerun ppl`: perplexity and KL divergence computed by
transformers (CPU, fp32) over a held-out text, written to
tests/fixtures/ppl/reference.json.

Python is only a fixture-making tool; nothing in the runtime or build needs it.

The evaluation follows the rule docs/cli.md gives for `moerun ppl`:
  * the text is tokenized without special tokens (the body); the prefix the
    tokenizer's post-processor puts before a text (e.g. BOS) is found by
    encoding a probe with and without special tokens;
  * windows of ctx tokens: the prefix, then the next ctx - len(prefix) body
    tokens (the last window may be shorter); windows do not overlap;
  * windows that score nothing (a short last one) are left out;
  * in a window of n tokens, logits row j (predicting token j+1) is scored for
    score_from <= j <= n - 2;
  * NLL = -log_softmax(logits[j])[token j+1] in float64 from fp32 logits;
  * KL(base || this) = sum_v p_base(v) * (log p_base(v) - log p_this(v)).

Cases:
  * models/demo-moe (trained Qwen3-MoE, bf16 weights computed in fp32), K = 4
    as configured and K = 2 (num_experts_per_tok overridden, which is what
    `--moe-top-k 2` does), ctx 64, score_from 32 (the default, ctx / 2);
    the K = 2 case also carries KL against the K = 4 run;
  * tests/fixtures/mixtral (random fp32 weights, a tokenizer that adds <s>),
    ctx 40, score_from 0: the BOS prefix and a short last window.

Usage: python tests/reference/make_ppl_fixtures.py
"""
import importlib.util
import json
import os

import numpy as np
import torch
import transformers
from tokenizers import Tokenizer
from transformers import AutoModelForCausalLM

torch.set_num_threads(2)
transformers.logging.set_verbosity_error()

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
OUT = os.path.join(REPO, "tests", "fixtures", "ppl")


def held_out_text():
    """Stories from the demo model's grammar with a seed it was not trained on."""
    spec = importlib.util.spec_from_file_location(
        "make_demo_model", os.path.join(REPO, "models", "make_demo_model.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    stories = [s for s in mod.corpus(60, 12345) if not s.startswith("<|")]
    return "".join(stories[:36])


def prefix_ids(tok):
    plain = tok.encode("a", add_special_tokens=False).ids
    full = tok.encode("a", add_special_tokens=True).ids
    for p in range(len(full) - len(plain) + 1):
        if full[p:p + len(plain)] == plain:
            return full[:p]
    raise SystemExit("probe not found in its own encoding")


def windows(prefix, body, ctx, score_from, limit=0):
    step = ctx - len(prefix)
    out = [prefix + body[o:o + step] for o in range(0, len(body), step)]
    out = out[:limit] if limit else out
    return [w for w in out if len(w) - 1 - score_from > 0]  # a short last one may score nothing


def log_probs(model, win):
    with torch.no_grad():
        logits = model(input_ids=torch.tensor([win])).logits[0].to(torch.float64)
    return torch.log_softmax(logits, dim=-1)


def evaluate(model, wins, score_from, base=None):
    """Per scored token: nll, argmax; with base (a list of log-prob rows),
    KL(base || this) and whether the argmax agrees with base's."""
    nll, top1, margin, kl, same, rows = [], [], [], [], [], []
    for win in wins:
        lp = log_probs(model, win)
        for j in range(score_from, len(win) - 1):
            nll.append(-lp[j, win[j + 1]].item())
            top1.append(int(torch.argmax(lp[j]).item()))
            two = torch.topk(lp[j], 2).values
            margin.append((two[0] - two[1]).item())
            rows.append(lp[j])
    if base is not None:
        for b, r in zip(base, rows):
            kl.append(float(torch.sum(torch.exp(b) * (b - r)).item()))
            same.append(int(torch.argmax(b).item() == torch.argmax(r).item()))
    return nll, top1, margin, kl, same, rows


def sig(x):
    """9 significant digits: the file stays small, float64 sums are unaffected."""
    return float(f"{x:.9g}")


def case(name, model_dir, text, ctx, score_from, top_k=None, base=None, limit=0):
    tok = Tokenizer.from_file(os.path.join(model_dir, "tokenizer.json"))
    prefix = prefix_ids(tok)
    body = tok.encode(text, add_special_tokens=False).ids
    wins = windows(prefix, body, ctx, score_from, limit)
    kw = {"num_experts_per_tok": top_k} if top_k else {}
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32,
                                                 attn_implementation="eager", **kw)
    model.eval()
    nll, top1, margin, kl, same, rows = evaluate(model, wins, score_from, base)
    targets = [w[j + 1] for w in wins for j in range(score_from, len(w) - 1)]
    c = {
        "name": name,
        "model": os.path.relpath(model_dir, REPO),
        "top_k": top_k or model.config.num_experts_per_tok,
        "top_k_override": top_k is not None,
        "ctx": ctx,
        "score_from": score_from,
        "prefix": prefix,
        "body_tokens": len(body),
        "windows": len(wins),
        "scored": len(nll),
        "mean_nll": float(np.mean(nll)),
        "ppl": float(np.exp(np.mean(nll))),
        "targets": targets,
        "nll": [sig(x) for x in nll],
        "argmax": top1,
        "top2_margin": [sig(x) for x in margin],
    }
    if base is not None:
        c["kl"] = [sig(x) for x in kl]
        c["same_top1"] = same
        c["mean_kl"] = float(np.mean(kl))
    return c, rows


def main():
    os.makedirs(OUT, exist_ok=True)
    text = held_out_text()
    with open(os.path.join(OUT, "stories.txt"), "w") as f:
        f.write(text)
    demo = os.path.join(REPO, "models", "demo-moe")
    k4, rows4 = case("demo_k4", demo, text, 64, 32)
    k2, _ = case("demo_k2", demo, text, 64, 32, top_k=2, base=rows4)
    k2["base"] = "demo_k4"
    mix, _ = case("mixtral_bos", os.path.join(REPO, "tests", "fixtures", "mixtral"), text, 40, 0,
                  limit=6)
    ref = {
        "transformers_version": transformers.__version__,
        "torch_version": torch.__version__,
        "text": "stories.txt",
        "cases": [k4, k2, mix],
    }
    with open(os.path.join(OUT, "reference.json"), "w") as f:  # one line per case
        head = json.dumps({k: v for k, v in ref.items() if k != "cases"})[:-1]
        f.write(head + ', "cases": [\n' + ",\n".join(json.dumps(c) for c in ref["cases"]) + "\n]}\n")
    for c in ref["cases"]:
        print(c["name"], "windows", c["windows"], "scored", c["scored"], "ppl", round(c["ppl"], 4),
              "mean_kl", round(c.get("mean_kl", 0), 5))


if __name__ == "__main__":
    main()
