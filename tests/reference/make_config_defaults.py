#!/usr/bin/env python3
"""Build tests/fixtures/config_defaults.json: what transformers makes of a
configuration that leaves a key out, for each family moerun reads.

For every fixture family (tests/fixtures/<name>/config.json) and every key
of KEYS its config holds, the config is written again without that key (and, for the families with sliding-window switches, with
the window turned on and the layer pattern left to the config class), read
back with transformers' AutoConfig, and the values moerun's parsed model
description must hold are recorded (each case: the fixture, the keys set
and removed, the values): experts per token, RoPE theta, RMSNorm
epsilon, context length, tied embeddings, the sliding window and which
layers use it, the routing switches (renormalisation, scaling factor,
expert groups) and which layers are MoE (as each family's modeling code
decides).  The C test
(tests/test_config_defaults.c) removes the same keys and compares.

Python is only a fixture-making tool; nothing in the runtime or build needs it.

Usage: python tests/reference/make_config_defaults.py
"""
import copy
import json
import os
import tempfile

import transformers
from transformers import AutoConfig

transformers.logging.set_verbosity_error()

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
FIXTURES = os.path.join(REPO, "tests", "fixtures")

FAMILIES = ["mixtral", "qwen2_moe", "qwen3_moe", "olmoe", "glm4_moe", "deepseek_v2", "deepseek_v3",
            "gpt_oss", "granitemoe", "granitemoeshared", "llama", "qwen2", "qwen3", "granite"]
KEYS = ["num_experts_per_tok", "rope_parameters", "rope_theta", "rms_norm_eps", "max_position_embeddings",
        "tie_word_embeddings", "use_sliding_window", "sliding_window", "max_window_layers", "layer_types",
        "norm_topk_prob", "routed_scaling_factor", "n_group", "topk_group", "first_k_dense_replace",
        "decoder_sparse_step", "mlp_only_layers"]
# families whose layers follow config.layer_types (the others: every layer
# takes config.sliding_window when it is set, or none does)
LAYER_TYPES = {"qwen2", "qwen2_moe", "qwen3", "gpt_oss"}
WINDOW_ALL = {"mixtral", "qwen3_moe"}


# the families whose modeling code reads these routing keys
ROUTING_KEYS = {
    "norm_topk_prob": ("qwen2_moe", "qwen3_moe", "olmoe", "glm4_moe", "deepseek_v3"),
    "routed_scaling_factor": ("glm4_moe", "deepseek_v2", "deepseek_v3"),
    "n_group": ("glm4_moe", "deepseek_v3"),
    "topk_group": ("glm4_moe", "deepseek_v3"),
}


def _first_k(cfg):
    k = cfg.first_k_dense_replace
    return [i >= k for i in range(cfg.num_hidden_layers)]


def _sparse_step(cfg):
    only = cfg.mlp_only_layers or []
    return [i not in only and (i + 1) % cfg.decoder_sparse_step == 0 for i in range(cfg.num_hidden_layers)]


# which layers are MoE, as the modeling code decides
MOE_PATTERN = {"glm4_moe": _first_k, "deepseek_v2": _first_k, "deepseek_v3": _first_k,
               "qwen2_moe": _sparse_step, "qwen3_moe": _sparse_step}


def described(name, cfg):
    """The values moerun's parser must give for cfg."""
    L = cfg.num_hidden_layers
    rp = getattr(cfg, "rope_parameters", None) or {}
    theta = rp.get("rope_theta", getattr(cfg, "rope_theta", None))
    win = getattr(cfg, "sliding_window", None) or 0
    if name in LAYER_TYPES:
        types = getattr(cfg, "layer_types", None) or ["full_attention"] * L
        sliding = [t == "sliding_attention" and win > 0 for t in types]
    elif name in WINDOW_ALL:
        sliding = [win > 0] * L
    else:
        sliding = [False] * L
    out = {
        "rope_theta": float(theta),
        "rms_eps": float(cfg.rms_norm_eps),
        "max_pos": int(cfg.max_position_embeddings),
        "tie": bool(cfg.tie_word_embeddings),
        "sliding": sliding,
        "sliding_window": int(win) if any(sliding) else 0,
    }
    for key, field in (("norm_topk_prob", "norm_topk"), ("routed_scaling_factor", "routed_scale"),
                       ("n_group", "n_group"), ("topk_group", "topk_group")):
        v = getattr(cfg, key, None)
        if v is not None and name in ROUTING_KEYS.get(key, ()):
            out[field] = v
    if name in MOE_PATTERN:
        out["moe_layers"] = MOE_PATTERN[name](cfg)
    # keys transformers leaves None: moerun may require them
    out["none"] = sorted(key for key in KEYS if hasattr(cfg, key) and getattr(cfg, key) is None)
    k = getattr(cfg, "num_experts_per_tok", None)
    if k is not None:
        out["top_k"] = int(k)
    return out


def read(d):
    with tempfile.TemporaryDirectory() as tmp:
        with open(os.path.join(tmp, "config.json"), "w") as f:
            json.dump(d, f)
        return AutoConfig.from_pretrained(tmp)


def main():
    cases = []
    for name in FAMILIES:
        with open(os.path.join(FIXTURES, name, "config.json")) as f:
            base = json.load(f)
        variants = [("as written", {}, [])]
        if name in LAYER_TYPES | WINDOW_ALL and name != "gpt_oss":
            variants.append(("window on", {"use_sliding_window": True, "sliding_window": 8,
                                           "max_window_layers": 1}, ["layer_types"]))
        for vname, sets, removes in variants:
            v = {k: x for k, x in base.items() if k not in removes}
            v.update(sets)
            cases.append({"fixture": name, "what": vname, "set": sets, "remove": removes,
                          "expect": described(name, read(v))})
            for key in KEYS:
                if key not in v:
                    continue
                d = {k: x for k, x in v.items() if k != key}
                cases.append({"fixture": name, "what": f"{vname}, without {key}", "set": sets,
                              "remove": removes + [key], "expect": described(name, read(d))})
    out = {"transformers": transformers.__version__, "keys": KEYS, "cases": cases}
    path = os.path.join(FIXTURES, "config_defaults.json")
    with open(path, "w") as f:
        json.dump(out, f, indent=1, sort_keys=True)
        f.write("\n")
    print(f"{path}: {len(cases)} cases")


if __name__ == "__main__":
    main()
