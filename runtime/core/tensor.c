/* tensor.c - dtype table and scalar conversions (see tensor.h).
 * f16 conversion follows IEEE 754 binary16 with round-to-nearest-even,
 * subnormals and infinities included. */
#include "tensor.h"

#include <math.h>

#include "status.h"

static const struct {
    const char *name;
    size_t size;
} dtype_info[MOE_DTYPE_COUNT] = {
    [MOE_DTYPE_F32] = {"F32", 4},       [MOE_DTYPE_F16] = {"F16", 2},
    [MOE_DTYPE_BF16] = {"BF16", 2},     [MOE_DTYPE_F8E4M3] = {"F8_E4M3", 1},
    [MOE_DTYPE_F8E5M2] = {"F8_E5M2", 1}, [MOE_DTYPE_F64] = {"F64", 8},
    [MOE_DTYPE_I8] = {"I8", 1},         [MOE_DTYPE_I16] = {"I16", 2},
    [MOE_DTYPE_I32] = {"I32", 4},       [MOE_DTYPE_I64] = {"I64", 8},
    [MOE_DTYPE_U8] = {"U8", 1},         [MOE_DTYPE_U16] = {"U16", 2},
    [MOE_DTYPE_U32] = {"U32", 4},       [MOE_DTYPE_U64] = {"U64", 8},
    [MOE_DTYPE_BOOL] = {"BOOL", 1},
};

size_t moe_dtype_size(enum moe_dtype t)
{
    if (t == MOE_DTYPE_BF16_PANEL) return 2; /* per element of the logical shape */
    if (t == MOE_DTYPE_Q8_0) return 1;       /* the int8 part; rows: moe_dtype_row_bytes */
    if (t == MOE_DTYPE_MXFP4) return 1;      /* as Q8_0 (a value is half a byte); rows: moe_dtype_row_bytes */
    if (t == MOE_DTYPE_FP8_B128) return 1;   /* the E4M3 part; rows: moe_dtype_row_bytes */
    if (moe_dtype_is_q4(t)) return 1;        /* as MXFP4; rows: moe_dtype_row_bytes */
    if (t == MOE_DTYPE_Q6_K) return 1;       /* as the four-bit formats */
    if (t == MOE_DTYPE_Q5_K) return 1;       /* as the four-bit formats */
    MOE_ASSERT((unsigned)t < MOE_DTYPE_COUNT);
    return dtype_info[t].size;
}

size_t moe_dtype_row_bytes(enum moe_dtype t, size_t n)
{
    if (t == MOE_DTYPE_Q8_0) return n / MOE_Q8_0_BLOCK * MOE_Q8_0_BYTES;
    if (t == MOE_DTYPE_MXFP4) return n / MOE_MXFP4_BLOCK * MOE_MXFP4_BYTES;
    if (t == MOE_DTYPE_FP8_B128) return n / MOE_FP8_BLOCK * MOE_FP8_BYTES;
    if (moe_dtype_is_q4(t)) return n / (size_t)moe_q4_group(t) * moe_q4_group_bytes(t);
    if (t == MOE_DTYPE_Q6_K) return n / MOE_Q6_K_BLOCK * MOE_Q6_K_BYTES; /* < n: no overflow */
    if (t == MOE_DTYPE_Q5_K) return n / MOE_Q5_K_BLOCK * MOE_Q5_K_BYTES; /* < n: no overflow */
    return n * moe_dtype_size(t);
}

const char *moe_dtype_name(enum moe_dtype t)
{
    if (t == MOE_DTYPE_BF16_PANEL) return "BF16_PANEL";
    if (t == MOE_DTYPE_Q8_0) return "Q8_0";
    if (t == MOE_DTYPE_MXFP4) return "MXFP4";
    if (t == MOE_DTYPE_FP8_B128) return "FP8_B128";
    if (t == MOE_DTYPE_Q4_1) return "Q4_1";
    if (t == MOE_DTYPE_Q4_G32) return "Q4_G32";
    if (t == MOE_DTYPE_Q4_G128) return "Q4_G128";
    if (t == MOE_DTYPE_Q4_K) return "Q4_K";
    if (t == MOE_DTYPE_Q6_K) return "Q6_K";
    if (t == MOE_DTYPE_Q5_K) return "Q5_K";
    return (unsigned)t < MOE_DTYPE_COUNT ? dtype_info[t].name : "?";
}

bool moe_dtype_parse(const char *s, enum moe_dtype *out)
{
    for (int i = 0; i < MOE_DTYPE_COUNT; i++) {
        if (strcmp(s, dtype_info[i].name) == 0) {
            *out = (enum moe_dtype)i;
            return true;
        }
    }
    return false;
}

int64_t moe_tensor_numel(const struct moe_tensor *t)
{
    int64_t n = 1;
    for (int i = 0; i < t->ndim; i++) {
        if (t->shape[i] < 0 || __builtin_mul_overflow(n, t->shape[i], &n)) return -1;
    }
    return n;
}

float moe_f16_to_f32(uint16_t h)
{
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    uint32_t exp = (h >> 10) & 0x1fu, man = h & 0x3ffu, u;
    if (exp == 0) {
        if (man == 0) {
            u = sign;
        } else { /* subnormal: normalise */
            exp = 127 - 15 + 1;
            while (!(man & 0x400u)) {
                man <<= 1;
                exp--;
            }
            u = sign | (exp << 23) | ((man & 0x3ffu) << 13);
        }
    } else if (exp == 0x1f) {
        u = sign | 0x7f800000u | (man << 13);
    } else {
        u = sign | ((exp + 127 - 15) << 23) | (man << 13);
    }
    float f;
    memcpy(&f, &u, 4);
    return f;
}

uint16_t moe_f32_to_f16(float f)
{
    uint32_t u;
    memcpy(&u, &f, 4);
    uint32_t sign = (u >> 16) & 0x8000u;
    uint32_t a = u & 0x7fffffffu;
    if (a > 0x7f800000u) return (uint16_t)(sign | 0x7e00u);
    if (a >= 0x477ff000u) return (uint16_t)(sign | 0x7c00u); /* overflow rounds to inf */
    if (a < 0x38800000u) {                                   /* subnormal or zero */
        if (a < 0x33000000u) return (uint16_t)sign;
        uint32_t man = (a & 0x7fffffu) | 0x800000u;
        int shift = 126 - (int)(a >> 23); /* 14..24: value = man * 2^-shift units of 2^-24 */
        uint32_t half = 1u << (shift - 1);
        uint32_t r = man >> shift;
        uint32_t rem = man & ((half << 1) - 1);
        if (rem > half || (rem == half && (r & 1))) r++;
        return (uint16_t)(sign | r);
    }
    uint32_t r = a - 0x38000000u; /* rebias exponent 127 -> 15, keep 23-bit mantissa */
    uint32_t rem = r & 0x1fffu;
    r >>= 13;
    if (rem > 0x1000u || (rem == 0x1000u && (r & 1))) r++;
    return (uint16_t)(sign | r);
}

/* The scale and offset of a four-bit group starting at blk. */
static inline void q4_head(const unsigned char *blk, enum moe_dtype t, float *d, float *m)
{
    if (t == MOE_DTYPE_Q4_1) {
        uint16_t h[2];
        memcpy(h, blk, 4);
        *d = moe_f16_to_f32(h[0]);
        *m = moe_f16_to_f32(h[1]);
    } else {
        memcpy(d, blk, 4);
        memcpy(m, blk + 4, 4);
    }
}

void moe_convert_row_f32(float *dst, const void *src, enum moe_dtype t, size_t n)
{
    switch (t) {
    case MOE_DTYPE_F32: memcpy(dst, src, n * sizeof(float)); return;
    case MOE_DTYPE_BF16: {
        const uint16_t *s = src;
        for (size_t i = 0; i < n; i++) dst[i] = moe_bf16_to_f32(s[i]);
        return;
    }
    case MOE_DTYPE_F16: {
        const uint16_t *s = src;
        for (size_t i = 0; i < n; i++) dst[i] = moe_f16_to_f32(s[i]);
        return;
    }
    case MOE_DTYPE_Q8_0: {
        const unsigned char *b = src;
        MOE_ASSERT(n % MOE_Q8_0_BLOCK == 0);
        for (size_t i = 0; i < n; i += MOE_Q8_0_BLOCK, b += MOE_Q8_0_BYTES) {
            float d;
            memcpy(&d, b, 4);
            for (int j = 0; j < MOE_Q8_0_BLOCK; j++) dst[i + j] = (float)(int8_t)b[4 + j] * d;
        }
        return;
    }
    case MOE_DTYPE_MXFP4: { /* exact: lut values are 2-bit significands */
        const unsigned char *b = src;
        MOE_ASSERT(n % MOE_MXFP4_BLOCK == 0);
        for (size_t i = 0; i < n; i += MOE_MXFP4_BLOCK, b += MOE_MXFP4_BYTES)
            for (size_t j = 0; j < MOE_MXFP4_BLOCK; j++) dst[i + j] = moe_mxfp4_get(b, j);
        return;
    }
    case MOE_DTYPE_FP8_B128: { /* exact: one rounding of q * s, as transformers' fp32 product */
        const unsigned char *b = src;
        MOE_ASSERT(n % MOE_FP8_BLOCK == 0);
        for (size_t i = 0; i < n; i += MOE_FP8_BLOCK, b += MOE_FP8_BYTES) {
            float s;
            memcpy(&s, b, 4);
            for (size_t j = 0; j < MOE_FP8_BLOCK; j++) dst[i + j] = moe_fp8_e4m3_to_f32(b[4 + j]) * s;
        }
        return;
    }
    case MOE_DTYPE_Q4_1:
    case MOE_DTYPE_Q4_G32:
    case MOE_DTYPE_Q4_G128: { /* exact for f16/bf16 scales: see MOE_DTYPE_Q4_G32 */
        const size_t G = (size_t)moe_q4_group(t), gb = moe_q4_group_bytes(t);
        const size_t hb = t == MOE_DTYPE_Q4_1 ? 4 : MOE_Q4_HEAD;
        const unsigned char *b = src;
        MOE_ASSERT(n % G == 0);
        /* moe_q4_get's values, a group's head read once */
        for (size_t i = 0; i < n; i += G, b += gb) {
            float d, m;
            q4_head(b, t, &d, &m);
            for (size_t r = 0; r < G / 32; r++) {
                const unsigned char *qs = b + hb + 16 * r;
                float *o = dst + i + 32 * r;
                for (int j = 0; j < 16; j++) {
                    o[j] = (float)(qs[j] & 15u) * d + m;
                    o[j + 16] = (float)(qs[j] >> 4) * d + m;
                }
            }
        }
        return;
    }
    case MOE_DTYPE_Q4_K: {
        const unsigned char *b = src;
        MOE_ASSERT(n % MOE_Q4_K_BLOCK == 0);
        for (size_t i = 0; i < n; i += MOE_Q4_K_BLOCK, b += MOE_Q4_K_BYTES) {
            float d[8], m[8];
            moe_q4_k_heads(b, d, m);
            for (int j = 0; j < 8; j++) {
                const unsigned char *qs = b + 16 + 32 * (j / 2);
                const int sh = 4 * (j % 2);
                for (int k = 0; k < 32; k++) dst[i + 32 * (size_t)j + k] = (float)((qs[k] >> sh) & 15u) * d[j] + m[j];
            }
        }
        return;
    }
    case MOE_DTYPE_Q5_K: { /* as Q4_K: q * d_j + m_j, the product exact */
        const unsigned char *b = src;
        MOE_ASSERT(n % MOE_Q5_K_BLOCK == 0);
        for (size_t i = 0; i < n; i += MOE_Q5_K_BLOCK, b += MOE_Q5_K_BYTES) {
            float d[8], m[8];
            moe_q5_k_heads(b, d, m);
            for (unsigned e = 0; e < MOE_Q5_K_BLOCK; e++)
                dst[i + e] = (float)moe_q5_k_code(b, e) * d[e / 32] + m[e / 32];
        }
        return;
    }
    case MOE_DTYPE_Q6_K: { /* gguf-py's operations: (d * sc) * (q - 32), the first exact */
        const unsigned char *b = src;
        MOE_ASSERT(n % MOE_Q6_K_BLOCK == 0);
        for (size_t i = 0; i < n; i += MOE_Q6_K_BLOCK, b += MOE_Q6_K_BYTES)
            for (unsigned j = 0; j < MOE_Q6_K_BLOCK / 16; j++) {
                const float s = moe_q6_k_scale(b, 16 * j);
                for (unsigned e = 16 * j; e < 16 * j + 16; e++) dst[i + e] = s * (float)((int)moe_q6_k_code(b, e) - 32);
            }
        return;
    }
    default: MOE_ASSERT(!"convert_row_f32: dtype is not a float weight type");
    }
}

float moe_q4_get(const void *row, enum moe_dtype t, size_t k)
{
    if (t == MOE_DTYPE_Q4_K) {
        const unsigned char *b = (const unsigned char *)row + k / MOE_Q4_K_BLOCK * MOE_Q4_K_BYTES;
        const size_t e = k % MOE_Q4_K_BLOCK, j = e / 32;
        float d[8], m[8];
        moe_q4_k_heads(b, d, m);
        const unsigned q = (b[16 + 32 * (j / 2) + e % 32] >> (4 * (j % 2))) & 15u;
        return (float)q * d[j] + m[j];
    }
    const size_t G = (size_t)moe_q4_group(t), j = k % G;
    const unsigned char *blk = (const unsigned char *)row + k / G * moe_q4_group_bytes(t);
    float d, m;
    q4_head(blk, t, &d, &m);
    const unsigned char *qs = blk + (t == MOE_DTYPE_Q4_1 ? 4 : MOE_Q4_HEAD) + j / 32 * 16;
    const unsigned q = (qs[j % 16] >> (j % 32 / 16 * 4)) & 15u;
    return (float)q * d + m;
}

void moe_q4_pack_group(void *dst, enum moe_dtype t, const uint8_t *codes, float d, float m)
{
    MOE_ASSERT(t == MOE_DTYPE_Q4_G32 || t == MOE_DTYPE_Q4_G128);
    unsigned char *b = dst;
    memcpy(b, &d, 4);
    memcpy(b + 4, &m, 4);
    for (int r = 0; r < moe_q4_group(t) / 32; r++)
        for (int j = 0; j < 16; j++)
            b[MOE_Q4_HEAD + 16 * r + j] = (unsigned char)((codes[32 * r + j] & 15u) | (codes[32 * r + j + 16] & 15u) << 4);
}

bool moe_quantize_row_q4_1(void *dst, const float *src, size_t n)
{
    unsigned char *b = dst;
    MOE_ASSERT(n % MOE_Q4_1_BLOCK == 0);
    for (size_t i = 0; i < n; i += MOE_Q4_1_BLOCK, b += MOE_Q4_1_BYTES) {
        const float *x = src + i;
        float lo = INFINITY, hi = -INFINITY;
        for (int j = 0; j < MOE_Q4_1_BLOCK; j++) {
            if (!isfinite(x[j])) return false;
            if (x[j] < lo) lo = x[j];
            if (x[j] > hi) hi = x[j];
        }
        const float d = (hi - lo) / 15.0f, id = d != 0.0f ? 1.0f / d : 0.0f;
        const uint16_t h[2] = {moe_f32_to_f16(d), moe_f32_to_f16(lo)};
        if ((h[0] & 0x7c00u) == 0x7c00u || (h[1] & 0x7c00u) == 0x7c00u) return false; /* past f16's range */
        memcpy(b, h, 4);
        for (int j = 0; j < 16; j++) {
            const int q0 = (int)(int8_t)((x[j] - lo) * id + 0.5f), q1 = (int)(int8_t)((x[j + 16] - lo) * id + 0.5f);
            b[4 + j] = (unsigned char)((q0 < 15 ? q0 : 15) | (q1 < 15 ? q1 : 15) << 4);
        }
    }
    return true;
}

bool moe_fp8_pack_row(void *dst, const uint8_t *q, const float *scales, size_t K)
{
    unsigned char *b = dst;
    MOE_ASSERT(K % MOE_FP8_BLOCK == 0);
    for (size_t g = 0; g < K / MOE_FP8_BLOCK; g++, b += MOE_FP8_BYTES, q += MOE_FP8_BLOCK) {
        if (!moe_fp8_scale_ok(scales[g])) return false;
        for (int j = 0; j < MOE_FP8_BLOCK; j++)
            if ((q[j] & 0x7f) == 0x7f) return false; /* NaN */
        memcpy(b, &scales[g], 4);
        memcpy(b + 4, q, MOE_FP8_BLOCK);
    }
    return true;
}

bool moe_mxfp4_pack_row(void *dst, const uint8_t *blocks, const uint8_t *scales, size_t K)
{
    unsigned char *b = dst;
    MOE_ASSERT(K % MOE_MXFP4_BLOCK == 0);
    for (size_t g = 0; g < K / MOE_MXFP4_BLOCK; g++, b += MOE_MXFP4_BYTES, blocks += 16) {
        if (scales[g] == 255) return false;
        b[0] = scales[g];
        /* element e of the group is nibble e % 2 of checkpoint byte e / 2;
         * ours: element j in the low nibble of qs[j], j + 16 in its high one */
        for (int j = 0; j < 16; j++) {
            const int lo = j, hi = j + 16;
            const unsigned nlo = (blocks[lo / 2] >> (lo % 2 * 4)) & 15u,
                           nhi = (blocks[hi / 2] >> (hi % 2 * 4)) & 15u;
            b[1 + j] = (unsigned char)(nlo | nhi << 4);
        }
    }
    return true;
}

size_t moe_planes_values_bytes(enum moe_dtype t, size_t rows, size_t K)
{
    MOE_ASSERT(moe_dtype_planes(t));
    return t == MOE_DTYPE_MXFP4 || moe_dtype_is_q4(t) ? rows * (K / 2)
           : t == MOE_DTYPE_Q6_K                      ? rows * (K / 4 * 3)
                                                      : rows * K;
}

size_t moe_planes_scales_bytes(enum moe_dtype t, size_t rows, size_t K)
{
    MOE_ASSERT(moe_dtype_planes(t));
    /* MXFP4: one E8M0 byte a block; FP8_B128, Q8_0: an f32; Q4_1: two f16;
     * Q4_G32, Q4_G128: two f32; Q4_K: its 16-byte head; Q6_K: its last 18
     * bytes */
    const size_t per = t == MOE_DTYPE_MXFP4                                ? 1
                       : t == MOE_DTYPE_Q4_G32 || t == MOE_DTYPE_Q4_G128 ? 8
                       : t == MOE_DTYPE_Q4_K                             ? MOE_Q4_K_BYTES - MOE_Q4_K_BLOCK / 2
                       : t == MOE_DTYPE_Q6_K                             ? MOE_Q6_K_TAIL
                                                                         : 4;
    return rows * (K / (size_t)moe_dtype_block(t)) * per;
}

/* Moves n blocks between the row layout (rows: each block's sb scale
 * bytes, then its vb value bytes) and planes (v, s): to_planes splits,
 * else joins.  Inlined with constant sizes, so the copies are moves, not
 * calls (the CUDA offload joins planes on every CPU step). */
static inline void blocks_copy(unsigned char *rows, size_t n, unsigned char *v, unsigned char *s, size_t vb,
                               size_t sb, bool to_planes)
{
    for (size_t b = 0; b < n; b++, rows += vb + sb, v += vb, s += sb) {
        if (to_planes) {
            memcpy(s, rows, sb);
            memcpy(v, rows + sb, vb);
        } else {
            memcpy(rows, s, sb);
            memcpy(rows + sb, v, vb);
        }
    }
}

/* Moves n Q4_K blocks between rows and planes (to_planes: splits, else
 * joins): the 16-byte head to s; the codes of each 64 values (32 bytes,
 * byte i: element i low, 32 + i high) to two runs of 32 (16 bytes each,
 * byte i: element i low, i + 16 high). */
static void q4_k_copy(unsigned char *rows, size_t n, unsigned char *v, unsigned char *s, bool to_planes)
{
    enum { HEAD = MOE_Q4_K_BYTES - MOE_Q4_K_BLOCK / 2 };
    for (size_t b = 0; b < n; b++, rows += MOE_Q4_K_BYTES, v += MOE_Q4_K_BLOCK / 2, s += HEAD) {
        unsigned char *q = rows + HEAD;
        if (to_planes) memcpy(s, rows, HEAD);
        else memcpy(rows, s, HEAD);
        for (int c = 0; c < 4; c++, q += 32)
            for (int i = 0; i < 16; i++) {
                unsigned char *r0 = v + 32 * c + i, *r1 = r0 + 16; /* runs 2c and 2c + 1 */
                if (to_planes) {
                    *r0 = (unsigned char)((q[i] & 15u) | (q[i + 16] & 15u) << 4);
                    *r1 = (unsigned char)(q[i] >> 4 | (q[i + 16] & 0xf0u));
                } else {
                    q[i] = (unsigned char)((*r0 & 15u) | (*r1 & 15u) << 4);
                    q[i + 16] = (unsigned char)(*r0 >> 4 | (*r1 & 0xf0u));
                }
            }
    }
}

void moe_q5_k_pack_codes(void *blk, const uint8_t *q)
{
    unsigned char *qh = (unsigned char *)blk + MOE_Q5_K_QH, *qs = (unsigned char *)blk + MOE_Q5_K_QS;
    memset(qh, 0, 32);
    for (int e = 0; e < MOE_Q5_K_BLOCK; e++) qh[e % 32] |= (unsigned char)((q[e] >> 4 & 1u) << (e / 32));
    for (int c = 0; c < 4; c++)
        for (int l = 0; l < 32; l++)
            qs[32 * c + l] = (unsigned char)((q[64 * c + l] & 15u) | (q[64 * c + 32 + l] & 15u) << 4);
}

void moe_q6_k_pack_codes(void *blk, const uint8_t *q)
{
    for (int h = 0; h < 2; h++) { /* half by half */
        const uint8_t *qh = q + 128 * h;
        unsigned char *ql = (unsigned char *)blk + 64 * h, *hi = (unsigned char *)blk + 128 + 32 * h;
        for (int l = 0; l < 32; l++) {
            ql[l] = (unsigned char)((qh[l] & 15u) | (qh[l + 64] & 15u) << 4);
            ql[l + 32] = (unsigned char)((qh[l + 32] & 15u) | (qh[l + 96] & 15u) << 4);
            hi[l] = (unsigned char)(qh[l] >> 4 | (qh[l + 32] >> 4) << 2 | (qh[l + 64] >> 4) << 4 |
                                    (qh[l + 96] >> 4) << 6);
        }
    }
}

/* Moves n Q6_K blocks between rows and planes (to_planes: splits, else
 * joins): the codes (moe_q6_k_code) to the low-nibble runs and the words
 * of high bits of the planes layout (tensor.h), the block's last 18 bytes
 * to s. */
static void q6_k_copy(unsigned char *rows, size_t n, unsigned char *v, unsigned char *s, bool to_planes)
{
    static const uint8_t slot[8] = MOE_Q6_K_SLOTS;
    enum { VB = MOE_Q6_K_BLOCK / 4 * 3 };
    for (size_t b = 0; b < n; b++, rows += MOE_Q6_K_BYTES, v += VB, s += MOE_Q6_K_TAIL) {
        uint8_t q[MOE_Q6_K_BLOCK];
        if (to_planes) {
            for (unsigned e = 0; e < MOE_Q6_K_BLOCK; e++) q[e] = (uint8_t)moe_q6_k_code(rows, e);
            memcpy(s, rows + MOE_Q6_K_BYTES - MOE_Q6_K_TAIL, MOE_Q6_K_TAIL);
            moe_q6_k_plane_codes(q, v);
            continue;
        }
        for (int r = 0; r < 8; r++) {
            uint8_t *qr = q + 32 * r;
            for (int i = 0; i < 16; i++) qr[i] = v[16 * r + i] & 15u, qr[i + 16] = v[16 * r + i] >> 4;
            for (int j = 0; j < 4; j++) {
                const unsigned w = v[128 + 8 * r + 2 * j] | (unsigned)v[128 + 8 * r + 2 * j + 1] << 8;
                for (int k = 0; k < 8; k++) qr[4 * j + slot[k]] |= (uint8_t)(((w >> (2 * k)) & 3u) << 4);
            }
        }
        moe_q6_k_pack_codes(rows, q);
        memcpy(rows + MOE_Q6_K_BYTES - MOE_Q6_K_TAIL, s, MOE_Q6_K_TAIL);
    }
}

/* Moves R rows of K values between the row layout (rows) and planes
 * (values, scales): to_planes splits, else joins.  MXFP4: the scale byte
 * first, then 16 bytes of nibbles; FP8: the f32 scale, then 128 bytes;
 * Q8_0: the f32 scale, then 32 bytes; Q4_1: f16 d and m, then 16 bytes;
 * Q4_G32, Q4_G128: f32 d and m, then 16 or 64 bytes; Q4_K: q4_k_copy. */
static void planes_copy(enum moe_dtype t, unsigned char *rows, size_t R, size_t K, unsigned char *v,
                        unsigned char *s, bool to_planes)
{
    const size_t blk = (size_t)moe_dtype_block(t), n = R * (K / blk);
    MOE_ASSERT(moe_dtype_planes(t) && K % blk == 0);
    if (t == MOE_DTYPE_MXFP4) blocks_copy(rows, n, v, s, MOE_MXFP4_BLOCK / 2, 1, to_planes);
    else if (t == MOE_DTYPE_FP8_B128) blocks_copy(rows, n, v, s, MOE_FP8_BLOCK, 4, to_planes);
    else if (t == MOE_DTYPE_Q8_0) blocks_copy(rows, n, v, s, MOE_Q8_0_BLOCK, 4, to_planes);
    else if (t == MOE_DTYPE_Q4_1) blocks_copy(rows, n, v, s, MOE_Q4_1_BLOCK / 2, 4, to_planes);
    else if (t == MOE_DTYPE_Q4_K) q4_k_copy(rows, n, v, s, to_planes);
    else if (t == MOE_DTYPE_Q6_K) q6_k_copy(rows, n, v, s, to_planes);
    else blocks_copy(rows, n, v, s, blk / 2, MOE_Q4_HEAD, to_planes); /* Q4_G32, Q4_G128 */
}

void moe_planes_from_rows(enum moe_dtype t, const void *rows, size_t R, size_t K, void *values,
                          void *scales)
{
    planes_copy(t, (unsigned char *)rows, R, K, values, scales, true);
}

void moe_rows_from_planes(enum moe_dtype t, const void *values, const void *scales, size_t R, size_t K,
                          void *rows)
{
    planes_copy(t, rows, R, K, (unsigned char *)values, (unsigned char *)scales, false);
}

bool moe_quantize_row_q8_0(void *dst, const float *src, size_t n)
{
    unsigned char *b = dst;
    for (size_t i = 0; i < n; i += MOE_Q8_0_BLOCK, b += MOE_Q8_0_BYTES) {
        float amax = 0.0f;
        for (int j = 0; j < MOE_Q8_0_BLOCK; j++) {
            if (!isfinite(src[i + j])) return false;
            const float a = fabsf(src[i + j]);
            if (a > amax) amax = a;
        }
        const float d = amax / 127.0f, id = d != 0.0f ? 1.0f / d : 0.0f;
        const uint16_t h = moe_f32_to_f16(d);
        if ((h & 0x7c00u) == 0x7c00u) return false; /* a scale past f16's range */
        const float dh = moe_f16_to_f32(h);
        memcpy(b, &dh, 4);
        for (int j = 0; j < MOE_Q8_0_BLOCK; j++) b[4 + j] = (unsigned char)(int8_t)roundf(src[i + j] * id);
    }
    return true;
}

void moe_convert_from_f32(void *dst, const float *src, enum moe_dtype t, size_t n)
{
    switch (t) {
    case MOE_DTYPE_F32: memcpy(dst, src, n * sizeof(float)); return;
    case MOE_DTYPE_BF16: {
        uint16_t *d = dst;
        for (size_t i = 0; i < n; i++) d[i] = moe_f32_to_bf16(src[i]);
        return;
    }
    case MOE_DTYPE_F16: {
        uint16_t *d = dst;
        for (size_t i = 0; i < n; i++) d[i] = moe_f32_to_f16(src[i]);
        return;
    }
    default: MOE_ASSERT(!"convert_from_f32: dtype is not a float weight type");
    }
}
