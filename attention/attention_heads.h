/* attention_heads.h - what the fast attention's kernel sets share around
 * their inner loops (attention_avx2.c, attention_avx512.c): the register
 * blocks of heads (4, 2, then 1; the block changes no head's arithmetic),
 * the fp8 value scales of a tile, and the entry points, one instance per
 * cache dtype.  Included once by each set after its dot_heads and
 * acc_heads, with ATT_FN its target attribute, ATT_NAME(f) the set's
 * name for f (f_avx2, f_avx512) and ATT_KEYS the most keys its dot_heads
 * takes at once (1, or 4: up to four keys' chains for a block of heads,
 * each the chain it has alone; a tile's keys in fours, then a pair, then
 * one). */
#pragma once

#ifndef ATT_KEYS
#define ATT_KEYS 1
#endif

ATT_FN INLINE void scores_dt(float *sc, int ldsc, const float *q, int gn, int Dh, const enum moe_dtype dt,
                             const void *const *krow, const float *ks, int nj, float scale)
{
    for (int jj = 0; jj < nj;) {
        const int nk = ATT_KEYS >= 4 && jj + 4 <= nj ? 4 : ATT_KEYS >= 2 && jj + 2 <= nj ? 2 : 1;
        float s[4] = {0};
        for (int u = 0; u < nk && dt == MOE_DTYPE_F8E4M3; u++) s[u] = ks[jj + u];
#define HEADS(nh, NK) dot_heads(sc + (size_t)g * ldsc + jj, ldsc, q + (size_t)g * Dh, nh, NK, Dh, dt, krow + jj, s, scale)
#define BLOCKS(NK)                                                                                           \
    do {                                                                                                     \
        int g = 0;                                                                                           \
        for (; g + 4 <= gn; g += 4) HEADS(4, NK);                                                            \
        if (g + 2 <= gn) {                                                                                   \
            HEADS(2, NK);                                                                                    \
            g += 2;                                                                                          \
        }                                                                                                    \
        if (g < gn) HEADS(1, NK);                                                                            \
    } while (0)
        if (nk == 4)
            BLOCKS(4);
        else if (nk == 2)
            BLOCKS(2);
        else
            BLOCKS(1);
#undef BLOCKS
#undef HEADS
        jj += nk;
    }
}

ATT_FN INLINE void accum_dt(float *acc, int gn, int Dh, const float *corr, const float *p, int ldp,
                            const enum moe_dtype dt, const void *const *vrow, const float *vs, int nj)
{
    float s[MOE_ATT_TILE], s256[MOE_ATT_TILE]; /* scales, 2^8 times them (non-fp8 rows: unused) */
    for (int jj = 0; jj < nj; jj++) {
        s[jj] = dt == MOE_DTYPE_F8E4M3 ? vs[jj] : 1.0f;
        s256[jj] = 256.0f * s[jj];
    }
    int g = 0;
    for (; g + 4 <= gn; g += 4)
        acc_heads(acc + (size_t)g * Dh, 4, Dh, corr + g, p + (size_t)g * ldp, ldp, dt, vrow, s, s256, nj);
    if (g + 2 <= gn) {
        acc_heads(acc + (size_t)g * Dh, 2, Dh, corr + g, p + (size_t)g * ldp, ldp, dt, vrow, s, s256, nj);
        g += 2;
    }
    if (g < gn) acc_heads(acc + (size_t)g * Dh, 1, Dh, corr + g, p + (size_t)g * ldp, ldp, dt, vrow, s, s256, nj);
}

ATT_FN void ATT_NAME(moe_attention_scores)(float *sc, int ldsc, const float *q, int gn, int Dh, enum moe_dtype dt,
                                           const void *const *krow, const float *ks, int nj, float scale)
{
    MOE_ASSERT(nj <= MOE_ATT_TILE);
#define SCORES(t) scores_dt(sc, ldsc, q, gn, Dh, t, krow, ks, nj, scale)
    KV_DTYPE_SWITCH(dt, SCORES)
#undef SCORES
}

ATT_FN void ATT_NAME(moe_attention_accum)(float *acc, int gn, int Dh, const float *corr, const float *p, int ldp,
                                          enum moe_dtype dt, const void *const *vrow, const float *vs, int nj)
{
    MOE_ASSERT(nj <= MOE_ATT_TILE);
#define ACCUM(t) accum_dt(acc, gn, Dh, corr, p, ldp, t, vrow, vs, nj)
    KV_DTYPE_SWITCH(dt, ACCUM)
#undef ACCUM
}
