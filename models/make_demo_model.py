#!/usr/bin/env python3
"""Train models/demo-moe: a tiny Qwen3-MoE (hidden 128, 4 layers, 16 experts,
top-4, vocabulary 512) on simple generated stories, so that `tools/demo.sh`
shows the runtime producing language rather than noise; then
models/demo-draft, its speculative-decoding draft: a dense Qwen3 (hidden 64,
3 layers, 181k parameters, 0.36 MB in bf16) trained on the same stories
with the same tokenizer (tokenizer.json, tokenizer_config.json and
generation_config.json copied byte for byte), partly by distillation from
demo-moe's logits so that its greedy choices agree with demo-moe's.

Python is a model-making tool only; nothing in moerun needs it.  The corpus
is generated here from a small grammar (no data set is downloaded); the
tokenizer is a byte-level BPE trained on it with the `tokenizers` package and
carries a ChatML chat template; the model is trained with transformers on
the CPU and saved in bf16.  Deterministic for a given torch version.

After training the draft the script measures, with transformers (fp32
compute of the bf16 files), how often the draft's argmax equals demo-moe's:
over held-out stories (teacher forcing) and along demo-moe's greedy
continuations of the benchmark prompts in models/demo-prompts.jsonl, with
the mean accepted length a greedy K = 4 speculation would get there.  It
writes tests/fixtures/demo_draft.json: the draft's greedy continuation of a
fixed prompt, the reference for tests/test_demo_draft.c.

Usage: python models/make_demo_model.py [--steps N] [--draft-steps N] [--distill-from N]
       python models/make_demo_model.py --draft-only [--draft-steps N] [--distill-from N]
       python models/make_demo_model.py --eval-only
       python models/make_demo_model.py --wide DIR [--wide-steps N]
  --draft-steps  the draft's training steps (default 800; batches of 16 x 128
                 tokens), of which the first --distill-from (default 400)
                 use cross-entropy alone and the rest add KL to demo-moe's
                 logits: 2 minutes on 2 idle threads, 9 on a busy machine
                 (torch 2.15, transformers 5.24), then 1-3 for the
                 measurement.  Rerunning reproduces demo-draft byte for byte.
  --draft-only   keep models/demo-moe as committed (its tokenizer and
                 weights are read, nothing there is written) and train only
                 models/demo-draft.
  --eval-only    train nothing: rewrite the fixture from the committed
                 draft and measure the agreement of the committed models.
  --wide DIR     train only a wider Qwen3-MoE into DIR (not committed):
                 hidden 256, expert FFN 256, 16 experts, top-4, 4 layers,
                 8 query / 2 KV heads of 32, on the same stories with
                 demo-moe's tokenizer (its three files copied byte for
                 byte), so that every expert matrix has rows of 256 and the
                 K-quant formats (Q4_K, Q6_K) apply to a trained model; then
                 its loss on held-out stories.  --wide-steps (default 300)
                 as --steps: 6.5 minutes on 2 busy threads (torch 2.15,
                 transformers 5.25).
"""
import argparse
import json
import os
import random
import shutil
import time

import torch
import transformers
from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import (PreTrainedTokenizerFast, Qwen3Config, Qwen3ForCausalLM, Qwen3MoeConfig,
                          Qwen3MoeForCausalLM)

torch.set_num_threads(2)
transformers.logging.set_verbosity_error()
HERE = os.path.dirname(os.path.abspath(__file__))
OUT = os.path.join(HERE, "demo-moe")
DRAFT = os.path.join(HERE, "demo-draft")
PROMPTS = os.path.join(HERE, "demo-prompts.jsonl")
FIXTURE = os.path.join(HERE, "..", "tests", "fixtures", "demo_draft.json")
# The draft's test prompt (tests/test_demo_draft.c) and its length.
TEST_PROMPT = "Once upon a time, there was a"
TEST_TOKENS = 32

NAMES = ["Lily", "Tom", "Mia", "Ben", "Sara", "Max", "Anna", "Sam", "Zoe", "Leo"]
ANIMALS = ["cat", "dog", "fox", "bird", "rabbit", "bear", "frog", "duck", "mouse", "owl"]
ADJS = ["little", "happy", "brave", "small", "kind", "funny", "shy", "big", "clever", "sleepy"]
PLACES = ["park", "garden", "forest", "river", "house", "meadow", "hill", "farm", "lake", "town"]
VERBS = ["play", "run", "jump", "sing", "dance", "read", "swim", "draw", "explore", "hide"]
THINGS = ["ball", "kite", "box", "book", "hat", "flower", "stone", "cake", "boat", "star"]
FEEL = ["happy", "sad", "excited", "tired", "surprised", "proud", "scared", "glad"]


def story(r):
    n, a, adj, p = r.choice(NAMES), r.choice(ANIMALS), r.choice(ADJS), r.choice(PLACES)
    v, v2, t, f = r.choice(VERBS), r.choice(VERBS), r.choice(THINGS), r.choice(FEEL)
    a2, adj2 = r.choice(ANIMALS), r.choice(ADJS)
    s = [f"Once upon a time, there was a {adj} {a} named {n}.",
         f"{n} liked to {v} in the {p}.",
         f"One day, {n} found a {t} near the {r.choice(PLACES)}.",
         f"{n} felt {f}.",
         f"Then {n} met a {adj2} {a2}.",
         f"They decided to {v2} together.",
         r.choice([f"The {a2} shared the {t} with {n}.", f"{n} gave the {t} to the {a2}.",
                   f"They played with the {t} all day."]),
         r.choice(["They became good friends.", "It was a wonderful day.",
                   f"{n} went home and slept well."]),
         "The end."]
    return " ".join(s)


def corpus(n, seed):
    r = random.Random(seed)
    out = []
    for i in range(n):
        st = story(r)
        if i % 3 == 0:  # some conversations in the demo's chat format
            ask = r.choice(["Tell me a story.", "Can you tell me a story?", "Please tell a short story.",
                            "I want a story."])
            out.append(f"<|im_start|>user\n{ask}<|im_end|>\n<|im_start|>assistant\n{st}<|im_end|>\n")
        else:
            out.append(st + "\n")
    return out


def train_tokenizer(texts):
    tok = Tokenizer(models.BPE())
    qwen_re = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
               r"|\s*[\r\n]+|\s+(?!\S)|\s+")
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(pattern=Regex(qwen_re), behavior="isolated"),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    tok.decoder = decoders.ByteLevel()
    specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    trainer = trainers.BpeTrainer(vocab_size=512, special_tokens=specials, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(texts, trainer)
    return tok


CHATML = ("{% for message in messages %}{{'<|im_start|>' + message['role'] + '\\n' + message['content']"
          " + '<|im_end|>' + '\\n'}}{% endfor %}{% if add_generation_prompt %}"
          "{{ '<|im_start|>assistant\\n' }}{% endif %}")


def batches(data, seq, batch, g):
    starts = torch.randint(0, len(data) - seq - 1, (batch,), generator=g)
    return torch.stack([data[s:s + seq] for s in starts])


def token_ids(tok, texts):
    """The texts' token ids, one tensor."""
    ids = []
    for t in texts:
        ids.extend(tok.encode(t).ids)
    return torch.tensor(ids, dtype=torch.long)


def moe_config(tok, hidden, ffn, moe_ffn, head_dim):
    """The demo's Qwen3-MoE shape (4 layers, 8/2 heads, 16 experts, top-4)
    at the given widths."""
    return Qwen3MoeConfig(vocab_size=512, hidden_size=hidden, intermediate_size=ffn, moe_intermediate_size=moe_ffn,
                          num_hidden_layers=4, num_attention_heads=8, num_key_value_heads=2, head_dim=head_dim,
                          num_experts=16, num_experts_per_tok=4, norm_topk_prob=True,
                          max_position_embeddings=2048, tie_word_embeddings=True, rope_theta=10000.0,
                          output_router_logits=True, router_aux_loss_coef=0.01,
                          eos_token_id=tok.token_to_id("<|im_end|>"))


def train_target(steps, texts):
    tok = train_tokenizer(texts)
    os.makedirs(OUT, exist_ok=True)
    tok.save(os.path.join(OUT, "tokenizer.json"))
    data = token_ids(tok, texts)
    model = Qwen3MoeForCausalLM(moe_config(tok, 128, 256, 64, 16))
    fit_moe(model, data, steps)
    model.to(torch.bfloat16).save_pretrained(OUT)
    with open(os.path.join(OUT, "tokenizer_config.json"), "w") as f:
        json.dump({"tokenizer_class": "PreTrainedTokenizerFast", "eos_token": "<|im_end|>",
                   "pad_token": "<|endoftext|>", "add_bos_token": False, "chat_template": CHATML},
                  f, indent=2)
        f.write("\n")
    gen = {"eos_token_id": [tok.token_to_id("<|im_end|>"), tok.token_to_id("<|endoftext|>")],
           "transformers_version": transformers.__version__}
    with open(os.path.join(OUT, "generation_config.json"), "w") as f:
        json.dump(gen, f, indent=2)
        f.write("\n")
    hf = PreTrainedTokenizerFast.from_pretrained(OUT)
    p = hf("Once upon a time", return_tensors="pt")
    with torch.no_grad():
        o = model.to(torch.float32).generate(**p, max_new_tokens=40, do_sample=False)
    print(hf.decode(o[0]))


def fit_moe(model, data, steps):
    """Train a Qwen3-MoE on the token stream: AdamW, one-cycle learning
    rate peaking at 3e-3, batches of 16 x 128 tokens; leaves it in eval
    mode without router logits."""
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=0.01)
    sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=3e-3, total_steps=steps, pct_start=0.1)
    seq, batch = 128, 16
    g = torch.Generator().manual_seed(0)
    model.train()
    t0 = time.time()
    for step in range(steps):
        x = batches(data, seq, batch, g)
        out = model(input_ids=x, labels=x)
        opt.zero_grad()
        out.loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        if step % 50 == 0 or step == steps - 1:
            print(f"step {step} loss {out.loss.item():.3f} ({time.time() - t0:.0f} s)", flush=True)
    model.config.output_router_logits = False
    model.eval()


def train_wide(path, steps, texts):
    """A Qwen3-MoE whose hidden size and expert FFN width are 256, on the
    same stories and demo-moe's tokenizer, saved in bf16 to path; then its
    mean loss on held-out stories (another seed) in windows of 128 tokens."""
    tok = Tokenizer.from_file(os.path.join(OUT, "tokenizer.json"))
    data = token_ids(tok, texts)
    model = Qwen3MoeForCausalLM(moe_config(tok, 256, 512, 256, 32))
    print(f"wide: {sum(p.numel() for p in model.parameters())} parameters", flush=True)
    fit_moe(model, data, steps)
    os.makedirs(path, exist_ok=True)
    model.to(torch.bfloat16).save_pretrained(path)
    for name in ("tokenizer.json", "tokenizer_config.json", "generation_config.json"):
        shutil.copyfile(os.path.join(OUT, name), os.path.join(path, name))
    model = load(Qwen3MoeForCausalLM, path)
    held = []
    for t in corpus(150, 3):
        held.extend(tok.encode(t).ids)
    x = torch.tensor([held[o:o + 128] for o in range(0, len(held) - 128, 128)])
    with torch.no_grad():
        loss = model(input_ids=x, labels=x).loss.item()
    print(f"wide: held-out loss {loss:.3f} over {x.numel()} tokens")


def load(cls, path):
    """A saved model as the runtime computes it: bf16 weights upcast to fp32."""
    return cls.from_pretrained(path, dtype=torch.float32, attn_implementation="eager").eval()


def train_draft(steps, distill_from, texts):
    """The draft: a dense Qwen3 trained on the same token stream as demo-moe,
    cross-entropy alone for the first distill_from steps, then
    cross-entropy plus KL(demo-moe || draft) on demo-moe's logits."""
    tok = Tokenizer.from_file(os.path.join(OUT, "tokenizer.json"))
    data = token_ids(tok, texts)
    teacher = load(Qwen3MoeForCausalLM, OUT)
    cfg = Qwen3Config(vocab_size=512, hidden_size=64, intermediate_size=192, num_hidden_layers=3,
                      num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                      max_position_embeddings=2048, tie_word_embeddings=True, rope_theta=10000.0,
                      eos_token_id=tok.token_to_id("<|im_end|>"))
    model = Qwen3ForCausalLM(cfg)
    print(f"draft: {sum(p.numel() for p in model.parameters())} parameters", flush=True)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.01)
    sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=1e-2, total_steps=steps, pct_start=0.1)
    seq, batch = 128, 16
    g = torch.Generator().manual_seed(1)
    model.train()
    t0 = time.time()
    for step in range(steps):
        x = batches(data, seq, batch, g)
        out = model(input_ids=x, labels=x)
        loss, kl = out.loss, torch.zeros(())
        if step >= distill_from:
            with torch.no_grad():
                tl = teacher(input_ids=x).logits.float().log_softmax(-1).reshape(-1, cfg.vocab_size)
            sl = out.logits.float().log_softmax(-1).reshape(-1, cfg.vocab_size)
            kl = torch.nn.functional.kl_div(sl, tl, log_target=True, reduction="batchmean")
            loss = 0.5 * loss + kl
        opt.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        if step % 50 == 0 or step == steps - 1:
            print(f"draft step {step} ce {out.loss.item():.3f} kl {kl.item():.3f} ({time.time() - t0:.0f} s)",
                  flush=True)
    model.eval()
    model.to(torch.bfloat16).save_pretrained(DRAFT)
    for name in ("tokenizer.json", "tokenizer_config.json", "generation_config.json"):
        shutil.copyfile(os.path.join(OUT, name), os.path.join(DRAFT, name))


def accepted_run(match, k):
    """Greedy speculation along a sequence whose draft guesses are `match`
    (draft argmax == target token, position by position): verification
    steps and drafted tokens accepted, K = k."""
    i = steps = acc = 0
    while i < len(match):
        a = 0
        while a < k and i + a < len(match) and match[i + a]:
            a += 1
        steps += 1
        acc += a
        i += a + 1
    return steps, acc


@torch.no_grad()
def evaluate(k=4):
    tok = Tokenizer.from_file(os.path.join(OUT, "tokenizer.json"))
    target, draft = load(Qwen3MoeForCausalLM, OUT), load(Qwen3ForCausalLM, DRAFT)
    eos = {tok.token_to_id("<|im_end|>"), tok.token_to_id("<|endoftext|>")}
    # Held-out stories (another seed than training), teacher forcing in
    # windows of 128 tokens.
    ids = []
    for t in corpus(150, 3):
        ids.extend(tok.encode(t).ids)
    same = total = 0
    for off in range(0, len(ids) - 128, 128 * 16):
        x = torch.tensor([ids[o:o + 128] for o in range(off, min(off + 128 * 16, len(ids) - 128), 128)])
        a = target(input_ids=x).logits.argmax(-1)
        b = draft(input_ids=x).logits.argmax(-1)
        same += (a == b).sum().item()
        total += a.numel()
    held = same / total
    # demo-moe's greedy continuations (64 tokens or to EOS) of the
    # benchmark prompts: the draft's argmax at each generated position.
    prompts = [json.loads(line) for line in open(PROMPTS)]
    res = {}
    for p in prompts:
        seq = tok.encode(p["prompt"]).ids
        n0 = len(seq)
        seq = target.generate(input_ids=torch.tensor([seq]), max_new_tokens=64, do_sample=False,
                              eos_token_id=sorted(eos), pad_token_id=0)[0].tolist()
        guess = draft(input_ids=torch.tensor([seq[:-1]])).logits[0].argmax(-1).tolist()
        match = [guess[i - 1] == seq[i] for i in range(n0, len(seq))]
        steps, acc = accepted_run(match, k)
        r = res.setdefault(p["kind"], [0, 0, 0, 0])
        r[0] += sum(match)
        r[1] += len(match)
        r[2] += steps
        r[3] += acc
        print(f"  {p['id']:8s} agree {sum(match) / len(match):.3f} over {len(match)} tokens, "
              f"K={k}: {acc / steps:.2f} accepted per step", flush=True)
    print(f"agreement (draft argmax == demo-moe argmax), held-out stories, teacher forcing: "
          f"{held:.3f} over {total} positions")
    for kind, (m, n, steps, acc) in res.items():
        print(f"agreement on demo-moe's greedy continuations of the {kind} prompts: {m / n:.3f} over {n} "
              f"tokens; greedy K={k}: {acc / steps:.2f} drafted tokens accepted per step "
              f"({n / steps:.2f} tokens per target pass)")
    return held


@torch.no_grad()
def write_fixture():
    """The draft's greedy continuation of TEST_PROMPT by transformers, and
    the smallest top-1 / top-2 logit gap on the way."""
    tok = Tokenizer.from_file(os.path.join(DRAFT, "tokenizer.json"))
    draft = load(Qwen3ForCausalLM, DRAFT)
    prompt = tok.encode(TEST_PROMPT).ids
    seq, gap = list(prompt), float("inf")
    last = None
    for _ in range(TEST_TOKENS):
        lg = draft(input_ids=torch.tensor([seq])).logits[0, -1]
        if last is None:
            last = lg
        top = lg.topk(2).values
        gap = min(gap, (top[0] - top[1]).item())
        seq.append(lg.argmax().item())
    out = {"model": "models/demo-draft", "prompt": TEST_PROMPT, "prompt_ids": prompt,
           "greedy": seq[len(prompt):], "min_top2_gap": round(gap, 4),
           "last_prompt_logits": [round(v, 5) for v in last.tolist()],
           "text": tok.decode(seq[len(prompt):]),
           "versions": {"torch": torch.__version__.split("+")[0], "transformers": transformers.__version__}}
    with open(FIXTURE, "w") as f:
        json.dump(out, f)
        f.write("\n")
    print(f"fixture: {TEST_PROMPT!r} -> {out['text']!r} (smallest top-2 gap {gap:.3f})")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=600)
    ap.add_argument("--draft-steps", type=int, default=800)
    ap.add_argument("--distill-from", type=int, default=400,
                    help="draft steps on cross-entropy alone before distillation joins")
    ap.add_argument("--draft-only", action="store_true")
    ap.add_argument("--eval-only", action="store_true")
    ap.add_argument("--wide", metavar="DIR", help="train only the wide model, into DIR")
    ap.add_argument("--wide-steps", type=int, default=300)
    args = ap.parse_args()
    torch.manual_seed(0)
    texts = corpus(20000, 1)
    if args.wide:
        train_wide(args.wide, args.wide_steps, texts)
        return
    if not args.draft_only and not args.eval_only:
        train_target(args.steps, texts)
    if not args.eval_only:
        torch.manual_seed(1)
        train_draft(args.draft_steps, args.distill_from, texts)
    write_fixture()
    evaluate()


if __name__ == "__main__":
    main()
