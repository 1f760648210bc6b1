/* model_fp8.c - the Linear weights of quantization_config fp8 checkpoints
 * (DeepSeek-V3/R1, Kimi-K2, Qwen3 "-FP8"; weight_block_size [128, 128]),
 * bound as MOE_DTYPE_FP8_B128 (runtime/core/tensor.h).
 *
 * Such a checkpoint stores a quantized Linear weight W (N, K) as `NAME`
 * F8_E4M3 (N, K) beside `SCALES` (ceil(N/128), ceil(K/128)) in F32 or BF16,
 * and a stack of expert matrices (E, N, K) with scales (E, ceil(N/128),
 * ceil(K/128)).  SCALES is NAME with its ".weight" suffix replaced by
 * ".weight_scale_inv", or NAME + "_scale_inv" for a stacked tensor without
 * the suffix (`mlp.experts.gate_up_proj_scale_inv`): the names
 * transformers' Fp8Quantize writes.  The value is
 *   W[n][k] = e4m3(q[n][k]) * SCALES[n / 128][k / 128]
 * in fp32, as DeepSeek's weight_dequant and transformers'
 * _dequantize_fp8_weight compute it: the last row group of a matrix whose N
 * is not a multiple of 128 (DeepSeek-V3's kv_a_proj_with_mqa, 576 rows) is
 * shorter.  (transformers' CPU loader, Fp8Dequantize, divides N evenly by
 * the grid instead, and refuses 576 rows in 5 groups: docs/models.md.)
 *
 * Which weights are quantized is read from each tensor's dtype; routers,
 * norms, embeddings and the LM head stay bf16 in these checkpoints, and
 * model.c sends only Linear weights here (it refuses F8_E4M3 elsewhere), so
 * modules_to_not_convert is not needed.  moe_model_fp8_bind packs every row
 * with its scales into memory the model owns and gives the source pages
 * back; a weight the loader rewrites (MLA's kv_b_proj, split per head) is
 * dequantized to F32 instead.  Every refusal names the tensor: its scales
 * missing, of another dtype or shape, or not finite, a NaN byte (0x7F,
 * 0xFF), K not a multiple of 128 (FP8_B128 rows hold whole blocks). */
#include <stdlib.h>
#include <string.h>

#include "runtime/model/model_impl.h"

static void shape_text(char *buf, size_t n, int ndim, const int64_t *shape)
{
    size_t off = (size_t)snprintf(buf, n, "(");
    for (int i = 0; i < ndim && off < n; i++)
        off += (size_t)snprintf(buf + off, n - off, i ? ", %lld" : "%lld", (long long)shape[i]);
    if (off < n) snprintf(buf + off, n - off, ")");
}

/* The scales of weight t (named name): present, F32 or BF16, of t's grid. */
static enum moe_status find_scales(const struct moe_model *m, const struct moe_st_tensor *t, const char *name,
                                   const struct moe_st_tensor **out)
{
    char sn[MOE_NAME_MAX];
    const size_t len = strlen(name);
    if (len > 7 && !strcmp(name + len - 7, ".weight"))
        snprintf(sn, sizeof sn, "%.*s.weight_scale_inv", (int)(len - 7), name);
    else
        snprintf(sn, sizeof sn, "%s_scale_inv", name);
    const struct moe_st_tensor *s = moe_safetensors_find(&m->st, sn);
    if (!s)
        return moe_fail(MOE_ERR_FORMAT, "checkpoint: tensor '%s' is F8_E4M3 but its scales '%s' are missing",
                        name, sn);
    if (s->dtype != MOE_DTYPE_F32 && s->dtype != MOE_DTYPE_BF16)
        return moe_fail(MOE_ERR_UNSUPPORTED, "checkpoint: tensor '%s' has dtype %s (supported: F32, BF16%s)",
                        sn, moe_dtype_name(s->dtype),
                        s->dtype == MOE_DTYPE_U8 ? "; E8M0 scales stored as bytes are not read yet" : "");
    int64_t want[MOE_MAX_DIMS];
    bool ok = s->ndim == t->ndim;
    for (int i = 0; i < t->ndim; i++) {
        want[i] = t->shape[i];
        if (i >= t->ndim - 2) want[i] = (t->shape[i] + MOE_FP8_BLOCK - 1) / MOE_FP8_BLOCK;
        ok = ok && s->shape[i] == want[i];
    }
    if (!ok) {
        char a[96], b[96], c[96];
        shape_text(a, sizeof a, s->ndim, s->shape);
        shape_text(b, sizeof b, t->ndim, want);
        shape_text(c, sizeof c, t->ndim, t->shape);
        return moe_fail(MOE_ERR_FORMAT, "checkpoint: tensor '%s' has shape %s, expected %s (blocks of "
                        "128 x 128 over '%s' %s)", sn, a, b, name, c);
    }
    const size_t n = s->nbytes / moe_dtype_size(s->dtype);
    for (size_t i = 0; i < n; i++) {
        const float v = s->dtype == MOE_DTYPE_F32 ? ((const float *)s->data)[i]
                                                  : moe_bf16_to_f32(((const uint16_t *)s->data)[i]);
        if (!moe_fp8_scale_ok(v))
            return moe_fail(MOE_ERR_FORMAT, "checkpoint: tensor '%s' holds a scale that is not finite (%g, "
                            "element %zu)", sn, v, i);
    }
    *out = s;
    return MOE_OK;
}

/* Row r of matrix b's scales (G of them) as f32 into sc. */
static void scale_row(float *sc, const struct moe_st_tensor *s, int64_t b, int64_t r, int64_t NB, int64_t G)
{
    const size_t off = (size_t)((b * NB + r / MOE_FP8_BLOCK) * G);
    moe_convert_row_f32(sc, (const char *)s->data + off * moe_dtype_size(s->dtype), s->dtype, (size_t)G);
}

/* The first NaN byte (0x7F, 0xFF) of q[0, K), or -1. */
static int64_t first_nan(const uint8_t *q, int64_t K)
{
    for (int64_t k = 0; k < K; k++)
        if ((q[k] & 0x7f) == 0x7f) return k;
    return -1;
}

enum moe_status moe_model_fp8_bind(struct moe_model *m, const struct moe_st_tensor *t, const char *name,
                                   bool to_f32, const uint8_t *keep, struct moe_tensor *out)
{
    MOE_ASSERT(t->dtype == MOE_DTYPE_F8E4M3 && t->ndim >= 2 && t->ndim <= 3);
    const int64_t N = t->shape[t->ndim - 2], K = t->shape[t->ndim - 1], B = t->ndim == 3 ? t->shape[0] : 1;
    const int64_t NB = (N + MOE_FP8_BLOCK - 1) / MOE_FP8_BLOCK, G = (K + MOE_FP8_BLOCK - 1) / MOE_FP8_BLOCK;
    if (!to_f32 && K % MOE_FP8_BLOCK)
        return moe_fail(MOE_ERR_UNSUPPORTED, "checkpoint: tensor '%s' is F8_E4M3 with %lld columns; FP8 "
                        "weights need a multiple of 128 (whole blocks)", name, (long long)K);
    const struct moe_st_tensor *s = NULL;
    MOE_TRY(find_scales(m, t, name, &s));
    const size_t row = to_f32 ? (size_t)K * sizeof(float) : moe_dtype_row_bytes(MOE_DTYPE_FP8_B128, (size_t)K);
    size_t bytes;
    if (!moe_mul_size((size_t)(B * N), row, &bytes))
        return moe_fail(MOE_ERR_FORMAT, "checkpoint: tensor '%s' is too large", name);
    char *base;
    MOE_TRY(moe_model_own(m, bytes, (void **)&base));
    float *sc = malloc((size_t)G * sizeof(float));
    if (!sc) return moe_fail(MOE_ERR_NOMEM, "checkpoint: scales of '%s'", name);
    const uint8_t *q = t->data;
    char *dst = base;
    for (int64_t b = 0; b < B; b++) {
        if (keep && B > 1 && !keep[b]) {
            q += N * K;
            dst += (size_t)N * row;
            continue;
        }
        for (int64_t r = 0; r < N; r++, q += K, dst += row) {
            const int64_t bad = first_nan(q, K);
            if (bad >= 0) {
                free(sc);
                char where[48] = "";
                if (B > 1) snprintf(where, sizeof where, " of matrix %lld", (long long)b);
                return moe_fail(MOE_ERR_FORMAT, "checkpoint: tensor '%s' holds a NaN (byte 0x%02x) at row "
                                "%lld%s, column %lld", name, q[bad], (long long)r, where, (long long)bad);
            }
            scale_row(sc, s, b, r, NB, G);
            if (to_f32) {
                float *d = (float *)dst;
                for (int64_t k = 0; k < K; k++) d[k] = moe_fp8_e4m3_to_f32(q[k]) * sc[k / MOE_FP8_BLOCK];
            } else {
                const bool packed = moe_fp8_pack_row(dst, q, sc, (size_t)K);
                MOE_ASSERT(packed); /* bytes and scales were checked above */
            }
        }
    }
    free(sc);
    *out = (struct moe_tensor){.dtype = to_f32 ? MOE_DTYPE_F32 : MOE_DTYPE_FP8_B128, .ndim = t->ndim,
                               .data = base, .device = -1};
    memcpy(out->shape, t->shape, sizeof t->shape);
    moe_safetensors_release(&m->st, t->data, t->nbytes, true);
    return MOE_OK;
}
