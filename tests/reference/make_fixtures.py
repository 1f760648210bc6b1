#!/usr/bin/env python3
"""Build the tiny reference models and reference outputs used by moerun's tests.

Python is only a fixture-making tool; nothing in the runtime or build needs it.

For every fixture model this script:
  * builds a tiny random model with transformers (fixed seed, large init std so
    logits and router scores are decisive),
  * saves it with save_pretrained into tests/fixtures/<name>/,
  * reloads the saved folder with from_pretrained (fp32 compute, eager attention)
    and records reference outputs into tests/fixtures/<name>/reference.safetensors
    plus tests/fixtures/<name>/reference.json.
A seed is accepted only if every greedy step has a top1-top2 logit gap >= 1e-3,
every routing decision has a K-th vs (K+1)-th router probability gap >= 1e-5,
and routing is not degenerate (for DeepSeek-V3.2 and GLM-MoE-DSA, index_margin: no near-tie
at the sparse-attention indexer's top-k cut either); otherwise the next seed
is tried.

models/demo-moe is made by models/make_demo_model.py (a trained model).

Usage: python tests/reference/make_fixtures.py [--only name,name] [--skip-demo]
"""
import argparse
import os
import shutil
import sys
import tempfile

import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file

import transformers
from transformers import (
    DeepseekV2Config,
    DeepseekV2ForCausalLM,
    DeepseekV3Config,
    DeepseekV3ForCausalLM,
    DeepseekV32Config,
    DeepseekV32ForCausalLM,
    Glm4MoeConfig,
    Glm4MoeForCausalLM,
    GlmMoeDsaConfig,
    GlmMoeDsaForCausalLM,
    GptOssConfig,
    GptOssForCausalLM,
    GraniteConfig,
    GraniteForCausalLM,
    GraniteMoeConfig,
    GraniteMoeForCausalLM,
    GraniteMoeSharedConfig,
    GraniteMoeSharedForCausalLM,
    LlamaConfig,
    Llama4ForCausalLM,
    Llama4TextConfig,
    LlamaForCausalLM,
    MiniMaxM2Config,
    MiniMaxM2ForCausalLM,
    MixtralConfig,
    MixtralForCausalLM,
    OlmoeConfig,
    OlmoeForCausalLM,
    Qwen2Config,
    Qwen2ForCausalLM,
    Qwen2MoeConfig,
    Qwen2MoeForCausalLM,
    Qwen3Config,
    Qwen3ForCausalLM,
    Qwen3MoeConfig,
    Qwen3MoeForCausalLM,
    Qwen3NextConfig,
    Qwen3NextForCausalLM,
    Qwen3_5MoeForCausalLM,
    Qwen3_5MoeTextConfig,
)

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from fixture_common import (COMMON, FIXTURES, GREEDY_TOKENS, INIT_STD, MAX_SEED_TRIES,  # noqa: E402
                            MLA_COMMON, MOE, REPO, RouterRecorder, check_default_experts,
                            check_stats, install_fixture, load, make_prompts, moe_layout,
                            randomize_router_bias, reference_outputs, tensor_index, tensor_sizes,
                            update_json, write_reference)

DEMO_DIR = os.path.join(REPO, "models", "demo-moe")


def fixture_specs():
    """name -> dict(cls, config factory, base seed, dtype, extra options)."""
    return {
        "mixtral": dict(
            cls=MixtralForCausalLM,
            config=lambda: MixtralConfig(
                **COMMON, **MOE, num_hidden_layers=2, num_local_experts=8,
                intermediate_size=32, sliding_window=None, tie_word_embeddings=False),
            seed=1000, dtype="float32",
            # save_pretrained writes per-expert tensors; this fixture is rewritten
            # into the stacked layout (see restack_experts) so both layouts exist.
            layout="stacked",
        ),
        "qwen2_moe": dict(
            cls=Qwen2MoeForCausalLM,
            config=lambda: Qwen2MoeConfig(
                **COMMON, **MOE, num_hidden_layers=3, num_experts=8,
                moe_intermediate_size=32, shared_expert_intermediate_size=48,
                intermediate_size=96, mlp_only_layers=[1], decoder_sparse_step=1,
                norm_topk_prob=False, qkv_bias=True, use_sliding_window=False,
                tie_word_embeddings=False),
            seed=2000, dtype="float32",
        ),
        "qwen3_moe": dict(
            cls=Qwen3MoeForCausalLM,
            config=lambda: Qwen3MoeConfig(
                **COMMON, **MOE, num_hidden_layers=2, num_experts=8,
                moe_intermediate_size=32, intermediate_size=96, norm_topk_prob=True,
                decoder_sparse_step=1, mlp_only_layers=[], attention_bias=False,
                use_sliding_window=False, tie_word_embeddings=False),
            seed=3000, dtype="float32", max_shard_size="300KB",
        ),
        "olmoe": dict(
            cls=OlmoeForCausalLM,
            config=lambda: OlmoeConfig(
                **COMMON, **MOE, num_hidden_layers=2, num_experts=8,
                intermediate_size=32, norm_topk_prob=False, clip_qkv=None,
                attention_bias=False, tie_word_embeddings=False),
            seed=4000, dtype="bfloat16",
        ),
        "glm4_moe": dict(
            cls=Glm4MoeForCausalLM,
            config=lambda: Glm4MoeConfig(
                **COMMON, num_hidden_layers=3, intermediate_size=96, moe_intermediate_size=32,
                n_routed_experts=16, num_experts_per_tok=3, n_shared_experts=1,
                first_k_dense_replace=1, n_group=4, topk_group=2, routed_scaling_factor=2.5,
                norm_topk_prob=True, use_qk_norm=True, attention_bias=True,
                partial_rotary_factor=0.5, tie_word_embeddings=False),
            seed=8000, dtype="float32",
            # transformers initialises e_score_correction_bias to zeros; a
            # random one makes the choice differ from the weighting
            router_bias_range=0.3,
        ),
        # Granite's four multipliers, none of them 1
        "granitemoe": dict(
            cls=GraniteMoeForCausalLM,
            config=lambda: GraniteMoeConfig(
                **COMMON, **MOE, num_hidden_layers=2, num_local_experts=8, intermediate_size=32,
                embedding_multiplier=3.0, residual_multiplier=0.5, attention_multiplier=0.2,
                logits_scaling=2.5, tie_word_embeddings=True),
            seed=9000, dtype="float32",
        ),
        "granitemoeshared": dict(
            cls=GraniteMoeSharedForCausalLM,
            config=lambda: GraniteMoeSharedConfig(
                **COMMON, **MOE, num_hidden_layers=2, num_local_experts=8, intermediate_size=32,
                shared_intermediate_size=48, embedding_multiplier=3.0, residual_multiplier=0.5,
                attention_multiplier=0.2, logits_scaling=2.5, tie_word_embeddings=False),
            seed=10000, dtype="bfloat16",
        ),
        "granite": dict(
            cls=GraniteForCausalLM,
            config=lambda: GraniteConfig(
                **COMMON, num_hidden_layers=2, intermediate_size=96, embedding_multiplier=3.0,
                residual_multiplier=0.5, attention_multiplier=0.2, logits_scaling=2.5,
                tie_word_embeddings=True),
            seed=11000, dtype="float32",
        ),
        # gpt-oss: attention sinks, YaRN, alternating sliding/full layers,
        # router and expert biases, clamped SwiGLU on interleaved gate/up.
        # Expert weights are rounded to MXFP4 values, so gpt_oss_mxfp4 (the
        # same model stored as the released checkpoints store experts) shares
        # the reference.  F = 64 keeps (E, D, 2F) apart from (E, 2F, D).
        "gpt_oss": dict(
            cls=GptOssForCausalLM,
            config=lambda: GptOssConfig(
                **COMMON, **MOE, num_hidden_layers=2, num_local_experts=8, intermediate_size=64,
                sliding_window=6, layer_types=["sliding_attention", "full_attention"],
                rope_parameters={"rope_type": "yarn", "rope_theta": 150000.0, "factor": 8.0,
                                 "beta_fast": 32.0, "beta_slow": 1.0, "truncate": False,
                                 "original_max_position_embeddings": 64},
                swiglu_limit=2.0, attention_bias=True, tie_word_embeddings=False),
            seed=12000, dtype="float32", random_biases=0.2, sinks_range=(-1.0, 2.0),
            mxfp4_experts=True,
        ),
        # DeepSeek multi-head latent attention: V2 without a q LoRA, softmax
        # routing (top-4) limited to the 2 of 4 groups with the best expert
        # (it changes choices: checked below), scaled, a dense first layer, YaRN with mscale =
        # mscale_all_dim (the score scale gains mscale^2); V3 with the q
        # LoRA, the sigmoid router over groups and interleaved RoPE
        "deepseek_v2": dict(
            cls=DeepseekV2ForCausalLM,
            config=lambda: DeepseekV2Config(
                **MLA_COMMON, num_hidden_layers=3, intermediate_size=96, num_experts_per_tok=4,
                moe_intermediate_size=32, n_routed_experts=16, n_shared_experts=2,
                first_k_dense_replace=1, routed_scaling_factor=1.5,
                topk_method="group_limited_greedy", n_group=4, topk_group=2,
                norm_topk_prob=False, q_lora_rank=None, kv_lora_rank=32, qk_nope_head_dim=16,
                qk_rope_head_dim=8, v_head_dim=12,
                rope_parameters={"rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0,
                                 "original_max_position_embeddings": 64, "beta_fast": 32,
                                 "beta_slow": 1, "mscale": 0.707, "mscale_all_dim": 0.707},
                tie_word_embeddings=False),
            seed=13000, dtype="float32",
        ),
        "deepseek_v3": dict(
            cls=DeepseekV3ForCausalLM,
            config=lambda: DeepseekV3Config(
                **MLA_COMMON, num_hidden_layers=3, intermediate_size=96,
                moe_intermediate_size=32, n_routed_experts=16, num_experts_per_tok=3,
                n_shared_experts=1, first_k_dense_replace=1, n_group=4, topk_group=2,
                routed_scaling_factor=2.5, norm_topk_prob=True, q_lora_rank=24, kv_lora_rank=32,
                qk_nope_head_dim=16, qk_rope_head_dim=8, v_head_dim=12, rope_interleave=True,
                rope_parameters={"rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0,
                                 "original_max_position_embeddings": 64, "beta_fast": 32,
                                 "beta_slow": 1, "mscale": 1.0, "mscale_all_dim": 1.0},
                tie_word_embeddings=False),
            seed=14000, dtype="float32", router_bias_range=0.3,
        ),
        # DeepSeek-V3.2: deepseek_v3's MLA + MoE (rope_interleave is no field of
        # DeepseekV32Config; its attention always interleaves; kept as in V3)
        # plus DeepSeek Sparse Attention: every layer's lightning indexer
        # (wq_b on the q LoRA latent, wk + LayerNorm k_norm, weights_proj)
        # keeps index_topk = 4 causal keys per query, so the 5..21-token
        # prompts attend sparsely.  k_norm is made random (transformers: 1, 0);
        # index_margin rejects seeds with a near-tie at the top-k cut.  8
        # index heads, not 4: a score is exactly 0 when relu zeroes every
        # head (about 2^-H of them: 6% with 4 heads, so every seed had tied
        # zeros at some cut; 0.4% with 8)
        "deepseek_v32": dict(
            cls=DeepseekV32ForCausalLM,
            config=lambda: DeepseekV32Config(
                **MLA_COMMON, num_hidden_layers=3, intermediate_size=96,
                moe_intermediate_size=32, n_routed_experts=16, num_experts_per_tok=3,
                n_shared_experts=1, first_k_dense_replace=1, n_group=4, topk_group=2,
                routed_scaling_factor=2.5, norm_topk_prob=True, q_lora_rank=24, kv_lora_rank=32,
                qk_nope_head_dim=16, qk_rope_head_dim=8, v_head_dim=12, rope_interleave=True,
                rope_parameters={"rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0,
                                 "original_max_position_embeddings": 64, "beta_fast": 32,
                                 "beta_slow": 1, "mscale": 1.0, "mscale_all_dim": 1.0},
                index_topk=4, index_n_heads=8, index_head_dim=16, tie_word_embeddings=False),
            seed=19000, dtype="float32", router_bias_range=0.3, random_index_norm=0.3,
            index_margin=1e-4,
        ),
        # GLM-MoE-DSA (GLM-5): deepseek_v32's sparse attention with the
        # indexer's rotary values in interleaved pairs (its q and k both),
        # and layers 1 and 3 "shared": no indexer, they reuse the top-k of
        # the full layer before them (index_topk_pattern "FSFS"); smaller
        # experts (8 of width 16, 2 per token, one group as in GLM-5) and
        # two dense layers keep it small.  The yarn, index and router-bias
        # settings as deepseek_v32's
        "glm_moe_dsa": dict(
            cls=GlmMoeDsaForCausalLM,
            config=lambda: GlmMoeDsaConfig(
                **MLA_COMMON, num_hidden_layers=4, intermediate_size=64,
                moe_intermediate_size=16, n_routed_experts=8, num_experts_per_tok=2,
                n_shared_experts=1, first_k_dense_replace=2, n_group=1, topk_group=1,
                routed_scaling_factor=2.5, norm_topk_prob=True, q_lora_rank=24, kv_lora_rank=32,
                qk_nope_head_dim=16, qk_rope_head_dim=8, v_head_dim=12,
                rope_parameters={"rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0,
                                 "original_max_position_embeddings": 64, "beta_fast": 32,
                                 "beta_slow": 1, "mscale": 1.0, "mscale_all_dim": 1.0},
                index_topk=4, index_n_heads=8, index_head_dim=16, index_topk_pattern="FSFS",
                tie_word_embeddings=False),
            seed=20000, dtype="float32", router_bias_range=0.3, random_index_norm=0.3,
            index_margin=1e-4,
        ),
        # MiniMax-M2: q/k RMSNorm over the whole projections, RoPE over
        # rotary_dim of each head's values, the sigmoid router with the
        # block's e_score_correction_bias (random here: transformers makes
        # zeros), renormalised, no groups
        "minimax_m2": dict(
            cls=MiniMaxM2ForCausalLM,
            config=lambda: MiniMaxM2Config(
                **COMMON, num_hidden_layers=2, num_local_experts=8, num_experts_per_tok=3,
                intermediate_size=32, rotary_dim=8, rope_theta=10000.0, tie_word_embeddings=False),
            seed=15000, dtype="float32", router_bias_range=0.3,
        ),
        # Llama-4 (text): chunks of 8 on the RoPE layers, layers 1 and 3
        # without RoPE (attention temperature, floor_scale 4 so it moves
        # within the prompts), the q/k L2 norm, top-1 sigmoid routing that
        # scales the expert's input, a shared expert, dense layers 0 and 2
        "llama4": dict(
            cls=Llama4ForCausalLM,
            config=lambda: Llama4TextConfig(
                **COMMON, num_hidden_layers=4, intermediate_size=32, intermediate_size_mlp=96,
                num_local_experts=8, num_experts_per_tok=1, interleave_moe_layer_step=2,
                no_rope_layer_interval=2, attention_chunk_size=8, use_qk_norm=True,
                attn_temperature_tuning=True, floor_scale=4, attn_scale=0.5,
                rope_theta=10000.0, tie_word_embeddings=False),
            seed=16000, dtype="float32",
        ),
        # Qwen3-Next: Gated DeltaNet (linear attention) layers 0, 2, 3 and a
        # gated full-attention layer 1 (q_proj also makes the output gate,
        # q/k RMSNorm, RoPE over a quarter of each head), the MoE with a
        # sigmoid-gated shared expert, a dense layer 2.  transformers makes
        # the (1 + w) RMSNorm weights zeros, the gated norm's ones and
        # dt_bias ones: random_norms adds normal(0, 0.3) noise to all of them
        "qwen3_next": dict(
            cls=Qwen3NextForCausalLM,
            config=lambda: Qwen3NextConfig(
                **COMMON, **MOE, num_hidden_layers=4,
                layer_types=["linear_attention", "full_attention", "linear_attention",
                             "linear_attention"],
                num_experts=8, moe_intermediate_size=32, shared_expert_intermediate_size=48,
                intermediate_size=96, mlp_only_layers=[2], decoder_sparse_step=1,
                norm_topk_prob=True, linear_num_key_heads=2, linear_num_value_heads=4,
                linear_key_head_dim=16, linear_value_head_dim=8, linear_conv_kernel_dim=4,
                rope_parameters={"rope_type": "default", "rope_theta": 10000.0,
                                 "partial_rotary_factor": 0.25},
                attention_bias=False, tie_word_embeddings=False),
            seed=17000, dtype="float32", random_norms=0.3,
        ),
        # Qwen3.5-MoE (text): Qwen3-Next's hybrid, Gated DeltaNet layers 0 and
        # 2 with separate in_proj_qkv / in_proj_z / in_proj_b / in_proj_a, a
        # gated full-attention layer 1, every layer MoE with the sigmoid-gated
        # shared expert, the router always renormalised, the text rotary of
        # mrope (its sections interleaved over the quarter of each head that
        # rotates; text positions are the same on all three axes).  The
        # zero-centred norms, the gated norm and dt_bias as for qwen3_next
        "qwen3_5_moe": dict(
            cls=Qwen3_5MoeForCausalLM,
            config=lambda: Qwen3_5MoeTextConfig(
                **COMMON, **MOE, num_hidden_layers=3,
                layer_types=["linear_attention", "full_attention", "linear_attention"],
                num_experts=8, moe_intermediate_size=32, shared_expert_intermediate_size=48,
                linear_num_key_heads=2, linear_num_value_heads=4,
                linear_key_head_dim=16, linear_value_head_dim=8, linear_conv_kernel_dim=4,
                rope_parameters={"rope_type": "default", "rope_theta": 10000.0,
                                 "partial_rotary_factor": 0.25, "mrope_section": [1, 1, 0]},
                attention_bias=False, tie_word_embeddings=False),
            seed=18000, dtype="float32", random_norms=0.3, kv_reject=True,
        ),
        "llama": dict(
            cls=LlamaForCausalLM,
            config=lambda: LlamaConfig(
                **COMMON, num_hidden_layers=2, intermediate_size=96,
                rope_scaling={"rope_type": "llama3", "rope_theta": 10000.0, "factor": 8.0,
                              "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                              "original_max_position_embeddings": 64},
                attention_bias=False, mlp_bias=False, tie_word_embeddings=True),
            seed=5000, dtype="float32",
        ),
        "qwen2": dict(
            cls=Qwen2ForCausalLM,
            config=lambda: Qwen2Config(
                **COMMON, num_hidden_layers=2, intermediate_size=96,
                use_sliding_window=False, tie_word_embeddings=False),
            seed=6000, dtype="float32",
        ),
        "qwen3": dict(
            cls=Qwen3ForCausalLM,
            config=lambda: Qwen3Config(
                **COMMON, num_hidden_layers=2, intermediate_size=96,
                attention_bias=False, use_sliding_window=False, tie_word_embeddings=True),
            seed=7000, dtype="float32",
        ),
    }



# --------------------------------------------------------------------------- layouts

def safetensors_files(path):
    return sorted(f for f in os.listdir(path) if f.endswith(".safetensors")
                  and f != "reference.safetensors")


def detect_layout(path):
    names = []
    for f in safetensors_files(path):
        with safe_open(os.path.join(path, f), "pt") as h:
            names += list(h.keys())
    if any(n.endswith("experts.gate_up_proj_bias") for n in names):
        return "stacked_transposed"  # gpt-oss: (E, D, 2F) gate/up interleaved, (E, F, D)
    if any(n.endswith("feed_forward.experts.gate_up_proj") for n in names):
        return "stacked_transposed_halves"  # Llama-4: (E, D, 2F) gate then up, (E, F, D)
    if any(n.endswith("experts.gate_up_proj") for n in names):
        return "stacked"
    if any(".experts.0." in n for n in names):
        return "per_expert"
    return None


def restack_experts(path, n_layers, n_experts):
    """Rewrite a per-expert Mixtral checkpoint into the stacked layout used by
    transformers 5 modules: mlp.gate.weight (E,D), mlp.experts.gate_up_proj
    (E, 2F, D) = cat(w1, w3) rows, mlp.experts.down_proj (E, D, F) = w2."""
    files = safetensors_files(path)
    assert files == ["model.safetensors"], files
    fn = os.path.join(path, "model.safetensors")
    with safe_open(fn, "pt") as h:
        meta = h.metadata()
        t = {k: h.get_tensor(k) for k in h.keys()}
    for li in range(n_layers):
        pre = f"model.layers.{li}.block_sparse_moe."
        w1 = [t.pop(f"{pre}experts.{e}.w1.weight") for e in range(n_experts)]
        w2 = [t.pop(f"{pre}experts.{e}.w2.weight") for e in range(n_experts)]
        w3 = [t.pop(f"{pre}experts.{e}.w3.weight") for e in range(n_experts)]
        new = f"model.layers.{li}.mlp."
        t[new + "gate.weight"] = t.pop(pre + "gate.weight")
        t[new + "experts.gate_up_proj"] = torch.stack(
            [torch.cat([a, c], 0) for a, c in zip(w1, w3)]).contiguous()
        t[new + "experts.down_proj"] = torch.stack(w2).contiguous()
    assert not any("block_sparse_moe" in k for k in t)
    save_file(dict(sorted(t.items())), fn, metadata=meta)


# --------------------------------------------------------------------------- building

def build_model(spec, seed):
    torch.manual_seed(seed)
    cfg = spec["config"]()
    model = spec["cls"](cfg)
    model.eval()
    randomize_router_bias(model, spec)
    with torch.no_grad():
        if "random_biases" in spec:  # transformers initialises most biases to zero
            for n, p in model.named_parameters():
                if n.endswith("bias"):
                    p.normal_(0.0, spec["random_biases"])
        if "random_norms" in spec:  # zero-centred / unit norm weights and dt_bias made random
            for n, p in model.named_parameters():
                if n.endswith("norm.weight") or n.endswith("dt_bias"):
                    p.add_(torch.randn(p.shape) * spec["random_norms"])
        if "random_index_norm" in spec:  # DSA indexer's k_norm LayerNorm: weight 1, bias 0
            a = spec["random_index_norm"]
            for layer in model.model.layers:
                if layer.self_attn.indexer is None:  # GLM-MoE-DSA's shared layers
                    continue
                kn = layer.self_attn.indexer.k_norm
                kn.weight.add_(torch.randn(kn.weight.shape) * a)
                kn.bias.normal_(0.0, a)
        if "sinks_range" in spec:
            lo, hi = spec["sinks_range"]
            for layer in model.model.layers:
                layer.self_attn.sinks.uniform_(lo, hi)
        if spec.get("mxfp4_experts"):
            for layer in model.model.layers:
                ex = layer.mlp.experts
                for name in ("gate_up_proj", "down_proj"):
                    p = getattr(ex, name)  # (E, in, out): blocks run along `in`
                    blocks, scales = mxfp4_quantize(p.transpose(1, 2))
                    p.copy_(mxfp4_dequantize(blocks, scales))
    return model


# --------------------------------------------------------------------------- MXFP4

FP4_MAGNITUDES = torch.tensor([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0])


def mxfp4_quantize(w):
    """(E, N, K) float -> (blocks (E, N, K/32, 16) uint8, scales (E, N, K/32) uint8)
    in the layout of the released gpt-oss checkpoints: per 32 values an E8M0
    scale byte, then E2M1 codes, value 2b in the low nibble of byte b and
    2b+1 in its high nibble.  Round to nearest; any rounding will do, as the
    fixture's model holds the dequantized values."""
    E, N, K = w.shape
    x = w.float().reshape(E, N, K // 32, 32)
    amax = x.abs().amax(-1)
    e = torch.where(amax > 0, torch.ceil(torch.log2(amax / 6.0)), torch.zeros_like(amax))
    e = e.clamp(-127, 127)
    y = x / torch.exp2(e)[..., None]
    idx = (y.abs()[..., None] - FP4_MAGNITUDES).abs().argmin(-1) + 8 * (y < 0).long()
    blocks = (idx[..., 0::2] | (idx[..., 1::2] << 4)).to(torch.uint8)
    return blocks.contiguous(), (e + 127).to(torch.uint8).contiguous()


def mxfp4_dequantize(blocks, scales):
    """transformers' own dequantization: (E, N, K/32, 16) -> (E, K, N) float32."""
    from transformers.integrations.mxfp4 import convert_moe_packed_tensors
    return convert_moe_packed_tensors(blocks, scales, dtype=torch.float32)


def write_mxfp4_fixture(src, dst):
    """dst = src with the experts stored as MXFP4 blocks and scales (the
    released gpt-oss layout: `gate_up_proj_blocks` (E, 2F, D/32, 16), ...)
    and config.json's quantization_config saying so."""
    if os.path.exists(dst):
        shutil.rmtree(dst)
    shutil.copytree(src, dst)
    fn = os.path.join(dst, "model.safetensors")
    with safe_open(fn, "pt") as h:
        meta = h.metadata()
        t = {k: h.get_tensor(k) for k in h.keys()}
    for k in [k for k in t if k.endswith(("experts.gate_up_proj", "experts.down_proj"))]:
        w = t.pop(k)  # (E, in, out)
        blocks, scales = mxfp4_quantize(w.transpose(1, 2))
        assert torch.equal(mxfp4_dequantize(blocks, scales), w), k
        t[k + "_blocks"], t[k + "_scales"] = blocks, scales
    save_file(dict(sorted(t.items())), fn, metadata=meta)
    update_json(os.path.join(dst, "config.json"), lambda cfg: cfg.update(quantization_config={
        "quant_method": "mxfp4", "modules_to_not_convert": [
            "model.layers.*.self_attn", "model.layers.*.mlp.router", "model.embed_tokens",
            "lm_head"]}))
    r = update_json(os.path.join(dst, "reference.json"),
                    lambda r: r.update(expert_layout="mxfp4"))
    # transformers reads the MXFP4 folder itself (its Mxfp4HfQuantizer
    # dequantizes on a CPU; needs the accelerate package) to the same logits
    refs = load_file(os.path.join(dst, "reference.safetensors"))
    q = load(dst, torch.float32, experts=None)
    with torch.no_grad():
        for i in range(r["n_prompts"]):
            lg = q(input_ids=refs[f"prompt.{i}"].long().view(1, -1), use_cache=False).logits[0]
            assert torch.equal(lg, refs[f"logits.{i}"]), "MXFP4 folder read by transformers differs"
    print(f"  {os.path.basename(dst)}: experts as MXFP4 blocks, transformers reads it to the "
          f"same logits, size {tensor_sizes(dst)} B")



def make_fixture(name, spec, prompts):
    base = spec["seed"]
    last_err = None
    for seed in range(base, base + MAX_SEED_TRIES):
        model = build_model(spec, seed)
        cfg = model.config
        tmp = tempfile.mkdtemp(prefix=f"fx_{name}_")
        try:
            if spec["dtype"] == "bfloat16":
                model = model.to(torch.bfloat16)
            kw = {}
            if "max_shard_size" in spec:
                kw["max_shard_size"] = spec["max_shard_size"]
            model.save_pretrained(tmp, **kw)
            saved_layout = detect_layout(tmp)
            ref_model = load(tmp, torch.float32)
            if "index_margin" in spec:  # DSA: no near-tie at any top-k cut
                bad, imargin, isel, igreedy = check_index_selection(ref_model, prompts,
                                                                    spec["index_margin"])
                if bad:
                    print(f"  {name}: seed {seed} rejected ({bad})", flush=True)
                    last_err = bad
                    continue
            try:
                tensors, stats = reference_outputs(ref_model, prompts)
            except RuntimeError as e:
                # kv_reject: a token-by-token vs prefill difference over KV_TOL
                # rejects the seed instead of stopping (fp32 rounding of the
                # chunked vs recurrent Gated DeltaNet scan, which some seeds
                # amplify; the same model in float64 agrees to ~1e-15)
                if not (spec.get("kv_reject") and "incremental vs prefill" in str(e)):
                    raise
                print(f"  {name}: seed {seed} rejected ({e})", flush=True)
                last_err = str(e)
                continue
            bad = check_stats(stats)
            if not bad and "index_margin" in spec:
                for pi in range(len(prompts)):
                    assert torch.equal(igreedy[pi].to(torch.int32), tensors[f"greedy.{pi}"])
                tensors.update(isel)
                stats["min_index_margin"] = imargin
                stats["dense_vs_sparse_per_prompt"] = dense_vs_sparse(name, ref_model, prompts,
                                                                      tensors, stats)
                stats["dense_vs_sparse"] = max(stats["dense_vs_sparse_per_prompt"])
                print(f"  {name}: min index margin {imargin:.4g}, |dense - sparse logits| "
                      f"per prompt {stats['dense_vs_sparse_per_prompt']}", flush=True)
            if bad:
                print(f"  {name}: seed {seed} rejected ({bad})", flush=True)
                last_err = bad
                continue
            if moe_layout(ref_model)[0] is not None:
                # the default experts implementation must agree with the eager loop
                stats["default_experts_impl"] = check_default_experts(name, tmp, prompts, tensors,
                                                                      stats)
            if spec["dtype"] == "bfloat16":
                # exact upcast check: fp32 load == bf16 weights
                sd = model.state_dict()
                for k, v in ref_model.state_dict().items():
                    if k in sd:
                        assert v.dtype == torch.float32
                        assert torch.equal(v, sd[k].float()), k
                bf = load(tmp, torch.bfloat16)
                routers, _, _ = moe_layout(bf)
                rec = RouterRecorder(routers)
                bf16_diff = 0.0
                same_routes = True
                with torch.no_grad():
                    for pi, p in enumerate(prompts):
                        rec.reset()
                        lb = bf(input_ids=p.view(1, -1), use_cache=False).logits[0]
                        assert lb.dtype == torch.bfloat16
                        tensors[f"logits_bf16.{pi}"] = lb.float().contiguous()
                        d = float((lb.float() - tensors[f"logits.{pi}"]).abs().max())
                        bf16_diff = max(bf16_diff, d)
                        for li, r in enumerate(routers):
                            if r is None:
                                continue
                            a = torch.sort(rec.calls[li][0][0], -1).values
                            b = torch.sort(tensors[f"experts.{pi}"][li].long(), -1).values
                            same_routes &= bool(torch.equal(a, b))
                rec.close()
                stats["bf16_max_abs_logit_diff"] = bf16_diff
                # keep the bf16 comparison meaningful: all-bf16 transformers must
                # route every prompt token to the same expert set as fp32
                if not same_routes:
                    print(f"  {name}: seed {seed} rejected (bf16 routing differs from fp32)")
                    last_err = "bf16 routing"
                    continue
                print(f"  {name}: |logits_bf16 - logits| max {bf16_diff:.4f}")
            layout = saved_layout
            if spec.get("layout") and spec["layout"] != saved_layout:
                assert spec["layout"] == "stacked" and saved_layout == "per_expert"
                restack_experts(tmp, cfg.num_hidden_layers, cfg.num_local_experts)
                layout = detect_layout(tmp)
                assert layout == "stacked"
                re_model = load(tmp, torch.float32)
                with torch.no_grad():
                    for pi, p in enumerate(prompts):
                        lg = re_model(input_ids=p.view(1, -1), use_cache=False).logits[0]
                        if not torch.equal(lg, tensors[f"logits.{pi}"]):
                            raise RuntimeError(f"{name}: restacked checkpoint logits differ")
                print(f"  {name}: restacked to stacked layout, from_pretrained logits identical")
            if name == "llama":
                check_llama3_rope(ref_model)
            ref = {
                "family": cfg.model_type,
                "architecture": type(model).__name__,
                "seed": seed,
                "dtype": spec["dtype"],
                "n_prompts": len(prompts),
                "greedy_tokens": GREEDY_TOKENS,
                "min_logit_margin": stats["min_logit_margin"],
                "min_route_margin": stats["min_route_margin"],
                "expert_layout": layout,
                "transformers_version": transformers.__version__,
                "torch_version": torch.__version__.split("+")[0],
            }
            if stats["experts_used"] is not None:
                ref["experts_used_per_layer"] = stats["experts_used"]
            if "linear_attention" in (getattr(cfg, "layer_types", None) or []):
                # hybrid (Qwen3-Next): which layers are Gated DeltaNet, their geometry
                ref["hybrid"] = dict(
                    layer_types=list(cfg.layer_types),
                    mlp_only_layers=list(getattr(cfg, "mlp_only_layers", None) or []),
                    linear_num_key_heads=cfg.linear_num_key_heads,
                    linear_num_value_heads=cfg.linear_num_value_heads,
                    linear_key_head_dim=cfg.linear_key_head_dim,
                    linear_value_head_dim=cfg.linear_value_head_dim,
                    linear_conv_kernel_dim=cfg.linear_conv_kernel_dim,
                    partial_rotary_factor=cfg.rope_parameters["partial_rotary_factor"])
            if "bf16_max_abs_logit_diff" in stats:
                ref["bf16_max_abs_logit_diff"] = stats["bf16_max_abs_logit_diff"]
            ref["kv_cache_max_rel_diff"] = stats["kv_rel"]
            ref["attn_implementation"] = "eager"
            if "default_experts_impl" in stats:
                ref["experts_implementation"] = "eager"
                ref["default_experts_implementation_matches"] = stats["default_experts_impl"]
            ref["max_abs_logit"] = stats["logit_absmax"]
            if "min_index_margin" in stats:
                ref["min_index_margin"] = stats["min_index_margin"]
                ref["dense_vs_sparse_max_abs_logit_diff"] = stats["dense_vs_sparse"]
                ref["dense_vs_sparse_max_abs_logit_diff_per_prompt"] = stats[
                    "dense_vs_sparse_per_prompt"]
            ref["tensors"] = tensor_index(tensors)
            write_reference(tmp, tensors, ref)
            dst = install_fixture(tmp, name)
            print(f"{name}: seed {seed} layout {layout} logit margin "
                  f"{stats['min_logit_margin']:.4g} route margin {stats['min_route_margin']} "
                  f"kv rel diff {stats['kv_rel']:.3g} max|logit| {stats['logit_absmax']:.3g} "
                  f"size {tensor_sizes(dst)} B", flush=True)
            return ref
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    raise RuntimeError(f"{name}: no acceptable seed ({last_err})")


# --------------------------------------------------------------------------- DSA indexer

def index_scores(mod, hidden_states, q_resid, position_embeddings):
    """DeepseekV32Indexer's scores before the causal mask, (B, S, T=S), recomputed
    from its weights as modeling_deepseek_v32.py does (no cache): per index head h
    q_h = wq_b(q_resid)_h, k = LayerNorm(wk(x)), rotate-half RoPE on the first
    qk_rope_head_dim dims of both, score = sum_h weights_proj(x)_h * H^-0.5
    * relu(q_h . k * D^-0.5).  GlmMoeDsaIndexer rotates interleaved pairs
    (2i, 2i+1) instead (apply_rotary_pos_emb_interleave: the rotated pairs
    written back evens first, then odds)."""
    B, S, _ = hidden_states.shape
    H, D, R = mod.n_heads, mod.head_dim, mod.qk_rope_head_dim
    cos, sin = position_embeddings  # (B, S, R): cat(freqs, freqs) layout
    interleave = type(mod).__name__ == "GlmMoeDsaIndexer"

    def rope(x):  # (..., R)
        c, s_ = (cos.unsqueeze(2), sin.unsqueeze(2)) if x.dim() == 4 else (cos, sin)
        if interleave:
            c, s_ = c[..., :R // 2], s_[..., :R // 2]
            x1, x2 = x[..., 0::2], x[..., 1::2]
            return torch.cat([x1 * c - x2 * s_, x2 * c + x1 * s_], dim=-1)
        x1, x2 = x[..., :R // 2], x[..., R // 2:]
        return x * c + torch.cat((-x2, x1), dim=-1) * s_

    q = mod.wq_b(q_resid).view(B, S, H, D)
    q = torch.cat([rope(q[..., :R]), q[..., R:]], dim=-1)
    k = mod.k_norm(mod.wk(hidden_states))  # (B, S, D)
    k = torch.cat([rope(k[..., :R]), k[..., R:]], dim=-1)
    s = torch.relu(torch.einsum("bshd,btd->bsht", q.float(), k.float()) * mod.softmax_scale)
    w = mod.weights_proj(hidden_states).float() * H ** -0.5  # (B, S, H)
    return torch.einsum("bsh,bsht->bst", w, s)


def full_index_layers(model):
    """The layers that run their own indexer (GLM-MoE-DSA's "shared" layers
    have none: they reuse the selection of the full layer before them)."""
    return [li for li, layer in enumerate(model.model.layers) if layer.self_attn.indexer is not None]


class IndexerRecorder:
    """Forward hooks on every layer's DSA indexer (use_cache=False runs):
    per call, the recomputed causal index scores (S, S; -inf above the
    diagonal) and the module's own top-k indices (S, topk)."""

    def __init__(self, model):
        self.calls = []
        self.handles = []
        for li in full_index_layers(model):
            ix = model.model.layers[li].self_attn.indexer
            self.handles.append(ix.register_forward_hook(self._hook(li), with_kwargs=True))

    def _hook(self, li):
        def fn(mod, args, kwargs, out):
            hs, q_resid, pe, mask = args[:4]
            assert kwargs.get("cache") is None
            sc = index_scores(mod, hs, q_resid, pe)[0]
            S = sc.shape[0]
            causal = torch.ones(S, S, dtype=torch.bool).tril()
            if mask.dtype == torch.bool:
                assert torch.equal(mask[0], causal)
            else:
                assert torch.equal(mask[0] == 0, causal)
            self.calls.append((li, sc.masked_fill(~causal, float("-inf")), out[0].long().clone()))
        return fn

    def close(self):
        for h in self.handles:
            h.remove()


def causal_selection(idx, topk):
    """(S, k) top-k indices -> (S, topk) int32: the causal ones (<= query
    position) in ascending order, -1 padded."""
    S = idx.shape[0]
    sel = torch.full((S, topk), -1, dtype=torch.int32)
    for s in range(S):
        c = sorted(int(t) for t in idx[s] if int(t) <= s)
        assert len(c) == min(topk, s + 1), (s, idx[s])
        sel[s, :len(c)] = torch.tensor(c, dtype=torch.int32)
    return sel


def index_margins(scores, idx, topk):
    """min over query rows with more than topk causal keys of
    (topk-th best - (topk+1)-th best) / max(1, |both|); checks that the
    module's selection is the top-k of the recomputed scores."""
    S = scores.shape[0]
    m = float("inf")
    for s in range(S):
        row = scores[s, :s + 1]
        if s + 1 <= topk:
            continue
        v, order = torch.sort(row, descending=True)
        rel = float(v[topk - 1] - v[topk]) / max(1.0, abs(float(v[topk - 1])),
                                                  abs(float(v[topk])))
        m = min(m, rel)
        mine = sorted(order[:topk].tolist())
        theirs = sorted(int(t) for t in idx[s])
        if mine != theirs and rel > 1e-5:  # a smaller gap is rejected as a near-tie
            raise RuntimeError(f"indexer selection {theirs} is not the top-{topk} {mine} of "
                               f"the recomputed scores (row {s})")
    return m


@torch.no_grad()
def check_index_selection(model, prompts, min_margin):
    """DeepSeek Sparse Attention, run before reference_outputs (whose KV-cache
    and cached-greedy checks a near-tie at a top-k cut would break): the
    index margins (index_margins) over each prompt and over each prompt
    followed by its greedy tokens (an uncached greedy run here).  Returns
    (reason to reject the seed or None, min margin, {index_topk.<p>: (L, S,
    index_topk) int32}, {p: greedy tokens})."""
    topk = model.config.index_topk
    L = len(model.model.layers)
    full = full_index_layers(model)
    rec = IndexerRecorder(model)
    margin = float("inf")
    sels, greedy = {}, {}
    try:
        for pi, p in enumerate(prompts):
            ids = p.view(1, -1)
            for _ in range(GREEDY_TOKENS):
                lg = model(input_ids=ids, use_cache=False).logits[0, -1]
                ids = torch.cat([ids, lg.argmax().view(1, 1)], dim=1)
            greedy[pi] = ids[0, p.numel():]
            for si, seq in enumerate((p.view(1, -1), ids)):
                rec.calls = []
                model(input_ids=seq, use_cache=False)
                assert [c[0] for c in rec.calls] == full
                sel = []
                for li, sc, idx in rec.calls:
                    margin = min(margin, index_margins(sc, idx, topk))
                    sel.append(causal_selection(idx, topk))
                # per layer: a shared layer's is the full layer's before it
                sel = [sel[max(i for i, f in enumerate(full) if f <= li)] for li in range(L)]
                if si == 0:
                    sels[f"index_topk.{pi}"] = torch.stack(sel).contiguous()
    finally:
        rec.close()
    bad = f"index margin {margin:.3g}" if margin < min_margin else None
    return bad, margin, sels, greedy


@torch.no_grad()
def dense_vs_sparse(name, model, prompts, tensors, stats):
    """The selection must matter: with every causal key kept (index_topk
    huge) the logits differ; returns the max |difference| per prompt."""
    ixs = [model.model.layers[li].self_attn.indexer for li in full_index_layers(model)]
    saved = [ix.index_topk for ix in ixs]
    per = []
    try:
        for ix in ixs:
            ix.index_topk = 1 << 30
        for pi, p in enumerate(prompts):
            lg = model(input_ids=p.view(1, -1), use_cache=False).logits[0]
            per.append(float((lg - tensors[f"logits.{pi}"]).abs().max()))
    finally:
        for ix, k in zip(ixs, saved):
            ix.index_topk = k
    if max(per) < 1e-3 * max(1.0, stats["logit_absmax"]):
        raise RuntimeError(f"{name}: dense attention gives the same logits ({per})")
    return per


def check_llama3_rope(model):
    """The llama3 rope scaling must actually change the inverse frequencies."""
    cfg = model.config
    rp = cfg.rope_parameters
    assert rp["rope_type"] == "llama3", rp
    dim = cfg.head_dim
    base = rp["rope_theta"]
    default = 1.0 / (base ** (torch.arange(0, dim, 2, dtype=torch.float) / dim))
    inv = model.model.rotary_emb.inv_freq
    changed = int((~torch.isclose(inv, default)).sum())
    assert changed >= 2, (inv, default)
    print(f"  llama: llama3 rope changes {changed}/{inv.numel()} inverse frequencies")


def make_demo():
    torch.manual_seed(9000)
    cfg = Qwen3MoeConfig(
        vocab_size=512, hidden_size=128, num_hidden_layers=4, num_attention_heads=8,
        num_key_value_heads=2, head_dim=16, num_experts=16, num_experts_per_tok=4,
        moe_intermediate_size=64, intermediate_size=256, max_position_embeddings=2048,
        norm_topk_prob=True, decoder_sparse_step=1, mlp_only_layers=[],
        initializer_range=INIT_STD, tie_word_embeddings=True, use_sliding_window=False,
        bos_token_id=None, eos_token_id=None, pad_token_id=None)
    model = Qwen3MoeForCausalLM(cfg).eval().to(torch.bfloat16)
    if os.path.exists(DEMO_DIR):
        shutil.rmtree(DEMO_DIR)
    model.save_pretrained(DEMO_DIR)
    m = load(DEMO_DIR, torch.bfloat16)
    with torch.no_grad():
        m(input_ids=torch.arange(8).view(1, -1))
    print(f"demo-moe: {tensor_sizes(DEMO_DIR)} B")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--only", default="")
    ap.add_argument("--skip-demo", action="store_true")
    args = ap.parse_args()
    specs = fixture_specs()
    only = [s for s in args.only.split(",") if s]
    prompts = make_prompts()
    os.makedirs(FIXTURES, exist_ok=True)
    layouts = {}
    for name, spec in specs.items():
        if only and name not in only:
            continue
        ref = make_fixture(name, spec, prompts)
        layouts[name] = ref["expert_layout"]
        if spec.get("mxfp4_experts"):
            write_mxfp4_fixture(os.path.join(FIXTURES, name), os.path.join(FIXTURES, name + "_mxfp4"))
    # models/demo-moe comes from models/make_demo_model.py now (a trained model)
    total = sum(tensor_sizes(os.path.join(FIXTURES, d)) for d in os.listdir(FIXTURES)
                if os.path.isdir(os.path.join(FIXTURES, d)))
    print(f"fixtures total: {total} B; layouts: {layouts}")


if __name__ == "__main__":
    sys.exit(main())
