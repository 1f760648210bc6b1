/* tensor.h - element types and tensor views.
 *
 * A struct moe_tensor is a view: it never owns its data.  Weights point into
 * the memory-mapped checkpoint (or into buffers the model owns); activations
 * point into workspaces the backend owns.  Layout is always row-major and
 * contiguous: shape[0] is the slowest dimension.
 *
 * The dtype list is the safetensors list (every dtype string the reference
 * implementation knows, except the sub-byte ones), then the runtime's own
 * storage formats (MOE_DTYPE_BF16_PANEL: bf16 weights repacked for the fast
 * CPU kernels, which changes how a matrix's bytes are ordered, so it is a
 * dtype: every (data, dtype) pair that reaches a kernel says how to read the
 * bytes, and code that does not know the format stops at its "not a float
 * weight type" check instead of reading panels as rows; Q8_0 and MXFP4
 * blocks, MXFP4 and block-scaled FP8 rows); the CPU backend computes in
 * fp32 and reads F32, F16, BF16, Q8_0, MXFP4 and FP8_B128 weights in
 * place; four-bit weights: Q4_1 (--quantize q4) and Q4_G32 / Q4_G128
 * (GPTQ, AWQ and compressed-tensors checkpoints); and ggml's K-quants
 * Q4_K, Q5_K and Q6_K. */
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#ifdef __cplusplus
extern "C" {
#endif

#define MOE_MAX_DIMS 8

enum moe_dtype {
    MOE_DTYPE_F32,
    MOE_DTYPE_F16,
    MOE_DTYPE_BF16,
    MOE_DTYPE_F8E4M3,
    MOE_DTYPE_F8E5M2,
    MOE_DTYPE_F64,
    MOE_DTYPE_I8,
    MOE_DTYPE_I16,
    MOE_DTYPE_I32,
    MOE_DTYPE_I64,
    MOE_DTYPE_U8,
    MOE_DTYPE_U16,
    MOE_DTYPE_U32,
    MOE_DTYPE_U64,
    MOE_DTYPE_BOOL,
    MOE_DTYPE_COUNT, /* the safetensors dtypes above; storage formats of the runtime below */
    /* bf16 weights of a 2-D (N, K) matrix, K even, repacked by the fast CPU
     * backend (runtime/cpu/gemm_fast.h, moe_gemm_pack_panels) into panels of 16
     * outputs: panel p (outputs 16p .. 16p+15, N padded up to a multiple of
     * 16 with zero rows) is K/2 64-byte lines, line i holding 16 32-bit
     * lanes, lane j = w[16p+j][2i] | w[16p+j][2i+1] << 16.  Panel p starts
     * at byte p*32*K.  The tensor keeps its logical shape (N, K); only the
     * fast AVX2 and AVX-512 kernels read it (same bits with either;
     * moe_dtype_name says "BF16_PANEL"; it is never parsed, written to a
     * file or converted by moe_convert_row_f32). */
    MOE_DTYPE_BF16_PANEL,
    /* Weights quantized at load (--quantize q8_0) as ggml's Q8_0 quantizes
     * them: per block of 32 values a scale d (an f16 value) and 32 int8 q,
     * the value (float)q * d.  Stored per row of K values (K a multiple of
     * 32) as K/32 blocks of 36 bytes: d widened to f32 (exactly), then the
     * 32 q; ggml stores d as f16 (34 bytes), but an f32 scale is one
     * broadcast from memory in the kernels where an f16 one costs three
     * shuffle-port instructions per block and row.  Made by
     * moe_quantize_row_q8_0 (the q and d of ggml-quants.c and gguf-py, bit
     * for bit); read by the CPU kernels (fast and reference) and, as
     * planes (moe_planes_from_rows), by the CUDA kernels.  moe_dtype_size says 1 (the int8 part); rows take
     * moe_dtype_row_bytes. */
    MOE_DTYPE_Q8_0,
    /* OCP microscaling FP4 (MXFP4), as gpt-oss checkpoints store their
     * expert weights: per block of 32 values one E8M0 scale byte s (the
     * power of two 2^(s-127); s = 255 is NaN and refused) and 32 E2M1
     * nibbles, each an index into {+0, +0.5, +1, +1.5, +2, +3, +4, +6,
     * -0, -0.5, -1, -1.5, -2, -3, -4, -6}; the value is lut[nibble] *
     * 2^(s-127), exact in fp32 (s = 0 gives the subnormal 2^-127; a value
     * past fp32's range, |lut| >= 4 at s = 253 or >= 2 at s = 254, is inf,
     * as in transformers).  Stored per row of K values (K a multiple of 32) as
     * K/32 blocks of 17 bytes: s, then 16 bytes qs, qs[j] holding element
     * j of the block in its low nibble and element j + 16 in its high
     * nibble (ggml's block_mxfp4), so 8 or 16 consecutive elements are
     * one load, one shift and a table lookup.  The checkpoint's own
     * layout (`*_blocks` (N, K/32, 16): byte b of group g holds elements
     * 32g + 2b (low nibble) and 32g + 2b + 1 (high); `*_scales` (N, K/32))
     * is repacked row by row at load by moe_mxfp4_pack_row.  Read by the
     * CPU kernels (fast and reference) and, as experts, by CUDA's expert
     * kernels (in planes: moe_planes_from_rows); refused by the
     * safetensors writer; never parsed from a file's dtype string, never
     * repacked to panels or requantized by --quantize.  moe_dtype_size
     * says 1 (as Q8_0: rows take moe_dtype_row_bytes). */
    MOE_DTYPE_MXFP4,
    /* Block-scaled FP8, as the official DeepSeek-V3/R1, Kimi-K2 and Qwen3
     * "-FP8" checkpoints store their Linear weights (quantization_config
     * quant_method "fp8", weight_block_size [128, 128]): a weight W (N, K)
     * is `*.weight` F8_E4M3 (N, K) plus `*.weight_scale_inv` (ceil(N/128),
     * ceil(K/128)) F32 or BF16, and W[n][k] = e4m3(q[n][k]) *
     * scale_inv[n/128][k/128], computed in fp32 (transformers'
     * Fp8Dequantize: q.to(float32) * scale; one rounding).  E4M3 is the
     * "fn" variant: 1 sign bit, 4 exponent bits of bias 7, 3 mantissa
     * bits, subnormals (exponent 0: m * 2^-9), no infinities, 0x7F and
     * 0xFF NaN (refused at load); the largest value is 448.  Stored per
     * row of K values (K a multiple of 128) as K/128 blocks of 132 bytes:
     * the block's scale as f32 (the scale of the row's 128-row group and
     * that column block, copied into each of the group's rows: 4 bytes
     * per 128 weights, 3% over the checkpoint's byte a weight, so that
     * any row is read alone and a matrix can be cut at any row), then the
     * block's 128 E4M3 bytes as stored.  Made by moe_fp8_pack_row from a
     * checkpoint row and its scale row (runtime/model/model_fp8.c); read by the
     * CPU kernels (fast and reference); by CUDA's expert and matmul
     * kernels as planes (moe_planes_from_rows), other matrices widened to
     * bf16 at upload;
     * refused by the safetensors writer; never parsed from a file's dtype
     * string (the checkpoint's own bytes are MOE_DTYPE_F8E4M3), never
     * repacked to panels or requantized by --quantize.  moe_dtype_size
     * says 1 (rows take moe_dtype_row_bytes). */
    MOE_DTYPE_FP8_B128,
    /* Four-bit weights quantized at load (--quantize q4: on the CPU
     * backends where rows are not multiples of 256, Q4_K otherwise; on
     * CUDA all of them), ggml's Q4_1 bit for bit: per block of 32 values an f16 scale d, an f16 minimum m and
     * 32 unsigned 4-bit codes q, the value q * d + m in fp32 (d and m
     * widened exactly, one rounding of the product, one of the sum).  20
     * bytes per block: d, m (f16, little-endian), then 16 bytes qs, qs[j]
     * holding element j in its low nibble and element j + 16 in its high
     * one (ggml's block_q4_1).  5 bits a weight; made by
     * moe_quantize_row_q4_1 (ggml's quantize_row_q4_1_ref and gguf-py's
     * Q4_1, bit for bit).  moe_dtype_size says 1 (rows take
     * moe_dtype_row_bytes); never parsed, written to a file or repacked. */
    MOE_DTYPE_Q4_1,
    /* Four-bit weights of GPTQ, AWQ and compressed-tensors checkpoints
     * (runtime/model/model_q4.c), per group of G values (G = 32 for
     * Q4_G32, 128 for Q4_G128): an f32 scale d, an f32 offset m, then G/2
     * bytes of unsigned codes in 16-byte runs ordered as Q4_1's (run r
     * covers elements 32r .. 32r+31 of the group: its byte j holds element
     * 32r+j in the low nibble, 32r+j+16 in the high one).  The value is
     * q * d + m in fp32.  A checkpoint's code q, zero point z and scale s
     * mean (q - z) * s; the loader stores d = s and m = -z * s, and when s
     * has at most 20 significant bits (an f16 or bf16 scale) both products
     * and the sum are exact, so q * d + m is exactly (q - z) * s, the value
     * the libraries compute before they round it to the model's dtype.  A
     * checkpoint group of 64 is two Q4_G32 groups with the same d and m; a
     * group of 256, 512, ... or one per row ("channel", group_size -1)
     * repeats d and m over Q4_G128 groups.  6 bits a weight (G32) or 4.5
     * (G128); moe_dtype_size says 1; never parsed, written or repacked. */
    MOE_DTYPE_Q4_G32,
    MOE_DTYPE_Q4_G128,
    /* Four-bit weights quantized at load (--quantize q4) where every row
     * of the matrix (of an expert: of its three matrices) is a multiple of
     * 256 long: ggml's Q4_K block bit for bit (gguf-py's Q4_K reads it).
     * Per block of 256 values, 144 bytes: an f16 d, an f16 dmin, 12 bytes
     * of eight 6-bit scales sc_j and eight 6-bit minimums mn_j (bytes 0-3:
     * sc_0..3 in the low 6 bits, the top 2 bits of sc_4..7 above; bytes
     * 4-7: mn_0..3 and the top 2 bits of mn_4..7; bytes 8-11: sc_4..7 low
     * nibble, mn_4..7 high nibble), then 128 bytes of codes: per 64 values
     * 32 bytes, byte i holding element i in its low nibble and element 32 +
     * i in its high one.  Group j (elements 32j .. 32j+31) has the scale
     * d_j = d * sc_j and offset m_j = -(dmin * mn_j), both exact in fp32;
     * the value is q * d_j + m_j, one rounding (the product is exact): what
     * ggml computes as d_j * q - dmin * mn_j.  4.5 bits a weight; made by
     * moe_quantize_row_q4_k.  moe_dtype_size says 1; never parsed,
     * written to a file or repacked. */
    MOE_DTYPE_Q4_K,
    /* Six-bit weights, ggml's Q6_K block bit for bit (gguf-py's Q6_K
     * reads it): what llama.cpp's Q4_K_M mix keeps some matrices in.  Per
     * block of 256 values, 210 bytes: ql[128] (the low 4 bits of the
     * codes), qh[64] (their high 2 bits), 16 int8 scales sc[16] (one per
     * 16 values), then an f16 d.  Each half h of 128 values reads ql from
     * byte 64h, qh from 128 + 32h and its scales from sc[8h]; for l in
     * 0..31 its codes (0..63) are
     *   element l      (ql[l] & 15)      | (qh[l] & 3) << 4
     *   element l + 32 (ql[l + 32] & 15) | (qh[l] >> 2 & 3) << 4
     *   element l + 64 (ql[l] >> 4)      | (qh[l] >> 4 & 3) << 4
     *   element l + 96 (ql[l + 32] >> 4) | (qh[l] >> 6 & 3) << 4
     * (moe_q6_k_code).  Element e of the block has the value
     * (d * sc[e / 16]) * (q - 32) in fp32, as gguf-py computes it: the
     * first product exact (11 by 8 significant bits), the second one
     * rounding.  6.5625 bits a weight; made by moe_quantize_row_q6_k
     * (on CUDA: the same fit, runtime/core/q6_k_fit.h, written as planes);
     * read by the CPU kernels (fast and reference) and by CUDA's as
     * planes.  moe_dtype_size says 1; never parsed, written to a file or
     * repacked. */
    MOE_DTYPE_Q6_K,
    /* Five-bit weights, ggml's Q5_K block bit for bit (gguf-py's Q5_K
     * reads it): what --quantize q5_k and q5_k_m make on the CPU
     * backends.  Per block of 256 values, 176 bytes: an f16 d, an f16
     * dmin, the 12 bytes of eight 6-bit scales sc_j and minimums mn_j
     * packed as Q4_K's (moe_q4_k_scales), 32 bytes qh, then 128 bytes qs
     * of low nibbles laid out as Q4_K's codes (per 64 values 32 bytes,
     * byte i holding element i in its low nibble and element 32 + i in
     * its high one).  Bit j of qh[l] is the fifth (high) bit of element
     * 32j + l, so element e's code (0..31) is its nibble | (qh[e % 32] >>
     * (e / 32) & 1) << 4 (moe_q5_k_code).  Group j (elements 32j ..
     * 32j+31) has d_j = d * sc_j and m_j = -(dmin * mn_j), both exact in
     * fp32, and the value q * d_j + m_j: the product exact (a 17-bit d_j
     * by a 5-bit code), one rounding, what gguf-py computes as d_j * q -
     * dmin * mn_j.  5.5 bits a weight; made by moe_quantize_row_q5_k;
     * read by the CPU kernels (fast and reference), not by the CUDA
     * backend (no planes).  moe_dtype_size says 1; never parsed, written
     * to a file or repacked. */
    MOE_DTYPE_Q5_K,
};
#define MOE_DTYPE_N (MOE_DTYPE_Q5_K + 1) /* the number of dtypes */

#define MOE_Q8_0_BLOCK 32 /* values per block */
#define MOE_Q8_0_BYTES 36 /* bytes per block: f32 scale, 32 int8 */
#define MOE_MXFP4_BLOCK 32 /* values per block */
#define MOE_MXFP4_BYTES 17 /* bytes per block: E8M0 scale, 16 bytes of nibbles */
#define MOE_FP8_BLOCK 128  /* values per block (and rows per scale group in a checkpoint) */
#define MOE_FP8_BYTES 132  /* bytes per block: f32 scale, 128 E4M3 bytes */
#define MOE_Q4_1_BLOCK 32  /* values per block */
#define MOE_Q4_1_BYTES 20  /* bytes per block: f16 d, f16 m, 16 bytes of codes */
#define MOE_Q4_HEAD 8      /* Q4_G32 / Q4_G128: f32 d, f32 m before each group's codes */
#define MOE_Q4_K_BLOCK 256 /* values per block (8 groups of 32) */
#define MOE_Q4_K_BYTES 144 /* bytes per block: f16 d, f16 dmin, 12 bytes of scales, 128 of codes */
#define MOE_Q6_K_BLOCK 256 /* values per block (16 sub-blocks of 16) */
#define MOE_Q6_K_BYTES 210 /* bytes per block: 128 ql, 64 qh, 16 int8 scales, f16 d */
#define MOE_Q6_K_TAIL 18   /* its last bytes: the 16 int8 scales and d */
#define MOE_Q5_K_BLOCK 256 /* values per block (8 groups of 32) */
#define MOE_Q5_K_BYTES 176 /* bytes per block: f16 d, f16 dmin, 12 of scales, 32 qh, 128 qs */
#define MOE_Q5_K_QH 16     /* offsets in the block: the high bits, the low nibbles */
#define MOE_Q5_K_QS 48

/* Whether t is one of the four-bit formats; values per block (one d and
 * one m each, but Q4_K: 8 groups of 32 with one d and m each) and bytes
 * per block. */
static inline bool moe_dtype_is_q4(enum moe_dtype t)
{
    return t == MOE_DTYPE_Q4_1 || t == MOE_DTYPE_Q4_G32 || t == MOE_DTYPE_Q4_G128 || t == MOE_DTYPE_Q4_K;
}
static inline int moe_q4_group(enum moe_dtype t)
{
    return t == MOE_DTYPE_Q4_K ? MOE_Q4_K_BLOCK : t == MOE_DTYPE_Q4_G128 ? 128 : 32;
}
static inline size_t moe_q4_group_bytes(enum moe_dtype t)
{
    return t == MOE_DTYPE_Q4_K ? MOE_Q4_K_BYTES
           : t == MOE_DTYPE_Q4_1 ? MOE_Q4_1_BYTES : MOE_Q4_HEAD + (size_t)moe_q4_group(t) / 2;
}
/* --quantize q4's format, on every backend, for a matrix whose rows hold
 * K values: Q4_K when K is a multiple of 256, else Q4_1; for an expert of
 * D x F (one format for its three matrices): Q4_K when both are. */
static inline enum moe_dtype moe_q4_quant_dtype(int64_t K)
{
    return K > 0 && K % MOE_Q4_K_BLOCK == 0 ? MOE_DTYPE_Q4_K : MOE_DTYPE_Q4_1;
}
static inline enum moe_dtype moe_q4_quant_expert_dtype(int64_t D, int64_t F)
{
    return moe_q4_quant_dtype(D) == MOE_DTYPE_Q4_K ? moe_q4_quant_dtype(F) : MOE_DTYPE_Q4_1;
}
/* --quantize q5_k's (and q5_k_m's base) format on the CPU backends for a
 * matrix whose rows hold K values: Q5_K when K is a multiple of 256, else
 * q4's fallback Q4_1 (moerun has no Q5_1, llama.cpp's fallback); for an
 * expert of D x F (one format for its gate, up and down): Q5_K when both
 * are. */
static inline enum moe_dtype moe_q5_quant_dtype(int64_t K)
{
    return K > 0 && K % MOE_Q5_K_BLOCK == 0 ? MOE_DTYPE_Q5_K : MOE_DTYPE_Q4_1;
}
static inline enum moe_dtype moe_q5_quant_expert_dtype(int64_t D, int64_t F)
{
    return moe_q5_quant_dtype(D) == MOE_DTYPE_Q5_K ? moe_q5_quant_dtype(F) : MOE_DTYPE_Q4_1;
}
/* Runs of 32 values per (d, m) pair of a four-bit dtype: 4 for Q4_G128,
 * 1 for the others (Q4_K's groups of 32 each have their own). */
static inline int moe_q4_head_runs(enum moe_dtype t) { return t == MOE_DTYPE_Q4_G128 ? 4 : 1; }
/* The 6-bit scales sc and minimums mn of the 8 groups of a Q4_K block's
 * 12 scale bytes s (MOE_DTYPE_Q4_K): each as 8 bytes of a 64-bit word,
 * group j in byte j. */
#ifdef __CUDACC__
__host__ __device__
#endif
static inline void moe_q4_k_scales(const unsigned char *s, uint64_t *sc, uint64_t *mn)
{
    uint32_t a, b, c;
    memcpy(&a, s, 4);
    memcpy(&b, s + 4, 4);
    memcpy(&c, s + 8, 4);
    const uint32_t sc_hi = (c & 0x0f0f0f0fu) | ((a >> 2) & 0x30303030u);
    const uint32_t mn_hi = ((c >> 4) & 0x0f0f0f0fu) | ((b >> 2) & 0x30303030u);
    *sc = (uint64_t)(a & 0x3f3f3f3fu) | (uint64_t)sc_hi << 32;
    *mn = (uint64_t)(b & 0x3f3f3f3fu) | (uint64_t)mn_hi << 32;
}

struct moe_tensor {
    enum moe_dtype dtype;
    int ndim;
    int64_t shape[MOE_MAX_DIMS];
    void *data; /* borrowed; NULL for an absent optional tensor */
    int device; /* -1 host, >= 0 device ordinal */
    /* A 2-D weight (N, K) whose stored columns are permuted (act-order
     * four-bit checkpoints: runtime/model/model_q4.c): stored column j
     * multiplies input column cols[j], so y = x[:, cols] . W^T; the forward
     * pass gathers the input's columns before the product.  NULL: in
     * order.  Host memory the model owns. */
    const int32_t *cols;
};

/* Bytes per element. */
size_t moe_dtype_size(enum moe_dtype t);
/* Bytes of a row of n elements (block formats: n a multiple of the block). */
size_t moe_dtype_row_bytes(enum moe_dtype t, size_t n);
/* safetensors name ("F32", "BF16", ...). */
const char *moe_dtype_name(enum moe_dtype t);
/* Parses a safetensors dtype string; false if unknown. */
bool moe_dtype_parse(const char *s, enum moe_dtype *out);

/* Number of elements; -1 on overflow or a negative dimension. */
int64_t moe_tensor_numel(const struct moe_tensor *t);
static inline bool moe_tensor_present(const struct moe_tensor *t) { return t && t->data; }

/* Scalar conversions (round-to-nearest-even on narrowing). */
static inline float moe_bf16_to_f32(uint16_t h)
{
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}
static inline uint16_t moe_f32_to_bf16(float f)
{
    uint32_t u;
    memcpy(&u, &f, 4);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40); /* quiet NaN */
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}
float moe_f16_to_f32(uint16_t h);
uint16_t moe_f32_to_f16(float f);

/* The code (0..63) of element e (0..255) of the Q6_K block at blk
 * (MOE_DTYPE_Q6_K's packing). */
static inline unsigned moe_q6_k_code(const unsigned char *blk, unsigned e)
{
    const unsigned h = e / 128, i = e % 128, l = i % 32, s = i / 32; /* half, element, lane, quarter */
    const unsigned ql = blk[64 * h + l + 32 * (s & 1)] >> (4 * (s >> 1)) & 15u;
    return ql | (blk[128 + 32 * h + l] >> (2 * s) & 3u) << 4;
}
/* The scale d * sc[e / 16] of element e of the Q6_K block at blk (exact). */
static inline float moe_q6_k_scale(const unsigned char *blk, unsigned e)
{
    uint16_t d;
    memcpy(&d, blk + 208, 2);
    return moe_f16_to_f32(d) * (float)(int8_t)blk[192 + e / 16];
}

/* The code (0..31) of element e (0..255) of the Q5_K block at blk
 * (MOE_DTYPE_Q5_K's packing). */
static inline unsigned moe_q5_k_code(const unsigned char *blk, unsigned e)
{
    const unsigned j = e / 32, l = e % 32; /* group, element in it */
    const unsigned lo = blk[MOE_Q5_K_QS + 32 * (j / 2) + l] >> (4 * (j % 2)) & 15u;
    return lo | (blk[MOE_Q5_K_QH + l] >> j & 1u) << 4;
}

/* Writes the qh and qs bytes of a Q5_K block from its 256 codes (0..31,
 * element order). */
void moe_q5_k_pack_codes(void *blk, const uint8_t *q);
/* Writes the first 192 bytes of a Q6_K block (ql, qh) from its 256 codes
 * (0..63, element order). */
void moe_q6_k_pack_codes(void *blk, const uint8_t *q);
/* Converts n elements of row `src` (dtype t) to fp32. */
void moe_convert_row_f32(float *dst, const void *src, enum moe_dtype t, size_t n);
/* Converts n fp32 values to dtype t (F32, F16 or BF16). */
void moe_convert_from_f32(void *dst, const float *src, enum moe_dtype t, size_t n);
/* Quantizes n values (a multiple of 32) to Q8_0 blocks as ggml does: per
 * block d = max|x| / 127, q = roundf(x * (1/d)) (0 when d is 0), d rounded
 * to f16 (and stored widened, see MOE_DTYPE_Q8_0).  False, dst unspecified,
 * when a value is not finite or d overflows f16. */
bool moe_quantize_row_q8_0(void *dst, const float *src, size_t n);
/* Quantizes n values (a multiple of 32) to Q4_1 blocks as ggml does: per
 * block min and max, d = (max - min) / 15, codes q = min(15, (int)((x -
 * min) * (1/d) + 0.5)) (0 when d is 0), d and min rounded to f16.  False,
 * dst unspecified, when a value is not finite or d or min overflows f16. */
bool moe_quantize_row_q4_1(void *dst, const float *src, size_t n);
/* Quantizes n values (a multiple of 256) to Q4_K blocks (MOE_DTYPE_Q4_K).
 * Per group of 32, the scale s and minimum a of x ~ s q - a (q in 0..15,
 * s, a >= 0) of least squared error over 21 candidate code assignments
 * (q = round((x - lo) (15 + i/10) / (hi - lo)), i = -10..10, each fitted
 * by least squares, a clamped at 0), then d = max s / 63 and dmin = max a /
 * 63 rounded to f16, each group's 6-bit pair (sc, mn) chosen among the
 * roundings of s / d and a / dmin and their neighbours by the error of
 * its nearest codes, and the codes q = clamp(round((x - m_j) / d_j), 0,
 * 15).  False, dst unspecified, when a value is not finite or d or dmin
 * overflows f16. */
bool moe_quantize_row_q4_k(void *dst, const float *src, size_t n);
/* Quantizes n values (a multiple of 256) to Q6_K blocks (MOE_DTYPE_Q6_K).
 * Per sub-block of 16, the scale s of least squared error x ~ s q (q in
 * -32..31) over 7 candidate code assignments (q = round(-t x / v), v the
 * value of largest magnitude, t = 28 .. 34, each fitted by least squares,
 * the best refitted once to its own nearest codes); then d
 * = (the s of largest magnitude) / -128 rounded to f16, each sub-block's
 * int8 scale chosen among the rounding of s / d and its neighbours by the
 * error of its nearest codes, and each code the nearest of the 64 values
 * (d * sc) * (q - 32) (of two as near, the rounding of x / (d sc)).
 * False, dst unspecified, when a value is not finite or d overflows f16
 * (|x| past about 2.3e8). */
bool moe_quantize_row_q6_k(void *dst, const float *src, size_t n);
/* Quantizes n values (a multiple of 256) to Q5_K blocks (MOE_DTYPE_Q5_K):
 * moe_quantize_row_q4_k's search with codes 0..31 (runtime/core/q5_k_fit.h:
 * per group of 32 the least-squares line x ~ s q - a over 8 candidate
 * code assignments, then d = max s / 63 and dmin = max a / 63 in f16,
 * each group's 6-bit pair chosen among the roundings of s / d and a /
 * dmin and their neighbours, and the nearest codes).  False, dst
 * unspecified, when a value is not finite or d or dmin overflows f16. */
bool moe_quantize_row_q5_k(void *dst, const float *src, size_t n);
/* The scales d_j and offsets m_j of the 8 groups of the Q4_K block at blk
 * (MOE_DTYPE_Q4_K: d * sc_j and -(dmin * mn_j), exact). */
void moe_q4_k_heads(const void *blk, float d[8], float m[8]);
/* The same of a Q5_K block (MOE_DTYPE_Q5_K: the same 16 leading bytes). */
static inline void moe_q5_k_heads(const void *blk, float d[8], float m[8]) { moe_q4_k_heads(blk, d, m); }
/* Writes one Q4_G32 / Q4_G128 group: G codes (0..15, element order), scale
 * d and offset m. */
void moe_q4_pack_group(void *dst, enum moe_dtype t, const uint8_t *codes, float d, float m);
/* Element k of a row of four-bit blocks (t: Q4_1, Q4_G32, Q4_G128, Q4_K) as fp32. */
float moe_q4_get(const void *row, enum moe_dtype t, size_t k);

/* 2^(s-127), the value of an E8M0 scale byte s, built from its bits: s in
 * 1..254 is the normal float with exponent field s, s == 0 the subnormal
 * 2^-127 (0x00400000); 255 (NaN in the OCP MX spec) gives a quiet NaN. */
static inline float moe_e8m0_to_f32(uint8_t s)
{
    const uint32_t u = s == 255 ? 0x7fc00000u : s ? (uint32_t)s << 23 : 0x00400000u;
    float f;
    memcpy(&f, &u, 4);
    return f;
}
/* Element k of a row of MXFP4 blocks (see MOE_DTYPE_MXFP4), as fp32. */
static inline float moe_mxfp4_get(const void *row, size_t k)
{
    static const float lut[16] = {0.0f,  0.5f,  1.0f,  1.5f,  2.0f,  3.0f,  4.0f,  6.0f,
                                  -0.0f, -0.5f, -1.0f, -1.5f, -2.0f, -3.0f, -4.0f, -6.0f};
    const unsigned char *blk = (const unsigned char *)row + k / MOE_MXFP4_BLOCK * MOE_MXFP4_BYTES;
    const size_t j = k % MOE_MXFP4_BLOCK;
    return lut[(blk[1 + j % 16] >> (j / 16 * 4)) & 15] * moe_e8m0_to_f32(blk[0]);
}
/* Repacks one row of K values (K a multiple of 32) from a gpt-oss
 * checkpoint's layout to MOE_DTYPE_MXFP4: blocks is the row's K/32 groups
 * of 16 bytes (`*_blocks` (N, K/32, 16), row n at n*K/2), scales its K/32
 * E8M0 bytes (`*_scales` (N, K/32), row n at n*K/32); dst takes
 * moe_dtype_row_bytes(MOE_DTYPE_MXFP4, K) bytes.  False, dst unspecified,
 * when a scale is 255 (NaN): the loader must refuse such a weight. */
__attribute__((warn_unused_result)) bool moe_mxfp4_pack_row(void *dst, const uint8_t *blocks,
                                                            const uint8_t *scales, size_t K);

/* The GPU's layout of MXFP4 and FP8_B128 matrices ("planes"): R rows of K
 * values as one plane of value bytes, then one of scales, so that every
 * 16-byte load of values is aligned and one block's values or a part of
 * one.  MXFP4: R*K/2 bytes of nibbles, row r at r*K/2, each block's 16
 * bytes as in MOE_DTYPE_MXFP4 (element j low, j + 16 high), then R*K/32
 * E8M0 bytes; FP8_B128: R*K E4M3 bytes, then R*K/128 f32 scales; Q8_0:
 * R*K int8 codes, then R*K/32 f32 scales; the four-bit formats: R*K/2
 * bytes of codes, 16 bytes a run of 32 values ordered as in the rows
 * (element j of the run low, j + 16 high), then per group of 32 (Q4_1,
 * Q4_G32) or 128 (Q4_G128) its d and m: two f16 (Q4_1) or two f32; Q4_K:
 * R*K/2 bytes of codes in the same runs of 32 (the block's nibbles
 * regrouped), then each block's 16 leading bytes as stored (f16 d, f16
 * dmin, 12 bytes of 6-bit scales and minimums), group j's d_j and m_j
 * decoded from them as in the rows; Q6_K: per block of 256, 192 bytes of
 * codes (R*K*3/4 in all): 128 bytes of their low 4 bits in the four-bit
 * formats' 8 runs of 32 (16 bytes a run: element i of the run low, i + 16
 * high), then 64 bytes of their high 2 bits, 8 bytes a run: 16-bit word j
 * of run r holds, 2 bits each from bit 0 up, the high bits of the run's
 * elements 4j + {0, 2, 16, 18, 1, 3, 17, 19} (the order in which the
 * kernels take a 32-bit word of low nibbles apart, moe_q6_k_half_bits);
 * then each block's last 18 bytes as stored (16 int8 scales, f16 d).  The
 * bytes of each plane: */
/* The GPU kernels' decoding of planes (experts/experts_cuda.cu): two codes
 * of a 32-bit word at once become the bits of two halves (low and high 16
 * bits), by placing their bits: E2M1 codes s e1 e0 m (nibbles at bits 0-3
 * and 16-19 of t) as s << 15 | e1 e0 m << 9, each the code's value times
 * 2^-14 (e = 0 lands on the half subnormal m * 2^-15, as E2M1's m * 0.5 at
 * the same ratio); E4M3 bytes s eeee mmm (bits 0-7 and 16-23) as s << 15 |
 * eeeemmm << 7, each the byte's value times 2^-8 (subnormals alike).  The
 * kernels fold 2^14 or 2^8 into the block's scale. */
#ifdef __CUDACC__
__host__ __device__
#endif
static inline uint32_t moe_e2m1x2_half_bits(uint32_t t)
{
    return (t & 0x00070007u) << 9 | (t & 0x00080008u) << 12;
}
#ifdef __CUDACC__
__host__ __device__
#endif
static inline uint32_t moe_e4m3x2_half_bits(uint32_t t)
{
    return (t & 0x007f007fu) << 7 | (t & 0x00800080u) << 8;
}
/* Q8_0 codes in planes (the CUDA backend's --quantize q8_0): byte j of
 * a 32-bit word w, an int8 q, as a float's bits: 2^23 + (q + 128), from
 * which the kernels subtract 2^23 + 128 (exact), with two integer
 * operations and one add instead of a conversion. */
#ifdef __CUDACC__
__host__ __device__
#endif
static inline uint32_t moe_q8_f32_bits(uint32_t w, int j)
{
    return 0x4B000000u | (((w ^ 0x80808080u) >> (8 * j)) & 0xffu);
}
#define MOE_Q8_F32_BIAS 8388736.0f /* 2^23 + 128 */
/* Q6_K codes in planes: of word w (32 bits of low nibbles of a run,
 * bytes 4j .. 4j+3) and the run's 16-bit word c of high bits for the same
 * elements, the two codes taken at shift s (0: elements 4j, 4j+2; 4:
 * 4j+16, 4j+18; 8: 4j+1, 4j+3; 12: 4j+17, 4j+19) as the bits of two
 * halves 1024 + q (q the code 0..63, under 0x6400), from which the
 * kernels subtract 1056 (exact): q - 32. */
#ifdef __CUDACC__
__host__ __device__
#endif
static inline uint32_t moe_q6_k_half_bits(uint32_t w, uint32_t c, int s)
{
    const uint32_t x = c | c << 14; /* the second code's high bits at 16 + s */
    return ((w >> s) & 0x000f000fu) | (((x >> s) << 4) & 0x00300030u) | 0x64006400u;
}
#define MOE_Q6_K_HALF_BIAS 1056.0f /* 1024 + 32 */
/* Field k (bits 2k, 2k+1) of word j of a run's high bits holds element 4j
 * + slot[k] of the run. */
#define MOE_Q6_K_SLOTS {0, 2, 16, 18, 1, 3, 17, 19}
/* The 192 value bytes of a Q6_K block in planes from its 256 codes (0..63,
 * element order). */
#ifdef __CUDACC__
__host__ __device__
#endif
static inline void moe_q6_k_plane_codes(const uint8_t *q, unsigned char *v)
{
    const uint8_t slot[8] = MOE_Q6_K_SLOTS;
    for (int r = 0; r < 8; r++) {
        const uint8_t *qr = q + 32 * r;
        for (int i = 0; i < 16; i++) v[16 * r + i] = (unsigned char)((qr[i] & 15u) | (qr[i + 16] & 15u) << 4);
        for (int j = 0; j < 4; j++) {
            unsigned w = 0;
            for (int k = 0; k < 8; k++) w |= (unsigned)(qr[4 * j + slot[k]] >> 4) << (2 * k);
            v[128 + 8 * r + 2 * j] = (unsigned char)w;
            v[128 + 8 * r + 2 * j + 1] = (unsigned char)(w >> 8);
        }
    }
}

/* Whether the CUDA backend keeps a matrix of dtype t as planes: MXFP4,
 * FP8_B128 and the four-bit formats as checkpoints store them, Q8_0, Q4_1,
 * Q4_K and Q6_K as --quantize makes them. */
#ifdef __CUDACC__
__host__ __device__
#endif
static inline bool moe_dtype_planes(enum moe_dtype t)
{
    return t == MOE_DTYPE_MXFP4 || t == MOE_DTYPE_FP8_B128 || t == MOE_DTYPE_Q8_0 || t == MOE_DTYPE_Q4_1 ||
           t == MOE_DTYPE_Q4_G32 || t == MOE_DTYPE_Q4_G128 || t == MOE_DTYPE_Q4_K || t == MOE_DTYPE_Q6_K;
}
/* Values per block of such a dtype (one scale each; Q4_K: one head of 8
 * groups' scales; Q6_K: of 16 sub-blocks' scales); 1 for the others. */
#ifdef __CUDACC__
__host__ __device__
#endif
static inline int moe_dtype_block(enum moe_dtype t)
{
    return t == MOE_DTYPE_MXFP4 ? MOE_MXFP4_BLOCK : t == MOE_DTYPE_FP8_B128 ? MOE_FP8_BLOCK
           : t == MOE_DTYPE_Q8_0 || t == MOE_DTYPE_Q4_1 || t == MOE_DTYPE_Q4_G32 ? 32
           : t == MOE_DTYPE_Q4_G128 ? 128 : t == MOE_DTYPE_Q4_K ? MOE_Q4_K_BLOCK
           : t == MOE_DTYPE_Q6_K ? MOE_Q6_K_BLOCK : 1;
}
size_t moe_planes_values_bytes(enum moe_dtype t, size_t rows, size_t K);
size_t moe_planes_scales_bytes(enum moe_dtype t, size_t rows, size_t K);
/* Splits R rows of K values stored as t (a dtype kept as planes, rows of
 * moe_dtype_row_bytes) into the value plane `values` and the scale plane
 * `scales` (moe_planes_*_bytes each). */
void moe_planes_from_rows(enum moe_dtype t, const void *rows, size_t R, size_t K, void *values,
                          void *scales);
/* The inverse: R rows of planes (row 0's values at `values`, its scales at
 * `scales`) joined into rows of moe_dtype_row_bytes each. */
void moe_rows_from_planes(enum moe_dtype t, const void *values, const void *scales, size_t R, size_t K,
                          void *rows);

/* The value of an E4M3 ("fn") byte as fp32, exactly: normal values from
 * their bits, subnormals m * 2^-9, +-0, and a quiet NaN for 0x7F / 0xFF
 * (the format has no infinities).  Also the CUDA kernels' scalar decoding
 * (runtime/cuda/cuda_dtype.cuh: the fp8 KV cache). */
#ifdef __CUDACC__
__host__ __device__
#endif
static inline float moe_fp8_e4m3_to_f32(uint8_t b)
{
    const uint32_t e = (b >> 3) & 15u, m = b & 7u;
    float f;
    if (e == 15 && m == 7) {
        const uint32_t u = 0x7fc00000u;
        memcpy(&f, &u, 4);
    } else if (e) {
        const uint32_t u = (e + 120) << 23 | m << 20;
        memcpy(&f, &u, 4);
    } else {
        f = (float)m * 0x1p-9f;
    }
    return b & 0x80 ? -f : f;
}
#define MOE_E4M3_MAX 448.0f /* the largest finite E4M3 value (0x7E) */
/* The E4M3 ("fn") byte nearest x, ties to even, as the fp8 KV cache
 * stores its values (kvcache.h): finite values beyond +-448 saturate to
 * +-448 (0x7E / 0xFE); NaN and +-infinity become NaN (0x7F / 0xFF, x's
 * sign): the format has no infinities, and an infinity saturated to 448
 * would read back as a plausible finite value.  Below 2^-6 the subnormals
 * m * 2^-9 (m = 0..7; a value rounding up to 8 * 2^-9 is the smallest
 * normal, byte 0x08).  Integer arithmetic on the bits only, one function
 * for the host and the CUDA kernels, so both round every value alike; the
 * rounding is torch's float32 -> float8_e4m3fn conversion wherever that
 * does not overflow (tests/test_kv_fp8.c, its fixture). */
#ifdef __CUDACC__
__host__ __device__
#endif
static inline uint8_t moe_f32_to_e4m3(float x)
{
    uint32_t u;
    memcpy(&u, &x, 4);
    const uint8_t sign = (uint8_t)((u >> 24) & 0x80u);
    const uint32_t a = u & 0x7fffffffu;
    if (a >= 0x7f800000u) return sign | 0x7f;  /* NaN, infinity */
    if (a >= 0x3c800000u) {                    /* >= 2^-6: a normal E4M3 value */
        uint32_t r = a >> 20;                  /* exponent and top 3 mantissa bits */
        const uint32_t rem = a & 0xfffffu;
        if (rem > 0x80000u || (rem == 0x80000u && (r & 1u))) r++;
        r -= 120u << 3;                        /* rebias 127 -> 7 */
        return sign | (uint8_t)(r > 0x7eu ? 0x7eu : r);
    }
    const uint32_t e = a >> 23;                /* a's value * 2^9 < 8: round to an integer */
    if (e <= 116) return sign;                 /* < 2^-10 (2^-10 itself: a tie, to even 0) */
    const uint32_t mant = (a & 0x7fffffu) | 0x800000u, sh = 141u - e; /* value * 2^9 = mant >> sh */
    uint32_t r = mant >> sh;
    const uint32_t rem = mant & ((1u << sh) - 1u), half = 1u << (sh - 1u);
    if (rem > half || (rem == half && (r & 1u))) r++;
    return sign | (uint8_t)r;
}
/* Whether s may be a block scale of MOE_DTYPE_FP8_B128: finite (NaN and
 * infinities would poison every product of the block). */
static inline bool moe_fp8_scale_ok(float s) { return s - s == 0.0f; }
/* Element k of a row of MOE_DTYPE_FP8_B128 blocks, as fp32. */
static inline float moe_fp8_get(const void *row, size_t k)
{
    const unsigned char *blk = (const unsigned char *)row + k / MOE_FP8_BLOCK * MOE_FP8_BYTES;
    float s;
    memcpy(&s, blk, 4);
    return moe_fp8_e4m3_to_f32(blk[4 + k % MOE_FP8_BLOCK]) * s;
}
/* Packs one row of K values (K a multiple of 128) to MOE_DTYPE_FP8_B128: q
 * is the row's K E4M3 bytes (row n of a checkpoint's F8_E4M3 `*.weight`),
 * scales its K/128 block scales (row n/128 of `*.weight_scale_inv`, as
 * f32); dst takes moe_dtype_row_bytes(MOE_DTYPE_FP8_B128, K) bytes.  False,
 * dst unspecified, when a byte is NaN (0x7F, 0xFF) or a scale fails
 * moe_fp8_scale_ok: the loader must refuse such a weight. */
__attribute__((warn_unused_result)) bool moe_fp8_pack_row(void *dst, const uint8_t *q, const float *scales,
                                                          size_t K);

#ifdef __cplusplus
}
#endif
