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

tests/fixtures/quant/q4_1.safetensors: Q4_1 blocks made by gguf-py the same
way (moerun's MOE_DTYPE_Q4_1 is ggml's block_q4_1 bit for bit):

  x        F32 (8, 256)  inputs: normal values, a constant block (d 0), a
                         zero block, tiny values (a subnormal f16 d), large
                         values near f16's range, bf16-rounded values,
                         outliers
  q4_1     U8  (8, 160)  gguf.quants.quantize(x, Q4_1): per 32 values an
                         f16 d, an f16 m (the block minimum), then 16 bytes:
                         byte j holds value j in its low nibble and value
                         j + 16 in its high one; a value is q * d + m
  dequant  F32 (8, 256)  gguf.quants.dequantize(q4_1, Q4_1)

tests/fixtures/quant/q4_k.safetensors: Q4_K blocks (ggml's block_q4_K,
moerun's MOE_DTYPE_Q4_K bit for bit) and their values as gguf-py
dequantizes them (gguf-py has no Q4_K quantizer: the blocks are random
bytes with finite f16 heads, so every scale and minimum packing occurs):

  q4_k     U8  (6, 576)   4 blocks of 144 bytes a row: f16 d, f16 dmin, 12
                          bytes of 6-bit scales and minimums, 128 bytes of
                          codes; row 0 every scale and minimum 63, row 1
                          all 0, row 2 subnormal f16 heads, the others
                          random (d and dmin in [2^-12, 2^-4))
  dequant  F32 (6, 1024)  gguf.quants.dequantize(q4_k, Q4_K)

tests/fixtures/quant/q6_k.safetensors: Q6_K blocks (ggml's block_q6_K,
moerun's MOE_DTYPE_Q6_K bit for bit) and their values as gguf-py
dequantizes them (gguf-py has no Q6_K quantizer: the blocks are random
bytes with finite f16 d, so every code, scale and bit position occurs):

  q6_k     U8  (6, 840)   4 blocks of 210 bytes a row: 128 bytes ql (low
                          4 bits of the codes), 64 bytes qh (high 2 bits),
                          16 int8 scales, f16 d; row 0 scales -128 and 127
                          with codes 0 and 63, row 1 every scale 0, row 2
                          a subnormal f16 d, the others random (|d| in
                          [2^-12, 2^-4), either sign)
  dequant  F32 (6, 1024)  gguf.quants.dequantize(q6_k, Q6_K)

tests/fixtures/quant/q5_k.safetensors: Q5_K blocks (ggml's block_q5_K,
moerun's MOE_DTYPE_Q5_K bit for bit) and their values as gguf-py
dequantizes them (gguf-py has no Q5_K quantizer: the blocks are random
bytes with finite f16 heads, so every scale, minimum, code and high bit
occurs):

  q5_k     U8  (6, 704)   4 blocks of 176 bytes a row: f16 d, f16 dmin, 12
                          bytes of 6-bit scales and minimums (Q4_K's
                          packing), 32 bytes qh (bit j of qh[l]: the high
                          bit of element 32j + l), 128 bytes qs (low
                          nibbles, Q4_K's layout); row 0 every scale and
                          minimum 63 with codes 31 (blocks 0, 1) and 0
                          (blocks 2, 3), row 1 all scales and minimums 0,
                          row 2 subnormal f16 heads, the others random (d
                          and dmin in [2^-12, 2^-4))
  dequant  F32 (6, 1024)  gguf.quants.dequantize(q5_k, Q5_K)

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

tests/fixtures/quant/fp8.safetensors: block-scaled FP8 (the DeepSeek-V3 /
Qwen3-FP8 checkpoint format, weight_block_size [128, 128]) and its values as
torch and transformers compute them:

  e4m3          F8_E4M3 (256)   every byte 0..255
  e4m3_f32      F32 (256)       torch's conversion .to(float32) (0x7F and
                                0xFF are NaN: float8_e4m3fn has no inf)
  NAME          F8_E4M3 (N, K)  a weight, random bytes, never NaN
  NAME_scale_inv F32 or BF16 (ceil(N/128), ceil(K/128))
  NAME_dequant  F32 (N, K)      transformers' _dequantize_fp8_weight (the
                                dequantization of its FP8Linear: scale rows
                                repeated 128 times and cut to N), in float32

for NAME in FP8_SHAPES.  N = 200 and 130 leave a last row group of 72 and
2 rows; the scales include 0, a subnormal (1e-40: products underflow), and
1e36 (products past fp32's range are inf, as in torch); c's scales are BF16.  Where the grid
divides N evenly transformers' CPU loader (Fp8Dequantize) gives the same
values; for N = 200 it would split the rows 100 / 100 instead (its bug: see
docs/models.md), so that tensor is checked against the grid of 128 only.

tests/fixtures/quant/kv_fp8.safetensors: the fp8 KV cache's rounding
(kvcache.h, tests/test_kv_fp8.c), as torch converts float32 to
float8_e4m3fn:

  x             F32 (M)     every non-NaN E4M3 value, the exact midpoints
                            between neighbours (ties) and the floats next to
                            them, log-uniform values up to 478, E4M3's
                            subnormal range, fp32 subnormals, 0, -0, and
                            values in [448, 480) (torch rounds them to 448;
                            from 480 on it gives NaN where the cache
                            saturates: that rule is tested apart); each
                            also negated
  e4m3          U8 (M)      x.to(float8_e4m3fn), the bytes
  e4m3_f32      F32 (M)     those bytes back to float32
  rows          F32 (64, 96) rows over 2^-20 .. 2^20 of magnitude, a zero
                            row, a constant row, a row with 3e38, a row of
                            fp32 subnormals
  rows_scale    F32 (64)    amax / 448 per row
  rows_e4m3     U8 (64, 96) (rows / scale).to(float8_e4m3fn) (0 where the
                            scale is 0)
  rows_dequant  F32 (64, 96) the bytes' values times the scale

Python is only a fixture-making tool.
Usage: python tests/reference/make_quant_fixtures.py [--only q8_0,q4_1,q4_k,q5_k,q6_k,mxfp4,fp8,kv_fp8]
"""
import argparse
import importlib.metadata
import os

import numpy as np
from gguf import GGMLQuantizationType, quants
from safetensors.numpy import save_file

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
OUT = os.path.join(REPO, "tests", "fixtures", "quant", "q8_0.safetensors")
OUT_Q4_1 = os.path.join(REPO, "tests", "fixtures", "quant", "q4_1.safetensors")
OUT_Q4_K = os.path.join(REPO, "tests", "fixtures", "quant", "q4_k.safetensors")
OUT_Q5_K = os.path.join(REPO, "tests", "fixtures", "quant", "q5_k.safetensors")
OUT_Q6_K = os.path.join(REPO, "tests", "fixtures", "quant", "q6_k.safetensors")
OUT_MXFP4 = os.path.join(REPO, "tests", "fixtures", "quant", "mxfp4.safetensors")
MXFP4_SHAPES = {"a": (3, 64), "b": (5, 96), "c": (7, 256)}
OUT_FP8 = os.path.join(REPO, "tests", "fixtures", "quant", "fp8.safetensors")
OUT_KV_FP8 = os.path.join(REPO, "tests", "fixtures", "quant", "kv_fp8.safetensors")
FP8_SHAPES = {"a": (5, 128, "F32"), "b": (200, 128, "F32"), "c": (130, 256, "BF16"), "d": (256, 128, "F32")}


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


def make_q4_1():
    r = np.random.default_rng(41)
    x = r.standard_normal((8, 256)).astype(np.float32)
    x[1, :32] = 0.0                                   # a zero block: d 0, m 0
    x[1, 32:64] = -1.75                               # a constant block: d 0, m the value
    x[2, 32:64] = np.linspace(-1.0, 2.0, 32)          # steps of d / 2: rounding on the midpoints
    x[3] *= 1e-6                                      # d below f16's normal range
    x[4] *= 1.5e4                                     # m and d near f16's range
    x[4, 64:96] = np.linspace(-65000.0, 65000.0, 32)
    x[5] = (x[5].view(np.uint32) & 0xFFFF0000).view(np.float32)  # bf16 values
    x[6, 5] = 40.0                                    # an outlier in a block
    x[7, ::32] = -9.0                                 # the block minimum an outlier
    q = quants.quantize(x, GGMLQuantizationType.Q4_1)
    d = quants.dequantize(q, GGMLQuantizationType.Q4_1).astype(np.float32)
    assert q.shape == (8, 160), q.shape
    # an independent reading of the format: the same values
    blk = q.reshape(8, 8, 20)
    dm = blk[..., :4].copy().view(np.float16).astype(np.float32)
    nib = np.concatenate([blk[..., 4:] & 15, blk[..., 4:] >> 4], axis=-1).astype(np.float32)
    mine = (nib * dm[..., :1] + dm[..., 1:]).reshape(8, 256)
    assert np.array_equal(mine, d) and np.isfinite(dm).all()
    assert (dm[1, 0, 0] == 0) and (dm[1, 1, 0] == 0) and (dm[1, 1, 1] == -1.75)
    assert 0 < abs(dm[3, :, 0]).max() < 2.0 ** -14
    save_file({"x": x, "q4_1": q.astype(np.uint8), "dequant": d}, OUT_Q4_1,
              metadata={"made_by": "tests/reference/make_quant_fixtures.py",
                        "gguf": importlib.metadata.version("gguf")})
    print(OUT_Q4_1, os.path.getsize(OUT_Q4_1), "bytes")


def make_q4_k():
    r = np.random.default_rng(44)
    rows, blocks = 6, 4
    q = r.integers(0, 256, size=(rows, blocks, 144), dtype=np.uint8)
    heads = r.uniform(2.0 ** -12, 2.0 ** -4, size=(rows, blocks, 2)).astype(np.float16)
    heads[2] = np.float16(2.0 ** -20)                 # subnormal f16 d and dmin
    q[..., :4] = heads.view(np.uint8).reshape(rows, blocks, 4)
    q[0, :, 4:16] = 0xFF                              # every 6-bit scale and minimum 63
    q[1, :, 4:16] = 0                                 # all 0: every value 0
    q = q.reshape(rows, blocks * 144)
    d = quants.dequantize(q, GGMLQuantizationType.Q4_K).astype(np.float32)
    assert d.shape == (rows, blocks * 256), d.shape
    assert np.isfinite(d).all() and (d[1] == 0).all()
    save_file({"q4_k": q, "dequant": d}, OUT_Q4_K,
              metadata={"made_by": "tests/reference/make_quant_fixtures.py",
                        "gguf": importlib.metadata.version("gguf")})
    print(OUT_Q4_K, os.path.getsize(OUT_Q4_K), "bytes")


def make_q5_k():
    r = np.random.default_rng(55)
    rows, blocks = 6, 4
    q = r.integers(0, 256, size=(rows, blocks, 176), dtype=np.uint8)
    heads = r.uniform(2.0 ** -12, 2.0 ** -4, size=(rows, blocks, 2)).astype(np.float16)
    heads[2] = np.float16(2.0 ** -20)                 # subnormal f16 d and dmin
    q[..., :4] = heads.view(np.uint8).reshape(rows, blocks, 4)
    q[0, :, 4:16] = 0xFF                              # every 6-bit scale and minimum 63
    q[0, :2, 16:] = 0xFF                              # codes 31
    q[0, 2:, 16:] = 0x00                              # codes 0
    q[1, :, 4:16] = 0                                 # all 0: every value 0
    q = q.reshape(rows, blocks * 176)
    deq = quants.dequantize(q, GGMLQuantizationType.Q5_K).astype(np.float32)
    assert deq.shape == (rows, blocks * 256), deq.shape
    assert np.isfinite(deq).all() and (deq[1] == 0).all()
    # an independent reading of the format (tensor.h's element formula,
    # Q4_K's scale packing written out): the same bits
    blk = q.reshape(rows, blocks, 176).astype(np.int32)
    dm = blk[..., :4].astype(np.uint8).copy().view(np.float16).astype(np.float32)
    s = blk[..., 4:16]
    sc = np.concatenate([s[..., 0:4] & 63, (s[..., 8:12] & 15) | (s[..., 0:4] >> 6) << 4], axis=-1)
    mn = np.concatenate([s[..., 4:8] & 63, (s[..., 8:12] >> 4) | (s[..., 4:8] >> 6) << 4], axis=-1)
    codes = np.zeros((rows, blocks, 256), dtype=np.int32)
    for e in range(256):
        j, ln = e // 32, e % 32
        nib = (blk[..., 48 + 32 * (j // 2) + ln] >> (4 * (j % 2))) & 15
        codes[..., e] = nib | ((blk[..., 16 + ln] >> j) & 1) << 4
    dj = dm[..., :1] * sc.astype(np.float32)
    mj = dm[..., 1:] * mn.astype(np.float32)
    mine = np.repeat(dj, 32, axis=-1) * codes.astype(np.float32) - np.repeat(mj, 32, axis=-1)
    assert np.array_equal(mine.reshape(rows, -1).view(np.uint32), deq.view(np.uint32))
    assert (codes[0, :2] == 31).all() and (codes[0, 2:] == 0).all()
    assert 0 < abs(dm[2]).max() < 2.0 ** -14
    save_file({"q5_k": q, "dequant": deq}, OUT_Q5_K,
              metadata={"made_by": "tests/reference/make_quant_fixtures.py",
                        "gguf": importlib.metadata.version("gguf")})
    print(OUT_Q5_K, os.path.getsize(OUT_Q5_K), "bytes")


def make_q6_k():
    r = np.random.default_rng(66)
    rows, blocks = 6, 4
    q = r.integers(0, 256, size=(rows, blocks, 210), dtype=np.uint8)
    d = (r.uniform(2.0 ** -12, 2.0 ** -4, size=(rows, blocks)) * r.choice([-1.0, 1.0], size=(rows, blocks)))
    d = d.astype(np.float16)
    d[2] = np.float16(2.0 ** -20)                     # a subnormal f16 d
    q[..., 208:] = d.view(np.uint8).reshape(rows, blocks, 2)
    q[0, :, 192:208] = np.array([0x80, 0x7F] * 8, dtype=np.uint8)  # scales -128 and 127
    q[0, :2, :192] = 0x00                             # codes 0 (value -32 sc d)
    q[0, 2:, :192] = 0xFF                             # codes 63 (value 31 sc d)
    q[1, :, 192:208] = 0                              # every scale 0: every value 0
    q = q.reshape(rows, blocks * 210)
    deq = quants.dequantize(q, GGMLQuantizationType.Q6_K).astype(np.float32)
    assert deq.shape == (rows, blocks * 256), deq.shape
    assert np.isfinite(deq).all() and (deq[1] == 0).all()
    # an independent reading of the format (tensor.h's element formulas):
    # the same bits
    blk = q.reshape(rows, blocks, 210)
    ql, qh = blk[..., :128].astype(np.int32), blk[..., 128:192].astype(np.int32)
    sc = blk[..., 192:208].copy().view(np.int8).astype(np.float32)
    dd = blk[..., 208:].copy().view(np.float16).astype(np.float32)
    codes = np.zeros((rows, blocks, 256), dtype=np.int32)
    for h in range(2):
        for ln in range(32):
            a, b, c = ql[..., 64 * h + ln], ql[..., 64 * h + ln + 32], qh[..., 32 * h + ln]
            codes[..., 128 * h + ln] = (a & 15) | (c & 3) << 4
            codes[..., 128 * h + ln + 32] = (b & 15) | (c >> 2 & 3) << 4
            codes[..., 128 * h + ln + 64] = (a >> 4) | (c >> 4 & 3) << 4
            codes[..., 128 * h + ln + 96] = (b >> 4) | (c >> 6 & 3) << 4
    mine = (dd * np.repeat(sc, 16, axis=-1)) * (codes - 32).astype(np.float32)
    assert np.array_equal(mine.reshape(rows, -1).view(np.uint32), deq.view(np.uint32))
    assert (codes[0, :2] == 0).all() and (codes[0, 2:] == 63).all()
    assert 0 < abs(dd[2]).max() < 2.0 ** -14
    save_file({"q6_k": q, "dequant": deq}, OUT_Q6_K,
              metadata={"made_by": "tests/reference/make_quant_fixtures.py",
                        "gguf": importlib.metadata.version("gguf")})
    print(OUT_Q6_K, os.path.getsize(OUT_Q6_K), "bytes")


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


def make_fp8():
    import torch
    import transformers
    from safetensors.torch import save_file as save_torch
    from transformers.integrations.finegrained_fp8 import Fp8Dequantize, _dequantize_fp8_weight

    f8 = torch.float8_e4m3fn
    g = torch.Generator().manual_seed(8)
    allb = torch.arange(256, dtype=torch.uint8)
    tensors = {"e4m3": allb.view(f8), "e4m3_f32": allb.view(f8).to(torch.float32)}
    assert torch.isnan(tensors["e4m3_f32"][[0x7F, 0xFF]]).all()
    assert int(torch.isnan(tensors["e4m3_f32"]).sum()) == 2
    specials = [0.0, 1e-40, 1e36]
    for i, (name, (n, k, sdt)) in enumerate(FP8_SHAPES.items()):
        q = torch.randint(0, 256, (n, k), dtype=torch.uint8, generator=g)
        q[(q & 0x7F) == 0x7F] = 0x3F  # never NaN
        q = q.view(f8)
        sn, sk = -(-n // 128), -(-k // 128)
        s = torch.exp2(torch.empty(sn, sk).uniform_(-14, -2, generator=g)) * torch.empty(sn, sk).uniform_(
            1, 2, generator=g)
        if name == "b":  # the special scales in the full row group and the partial one
            s[0, 0], s[1, 0] = specials[1:]
        if name == "c":
            s[1, 0] = specials[0]
        s = s.to(torch.bfloat16) if sdt == "BF16" else s
        deq = _dequantize_fp8_weight(q, s, [128, 128], torch.float32)
        # an independent reading of the format: the same bits
        mine = q.to(torch.float32) * s.to(torch.float32).repeat_interleave(128, 0)[:n].repeat_interleave(128, 1)[:, :k]
        assert torch.equal(mine.view(torch.int32), deq.view(torch.int32)), name
        if n % sn == 0 and n // sn in (n, 128):  # transformers' CPU loader splits N evenly by the grid
            dl = Fp8Dequantize(None)._dequantize_one(q, s, output_dtype=torch.float32)
            assert torch.equal(dl.view(torch.int32), deq.view(torch.int32)), name
        tensors[name] = q.contiguous()
        tensors[name + "_scale_inv"] = s.contiguous()
        tensors[name + "_dequant"] = deq.contiguous()
    assert torch.isinf(tensors["b_dequant"]).any() and (tensors["c_dequant"][128:, :128] == 0).all()
    save_torch(tensors, OUT_FP8, metadata={"made_by": "tests/reference/make_quant_fixtures.py",
                                           "transformers": transformers.__version__,
                                           "torch": torch.__version__})
    print(OUT_FP8, os.path.getsize(OUT_FP8), "bytes")


def make_kv_fp8():
    import torch
    from safetensors.torch import save_file as save_torch

    f8 = torch.float8_e4m3fn
    g = torch.Generator().manual_seed(9)
    allb = torch.arange(256, dtype=torch.uint8)
    vals = allb.view(f8).to(torch.float32)
    vals = torch.sort(vals[~torch.isnan(vals) & (vals >= 0)]).values  # 0 .. 448, 127 values
    mid = (vals[:-1] + vals[1:]) / 2  # exact ties (a few extra bits fit in fp32)
    up, dn = torch.nextafter(mid, torch.tensor(1e9)), torch.nextafter(mid, torch.tensor(-1e9))
    logu = torch.exp2(torch.empty(2000).uniform_(-14, 8.9, generator=g))  # up to ~478
    sub = torch.empty(300).uniform_(0, 2.0 ** -6, generator=g)            # E4M3's subnormal range
    edge = torch.tensor([0.0, 2.0 ** -10, 2.0 ** -11, 3 * 2.0 ** -11, 2.0 ** -12, 1e-30, 1e-40, 1e-45,
                         448.0, 455.9, 463.99, 464.0, 470.0, 479.9, 2.0 ** -6, 2.0 ** -7, 15 * 2.0 ** -10])
    pos = torch.cat([vals, mid, up, dn, logu, sub, edge])
    x = torch.cat([pos, -pos, torch.tensor([-0.0])]).to(torch.float32)
    assert x.abs().max() < 480  # torch's conversion gives NaN from 480 on; saturation is tested by rule
    q = x.to(f8)
    # rows as the KV cache quantizes them: s = amax / 448, bytes of x / s
    R, Dh = 64, 96
    rows = torch.randn(R, Dh, generator=g) * torch.exp2(torch.empty(R, 1).uniform_(-20, 20, generator=g))
    rows[3] = 0.0
    rows[5, :] = 1e-3
    rows[6, 7] = 3e38
    rows[7] = torch.randn(Dh, generator=g) * 1e-39  # subnormal values, a subnormal scale
    scale = rows.abs().amax(dim=1) / 448.0
    qrows = torch.where(scale[:, None] > 0, rows / scale[:, None], torch.zeros(())).to(f8)
    assert not torch.isnan(qrows.to(torch.float32)).any()
    tensors = {"x": x.contiguous(), "e4m3": q.view(torch.uint8).contiguous(),
               "e4m3_f32": q.to(torch.float32).contiguous(),
               "rows": rows.contiguous(), "rows_scale": scale.contiguous(),
               "rows_e4m3": qrows.view(torch.uint8).contiguous(),
               "rows_dequant": (qrows.to(torch.float32) * scale[:, None]).contiguous()}
    save_torch(tensors, OUT_KV_FP8, metadata={"made_by": "tests/reference/make_quant_fixtures.py",
                                              "torch": torch.__version__})
    print(OUT_KV_FP8, os.path.getsize(OUT_KV_FP8), "bytes")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--only", default="q8_0,q4_1,q4_k,q5_k,q6_k,mxfp4,fp8,kv_fp8")
    only = ap.parse_args().only.split(",")
    for name, make in (("q8_0", make_q8_0), ("q4_1", make_q4_1), ("q4_k", make_q4_k), ("q5_k", make_q5_k),
                       ("q6_k", make_q6_k),
                       ("mxfp4", make_mxfp4), ("fp8", make_fp8),
                       ("kv_fp8", make_kv_fp8)):
        if name in only:
            make()


if __name__ == "__main__":
    main()
