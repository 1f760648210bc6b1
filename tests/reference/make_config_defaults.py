#!/usr/bin/env python3
"""Build tests/fixtures/config_defaults.json: what transformers makes of a
configuration that leaves a key out, for each family moerun reads.

For every fixture family (tests/fixtures/<name>/config.json) and every key
of KEYS its config holds, the config is written again without that key (and, for the families with sliding-window switches, with
the window turned on and the layer pattern left to the config class; for
Llama-4, with its per-layer lists left to the config class; for Qwen3-Next
and Qwen3.5-MoE, with its layer pattern left to full_attention_interval, and
with the keys whose defaults the fixture holds set otherwise; for
GLM-MoE-DSA, with its indexer layers left to the index_topk_freq schedule,
and with every indexer key and the MLP pattern left out; for a
multimodal fixture of TEXT_CONFIG, the keys removed from its text_config), read
back with transformers' AutoConfig, and the values moerun's parsed model
description must hold are recorded (each case: the fixture, the keys set
and removed, the values): experts per token, RoPE theta, RMSNorm
epsilon, context length, tied embeddings, the sliding window and which
layers use it, the routing switches (renormalisation, scaling factor,
expert groups) and which layers are MoE (as each family's modeling code
decides), and the shapes the modeling code builds from the config (read
off a model instantiated on the meta device, so the modeling code, not
this script, says what a key means): head dimension, KV heads, rotated
dimensions, the attention and MLP biases, expert, shared-expert and dense
FFN widths, the latent-attention dimensions, gpt-oss's activation limit,
Llama-4's layers without RoPE, chunked layers, q/k L2 norm and
attention temperature, and Qwen3-Next's and Qwen3.5-MoE's gated attention
output, which layers are linear attention (Gated DeltaNet) and its heads,
head widths and convolution width, and GLM-MoE-DSA's sparse-attention
indexer (top-k, heads, head width, which layers run one) (Qwen3.5-MoE's
router, which reads no norm_topk_prob, is run to tell whether it
renormalises).  A configuration transformers cannot build a model from (or
whose model cannot run: KV or key heads that do not divide the query or
value heads, more experts per token than experts, an indexer head narrower
than its rotated part) is recorded as such (moerun must refuse it too).  The C test
(tests/test_config_defaults.c) removes the same keys and compares.

Python is only a fixture-making tool; nothing in the runtime or build needs it.

Usage: python tests/reference/make_config_defaults.py
"""
import copy
import json
import os
import tempfile

import torch
import transformers
from transformers import AutoConfig, AutoModelForCausalLM, AutoModelForImageTextToText

transformers.logging.set_verbosity_error()

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
FIXTURES = os.path.join(REPO, "tests", "fixtures")

FAMILIES = ["mixtral", "qwen2_moe", "qwen3_moe", "olmoe", "glm4_moe", "deepseek_v2", "deepseek_v3",
            "gpt_oss", "granitemoe", "granitemoeshared", "llama", "qwen2", "qwen3", "granite", "minimax_m2",
            "llama4", "qwen3_next", "qwen3_5_moe", "qwen3_5_moe_multimodal", "glm_moe_dsa"]
KEYS = ["num_experts_per_tok", "rope_parameters", "rope_theta", "rms_norm_eps", "max_position_embeddings",
        "tie_word_embeddings", "use_sliding_window", "sliding_window", "max_window_layers", "layer_types",
        "norm_topk_prob", "routed_scaling_factor", "n_group", "topk_group", "first_k_dense_replace",
        "decoder_sparse_step", "mlp_only_layers",
        "head_dim", "num_key_value_heads", "partial_rotary_factor", "rotary_dim", "attention_bias", "mlp_bias",
        "intermediate_size", "moe_intermediate_size", "shared_expert_intermediate_size", "n_shared_experts",
        "kv_lora_rank", "q_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim", "swiglu_limit",
        "no_rope_layers", "no_rope_layer_interval", "attention_chunk_size", "use_qk_norm",
        "attn_temperature_tuning", "floor_scale", "attn_scale", "interleave_moe_layer_step", "moe_layers",
        "intermediate_size_mlp", "linear_num_key_heads", "linear_num_value_heads", "linear_key_head_dim",
        "linear_value_head_dim", "linear_conv_kernel_dim"]
# families whose layers follow config.layer_types (the others: every layer
# takes config.sliding_window when it is set, or none does)
LAYER_TYPES = {"qwen2", "qwen2_moe", "qwen3", "gpt_oss"}
WINDOW_ALL = {"mixtral", "qwen3_moe"}


# the families whose modeling code reads these routing keys
ROUTING_KEYS = {
    "norm_topk_prob": ("qwen2_moe", "qwen3_moe", "olmoe", "glm4_moe", "deepseek_v3", "qwen3_next", "glm_moe_dsa"),
    "routed_scaling_factor": ("glm4_moe", "deepseek_v2", "deepseek_v3", "glm_moe_dsa"),
    "n_group": ("glm4_moe", "deepseek_v3", "glm_moe_dsa"),
    "topk_group": ("glm4_moe", "deepseek_v3", "glm_moe_dsa"),
}


def _first_k(cfg):
    k = cfg.first_k_dense_replace
    return [i >= k for i in range(cfg.num_hidden_layers)]


def _sparse_step(cfg):
    only = cfg.mlp_only_layers or []
    return [i not in only and (i + 1) % cfg.decoder_sparse_step == 0 for i in range(cfg.num_hidden_layers)]


def _llama4_moe(cfg):
    return [i in cfg.moe_layers for i in range(cfg.num_hidden_layers)]


def _every_layer(cfg):  # Qwen3.5-MoE: a sparse MoE block in every decoder layer
    return [True] * cfg.num_hidden_layers


def _mlp_types(cfg):  # GLM-MoE-DSA: mlp_layer_types (derived from first_k_dense_replace when absent)
    return [t == "sparse" for t in cfg.mlp_layer_types]


# which layers are MoE, as the modeling code decides
MOE_PATTERN = {"glm4_moe": _first_k, "deepseek_v2": _first_k, "deepseek_v3": _first_k,
               "qwen2_moe": _sparse_step, "qwen3_moe": _sparse_step, "qwen3_next": _sparse_step,
               "llama4": _llama4_moe, "qwen3_5_moe": _every_layer, "glm_moe_dsa": _mlp_types}
# families with linear-attention (Gated DeltaNet) layers, chosen by config.layer_types
LINEAR = {"qwen3_next", "qwen3_5_moe"}
# families whose router reads no norm_topk_prob: whether it renormalises the K
# weights chosen is read off the router itself (renormalised()), not the config
ROUTER_RENORM = {"qwen3_5_moe"}
# multimodal fixtures whose text model is a family's: its keys in text_config (the
# keys are removed there), the model the image-text-to-text class builds
TEXT_CONFIG = {"qwen3_5_moe_multimodal": "qwen3_5_moe"}
# the model types whose attention gates its output (q_proj gives queries and gates)
GATED_ATTN = {"qwen3_next", "qwen3_5_moe_text"}


def described(name, cfg):
    """The values moerun's parser must give for cfg."""
    if name in TEXT_CONFIG:  # a multimodal config: its text model's values; the model ties embeddings
        # as the outer config (not text_config) says, read off the model the image-text-to-text class builds
        top, name, cfg = cfg, TEXT_CONFIG[name], cfg.get_text_config()
        out = described(name, cfg)
        try:
            m, dec = build(top)
            out["tie"] = m.lm_head.weight is dec.embed_tokens.weight
            out["shapes"] = shapes(cfg, top)
        except Exception as e:
            out["shapes"] = {"error": f"{type(e).__name__}: {e}"[:200]}
        return out
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
    if name in ROUTER_RENORM:
        out["norm_topk"] = renormalised(cfg)
    if name in MOE_PATTERN:
        out["moe_layers"] = MOE_PATTERN[name](cfg)
    if name in LINEAR:
        out["layer_linear"] = [t == "linear_attention" for t in cfg.layer_types]
    # keys transformers leaves None: moerun may require them
    out["none"] = sorted(key for key in KEYS if hasattr(cfg, key) and getattr(cfg, key) is None)
    k = getattr(cfg, "num_experts_per_tok", None)
    if k is not None:
        out["top_k"] = int(k)
    try:
        out["shapes"] = shapes(cfg)
    except Exception as e:  # transformers cannot build this model: moerun must refuse it too
        out["shapes"] = {"error": f"{type(e).__name__}: {e}"[:200]}
    return out


def renormalised(cfg):
    """Whether the modeling code's router renormalises the K weights it
    chooses: one router built on the CPU, its weights random, run on a few
    tokens; renormalised weights sum to 1 (with K < E the softmax's K largest
    alone do not)."""
    with torch.device("meta"):
        m = AutoModelForCausalLM.from_config(cfg)
    gate = next(layer.mlp.gate for layer in m.model.layers if hasattr(getattr(layer, "mlp", None), "gate"))
    router = type(gate)(cfg)
    torch.manual_seed(0)
    torch.nn.init.normal_(router.weight)
    _, weights, _ = router(torch.randn(4, cfg.hidden_size))
    return bool(torch.allclose(weights.sum(-1), torch.ones(4)))


def build(top):
    """The model top describes, on the meta device, and its decoder (a
    multimodal model's text model)."""
    with torch.device("meta"):
        if top.get_text_config() is top:
            m = AutoModelForCausalLM.from_config(top)
            return m, m.model
        m = AutoModelForImageTextToText.from_config(top)
        return m, m.model.language_model


def shapes(cfg, top=None):
    """What the modeling code builds from cfg (the text config of top, if
    given): a model on the meta device."""
    m, dec = build(top or cfg)
    H = cfg.num_attention_heads
    out = {}
    layers = dec.layers
    # the first attention layer (Qwen3-Next's layer 0 may be linear attention, without self_attn)
    a = next((layer.self_attn for layer in layers if hasattr(layer, "self_attn")), None)
    lin = [layer.linear_attn for layer in layers if hasattr(layer, "linear_attn")]
    if lin:  # Gated DeltaNet: its geometry, and which layers have it
        g = lin[0]
        if g.num_v_heads % g.num_k_heads:  # the q/k heads cannot be shared among the value heads
            raise ValueError(f"{g.num_v_heads} value heads are not a multiple of {g.num_k_heads} key heads")
        out["linear_attn"] = dict(k_heads=g.num_k_heads, v_heads=g.num_v_heads, k_dim=g.head_k_dim,
                                  v_dim=g.head_v_dim, conv=g.conv_kernel_size,
                                  layers=[hasattr(layer, "linear_attn") for layer in layers])
    ixl = [getattr(getattr(layer, "self_attn", None), "indexer", None) for layer in layers]
    ix = [x for x in ixl if x is not None]
    if ix:  # DeepSeek sparse attention: the indexer's geometry, which layers have one (GLM-MoE-DSA's
        # "shared" layers have none); a rotary part wider than its head cannot run (torch.split fails)
        if ix[0].qk_rope_head_dim > ix[0].head_dim:
            raise ValueError(f"index_head_dim {ix[0].head_dim} is below qk_rope_head_dim {ix[0].qk_rope_head_dim}")
        out["dsa"] = dict(topk=ix[0].index_topk, heads=ix[0].n_heads, dim=ix[0].head_dim,
                          full=[x is not None for x in ixl])
    if a is None:
        pass
    elif hasattr(a, "kv_a_proj_with_mqa"):  # latent attention
        R = a.kv_a_layernorm.weight.shape[0]
        rope = a.kv_a_proj_with_mqa.out_features - R
        qa = getattr(a, "q_a_proj", None)
        q = a.q_b_proj if qa is not None else a.q_proj
        out.update(kv_lora_rank=R, q_lora_rank=qa.out_features if qa is not None else 0,
                   rope_dim=rope, qk_nope_dim=q.out_features // H - rope, v_head_dim=a.o_proj.in_features // H)
    else:
        # Qwen3-Next: q_proj gives each head's queries and an output gate (2 Dh values); o_proj reads H Dh
        gate = cfg.model_type in GATED_ATTN
        if gate:
            assert a.q_proj.out_features == 2 * a.o_proj.in_features
            out["attn_out_gate"] = True
        dh = a.q_proj.out_features // (2 * H if gate else H)
        if H % (a.k_proj.out_features // dh):  # repeat_kv cannot share KV heads among the query heads
            raise ValueError(f"{H} query heads are not a multiple of {a.k_proj.out_features // dh} KV heads")
        out.update(head_dim=dh, n_kv_heads=a.k_proj.out_features // dh, qk_norm=hasattr(a, "q_norm"),
                   qkv_bias=a.q_proj.bias is not None, o_bias=a.o_proj.bias is not None,
                   rope_dim=2 * dec.rotary_emb.inv_freq.shape[0])
    D = cfg.hidden_size
    if hasattr(a, "use_rope"):  # Llama-4: per layer, as its attention modules hold them
        att = [layer.self_attn for layer in layers]
        types = cfg.layer_types
        out["llama4"] = dict(nope=[not x.use_rope for x in att],
                             chunked=[t == "chunked_attention" for t in types],
                             chunk=cfg.attention_chunk_size or 0,
                             qk_l2=any(hasattr(x, "qk_norm") for x in att),
                             temp_floor=att[0].floor_scale if att[0].attn_temperature_tuning else 0,
                             temp_scale=float(att[0].attn_scale))
    for layer in layers:
        mlp = (getattr(layer, "mlp", None) or getattr(layer, "block_sparse_moe", None)
               or getattr(layer, "feed_forward", None))
        x = getattr(mlp, "experts", None)
        if x is not None and "d_expert" not in out:
            r = getattr(mlp, "gate", None)
            k, n = getattr(r, "top_k", None), getattr(r, "num_experts", None)
            if isinstance(k, int) and isinstance(n, int) and k > n:  # the router's topk cannot choose them
                raise ValueError(f"{k} experts per token exceed the {n} experts")
            gu = x.gate_up_proj.shape  # (E, 2F, D), or (E, D, 2F) (gpt-oss)
            out["d_expert"] = (gu[2] if gu[1] == D else gu[1]) // 2
            if hasattr(x, "limit"):
                out["swiglu_limit"] = float(x.limit)
            sh = getattr(mlp, "shared_expert", None) or getattr(mlp, "shared_experts", None)
            if sh is not None:
                out["d_shared"] = sh.gate_proj.out_features
            elif hasattr(layer, "shared_mlp"):
                out["d_shared"] = layer.shared_mlp.input_linear.out_features // 2
        elif x is None and hasattr(mlp, "gate_proj") and "d_ff" not in out:
            out["d_ff"] = mlp.gate_proj.out_features
            out["mlp_bias"] = mlp.gate_proj.bias is not None
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
        within = "text_config" if name in TEXT_CONFIG else None  # where the keys are set and removed
        variants = [("as written", {}, [])]
        if name in LAYER_TYPES | WINDOW_ALL and name != "gpt_oss":
            variants.append(("window on", {"use_sliding_window": True, "sliding_window": 8,
                                           "max_window_layers": 1}, ["layer_types"]))
        if name == "qwen3_next":  # the layer pattern left to full_attention_interval (default 4, or set);
            # and, the fixture holding their defaults, keys set otherwise so that removing them tells
            variants.append(("layer pattern from the interval", {}, ["layer_types"]))
            variants.append(("full_attention_interval 2, convolution 3, no renormalisation",
                             {"full_attention_interval": 2, "linear_conv_kernel_dim": 3, "norm_topk_prob": False},
                             ["layer_types"]))
        if name == "qwen3_5_moe":  # as Qwen3-Next (the interval's default, 4, makes all 3 layers linear);
            # the keys whose defaults the fixture holds set otherwise (RoPE's theta and partial factor
            # in rope_parameters); norm_topk_prob, which Qwen3_5MoeTextConfig has not, changes nothing
            variants.append(("layer pattern from the interval", {}, ["layer_types"]))
            variants.append(("full_attention_interval 2, convolution 3, other defaults",
                             {"full_attention_interval": 2, "linear_conv_kernel_dim": 3, "num_key_value_heads": 1,
                              "rms_norm_eps": 1e-5, "tie_word_embeddings": True, "attention_bias": True,
                              "rope_parameters": {"mrope_section": [2, 1, 1], "partial_rotary_factor": 0.5,
                                                  "rope_theta": 500000.0, "rope_type": "default"},
                              "norm_topk_prob": False},
                             ["layer_types"]))
        if name == "glm_moe_dsa":  # the indexer's layers left to the schedule (freq 2, offset 2: full,
            # full, shared, full), and every indexer key (and the MLP pattern) left to the config class
            variants.append(("indexer layers from the schedule", {"index_topk_freq": 2, "index_skip_topk_offset": 2},
                             ["indexer_types", "index_topk_pattern"]))
            variants.append(("indexer defaults", {}, ["indexer_types", "index_topk_pattern", "index_topk",
                                                     "index_n_heads", "index_head_dim", "mlp_layer_types"]))
        if name == "llama4":  # the layer lists left to the intervals and the chunk size
            variants.append(("layer pattern from the intervals", {},
                             ["no_rope_layers", "layer_types", "moe_layers"]))
        for vname, sets, removes in variants:
            v = {k: x for k, x in (base[within] if within else base).items() if k not in removes}
            v.update(sets)
            whole = (lambda t: dict(base, **{within: t})) if within else (lambda t: t)
            where = {"within": within} if within else {}
            cases.append({"fixture": name, "what": vname, "set": sets, "remove": removes, **where,
                          "expect": described(name, read(whole(v)))})
            for key in KEYS:
                if key not in v:
                    continue
                d = {k: x for k, x in v.items() if k != key}
                cases.append({"fixture": name, "what": f"{vname}, without {key}", "set": sets,
                              "remove": removes + [key], **where, "expect": described(name, read(whole(d)))})
    out = {"transformers": transformers.__version__, "keys": KEYS, "cases": cases}
    path = os.path.join(FIXTURES, "config_defaults.json")
    with open(path, "w") as f:
        json.dump(out, f, indent=1, sort_keys=True)
        f.write("\n")
    print(f"{path}: {len(cases)} cases")


if __name__ == "__main__":
    main()
