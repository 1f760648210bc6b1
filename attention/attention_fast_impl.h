/* attention_fast_impl.h - the fast attention's kernels (attention_avx2.c,
 * and attention_avx512.c: the same bits), private to attention_fast.c; the
 * numbers they keep are described there. */
#pragma once

#include "runtime/core/tensor.h"

enum { MOE_ATT_TILE = 16 }; /* keys per softmax tile */

/* sc[g * ldsc + jj] = (q_g . k_jj) * scale for heads g < gn (q_g = q + g * Dh,
 * Dh floats) and keys jj < nj <= MOE_ATT_TILE; k_jj: the row at krow[jj],
 * Dh values of dt (F32, F16, BF16, F8E4M3: row scale ks[jj]; ks is read
 * for F8E4M3 only). */
void moe_attention_scores_avx2(float *sc, int ldsc, const float *q, int gn, int Dh, enum moe_dtype dt,
                               const void *const *krow, const float *ks, int nj, float scale);
/* acc_g (Dh floats at acc + g * Dh) = acc_g * corr[g] + sum over jj < nj, in
 * order, of p[g * ldp + jj] * v_jj, for heads g < gn; v_jj as k_jj above
 * (scales vs). */
void moe_attention_accum_avx2(float *acc, int gn, int Dh, const float *corr, const float *p, int ldp,
                              enum moe_dtype dt, const void *const *vrow, const float *vs, int nj);
/* The same two on 512-bit registers, the same bits (attention_avx512.c). */
void moe_attention_scores_avx512(float *sc, int ldsc, const float *q, int gn, int Dh, enum moe_dtype dt,
                                 const void *const *krow, const float *ks, int nj, float scale);
void moe_attention_accum_avx512(float *acc, int gn, int Dh, const float *corr, const float *p, int ldp,
                                enum moe_dtype dt, const void *const *vrow, const float *vs, int nj);
/* The online-softmax update of one tile for heads g < gn: mn = the larger of
 * m[g] and the tile's scores sc[g * ldsc + jj], jj < nj (NaN scores
 * skipped, as the reference's); corr[g] = e^(m[g] - mn); the scores become
 * p = e^(s - mn) (all MOE_ATT_TILE lanes stored, 0 past nj); l[g] =
 * l[g] * corr[g] + the sum of the tile's p in one fixed order; m[g] = mn.
 * The exponential: moe_attention_exp_avx2's (attention.h). */
void moe_attention_softmax_avx2(float *sc, int ldsc, int gn, int nj, float *m, float *l, float *corr);
