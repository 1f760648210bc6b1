/* gemm_amx_int8.h - what the AMX-INT8 products over Q8_0 (gemm_q8_amx.c)
 * and four-bit weights (gemm_q4_amx.c) share: the tile configuration, the
 * B tile of 16 weight rows' 32 codes, the pairwise folds to one lane per
 * weight row, a bias vector. */
#pragma once

#include <immintrin.h>
#include <stdint.h>
#include <string.h>

#include "runtime/cpu/gemm.h"

#define AMXI __attribute__((target("amx-tile,amx-int8,avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx2,fma,f16c")))
#define INLINE static inline __attribute__((always_inline))

enum { BT = 512 /* bytes of a block's B tile (8 x 64) */ };

struct tilecfg {
    uint8_t palette, start_row;
    uint8_t reserved[14];
    uint16_t colsb[16];
    uint8_t rows[16];
};

/* A block of 32 per product: tmm0, tmm3 accumulators (16 x 16 int32);
 * tmm1, tmm4 input rows (16 x 32 codes); tmm2, tmm5 weights (8 x 64). */
AMXI static inline void moe_amx_int8_configure(void)
{
    struct tilecfg c = {.palette = 1};
    c.rows[0] = c.rows[3] = c.rows[1] = c.rows[4] = 16;
    c.colsb[0] = c.colsb[3] = 64;
    c.colsb[1] = c.colsb[4] = 32;
    c.rows[2] = c.rows[5] = 8;
    c.colsb[2] = c.colsb[5] = 64;
    _tile_loadconfig(&c);
}

/* The B tile at o (8 lines of 64 bytes: line q holds bytes 4q..4q+3 of
 * each row) of 16 rows' 32 codes, z[j] holding row j's in the lower half
 * and row j + 8's in the upper. */
AMXI INLINE void moe_amx_b_tile(char *o, const __m512i *z)
{
    const __m512i lo = _mm512_setr_epi64(0, 1, 8, 9, 4, 5, 12, 13), hi = _mm512_setr_epi64(2, 3, 10, 11, 6, 7, 14, 15);
    /* an 8 x 8 transpose of words in each half: line q = word q of rows 0..15 */
    __m512i t[8], u[8];
    for (int j = 0; j < 8; j += 2) {
        t[j] = _mm512_unpacklo_epi32(z[j], z[j + 1]);
        t[j + 1] = _mm512_unpackhi_epi32(z[j], z[j + 1]);
    }
    for (int j = 0; j < 8; j += 4) {
        u[j] = _mm512_unpacklo_epi64(t[j], t[j + 2]);
        u[j + 1] = _mm512_unpackhi_epi64(t[j], t[j + 2]);
        u[j + 2] = _mm512_unpacklo_epi64(t[j + 1], t[j + 3]);
        u[j + 3] = _mm512_unpackhi_epi64(t[j + 1], t[j + 3]);
    }
    for (int j = 0; j < 4; j++) {
        _mm512_store_si512((void *)(o + 64 * j), _mm512_permutex2var_epi64(u[j], lo, u[j + 4]));
        _mm512_store_si512((void *)(o + 64 * (j + 4)), _mm512_permutex2var_epi64(u[j], hi, u[j + 4]));
    }
}

/* c0 = A0 . B0 and c1 = A1 . B1 (16 x 16 int32 each, from zero): A the
 * 16 rows of 32 codes at a0, a1 (stride lda), B the B tiles at b0, b1;
 * the two products in flight together. */
AMXI INLINE void moe_amx_dot2(int32_t *c0, int32_t *c1, const void *a0, const void *a1, size_t lda, const char *b0,
                              const char *b1)
{
    _tile_zero(0);
    _tile_zero(3);
    _tile_loadd(1, a0, (long)lda);
    _tile_loadd(2, b0, 64);
    _tile_loadd(4, a1, (long)lda);
    _tile_loadd(5, b1, 64);
    _tile_dpbssd(0, 1, 2);
    _tile_dpbssd(3, 4, 5);
    _tile_stored(0, c0, 64);
    _tile_stored(3, c1, 64);
}

/* c = A . B alone (as above). */
AMXI INLINE void moe_amx_dot1(int32_t *c, const void *a, size_t lda, const char *b)
{
    _tile_zero(0);
    _tile_loadd(1, a, (long)lda);
    _tile_loadd(2, b, 64);
    _tile_dpbssd(0, 1, 2);
    _tile_stored(0, c, 64);
}

/* Bias of outputs n .. n + m - 1 (m <= 16), zero past them. */
AMXI INLINE __m512 moe_amx_bias16(const struct moe_tensor *b, int n, int m)
{
    _Alignas(64) float v[16] = {0};
    if (b)
        for (int i = 0; i < m; i++) v[i] = moe_tensor_get_f32(b, n + i);
    return _mm512_load_ps(v);
}

/* Three folds: lanes of v[p] (row 2p in the lower half, 2p + 1 in the
 * upper, 8 partial sums each) summed to one lane per row, rows in order. */
AMXI INLINE __m512i moe_amx_fold(__m512i a, __m512i b)
{
    const __m512i ev = _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30);
    const __m512i od = _mm512_setr_epi32(1, 3, 5, 7, 9, 11, 13, 15, 17, 19, 21, 23, 25, 27, 29, 31);
    return _mm512_add_epi32(_mm512_permutex2var_epi32(a, ev, b), _mm512_permutex2var_epi32(a, od, b));
}

