#!/usr/bin/env python3
"""Train models/demo-moe: a tiny Qwen3-MoE (hidden 128, 4 layers, 16 experts,
top-4, vocabulary 512) on simple generated stories, so that `tools/demo.sh`
shows the runtime producing language rather than noise.

Python is a model-making tool only; nothing in moerun needs it.  The corpus
is generated here from a small grammar (no data set is downloaded); the
tokenizer is a byte-level BPE trained on it with the `tokenizers` package and
carries a ChatML chat template; the model is trained with transformers on
the CPU and saved in bf16.  Deterministic for a given torch version.

Usage: python models/make_demo_model.py [--steps N]
"""
import argparse
import json
import os
import random

import torch
import transformers
from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast, Qwen3MoeConfig, Qwen3MoeForCausalLM

torch.set_num_threads(2)
transformers.logging.set_verbosity_error()
HERE = os.path.dirname(os.path.abspath(__file__))
OUT = os.path.join(HERE, "demo-moe")

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


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=600)
    args = ap.parse_args()
    torch.manual_seed(0)
    texts = corpus(20000, 1)
    tok = train_tokenizer(texts)
    os.makedirs(OUT, exist_ok=True)
    tok.save(os.path.join(OUT, "tokenizer.json"))
    ids = []
    for t in texts:
        ids.extend(tok.encode(t).ids)
    data = torch.tensor(ids, dtype=torch.long)
    cfg = Qwen3MoeConfig(vocab_size=512, hidden_size=128, intermediate_size=256, moe_intermediate_size=64,
                         num_hidden_layers=4, num_attention_heads=8, num_key_value_heads=2, head_dim=16,
                         num_experts=16, num_experts_per_tok=4, norm_topk_prob=True,
                         max_position_embeddings=2048, tie_word_embeddings=True, rope_theta=10000.0,
                         output_router_logits=True, router_aux_loss_coef=0.01,
                         eos_token_id=tok.token_to_id("<|im_end|>"))
    model = Qwen3MoeForCausalLM(cfg)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=0.01)
    sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=3e-3, total_steps=args.steps, pct_start=0.1)
    seq, batch = 128, 16
    g = torch.Generator().manual_seed(0)
    model.train()
    for step in range(args.steps):
        starts = torch.randint(0, len(data) - seq - 1, (batch,), generator=g)
        x = torch.stack([data[s:s + seq] for s in starts])
        out = model(input_ids=x, labels=x)
        opt.zero_grad()
        out.loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        if step % 50 == 0 or step == args.steps - 1:
            print(f"step {step} loss {out.loss.item():.3f}", flush=True)
    model.config.output_router_logits = False
    model.eval()
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


if __name__ == "__main__":
    main()
