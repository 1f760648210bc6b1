/* quant_error.c - how far `--quantize Q` moves a checkpoint's weights: the
 * relative RMS error (sqrt of the summed squared error over the summed
 * squared weights) and the bits a weight, per part (experts, attention,
 * dense and shared feed-forward, LM head) and in all.
 *
 * The checkpoint is loaded twice: once as stored, once prepared by the
 * reference CPU backend with the quantization (the same choices and bytes
 * as every CPU backend makes: runtime/backend/backend_cpu_pack.c); every
 * matrix the backend quantized is read back row by row
 * (moe_convert_row_f32, exact) against the stored rows widened to fp32.
 * Routers and the embedding are kept as stored by every quantization and
 * not counted.
 *
 * Build and run (from the repository root, after the CPU build in build-cpu/):
 *   cmake --build build-cpu --target bench_quant_error && build-cpu/bench_quant_error MODEL_DIR q4_k_m
 * Not run by the tests. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "runtime/backend/backend.h"
#include "runtime/cli/cli_common.h"
#include "runtime/core/status.h"
#include "runtime/model/model.h"

enum { P_EXPERTS, P_ATTN, P_FFN, P_LM_HEAD, P_ALL, PARTS };
static const char *const part_names[PARTS] = {"experts", "attention", "dense and shared FFN", "LM head", "all"};

struct sums {
    double err, ref, bytes, weights;
};

/* Adds matrix (N, K): stored rows a (dtype at), quantized rows b (dtype bt). */
static void add(struct sums *s, const void *a, enum moe_dtype at, const void *b, enum moe_dtype bt, int64_t N,
                int64_t K, float *ra, float *rb)
{
    if (bt == at) return; /* not quantized */
    const size_t sa = moe_dtype_row_bytes(at, (size_t)K), sb = moe_dtype_row_bytes(bt, (size_t)K);
    for (int64_t n = 0; n < N; n++) {
        moe_convert_row_f32(ra, (const char *)a + (size_t)n * sa, at, (size_t)K);
        moe_convert_row_f32(rb, (const char *)b + (size_t)n * sb, bt, (size_t)K);
        for (int64_t k = 0; k < K; k++) {
            const double d = (double)rb[k] - ra[k];
            s->err += d * d;
            s->ref += (double)ra[k] * ra[k];
        }
    }
    s->bytes += (double)sb * (double)N;
    s->weights += (double)N * (double)K;
}

static void add_tensor(struct sums *s, const struct moe_tensor *a, const struct moe_tensor *b, float *ra, float *rb)
{
    if (a->data && a->ndim == 2) add(s, a->data, a->dtype, b->data, b->dtype, a->shape[0], a->shape[1], ra, rb);
}

int main(int argc, char **argv)
{
    enum moe_weight_quant q;
    if (argc != 3 || !moe_cli_parse_quant(argv[2], &q)) {
        fprintf(stderr, "usage: %s MODEL_DIR q8_0|q4|q4_k_m|q5_k|q5_k_m\n", argv[0]);
        return 2;
    }
    struct moe_model a, b;
    if (moe_model_load(&a, argv[1]) != MOE_OK || moe_model_load(&b, argv[1]) != MOE_OK) {
        fprintf(stderr, "%s\n", moe_last_error());
        return 1;
    }
    struct moe_backend_opts o;
    moe_backend_opts_defaults(&o);
    o.quant = q;
    struct moe_backend be;
    if (moe_backend_init(&be, "cpu-ref", &o) != MOE_OK || be.ops->prepare_model(&be, &b) != MOE_OK) {
        fprintf(stderr, "%s\n", moe_last_error());
        return 1;
    }
    const struct moe_config *c = &a.cfg;
    const int64_t wmax = c->d_model > c->d_expert ? c->d_model : c->d_expert;
    const int64_t width = wmax > c->d_ff ? (wmax > c->d_shared ? wmax : c->d_shared) : c->d_ff;
    const int64_t row = width > (int64_t)c->n_heads * c->head_dim ? width : (int64_t)c->n_heads * c->head_dim;
    float *ra = malloc((size_t)row * sizeof(float)), *rb = malloc((size_t)row * sizeof(float));
    struct sums s[PARTS] = {{0}};
    add_tensor(&s[P_LM_HEAD], &a.lm_head, &b.lm_head, ra, rb);
    for (int l = 0; l < c->n_layers; l++) {
        const struct moe_layer_weights *x = &a.layers[l], *y = &b.layers[l];
        const struct moe_tensor *attn[][2] = {{&x->wq, &y->wq}, {&x->wk, &y->wk}, {&x->wv, &y->wv},
                                              {&x->wo, &y->wo}, {&x->wq_a, &y->wq_a}, {&x->wkv_a, &y->wkv_a}};
        const struct moe_tensor *ffn[][2] = {{&x->w_gate, &y->w_gate}, {&x->w_up, &y->w_up},
                                             {&x->w_down, &y->w_down}, {&x->sh_gate, &y->sh_gate},
                                             {&x->sh_up, &y->sh_up},   {&x->sh_down, &y->sh_down}};
        for (size_t i = 0; i < sizeof attn / sizeof *attn; i++) add_tensor(&s[P_ATTN], attn[i][0], attn[i][1], ra, rb);
        for (size_t i = 0; i < sizeof ffn / sizeof *ffn; i++) add_tensor(&s[P_FFN], ffn[i][0], ffn[i][1], ra, rb);
        if (!c->layer_moe[l] || !x->experts.gate) continue;
        const int64_t D = c->d_model, F = c->d_expert;
        for (int e = 0; e < c->n_experts; e++) {
            const struct moe_expert_weights *ex = &x->experts, *ey = &y->experts;
            const enum moe_dtype at = moe_expert_dtype(ex, e), bt = moe_expert_dtype(ey, e),
                                 bd = moe_expert_down_dtype(ey, e);
            add(&s[P_EXPERTS], ex->gate[e], at, ey->gate[e], bt, F, D, ra, rb);
            add(&s[P_EXPERTS], ex->up[e], at, ey->up[e], bt, F, D, ra, rb);
            add(&s[P_EXPERTS], ex->down[e], moe_expert_down_dtype(ex, e), ey->down[e], bd, D, F, ra, rb);
        }
    }
    for (int p = 0; p < P_ALL; p++) {
        s[P_ALL].err += s[p].err, s[P_ALL].ref += s[p].ref;
        s[P_ALL].bytes += s[p].bytes, s[P_ALL].weights += s[p].weights;
    }
    printf("%s --quantize %s\n%-22s %14s %12s %14s\n", argv[1], argv[2], "part", "weights", "bits/weight",
           "relative RMS");
    for (int p = 0; p < PARTS; p++)
        if (s[p].weights > 0)
            printf("%-22s %14.0f %12.4f %14.6f\n", part_names[p], s[p].weights, 8 * s[p].bytes / s[p].weights,
                   sqrt(s[p].err / s[p].ref));
    free(ra);
    free(rb);
    moe_backend_free(&be);
    moe_model_free(&a);
    moe_model_free(&b);
    return 0;
}
