/* test_cuda_synth.c - synthetic weights made on the device
 * (moe_model_synthetic_deferred, the CUDA backend's upload) for a rank of
 * expert parallelism: the experts it holds, stacked in slot order, are
 * byte for byte the host generator's values of those experts (each
 * expert's part of the stream entered where the whole tensor has it,
 * moe_ops_synth_fill_at_cuda, in runs of consecutive experts), the others
 * are not uploaded.  Without a device every test skips (the suite's .init
 * asks the CUDA runtime in the forked test process). */
#include <criterion/criterion.h>
#include <stdlib.h>
#include <string.h>

#include "runtime/backend/backend.h"
#include "runtime/model/model.h"
#include "tests/testutil.h"

TestSuite(cuda_synth, .init = tu_need_cuda_device);

/* tiny-moe with experts 100 wide: a gate/up pair is 51200 values and a
 * down matrix 25600, so the generator's chunks of 65536 values begin and
 * end inside experts. */
static struct moe_config tiny_cfg(void)
{
    struct moe_config cfg;
    cr_assert_eq(moe_config_load(&cfg, MOERUN_SOURCE_DIR "/configs/tiny-moe.json"), MOE_OK, "%s", moe_last_error());
    cfg.d_expert = 100;
    return cfg;
}

static void check_share(const uint8_t *held)
{
    const struct moe_config cfg = tiny_cfg();
    const int L = cfg.n_layers, E = cfg.n_experts;
    struct moe_model h, d;
    cr_assert_eq(moe_model_synthetic(&h, &cfg, MOE_DTYPE_BF16, 3), MOE_OK, "%s", moe_last_error());
    const struct moe_synth_part o = {.held = held, .deferred = true};
    cr_assert_eq(moe_model_synthetic_part(&d, &cfg, MOE_DTYPE_BF16, 3, &o), MOE_OK, "%s", moe_last_error());
    struct moe_backend be;
    cr_assert_eq(tu_backend_init(&be, "cuda"), MOE_OK, "%s", moe_last_error());
    cr_assert_eq(be.ops->prepare_model(&be, &d), MOE_OK, "%s", moe_last_error());
    const size_t mat = (size_t)cfg.d_expert * cfg.d_model * 2;
    char *got = malloc(mat);
    int checked = 0;
    for (int l = 0; l < L; l++)
        for (int e = 0; e < E; e++) {
            const struct moe_expert_weights *x = &d.layers[l].experts, *w = &h.layers[l].experts;
            if (held && !held[l * E + e]) {
                cr_expect(!x->gate[e] && !x->down[e], "layer %d expert %d: not held, yet uploaded", l, e);
                continue;
            }
            const void *dev[3] = {x->gate[e], x->up[e], x->down[e]}, *host[3] = {w->gate[e], w->up[e], w->down[e]};
            for (int k = 0; k < 3; k++) {
                cr_assert_eq(be.ops->to_host(&be, got, dev[k], mat), MOE_OK, "%s", moe_last_error());
                cr_assert_eq(memcmp(got, host[k], mat), 0, "layer %d expert %d matrix %d: not the host's values", l,
                             e, k);
            }
            checked++;
        }
    cr_expect_gt(checked, 0);
    free(got);
    moe_backend_free(&be);
    moe_model_free(&d);
    moe_model_free(&h);
}

Test(cuda_synth, the_whole_model_is_the_hosts) { check_share(NULL); }

/* held: singles, runs and gaps, another pattern in each layer */
static uint8_t *irregular_share(int L, int E)
{
    uint8_t *held = calloc((size_t)L * E, 1);
    for (int l = 0; l < L; l++)
        for (int e = 0; e < E; e++) held[l * E + e] = e % (l + 2) == 0 || (e >= 9 && e < 13) || e == E - 1;
    return held;
}

Test(cuda_synth, a_ranks_share_is_the_hosts_experts)
{
    const struct moe_config cfg = tiny_cfg();
    uint8_t *held = irregular_share(cfg.n_layers, cfg.n_experts);
    check_share(held);
    free(held);
}

/* MXFP4 experts (gpt-oss) made on the device have codes of their own (the
 * host makes other ones): a rank's share holds, byte for byte, the codes
 * the whole model made on the device has for those experts. */
Test(cuda_synth, an_mxfp4_share_is_the_whole_device_models_experts)
{
    struct moe_config cfg;
    cr_assert_eq(moe_config_load(&cfg, FIXTURE_DIR "/gpt_oss_mxfp4/config.json"), MOE_OK, "%s", moe_last_error());
    const int L = cfg.n_layers, E = cfg.n_experts;
    uint8_t *held = irregular_share(L, E);
    struct moe_model w, p;
    const struct moe_synth_part wo = {.deferred = true}, po = {.held = held, .deferred = true};
    cr_assert_eq(moe_model_synthetic_part(&w, &cfg, MOE_DTYPE_BF16, 5, &wo), MOE_OK, "%s", moe_last_error());
    cr_assert_eq(moe_model_synthetic_part(&p, &cfg, MOE_DTYPE_BF16, 5, &po), MOE_OK, "%s", moe_last_error());
    struct moe_backend bw, bp;
    cr_assert_eq(tu_backend_init(&bw, "cuda"), MOE_OK, "%s", moe_last_error());
    cr_assert_eq(tu_backend_init(&bp, "cuda"), MOE_OK, "%s", moe_last_error());
    cr_assert_eq(bw.ops->prepare_model(&bw, &w), MOE_OK, "%s", moe_last_error());
    cr_assert_eq(bp.ops->prepare_model(&bp, &p), MOE_OK, "%s", moe_last_error());
    const size_t mat = moe_planes_values_bytes(MOE_DTYPE_MXFP4, cfg.d_expert, cfg.d_model);
    char *a = malloc(mat), *b = malloc(mat);
    int checked = 0;
    for (int l = 0; l < L; l++)
        for (int e = 0; e < E; e++) {
            const struct moe_expert_weights *x = &p.layers[l].experts, *y = &w.layers[l].experts;
            cr_assert_eq(x->dtype, MOE_DTYPE_MXFP4);
            if (!held[l * E + e]) {
                cr_expect(!x->gate[e], "layer %d expert %d: not held, yet uploaded", l, e);
                continue;
            }
            const void *px[3] = {x->gate[e], x->up[e], x->down[e]}, *py[3] = {y->gate[e], y->up[e], y->down[e]};
            for (int k = 0; k < 3; k++) {
                cr_assert_eq(bp.ops->to_host(&bp, a, px[k], mat), MOE_OK, "%s", moe_last_error());
                cr_assert_eq(bw.ops->to_host(&bw, b, py[k], mat), MOE_OK, "%s", moe_last_error());
                cr_assert_eq(memcmp(a, b, mat), 0, "layer %d expert %d matrix %d: not the whole model's codes", l, e,
                             k);
            }
            checked++;
        }
    cr_expect_gt(checked, 0);
    free(a), free(b);
    moe_backend_free(&bp);
    moe_backend_free(&bw);
    moe_model_free(&p);
    moe_model_free(&w);
    free(held);
}
