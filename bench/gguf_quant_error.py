#!/usr/bin/env python3
"""Relative RMS error and bits a weight of a quantized GGUF's matrices against
the same model's unquantized GGUF, per part, as bench/quant_error.c prints them
for moerun's --quantize: the reference side of that comparison.

usage: gguf_quant_error.py BASE.gguf QUANT.gguf

BASE is the bf16/f16/f32 GGUF (llama.cpp's convert_hf_to_gguf.py), QUANT the
file llama.cpp's llama-quantize made from it.  Each tensor QUANT stores
quantized is dequantized by gguf-py (gguf.quants.dequantize) and compared
with BASE's values widened to fp32.  Parts: experts (ffn_*_exps), attention
(attn_*), dense and shared FFN (other ffn_*), LM head (output.weight);
token_embd is reported apart (moerun keeps the embedding as stored).
Needs gguf-py (pip install gguf, or llama.cpp's gguf-py folder on PYTHONPATH)
and numpy.  Not run by the tests.
"""
import sys

import numpy as np
from gguf import GGMLQuantizationType, GGUFReader, quants


def values(t):
    a = np.asarray(t.data)
    if t.tensor_type == GGMLQuantizationType.BF16:
        return (a.view(np.uint16).astype(np.uint32) << 16).view(np.float32)
    if t.tensor_type in (GGMLQuantizationType.F32, GGMLQuantizationType.F16):
        return a.astype(np.float32)
    return quants.dequantize(a, t.tensor_type).astype(np.float32)


def part(name):
    if name == "output.weight":
        return "LM head"
    if name == "token_embd.weight":
        return "embedding"
    if "_exps" in name:
        return "experts"
    if ".attn_" in name:
        return "attention"
    if ".ffn_" in name:
        return "dense and shared FFN"
    return None


def main():
    base = {t.name: t for t in GGUFReader(sys.argv[1]).tensors}
    sums = {}
    for t in GGUFReader(sys.argv[2]).tensors:
        p = part(t.name)
        if p is None or t.tensor_type in (GGMLQuantizationType.F32, GGMLQuantizationType.BF16,
                                          GGMLQuantizationType.F16):
            continue
        q = values(t).reshape(-1).astype(np.float64)
        r = values(base[t.name]).reshape(-1).astype(np.float64)
        s = sums.setdefault(p, [0.0, 0.0, 0, 0])
        s[0] += float(np.sum((q - r) ** 2))
        s[1] += float(np.sum(r * r))
        s[2] += int(t.n_bytes)
        s[3] += q.size
    print(f"{sys.argv[2]}\n{'part':22s} {'weights':>14s} {'bits/weight':>12s} {'relative RMS':>14s}")
    total = [0.0, 0.0, 0, 0]
    for p in ("experts", "attention", "dense and shared FFN", "LM head", "embedding"):
        if p not in sums:
            continue
        s = sums[p]
        print(f"{p:22s} {s[3]:14d} {8 * s[2] / s[3]:12.4f} {np.sqrt(s[0] / s[1]):14.6f}")
        if p != "embedding":
            total = [a + b for a, b in zip(total, s)]
    print(f"{'all but the embedding':22s} {total[3]:14d} {8 * total[2] / total[3]:12.4f} "
          f"{np.sqrt(total[0] / total[1]):14.6f}")


if __name__ == "__main__":
    main()
