#!/usr/bin/env python3
"""Build tests/fixtures/llama4_multimodal: the text model of tests/fixtures/llama4
inside a Llama4ForConditionalGeneration checkpoint (a tiny random vision
tower beside it), saved by transformers as the released Llama-4 checkpoints
are laid out: config.json with text_config and vision_config, the text
model's tensors under `language_model.`.  It shares llama4's reference
(text prompts: the vision tower is not run), which transformers' own
Llama4ForConditionalGeneration is checked to reproduce.

Python is only a fixture-making tool; nothing in the runtime or build needs it.

Usage: python tests/reference/make_multimodal_fixtures.py (after make_fixtures.py --only llama4)
"""
import os
import shutil
import sys
import tempfile

import torch
from safetensors.torch import load_file

from transformers import Llama4Config, Llama4ForConditionalGeneration

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from fixture_common import FIXTURES, KV_TOL, load, tensor_sizes, update_json  # noqa: E402

VISION = dict(hidden_size=32, num_hidden_layers=1, num_attention_heads=2, intermediate_size=64, image_size=28,
              patch_size=14, vision_output_dim=32, projector_input_dim=32, projector_output_dim=64,
              pixel_shuffle_ratio=0.5)


def main():
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


if __name__ == "__main__":
    sys.exit(main())
