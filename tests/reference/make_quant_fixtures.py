#!/usr/bin/env python3
"""Reference quantized weights for tests/test_quant.c.

tests/fixtures/quant/q8_0.safetensors: Q8_0 blocks made by gguf-py (the
quantizer llama.cpp's convert_hf_to_gguf.py uses, bit-exact with
ggml-quants.c):

  x        F32 (8, 256)  inputs: normal values, a zero block, exact .5 ties,
                         tiny values (a subnormal f16 scale), large values,
                         bf16-rounded values, outliers
  q8_0     U8  (8, 272)  gguf.quants.quantize(x, Q8_0): per 32 values an f16
                         scale then 32 int8
  dequant  F32 (8, 256)  gguf.quants.dequantize(q8_0, Q8_0)

tests/fixtures/quant/mxfp4.safetensors: MXFP4 matrices in a gpt-oss
checkpoint's layout and their values as transformers dequantizes them
(transformers.integrations.mxfp4.convert_moe_packed_tensors, in float32, so
exact), for each name in NAMES with shape (N, K):

  NAME_blocks   U8  (N, K/32, 16)  byte b of group g: element 32g+2b in the
                                   low nibble, 32g+2b+1 in the high one
  NAME_scales   U8  (N, K/32)      E8M0 exponents; 0, 1, 100..140 and 254
                                   all occur (255, NaN, never)
  NAME_dequant  F32 (N, K)

Every byte value 0..255 occurs among the blocks.  Scale 254 makes the values
of magnitude 2 and more overflow to inf, and scale 0 makes subnormals; both
are what transformers computes.

Python is only a fixture-making tool.  Usage: python tests/reference/make_quant_fixtures.py
"""
import importlib.metadata
import os

import numpy as np
from gguf import GGMLQuantizationType, quants
from safetensors.numpy import save_file

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
OUT = os.path.join(REPO, "tests", "fixtures", "quant", "q8_0.safetensors")
OUT_MXFP4 = os.path.join(REPO, "tests", "fixtures", "quant", "mxfp4.safetensors")
MXFP4_SHAPES = {"a": (3, 64), "b": (5, 96), "c": (7, 256)}


def make_q8_0():
    r = np.random.default_rng(8)
    x = r.standard_normal((8, 256)).astype(np.float32)
    x[1, :32] = 0.0                                   # a zero block: scale 0, q 0
    x[2, :32] = 0.0
    x[2, 0] = 127.0                                   # d = 1, id = 1: ties round away from 0
    x[2, 1:9] = [2.5, -3.5, 0.5, -0.5, 1.5, -1.5, 126.5, -126.5]
    x[3] *= 1e-6                                      # scales below f16's normal range
    x[4] *= 1e4
    x[5] = (x[5].view(np.uint32) & 0xFFFF0000).view(np.float32)  # bf16 values
    x[6, 5] = 40.0                                    # an outlier in a block
    x[7, ::32] = -9.0                                 # the block maximum negative
    q = quants.quantize(x, GGMLQuantizationType.Q8_0)
    d = quants.dequantize(q, GGMLQuantizationType.Q8_0).astype(np.float32)
    assert q.shape == (8, 272), q.shape
    os.makedirs(os.path.dirname(OUT), exist_ok=True)
    save_file({"x": x, "q8_0": q.astype(np.uint8), "dequant": d}, OUT,
              metadata={"made_by": "tests/reference/make_quant_fixtures.py",
                        "gguf": importlib.metadata.version("gguf")})
    print(OUT, os.path.getsize(OUT), "bytes")


def make_mxfp4():
    import torch
    import transformers
    from transformers.integrations.mxfp4 import FP4_VALUES, convert_moe_packed_tensors

    r = np.random.default_rng(4)
    groups = sum(n * k // 32 for n, k in MXFP4_SHAPES.values())
    nbytes = groups * 16
    # every byte value, then random ones, in a random order
    blocks = np.concatenate([np.arange(256), r.integers(0, 256, nbytes - 256)]).astype(np.uint8)
    r.shuffle(blocks)
    # the edge exponents and 100..140, then random ones (never 255)
    scales = np.concatenate([[0, 1, 254], np.arange(100, 141),
                             r.integers(0, 255, groups - 44)]).astype(np.uint8)
    r.shuffle(scales)
    assert scales.max() < 255 and len(set(blocks.tolist())) == 256
    lut = np.array(FP4_VALUES, dtype=np.float32)
    tensors, b0, s0 = {}, 0, 0
    for name, (n, k) in MXFP4_SHAPES.items():
        g = k // 32
        blk = blocks[b0:b0 + n * g * 16].reshape(n, g, 16)
        sc = scales[s0:s0 + n * g].reshape(n, g)
        b0, s0 = b0 + n * g * 16, s0 + n * g
        # transformers takes (E, N, G, 16) and returns (E, K, N): one expert, transposed back
        deq = convert_moe_packed_tensors(torch.from_numpy(blk.copy())[None], torch.from_numpy(sc.copy())[None],
                                         dtype=torch.float32)[0].T.contiguous().numpy()
        assert deq.shape == (n, k) and deq.dtype == np.float32, (deq.shape, deq.dtype)
        # an independent reading of the format: the same bits
        nib = np.stack([blk & 15, blk >> 4], axis=-1).reshape(n, g, 32)
        with np.errstate(over="ignore"):
            mine = (lut[nib] * np.ldexp(np.float32(1), sc.astype(np.int32) - 127)
                    .astype(np.float32)[..., None]).reshape(n, k)
        assert np.array_equal(mine.view(np.uint32), deq.view(np.uint32)), name
        tensors[name + "_blocks"] = blk
        tensors[name + "_scales"] = sc
        tensors[name + "_dequant"] = deq
    save_file(tensors, OUT_MXFP4, metadata={"made_by": "tests/reference/make_quant_fixtures.py",
                                            "transformers": transformers.__version__,
                                            "torch": torch.__version__})
    print(OUT_MXFP4, os.path.getsize(OUT_MXFP4), "bytes")


def main():
    make_q8_0()
    make_mxfp4()


if __name__ == "__main__":
    main()
