#!/usr/bin/env python3
"""Reference Q8_0 blocks made by gguf-py (the quantizer llama.cpp's
convert_hf_to_gguf.py uses, bit-exact with ggml-quants.c), for
tests/test_quant.c: tests/fixtures/quant/q8_0.safetensors holds

  x        F32 (8, 256)  inputs: normal values, a zero block, exact .5 ties,
                         tiny values (a subnormal f16 scale), large values,
                         bf16-rounded values, outliers
  q8_0     U8  (8, 272)  gguf.quants.quantize(x, Q8_0): per 32 values an f16
                         scale then 32 int8
  dequant  F32 (8, 256)  gguf.quants.dequantize(q8_0, Q8_0)

Python is only a fixture-making tool.  Usage: python tests/reference/make_quant_fixtures.py
"""
import importlib.metadata
import os

import numpy as np
from gguf import GGMLQuantizationType, quants
from safetensors.numpy import save_file

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
OUT = os.path.join(REPO, "tests", "fixtures", "quant", "q8_0.safetensors")


def main():
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


if __name__ == "__main__":
    main()
