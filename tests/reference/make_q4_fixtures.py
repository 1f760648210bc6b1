#!/usr/bin/env python3
"""Tiny four-bit checkpoints as the quantization libraries write them, and
their reference outputs, for moerun's four-bit loaders (GPTQ, AWQ and
compressed-tensors `quantization_config` checkpoints).

For each spec below this script
  * builds a tiny random model with transformers (fixed seed; hidden size 128
    and expert widths of 128, a dense FFN of 256, so a group of 128 divides K
    both ways and a dense down_proj spans two groups), stored as bf16 or fp16
    (the scales' dtype),
  * saves it, then rewrites every `*_proj.weight` of the attention and the
    experts / MLP with the library's own quantizer and packer (the router
    `mlp.gate`, the embeddings, the norms and the LM head stay 16-bit),
  * builds the reference: transformers' fp32 model over the exact fp32
    dequantization ((q - z) * s computed in float64; every product of a
    four-bit code and a 16-bit scale is exact in fp32, so it is the value
    moerun computes), checked against the library's own dequantization,
  * records logits, routed expert ids and 32 greedy tokens with
    fixture_common.reference_outputs, under the seed rules of make_fixtures.py,
  * writes dequant.safetensors: for three weights (an expert's gate_proj, an
    attention q_proj, a down_proj) the F32 dequantized matrix (N, K) =
    (out_features, in_features), named by the checkpoint's module name +
    ".weight", for the loader's weight-by-weight check.

compressed-tensors (format pack-quantized, compressed-tensors 0.20): the
weights are the library's `calculate_qparams` (min / max per group or
channel, in the weight's bf16, as llm-compressor's min-max observer) and
`PackedQuantizationCompressor.compress`; config.json's quantization_config
is `ModelCompressor.update_config`'s.  transformers reads the symmetric
MoE and the Llama folders itself (`from_pretrained(dtype=float32,
quantization_config=CompressedTensorsConfig(dequantize=True))`: the plain
route leaves the fused experts bf16 and cannot run in fp32), but computes
(q - z) * s in the scale's bf16, so its weights are the exact values rounded
to bf16: the script checks exactly that, and the reference model takes the
exact fp32 values instead (reference.json records the largest logit
difference between the two, about 0.09).  transformers 5.24 cannot read the
asymmetric MoE at all (its expert path drops the zero points); there the
weights are checked against the library's decompress only.

GPTQ and AWQ (GPTQModel 7.7, fp16 model and scales): GPTQModel itself
quantizes (GPTQModel.load, quantize on random-token calibration sequences:
real GPTQ with its Hessian, real AWQ with its scale search), packs and saves
(config.json's quantization_config and quantize_config.json are its own;
the rest of config.json and generation_config.json are the model's, as
GPTQModel's save sets eos / pad token 0 and do_sample from the tokenizer it
adds; its tokenizer files and timing log are left out).  Its Qwen3-MoE definition wants
experts in every layer, so these models have two MoE layers of 6 experts.
Importing gptqmodel patches transformers' MoE blocks into per-expert Linears,
so the quantization runs in a child process (`--gptqmodel-worker`), which
also writes the library's own dequantization (GPTQ: TorchLinear.
dequantize_weight after its v1 -> v2 zero conversion; AWQ: dequantize_gemm;
both given fp32 scales so that they compute exactly); the parent checks it
against its own reading of the bits and runs transformers (unpatched) over
those weights.  K is 128 throughout, so the act-order fixture uses groups of
32 (a group of 128 would make g_idx all zeros).  GPTQ v1 stores z - 1 by
subtracting 0x11111111 from each qzeros word; no z is 0 in these fixtures, so
reading each nibble + 1 gives the same zero points (checked).

The checkpoints are written per expert (`mlp.experts.{e}.gate_proj.*`), as
released.

Python is only a fixture-making tool.
Usage: python tests/reference/make_q4_fixtures.py [--only qwen3_moe_ct_w4,...]
"""
import argparse
import importlib.metadata
import json
import os
import shutil
import subprocess
import sys
import tempfile

import torch
from safetensors.torch import load_file, save_file

import transformers
from transformers import LlamaConfig, LlamaForCausalLM, Qwen3MoeConfig, Qwen3MoeForCausalLM

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from fixture_common import (COMMON, GREEDY_TOKENS, MAX_SEED_TRIES, MOE,  # noqa: E402
                            check_default_experts, check_stats, install_fixture, load,
                            make_prompts, reference_outputs, tensor_index, tensor_sizes,
                            write_json, write_reference)

WIDE = dict(hidden_size=128, head_dim=32)


def qwen3_moe_config():
    # attention q (128, 128), k/v (64, 128), o (128, 128); layer 0: 8 experts
    # of (128, 128) / (128, 128), top-2; layer 1 a dense FFN of (256, 128) /
    # (128, 256)
    return Qwen3MoeConfig(
        **{**COMMON, **WIDE}, **MOE, num_hidden_layers=2, num_experts=8,
        moe_intermediate_size=128, intermediate_size=256, norm_topk_prob=True,
        decoder_sparse_step=1, mlp_only_layers=[1], attention_bias=False,
        use_sliding_window=False, tie_word_embeddings=False)


def qwen3_moe_all_moe_config():
    # as qwen3_moe_config with both layers MoE (GPTQModel's Qwen3-MoE
    # definition expects experts in every layer), 6 experts each to stay small
    cfg = qwen3_moe_config()
    cfg.mlp_only_layers = []
    cfg.num_experts = 6
    return cfg


def llama_config():
    # attention q (128, 128), k/v (64, 128), o (128, 128); FFN (256, 128) / (128, 256)
    return LlamaConfig(**{**COMMON, **WIDE}, num_hidden_layers=2, intermediate_size=256,
                       tie_word_embeddings=False)


MOE_DEQUANT = ["model.layers.0.mlp.experts.3.gate_proj.weight", "model.layers.0.self_attn.q_proj.weight",
               "model.layers.1.mlp.down_proj.weight"]
ALL_MOE_DEQUANT = ["model.layers.0.mlp.experts.3.gate_proj.weight", "model.layers.0.self_attn.q_proj.weight",
                   "model.layers.1.mlp.experts.5.down_proj.weight"]
DENSE_DEQUANT = ["model.layers.0.mlp.gate_proj.weight", "model.layers.1.self_attn.q_proj.weight",
                 "model.layers.1.mlp.down_proj.weight"]


def fixture_specs():
    return {
        "qwen3_moe_ct_w4": dict(cls=Qwen3MoeForCausalLM, config=qwen3_moe_config, seed=41000,
                                dtype=torch.bfloat16, fmt="ct", strategy="group", group=128, sym=True,
                                dequant=MOE_DEQUANT),
        "qwen3_moe_ct_w4_asym": dict(cls=Qwen3MoeForCausalLM, config=qwen3_moe_config, seed=42000,
                                     dtype=torch.bfloat16, fmt="ct", strategy="group", group=32, sym=False,
                                     dequant=MOE_DEQUANT),
        "llama_ct_w4_channel": dict(cls=LlamaForCausalLM, config=llama_config, seed=43000,
                                    dtype=torch.bfloat16, fmt="ct", strategy="channel", group=None, sym=False,
                                    dequant=DENSE_DEQUANT),
        # GPTQModel: GPTQ proper (Hessian from random-token calibration), then its packer
        "qwen3_moe_gptq": dict(cls=Qwen3MoeForCausalLM, config=qwen3_moe_all_moe_config, seed=44000,
                               dtype=torch.float16, fmt="gptqmodel", dequant=ALL_MOE_DEQUANT,
                               qcfg=dict(bits=4, group_size=128, sym=True, desc_act=False)),
        "qwen3_moe_gptq_asym_g32": dict(cls=Qwen3MoeForCausalLM, config=qwen3_moe_all_moe_config, seed=45000,
                                        dtype=torch.float16, fmt="gptqmodel", dequant=ALL_MOE_DEQUANT,
                                        qcfg=dict(bits=4, group_size=32, sym=False, desc_act=False)),
        # act order: K is 128 throughout, so a group of 32 for a g_idx that is not all zeros
        "qwen3_moe_gptq_actorder": dict(cls=Qwen3MoeForCausalLM, config=qwen3_moe_all_moe_config, seed=46000,
                                        dtype=torch.float16, fmt="gptqmodel", dequant=ALL_MOE_DEQUANT,
                                        qcfg=dict(bits=4, group_size=32, sym=True, desc_act=True)),
        "qwen3_moe_gptq_v2": dict(cls=Qwen3MoeForCausalLM, config=qwen3_moe_all_moe_config, seed=47000,
                                  dtype=torch.float16, fmt="gptqmodel", dequant=ALL_MOE_DEQUANT,
                                  qcfg=dict(bits=4, group_size=128, sym=False, desc_act=False, format="gptq_v2")),
        "qwen3_moe_awq": dict(cls=Qwen3MoeForCausalLM, config=qwen3_moe_all_moe_config, seed=48000,
                              dtype=torch.float16, fmt="gptqmodel", dequant=ALL_MOE_DEQUANT,
                              qcfg=dict(bits=4, group_size=128, sym=False, method="awq", format="gemm")),
    }


def is_quantized(name):
    """The Linear weights the libraries quantize: attention and FFN / expert
    projections; not the router (`mlp.gate`), embeddings, norms or LM head."""
    return name.endswith("_proj.weight")


# --------------------------------------------------------------------------- compressed-tensors

def ct_scheme(spec):
    from compressed_tensors.quantization import QuantizationArgs, QuantizationScheme

    args = dict(num_bits=4, type="int", symmetric=spec["sym"], dynamic=False, strategy=spec["strategy"])
    if spec["group"] is not None:
        args["group_size"] = spec["group"]
    return QuantizationScheme(targets=["Linear"], weights=QuantizationArgs(**args))


def ct_quantize(w, scheme):
    """The library's quantization of one (N, K) weight: its qparams from the
    min and max per group (channel), then its pack-quantized compressor.
    Returns (the tensors to store, their local names, exact fp32 values)."""
    from compressed_tensors.compressors.pack_quantized.base import PackedQuantizationCompressor
    from compressed_tensors.quantization.utils.helpers import calculate_qparams

    a = scheme.weights
    N, K = w.shape
    G = a.group_size if a.strategy == "group" else K
    wg = w.view(N, K // G, G)
    scale, zp = calculate_qparams(wg.amin(dim=-1), wg.amax(dim=-1), a)
    assert scale.shape == (N, K // G) and scale.dtype == w.dtype, (scale.shape, scale.dtype)
    sd = PackedQuantizationCompressor.compress({"weight": w, "weight_scale": scale, "weight_zero_point": zp},
                                               scheme)
    # an independent reading of the stored tensors: codes u in 0..15 (k-th of a
    # row in word k/8, bits 4(k%8)), the signed code u - 8, the zero point the
    # same way packed along N, value (q - z) * s
    p = sd["weight_packed"]
    assert p.dtype == torch.int32 and p.shape == (N, K // 8)
    u = ((p.to(torch.int64).unsqueeze(-1) >> (4 * torch.arange(8))) & 15).reshape(N, K)
    if a.symmetric:
        assert "weight_zero_point" not in sd
        z = torch.zeros(N, K // G, dtype=torch.int64)
    else:
        zpk = sd["weight_zero_point"]
        assert zpk.dtype == torch.int32 and zpk.shape == (N // 8, K // G)
        z = ((zpk.to(torch.int64).unsqueeze(1) >> (4 * torch.arange(8)).view(1, 8, 1)) & 15).reshape(N, K // G) - 8
        assert torch.equal(z, zp.to(torch.int64)), "zero points"
    s = sd["weight_scale"].double()
    exact = ((u - 8 - z.repeat_interleave(G, 1)).double() * s.repeat_interleave(G, 1))
    values = exact.float()
    assert torch.equal(values.double(), exact), "the dequantization is exact in fp32"
    # the library's own decompression, in the scale's dtype
    lib = PackedQuantizationCompressor.decompress(dict(sd), scheme)["weight"]
    assert lib.dtype == w.dtype and torch.equal(lib, values.to(w.dtype)), "library dequantization"
    return sd, values


def write_ct(src, dst, spec):
    """dst = the checkpoint in src with every quantized Linear as pack-quantized;
    returns ({checkpoint name: exact fp32 value}, quantization_config)."""
    from compressed_tensors.compressors import ModelCompressor
    from compressed_tensors.quantization import QuantizationConfig

    scheme = ct_scheme(spec)
    qcfg = QuantizationConfig(config_groups={"group_0": scheme}, ignore=["lm_head", "re:.*mlp.gate$"],
                              format="pack-quantized", quantization_status="compressed")
    shutil.copytree(src, dst)
    fn = os.path.join(dst, "model.safetensors")
    t = load_file(fn)
    out, values = {}, {}
    for k, v in sorted(t.items()):
        if is_quantized(k):
            sd, values[k] = ct_quantize(v, scheme)
            for n, x in sd.items():
                out[k[:-len("weight")] + n] = x.contiguous()
        else:
            out[k] = v
            values[k] = v.float()
    save_file(out, fn, metadata={"format": "pt"})
    ModelCompressor(quantization_config=qcfg).update_config(dst)
    return values


def check_ct_transformers(dst, values, ref_tensors, prompts):
    """transformers' own reading of the folder, as a sentence for reference.json.

    With CompressedTensorsConfig(dequantize=True) transformers decompresses
    at load time; its weights are the exact values rounded to bf16 (it
    computes (q - z) * s in the scale's dtype), and the fused experts stay
    bf16 under dtype=float32, so the model is cast to fp32 (exact) before
    it runs.  Its expert path drops the zero points, and the plain route
    (decompression on the first forward) keeps the zero-point parameters in
    their unpacked shape, so transformers 5.24 cannot read an asymmetric MoE
    checkpoint at all."""
    errors = []
    for kw in ({"quantization_config": transformers.CompressedTensorsConfig(dequantize=True)}, {}):
        try:
            m = transformers.AutoModelForCausalLM.from_pretrained(
                dst, dtype=torch.float32, attn_implementation="eager", experts_implementation="eager", **kw)
        except (RuntimeError, AssertionError) as e:
            errors.append(str(e).splitlines()[0][:160])
            continue
        m.eval()
        if not kw:
            errors.append("the plain route loads it; not run: its experts would stay bf16")
            continue
        n = check_weights(m, values, rounded_to=torch.bfloat16)
        m.float()
        d = 0.0
        with torch.no_grad():
            for pi, p in enumerate(prompts):
                lg = m(input_ids=p.view(1, -1), use_cache=False).logits[0].float()
                d = max(d, float((lg - ref_tensors[f"logits.{pi}"]).abs().max()))
        return (f"from_pretrained(dtype=float32, quantization_config=CompressedTensorsConfig(dequantize=True)) "
                f"decompresses the folder itself; its {n} weights are the exact values rounded to bf16 (it "
                f"computes (q - z) * s in the scale's dtype); the reference uses the exact fp32 values; run in "
                f"fp32, its logits differ from the reference's by at most {d:.3g}")
    assert len(errors) == 2, errors
    return (f"transformers {transformers.__version__} cannot load this folder: with dequantize=True its expert "
            f"path drops the zero points (compressed-tensors: 'Asymmetric quant requires zero-point values'), "
            f"and the plain route keeps the zero-point parameters in their unpacked shape (size mismatch); the "
            f"weights are checked against the library's PackedQuantizationCompressor.decompress instead")

# --------------------------------------------------------------------------- GPTQModel (GPTQ, AWQ)

CALIB_SEQS, CALIB_LEN = 16, 64


def calibration():
    g = torch.Generator().manual_seed(777)
    return [{"input_ids": torch.randint(0, COMMON["vocab_size"], (CALIB_LEN,), generator=g).tolist(),
             "attention_mask": [1] * CALIB_LEN} for _ in range(CALIB_SEQS)]


def nibbles_down(w, count):
    """(R, C) int32 words -> (R * 8, C) codes: word r holds rows 8r..8r+7, row 8r+j at bits 4j."""
    R, C = w.shape
    return ((w.to(torch.int64).unsqueeze(1) >> (4 * torch.arange(8)).view(1, 8, 1)) & 15).reshape(R * 8, C)[:count]


def nibbles_across(w, order=None):
    """(R, C) int32 words -> (R, C * 8) codes: word c holds columns 8c..8c+7, nibble j
    (bits 4j) holding column 8c + order[j] (order = identity, or AWQ's interleave)."""
    R, C = w.shape
    nib = (w.to(torch.int64).unsqueeze(-1) >> (4 * torch.arange(8))) & 15  # (R, C, 8): nibble j
    if order is not None:
        out = torch.empty_like(nib)
        out[..., order] = nib
        nib = out
    return nib.reshape(R, C * 8)


AWQ_ORDER = [0, 2, 4, 6, 1, 3, 5, 7]


def gptq_library(prefix, t, qc):
    """The library's own dequantization of a GPTQ module: TorchLinear.dequantize_weight
    after its v1 -> v2 zero conversion (checkpoint_format gptq), with the scales
    in fp32 so that it computes exactly; fp32 (N, K)."""
    from gptqmodel.nn_modules.qlinear.torch import TorchLinear
    from gptqmodel.utils.model import convert_gptq_v1_to_v2_format_module

    qw = t[prefix + "qweight"]
    K, N = qw.shape[0] * 8, qw.shape[1]
    m = TorchLinear(bits=4, group_size=qc["group_size"], sym=qc["sym"], desc_act=qc["desc_act"],
                    in_features=K, out_features=N, bias=False, pack_dtype=torch.int32)
    for n in ("qweight", "qzeros", "scales", "g_idx"):
        getattr(m, n).copy_(t[prefix + n])
    if qc["checkpoint_format"] == "gptq":
        convert_gptq_v1_to_v2_format_module(m, bits=4, pack_dtype=torch.int32)
    m.post_init()
    m.scales = m.scales.float()
    return m.dequantize_weight().T.contiguous()


def awq_library(prefix, t, qc):
    """The library's dequantize_gemm of an AWQ module with fp32 scales; fp32 (N, K)."""
    from gptqmodel.quantization.awq.utils.packing_utils import dequantize_gemm

    return dequantize_gemm(t[prefix + "qweight"], t[prefix + "qzeros"], t[prefix + "scales"].float(), 4,
                           qc["group_size"]).T.contiguous()


def gptq_values(prefix, t, qc):
    """An independent reading of a GPTQ module (prefix + qweight / qzeros /
    scales / g_idx) as float64 (N, K)."""
    qw, qz, sc, gi = (t[prefix + n] for n in ("qweight", "qzeros", "scales", "g_idx"))
    K, N = qw.shape[0] * 8, qw.shape[1]
    G = qc["group_size"] if qc["group_size"] > 0 else K
    assert qw.dtype == qz.dtype == gi.dtype == torch.int32 and sc.dtype == torch.float16
    assert qz.shape == (K // G, N // 8) and sc.shape == (K // G, N) and gi.shape == (K,)
    if not qc["desc_act"]:
        assert torch.equal(gi, torch.arange(K, dtype=torch.int32) // G), "g_idx"
    q = nibbles_down(qw, K)
    if qc["checkpoint_format"] == "gptq":
        # v1 stores z - 1, subtracted from the whole word (0x11111111); read per
        # nibble it is the same as long as no z is 0 (no borrow): checked here
        z = nibbles_across(((qz.to(torch.int64) + 0x11111111) & 0xFFFFFFFF).to(torch.int32))
        assert torch.equal(z, (nibbles_across(qz) + 1) & 15) and (z > 0).all(), "v1 zero points"
    else:
        z = nibbles_across(qz)
    if qc["sym"]:
        assert (z == 8).all(), "symmetric zero point"
    gl = gi.long()
    return ((q - z[gl]).double() * sc.double()[gl]).T  # (N, K)


def awq_values(prefix, t, qc):
    """An independent reading of an AWQ gemm module (qweight (K, N/8) with
    AWQ's nibble order, qzeros (K/G, N/8) likewise, scales (K/G, N)) as
    float64 (N, K)."""
    qw, qz, sc = (t[prefix + n] for n in ("qweight", "qzeros", "scales"))
    K, N = qw.shape[0], qw.shape[1] * 8
    G = qc["group_size"]
    assert qw.dtype == qz.dtype == torch.int32 and sc.dtype == torch.float16
    assert qz.shape == (K // G, N // 8) and sc.shape == (K // G, N)
    assert prefix + "g_idx" not in t
    q = nibbles_across(qw, AWQ_ORDER)
    z = nibbles_across(qz, AWQ_ORDER).repeat_interleave(G, 0)
    return ((q - z).double() * sc.double().repeat_interleave(G, 0)).T


def gptqmodel_worker(name, src, out):
    """Run in a child process (importing gptqmodel patches transformers' MoE
    blocks into per-expert Linears, which the reference must not see):
    quantize src with GPTQModel, save it in out, and write the library's
    dequantization of every module to out/library_dequant.safetensors."""
    os.environ.setdefault("GPTQMODEL_CPU_WORKERS", "2")  # its CPU pool wants 2 loader workers
    from gptqmodel import GPTQModel, QuantizeConfig

    spec = fixture_specs()[name]
    qcfg = QuantizeConfig(**spec["qcfg"], offload_to_disk=False)
    model = GPTQModel.load(src, qcfg, dtype=spec["dtype"])
    model.quantize(calibration(), batch_size=1)
    model.save(out)
    with open(os.path.join(out, "config.json")) as f:
        qc = json.load(f)["quantization_config"]
    t = load_file(os.path.join(out, "model.safetensors"))
    lib = {}
    for k in sorted(t):
        if k.endswith(".qweight"):
            prefix = k[:-len("qweight")]
            lib[prefix + "weight"] = (awq_library if qc["quant_method"] == "awq" else gptq_library)(prefix, t, qc)
    save_file(lib, os.path.join(out, "library_dequant.safetensors"))


def write_gptqmodel(src, dst, spec):
    """dst = src quantized by GPTQModel (GPTQ or AWQ) and saved by it; returns
    {checkpoint name: exact fp32 value}."""
    out = dst + "_saved"
    # in the temporary folder: GPTQModel writes its logs/ into the working directory
    subprocess.run([sys.executable, os.path.abspath(__file__), "--gptqmodel-worker", spec["name"], src, out],
                   check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd=os.path.dirname(out))
    os.makedirs(dst)
    # the checkpoint as saved, less the tokenizer GPTQModel adds for its own
    # calibration and its timing log; config.json and generation_config.json
    # are the model's own plus GPTQModel's quantization_config (its save
    # also sets eos / pad token 0 from that tokenizer, and do_sample)
    for f in ("quantize_config.json", "model.safetensors"):
        shutil.copy(os.path.join(out, f), dst)
    shutil.copy(os.path.join(src, "generation_config.json"), dst)
    with open(os.path.join(out, "config.json")) as f:
        qc = json.load(f)["quantization_config"]
    with open(os.path.join(src, "config.json")) as f:
        cfg = json.load(f)
    cfg["quantization_config"] = qc
    write_json(os.path.join(dst, "config.json"), cfg)
    t = load_file(os.path.join(dst, "model.safetensors"))
    lib = load_file(os.path.join(out, "library_dequant.safetensors"))
    values = {}
    for k, v in sorted(t.items()):
        if k.endswith(".qweight"):
            prefix = k[:-len("qweight")]
            mine = (awq_values if qc["quant_method"] == "awq" else gptq_values)(prefix, t, qc)
            values[prefix + "weight"] = mine.float()
            assert torch.equal(values[prefix + "weight"].double(), mine), "the dequantization is exact in fp32"
            assert torch.equal(lib.pop(prefix + "weight"), values[prefix + "weight"]), \
                f"{prefix}: the library's dequantization differs"
        elif k.endswith((".qzeros", ".scales", ".g_idx")):
            continue
        else:
            assert v.dtype == torch.float16, (k, v.dtype)
            values[k] = v.float()
    assert not lib
    return values

# --------------------------------------------------------------------------- reference

def model_weight(sd, k):
    """transformers' tensor for checkpoint name k (experts fused per layer)."""
    if ".experts." in k and k.split(".experts.")[1].split(".")[0].isdigit():
        layer, rest = k.split(".experts.")
        e, proj = int(rest.split(".")[0]), rest.split(".")[1]
        if proj == "down_proj":
            return sd[f"{layer}.experts.down_proj"][e]
        gu = sd[f"{layer}.experts.gate_up_proj"][e]
        half = gu.shape[0] // 2
        return gu[:half] if proj == "gate_proj" else gu[half:]
    return sd[k]


def check_weights(model, values, rounded_to=None):
    """The model's weights are values (rounded to a dtype and back, if given)."""
    sd = model.state_dict()
    for k, v in values.items():
        got = model_weight(sd, k)
        want = v.to(rounded_to).float() if rounded_to is not None else v
        assert got.dtype == torch.float32 or rounded_to is not None, (k, got.dtype)
        got = got.float()
        assert torch.equal(got, want), f"{k}: differs by {float((got - want).abs().max())}"
    return len(values)


def write_values(src, path, values):
    """A plain fp32 checkpoint of values with src's config: the reference model."""
    os.makedirs(path)
    for f in os.listdir(src):
        if not f.endswith(".safetensors"):
            shutil.copy(os.path.join(src, f), path)
    save_file({k: v.contiguous() for k, v in values.items()}, os.path.join(path, "model.safetensors"),
              metadata={"format": "pt"})


FORMATS = {"ct": write_ct, "gptqmodel": write_gptqmodel}


def make_fixture(name, spec, prompts):
    last_err = None
    for seed in range(spec["seed"], spec["seed"] + MAX_SEED_TRIES):
        torch.manual_seed(seed)
        cfg = spec["config"]()
        model = spec["cls"](cfg).eval().to(spec["dtype"])
        tmp = tempfile.mkdtemp(prefix=f"fx_{name}_")
        try:
            src, dst, deq = (os.path.join(tmp, d) for d in ("src", "q4", "deq"))
            model.save_pretrained(src)
            values = FORMATS[spec["fmt"]](src, dst, spec)
            write_values(src, deq, values)
            ref_model = load(deq, torch.float32)
            n = check_weights(ref_model, values)
            tensors, stats = reference_outputs(ref_model, prompts)
            bad = check_stats(stats)
            if bad:
                print(f"  {name}: seed {seed} rejected ({bad})", flush=True)
                last_err = bad
                continue
            extra = {}
            if stats["min_route_margin"] is not None:
                extra["default_experts_implementation_matches"] = check_default_experts(
                    name, deq, prompts, tensors, stats)
            if spec["fmt"] == "ct":
                extra["transformers_load"] = check_ct_transformers(dst, values, tensors, prompts)
                extra["compressed_tensors_version"] = importlib.metadata.version("compressed-tensors")
            with open(os.path.join(dst, "config.json")) as f:
                qc = json.load(f)["quantization_config"]
            if spec["fmt"] == "gptqmodel":
                extra["library"] = (f"GPTQModel {importlib.metadata.version('gptqmodel')}: GPTQModel.load, "
                                    f"quantize on {CALIB_SEQS} random sequences of {CALIB_LEN} tokens, save")
                extra["reference_weights"] = (
                    "the library's dequantization (" + ("dequantize_gemm" if qc["quant_method"] == "awq" else
                                                        "TorchLinear.dequantize_weight") +
                    ") with fp32 scales, equal to the exact (q - z) * s")
            ref = {
                "family": cfg.model_type,
                "architecture": type(model).__name__,
                "seed": seed,
                "dtype": f"int4 Linear weights with {str(spec['dtype']).replace('torch.', '')} scales; "
                         f"{str(spec['dtype']).replace('torch.', '')} elsewhere",
                "quantization_config": qc,
                "reference": "transformers in fp32 over the exact fp32 dequantization (q - z) * s",
                "weights_checked": n,
                "n_prompts": len(prompts),
                "greedy_tokens": GREEDY_TOKENS,
                "min_logit_margin": stats["min_logit_margin"],
                "min_route_margin": stats["min_route_margin"],
                "expert_layout": "per_expert" if stats["min_route_margin"] is not None else None,
                "experts_used_per_layer": stats["experts_used"],
                "kv_cache_max_rel_diff": stats["kv_rel"],
                "attn_implementation": "eager",
                "experts_implementation": "eager",
                **extra,
                "max_abs_logit": stats["logit_absmax"],
                "transformers_version": transformers.__version__,
                "torch_version": torch.__version__.split("+")[0],
                "tensors": tensor_index(tensors),
            }
            write_reference(dst, tensors, ref)
            save_file({k: values[k].contiguous() for k in spec["dequant"]},
                      os.path.join(dst, "dequant.safetensors"))
            out = install_fixture(dst, name)
            print(f"{name}: seed {seed}, {n} weights, logit margin {stats['min_logit_margin']:.4g}, "
                  f"route margin {stats['min_route_margin']}, size {tensor_sizes(out)} B", flush=True)
            if "transformers_load" in extra:
                print(f"  {extra['transformers_load']}", flush=True)
            return
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    raise RuntimeError(f"{name}: no acceptable seed ({last_err})")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--only", default="")
    ap.add_argument("--gptqmodel-worker", nargs=3, metavar=("NAME", "SRC", "OUT"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.gptqmodel_worker:
        return gptqmodel_worker(*args.gptqmodel_worker)
    only = [s for s in args.only.split(",") if s]
    prompts = make_prompts()
    for name, spec in fixture_specs().items():
        if not only or name in only:
            make_fixture(name, {**spec, "name": name}, prompts)


if __name__ == "__main__":
    sys.exit(main())
