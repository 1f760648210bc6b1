#!/usr/bin/env python3
"""Tiny fp8 checkpoints (quantization_config quant_method "fp8",
weight_block_size [128, 128]: the DeepSeek-V3 / Qwen3-FP8 format) and their
reference outputs, for moerun's forward tests.

For each spec below this script
  * builds a tiny random model with transformers (fixed seed; shapes of 128
    and 256 so weights span several 128 x 128 blocks, and a kv_a_proj_with_mqa
    of 160 rows, whose last row group is short, as DeepSeek-V3's 576 rows),
  * saves it, then rewrites every Linear weight (`*_proj.weight`,
    `*_proj_with_mqa.weight`) as the released checkpoints store it:
    `*.weight` float8_e4m3fn plus `*.weight_scale_inv` F32
    (ceil(N/128), ceil(K/128)), scale = amax / 448 per block; routers,
    norms, embeddings and the LM head as BF16, the router's choice bias F32;
    config.json gains the quantization_config of DeepSeek-V3's release,
  * loads that folder with transformers' from_pretrained(dtype=float32): on
    a CPU transformers dequantizes FP8 itself (Fp8Dequantize), and that model
    is the reference; its weights are checked against an independent
    dequantization (q.float() * scale over 128 x 128 blocks),
  * records logits, routed expert ids and 32 greedy tokens with
    fixture_common.reference_outputs, under the seed rules of make_fixtures.py.

transformers' CPU dequantization divides N evenly by the scale grid (160
rows in 2 groups: 80 + 80) where the format (DeepSeek's weight_dequant, and
transformers' own FP8Linear) groups rows by 128 (128 + 32).  Both readings
agree when a tensor's row groups share their scales, so a tensor whose N
is above 128 and not a multiple of it gets one scale per column block
(the largest of its row groups'); tests/test_quant_fp8.c checks the 128-row
grouping itself against transformers' _dequantize_fp8_weight.

The checkpoints are written per expert (`mlp.experts.{e}.gate_proj.weight`),
as released; transformers 5.24 does not dequantize a stacked fp8 layout
(`mlp.experts.gate_up_proj` + `gate_up_proj_scale_inv`) on a CPU, so the
stacked layout is tested in C by restacking these tensors.

Python is only a fixture-making tool.
Usage: python tests/reference/make_fp8_fixtures.py [--only qwen3_moe_fp8,deepseek_v3_fp8]
"""
import argparse
import os
import shutil
import sys
import tempfile

import torch
from safetensors.torch import load_file, save_file

import transformers
from transformers import DeepseekV3Config, DeepseekV3ForCausalLM, Qwen3MoeConfig, Qwen3MoeForCausalLM

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from fixture_common import (COMMON, GREEDY_TOKENS, MAX_SEED_TRIES, MLA_COMMON, MOE,  # noqa: E402
                            check_default_experts, check_stats, install_fixture, load,
                            make_prompts, randomize_router_bias, reference_outputs, tensor_index,
                            tensor_sizes, update_json, write_reference)

FP8 = torch.float8_e4m3fn
FP8_MAX = 448.0
BLOCK = 128
QUANT_CONFIG = {"activation_scheme": "dynamic", "fmt": "e4m3", "quant_method": "fp8",
                "weight_block_size": [BLOCK, BLOCK]}
WIDE = dict(hidden_size=256)


def fixture_specs():
    return {
        # attention q (128, 256), k/v (64, 256), o (256, 128); 8 experts of
        # (128, 256) / (256, 128); layer 1 a dense FFN of width 128
        "qwen3_moe_fp8": dict(
            cls=Qwen3MoeForCausalLM,
            config=lambda: Qwen3MoeConfig(
                **{**COMMON, **WIDE, "head_dim": 32}, **MOE, num_hidden_layers=2, num_experts=8,
                moe_intermediate_size=128, intermediate_size=128, norm_topk_prob=True,
                decoder_sparse_step=1, mlp_only_layers=[1], attention_bias=False,
                use_sliding_window=False, tie_word_embeddings=False),
            seed=23000,
        ),
        # MLA with the q LoRA: q_a (128, 256), q_b (256, 128), kv_a (160, 256),
        # kv_b (256, 128), o (256, 128); layer 0 dense, layer 1 8 experts in 4
        # groups (2 eligible), top-3, a shared expert
        "deepseek_v3_fp8": dict(
            cls=DeepseekV3ForCausalLM,
            config=lambda: DeepseekV3Config(
                **{**MLA_COMMON, **WIDE}, num_hidden_layers=2, intermediate_size=128,
                moe_intermediate_size=128, n_routed_experts=8, num_experts_per_tok=3,
                n_shared_experts=1, first_k_dense_replace=1, n_group=4, topk_group=2,
                routed_scaling_factor=2.5, norm_topk_prob=True, q_lora_rank=128, kv_lora_rank=128,
                qk_nope_head_dim=32, qk_rope_head_dim=32, v_head_dim=32, rope_interleave=True,
                rope_parameters={"rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0,
                                 "original_max_position_embeddings": 64, "beta_fast": 32,
                                 "beta_slow": 1, "mscale": 1.0, "mscale_all_dim": 1.0},
                tie_word_embeddings=False),
            seed=24000, router_bias_range=0.3,
        ),
    }


def is_linear(name):
    return name.endswith(("_proj.weight", "_proj_with_mqa.weight"))


def quantize(w):
    """(N, K) float -> (q float8_e4m3fn (N, K), scale_inv F32 (ceil(N/128), ceil(K/128))),
    scale = amax / 448 per block (1 for an all-zero block).  Above 128 rows and
    not a multiple of 128, every row group of a column block takes the
    largest of their scales (see the module comment)."""
    N, K = w.shape
    nb, kb = -(-N // BLOCK), -(-K // BLOCK)
    w = w.float()
    amax = torch.zeros(nb, kb)
    for i in range(nb):
        for j in range(kb):
            amax[i, j] = w[i * BLOCK:(i + 1) * BLOCK, j * BLOCK:(j + 1) * BLOCK].abs().max()
    if N > BLOCK and N % BLOCK:
        amax = amax.max(dim=0, keepdim=True).values.expand(nb, kb).clone()
    s = torch.where(amax > 0, amax / FP8_MAX, torch.ones_like(amax))
    full = s.repeat_interleave(BLOCK, 0)[:N].repeat_interleave(BLOCK, 1)[:, :K]
    q = (w / full).clamp(-FP8_MAX, FP8_MAX).to(FP8)
    return q.contiguous(), s.contiguous()


def dequantize(q, s):
    """The format's reading: row groups and column blocks of 128."""
    N, K = q.shape
    return q.float() * s.repeat_interleave(BLOCK, 0)[:N].repeat_interleave(BLOCK, 1)[:, :K]


def write_fp8(src, dst):
    """dst = the checkpoint in src with every Linear weight as FP8 and the
    rest as BF16 (F32 choice biases); returns {name: dequantized value}."""
    shutil.copytree(src, dst)
    files = [f for f in os.listdir(dst) if f.endswith(".safetensors")]
    assert files == ["model.safetensors"], files
    fn = os.path.join(dst, "model.safetensors")
    t = load_file(fn)
    out, values = {}, {}
    for k, v in sorted(t.items()):
        if is_linear(k):
            q, s = quantize(v)
            out[k], out[k[:-len("weight")] + "weight_scale_inv"] = q, s
            values[k] = dequantize(q, s)
        elif k.endswith("e_score_correction_bias"):
            out[k] = values[k] = v.float()
        else:
            out[k] = v.to(torch.bfloat16)
            values[k] = out[k].float()
    save_file(out, fn, metadata={"format": "pt"})

    def fp8_config(cfg):
        cfg["quantization_config"] = QUANT_CONFIG
        cfg.pop("dtype", None)
        cfg["torch_dtype"] = "bfloat16"
    update_json(os.path.join(dst, "config.json"), fp8_config)
    return values


def check_weights(model, values):
    """transformers' dequantized model holds exactly the values of the format."""
    sd = model.state_dict()
    seen = 0
    for k, v in values.items():
        if ".experts." in k and k.split(".experts.")[1].split(".")[0].isdigit():
            layer, rest = k.split(".experts.")
            e, proj = rest.split(".")[0], rest.split(".")[1]
            e = int(e)
            if proj == "down_proj":
                got = sd[f"{layer}.experts.down_proj"][e]
            else:
                gu = sd[f"{layer}.experts.gate_up_proj"][e]
                half = gu.shape[0] // 2
                got = gu[:half] if proj == "gate_proj" else gu[half:]
        else:
            got = sd[k]
        assert got.dtype == torch.float32, (k, got.dtype)
        assert torch.equal(got, v), f"{k}: transformers' weights differ from the format's by " \
                                    f"{float((got - v).abs().max())}"
        seen += 1
    return seen


def make_fixture(name, spec, prompts):
    last_err = None
    for seed in range(spec["seed"], spec["seed"] + MAX_SEED_TRIES):
        torch.manual_seed(seed)
        cfg = spec["config"]()
        model = spec["cls"](cfg).eval()
        randomize_router_bias(model, spec)
        tmp = tempfile.mkdtemp(prefix=f"fx_{name}_")
        try:
            src, dst = os.path.join(tmp, "src"), os.path.join(tmp, "fp8")
            model.save_pretrained(src)
            values = write_fp8(src, dst)
            ref_model = load(dst, torch.float32)
            n = check_weights(ref_model, values)
            tensors, stats = reference_outputs(ref_model, prompts)
            bad = check_stats(stats)
            if bad:
                print(f"  {name}: seed {seed} rejected ({bad})", flush=True)
                last_err = bad
                continue
            # transformers' default experts implementation agrees with the eager loop
            default_experts = check_default_experts(name, dst, prompts, tensors, stats)
            ref = {
                "family": cfg.model_type,
                "architecture": type(model).__name__,
                "seed": seed,
                "dtype": "fp8 (F8_E4M3 Linear weights, F32 block scales; BF16 elsewhere)",
                "quantization_config": QUANT_CONFIG,
                "weights_checked": n,
                "n_prompts": len(prompts),
                "greedy_tokens": GREEDY_TOKENS,
                "min_logit_margin": stats["min_logit_margin"],
                "min_route_margin": stats["min_route_margin"],
                "expert_layout": "per_expert",
                "experts_used_per_layer": stats["experts_used"],
                "kv_cache_max_rel_diff": stats["kv_rel"],
                "attn_implementation": "eager",
                "experts_implementation": "eager",
                "default_experts_implementation_matches": default_experts,
                "max_abs_logit": stats["logit_absmax"],
                "transformers_version": transformers.__version__,
                "torch_version": torch.__version__.split("+")[0],
                "tensors": tensor_index(tensors),
            }
            write_reference(dst, tensors, ref)
            out = install_fixture(dst, name)
            print(f"{name}: seed {seed}, {n} weights as transformers dequantizes them, logit margin "
                  f"{stats['min_logit_margin']:.4g}, route margin {stats['min_route_margin']}, "
                  f"size {tensor_sizes(out)} B", flush=True)
            return
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    raise RuntimeError(f"{name}: no acceptable seed ({last_err})")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--only", default="")
    args = ap.parse_args()
    only = [s for s in args.only.split(",") if s]
    prompts = make_prompts()
    for name, spec in fixture_specs().items():
        if not only or name in only:
            make_fixture(name, spec, prompts)


if __name__ == "__main__":
    sys.exit(main())
