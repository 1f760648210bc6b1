"""A GPTQ checkpoint (v1 layout, 4 bits, symmetric, group 128) of random
codes and scales at chosen widths, for timing how fast moerun reads
four-bit checkpoints (the weights are noise; only their layout is
GPTQModel's, as in tests/fixtures/qwen3_moe_gptq).  Needs numpy and
safetensors.

Usage: make_gptq_checkpoint.py OUT_DIR [--hidden 2048] [--expert 768]
       [--experts 32] [--layers 4] [--vocab 4096]"""
import argparse
import json
import os
import shutil

import numpy as np
from safetensors.numpy import save_file

ap = argparse.ArgumentParser()
ap.add_argument("out")
ap.add_argument("--hidden", type=int, default=2048)
ap.add_argument("--expert", type=int, default=768)
ap.add_argument("--experts", type=int, default=32)
ap.add_argument("--layers", type=int, default=4)
ap.add_argument("--vocab", type=int, default=4096)
a = ap.parse_args()
here = os.path.dirname(os.path.abspath(__file__))
fixture = os.path.join(here, "..", "tests", "fixtures", "qwen3_moe_gptq")
cfg = json.load(open(os.path.join(fixture, "config.json")))
D, F, E, L, V, G = a.hidden, a.expert, a.experts, a.layers, a.vocab, 128
heads, kv, hd = D // 128, max(1, D // 512), 128
cfg.update({"hidden_size": D, "moe_intermediate_size": F, "intermediate_size": 4 * F, "num_experts": E,
            "num_experts_per_tok": 8 if E >= 8 else 2, "num_hidden_layers": L, "num_attention_heads": heads,
            "num_key_value_heads": kv, "head_dim": hd, "vocab_size": V, "max_position_embeddings": 4096})
cfg.pop("mlp_only_layers", None)
cfg["decoder_sparse_step"] = 1
rng = np.random.default_rng(0)
t = {}


def quantized(prefix, n, k):  # W (n, k): qweight (k/8, n), qzeros (k/G, n/8), scales (k/G, n), g_idx (k)
    t[prefix + ".qweight"] = rng.integers(-2**31, 2**31, size=(k // 8, n), dtype=np.int64).astype(np.int32)
    t[prefix + ".qzeros"] = np.full((k // G, n // 8), 0x77777777, dtype=np.int32)  # z - 1 = 7: z = 8
    t[prefix + ".scales"] = (rng.random((k // G, n), dtype=np.float32) * 0.01 + 0.001).astype(np.float16)
    t[prefix + ".g_idx"] = (np.arange(k, dtype=np.int32) // G)


def plain(name, shape):
    t[name] = (rng.standard_normal(shape, dtype=np.float32) * 0.02).astype(np.float16)


plain("model.embed_tokens.weight", (V, D))
plain("lm_head.weight", (V, D))
t["model.norm.weight"] = np.ones(D, dtype=np.float16)
for l in range(L):
    p = "model.layers.%d." % l
    for n in ("input_layernorm", "post_attention_layernorm"):
        t[p + n + ".weight"] = np.ones(D, dtype=np.float16)
    for n in ("q_norm", "k_norm"):
        t[p + "self_attn." + n + ".weight"] = np.ones(hd, dtype=np.float16)
    quantized(p + "self_attn.q_proj", heads * hd, D)
    quantized(p + "self_attn.k_proj", kv * hd, D)
    quantized(p + "self_attn.v_proj", kv * hd, D)
    quantized(p + "self_attn.o_proj", D, heads * hd)
    plain(p + "mlp.gate.weight", (E, D))
    for e in range(E):
        quantized(p + "mlp.experts.%d.gate_proj" % e, F, D)
        quantized(p + "mlp.experts.%d.up_proj" % e, F, D)
        quantized(p + "mlp.experts.%d.down_proj" % e, D, F)
os.makedirs(a.out, exist_ok=True)
save_file(t, os.path.join(a.out, "model.safetensors"), metadata={"format": "pt"})
json.dump(cfg, open(os.path.join(a.out, "config.json"), "w"), indent=1)
for f in ("quantize_config.json", "generation_config.json"):
    if os.path.exists(os.path.join(fixture, f)):
        shutil.copy(os.path.join(fixture, f), a.out)
print("wrote %s: %.1f MB" % (a.out, os.path.getsize(os.path.join(a.out, "model.safetensors")) / 1e6))
