#!/usr/bin/env python3
"""Build tests/fixtures/llama4_multimodal: the text model of tests/fixtures/llama4
inside a Llama4ForConditionalGeneration checkpoint (a tiny random vision
tower beside it), saved by transformers as the released Llama-4 checkpoints
are laid out: config.json with text_config and vision_config, the text
model's tensors under `language_model.`.  It shares llama4's reference
(text prompts: the vision tower is not run), which transformers' own
Llama4ForConditionalGeneration is checked to reproduce.

And tests/fixtures/qwen3_5_moe_multimodal: the same for tests/fixtures/qwen3_5_moe
inside a Qwen3_5MoeForConditionalGeneration checkpoint (model_type
qwen3_5_moe, as the released Qwen3.5-MoE checkpoints are): the text model's
tensors under `model.language_model.`, `lm_head.weight`, a tiny random
vision tower under `model.visual.`; qwen3_5_moe's reference, which
Qwen3_5MoeForConditionalGeneration's forward on input_ids alone (and
AutoModelForCausalLM reading the folder, its text model only) reproduce.

Python is only a fixture-making tool; nothing in the runtime or build needs it.

Usage: python tests/reference/make_multimodal_fixtures.py [--only name,name]
(after make_fixtures.py --only llama4,qwen3_5_moe)
"""
import argparse
import os
import shutil
import sys
import tempfile

import torch
from safetensors import safe_open
from safetensors.torch import load_file

import transformers
from transformers import (Llama4Config, Llama4ForConditionalGeneration, Qwen3_5MoeConfig,
                          Qwen3_5MoeForConditionalGeneration)

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from fixture_common import FIXTURES, KV_TOL, load, tensor_sizes, update_json  # noqa: E402

VISION = dict(hidden_size=32, num_hidden_layers=1, num_attention_heads=2, intermediate_size=64, image_size=28,
              patch_size=14, vision_output_dim=32, projector_input_dim=32, projector_output_dim=64,
              pixel_shuffle_ratio=0.5)
# Qwen3.5's vision tower, tiny: one block, patches of 2x8x8 pixels, a 4x4
# learned position grid, 2x2 patches merged into one text embedding (64)
QWEN3_5_VISION = dict(depth=1, hidden_size=32, num_heads=2, intermediate_size=64, patch_size=8,
                      temporal_patch_size=2, spatial_merge_size=2, num_position_embeddings=16,
                      out_hidden_size=64)


def make_llama4():
    src, dst = os.path.join(FIXTURES, "llama4"), os.path.join(FIXTURES, "llama4_multimodal")
    text = load(src, torch.float32)
    torch.manual_seed(17000)
    cfg = Llama4Config(text_config=text.config.to_dict(), vision_config=VISION)
    model = Llama4ForConditionalGeneration(cfg).eval()
    missing = model.language_model.load_state_dict(text.state_dict(), strict=True)
    assert not missing.missing_keys and not missing.unexpected_keys, missing
    tmp = tempfile.mkdtemp(prefix="fx_llama4_mm_")
    try:
        model.save_pretrained(tmp)
        for f in ("reference.json", "reference.safetensors"):
            shutil.copy(os.path.join(src, f), os.path.join(tmp, f))
        r = update_json(os.path.join(tmp, "reference.json"),
                        lambda r: r.update(architecture="Llama4ForConditionalGeneration",
                                           reference_from="llama4 (the same text model)"))
        # transformers reads the multimodal folder to the text model's logits
        refs = load_file(os.path.join(tmp, "reference.safetensors"))
        mm = Llama4ForConditionalGeneration.from_pretrained(tmp, dtype=torch.float32,
                                                            attn_implementation="eager").eval()
        with torch.no_grad():
            for i in range(r["n_prompts"]):
                # its language_model, what its forward runs on text alone
                # (5.24's forward itself fails building its output:
                # MoeCausalLMOutputWithPast has no image_outputs)
                lg = mm.language_model(input_ids=refs[f"prompt.{i}"].long().view(1, -1),
                                       use_cache=False).logits[0]
                d = float((lg - refs[f"logits.{i}"]).abs().max())
                assert d <= KV_TOL * max(1.0, r["max_abs_logit"]), f"prompt {i}: differs by {d}"
        if os.path.exists(dst):
            shutil.rmtree(dst)
        shutil.copytree(tmp, dst)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    print(f"llama4_multimodal: the llama4 text model under language_model., size {tensor_sizes(dst)} B")


def make_qwen3_5_moe():
    src, dst = os.path.join(FIXTURES, "qwen3_5_moe"), os.path.join(FIXTURES, "qwen3_5_moe_multimodal")
    text = load(src, torch.float32)
    text_cfg = text.config.to_dict()
    for k in ("_name_or_path", "architectures"):  # not a separate checkpoint's
        text_cfg.pop(k, None)
    torch.manual_seed(18000)
    cfg = Qwen3_5MoeConfig(text_config=text_cfg, vision_config=QWEN3_5_VISION,
                           tie_word_embeddings=False)
    assert cfg.text_config.hidden_size == cfg.vision_config.out_hidden_size
    model = Qwen3_5MoeForConditionalGeneration(cfg).eval()
    for part, ref in ((model.model.language_model, text.model), (model.lm_head, text.lm_head)):
        missing = part.load_state_dict(ref.state_dict(), strict=True)
        assert not missing.missing_keys and not missing.unexpected_keys, missing
    tmp = tempfile.mkdtemp(prefix="fx_qwen3_5_moe_mm_")
    try:
        model.save_pretrained(tmp)
        with safe_open(os.path.join(tmp, "model.safetensors"), "pt") as h:
            names = list(h.keys())
        prefixes = sorted({".".join(n.split(".")[:2]) if n.startswith("model.") else n for n in names})
        assert prefixes == ["lm_head.weight", "model.language_model", "model.visual"], prefixes
        # the text tensors are qwen3_5_moe's, named model.language_model.*
        src_t = load_file(os.path.join(src, "model.safetensors"))
        mm_t = load_file(os.path.join(tmp, "model.safetensors"))
        for k, v in src_t.items():
            k2 = k if k == "lm_head.weight" else "model.language_model." + k[len("model."):]
            assert torch.equal(mm_t[k2], v), k
        assert len(mm_t) == len(src_t) + sum(n.startswith("model.visual.") for n in mm_t)
        for f in ("reference.json", "reference.safetensors"):
            shutil.copy(os.path.join(src, f), os.path.join(tmp, f))
        r = update_json(os.path.join(tmp, "reference.json"),
                        lambda r: r.update(architecture="Qwen3_5MoeForConditionalGeneration",
                                           reference_from="qwen3_5_moe (the same text model)"))
        refs = load_file(os.path.join(tmp, "reference.safetensors"))
        kw = dict(dtype=torch.float32, attn_implementation="eager", experts_implementation="eager")
        mm = Qwen3_5MoeForConditionalGeneration.from_pretrained(tmp, **kw).eval()
        lm = transformers.AutoModelForCausalLM.from_pretrained(tmp, **kw).eval()
        assert type(lm).__name__ == "Qwen3_5MoeForCausalLM", type(lm)
        worst = 0.0
        with torch.no_grad():
            for i in range(r["n_prompts"]):
                ids = refs[f"prompt.{i}"].long().view(1, -1)
                for m in (mm, lm):  # the whole forward, on input_ids alone
                    lg = m(input_ids=ids, use_cache=False).logits[0]
                    d = float((lg - refs[f"logits.{i}"]).abs().max())
                    worst = max(worst, d)
                    assert d <= KV_TOL * max(1.0, r["max_abs_logit"]), f"prompt {i}: differs by {d}"
        if os.path.exists(dst):
            shutil.rmtree(dst)
        shutil.copytree(tmp, dst)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    print(f"qwen3_5_moe_multimodal: the qwen3_5_moe text model under model.language_model., "
          f"{sum(n.startswith('model.visual.') for n in names)} vision tensors under model.visual.; "
          f"transformers' logits max |diff| {worst:.3g}; size {tensor_sizes(dst)} B")


MAKERS = {"llama4_multimodal": make_llama4, "qwen3_5_moe_multimodal": make_qwen3_5_moe}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--only", default="")
    args = ap.parse_args()
    only = [s for s in args.only.split(",") if s]
    unknown = set(only) - set(MAKERS)
    if unknown:
        ap.error(f"unknown fixtures {sorted(unknown)}; known: {sorted(MAKERS)}")
    for name, make in MAKERS.items():
        if not only or name in only:
            make()


if __name__ == "__main__":
    sys.exit(main())
