/* cli_draft.c - `--draft DIR` (see cli_draft.h). */
#include "runtime/cli/cli_draft.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "runtime/text/tokenizer.h"

enum moe_status moe_cli_draft_check(const struct moe_cli_model_opts *o)
{
    if (!o->draft) return MOE_OK;
    if (!o->path)
        return moe_fail(MOE_ERR_INVALID_ARG, "--draft %s: the target needs a model folder (its "
                        "tokenizer is compared with the draft's)", o->draft);
    struct moe_tokenizer t = {0}, d = {0};
    enum moe_status s = moe_tokenizer_load(&t, o->path);
    if (s == MOE_OK) s = moe_tokenizer_load(&d, o->draft);
    if (s == MOE_OK) s = moe_tokenizer_same(&t, &d, "target", "draft");
    if (s != MOE_OK) moe_error_prefix("--draft %s: ", o->draft);
    moe_tokenizer_free(&d);
    moe_tokenizer_free(&t);
    return s;
}

struct cli_draft {
    struct moe_model m;
    struct moe_backend be; /* used when the draft has a backend of its own */
    bool own_be;
};

static void draft_release(void *ctx)
{
    struct cli_draft *d = ctx;
    if (d->own_be) moe_backend_free(&d->be);
    moe_model_free(&d->m);
    free(d);
}

/* The target's share of --kv-budget when every block costs the target's
 * and the draft's bytes: both pools hold the same number of tokens. */
static enum moe_status split_budget(const struct moe_cli_engine *o, const struct moe_model *m,
                                    const struct moe_model *dm, enum moe_dtype kvt, int *n_blocks)
{
    size_t budget, a = moe_kvcache_block_bytes(&m->cfg, (int)o->kv_block, kvt),
                   b = moe_kvcache_block_bytes(&dm->cfg, (int)o->kv_block, kvt);
    MOE_TRY(moe_cli_parse_budget(o->kv_budget, &budget));
    if (a == SIZE_MAX || b == SIZE_MAX || a > SIZE_MAX - b || budget / (a + b) == 0)
        return moe_fail(MOE_ERR_INVALID_ARG, "--kv-budget of %zu bytes holds no block of the target "
                        "and the draft (a block of %ld tokens takes %zu + %zu bytes)", budget,
                        o->kv_block, a, b);
    size_t n = budget / (a + b);
    *n_blocks = n > (size_t)INT32_MAX / 2 ? INT32_MAX / 2 : (int)n;
    return MOE_OK;
}

/* --draft DIR, or --spec mtp: the target's module 0 (borrowing its weights),
 * on the target's backend. */
enum moe_status moe_cli_draft_attach(const struct moe_cli_engine *o, const struct moe_model *m,
                                     struct moe_backend *be, struct moe_engine_opts *eo)
{
    const bool mtp = o->spec.kind == MOE_SPEC_MTP;
    const char *dir = o->model.draft;
    if (!mtp && !dir) return MOE_OK;
    struct cli_draft *d = calloc(1, sizeof *d);
    if (!d) return moe_fail(MOE_ERR_NOMEM, mtp ? "--spec mtp" : "--draft %s", dir);
    enum moe_status s = mtp ? moe_model_mtp_view(m, 0, &d->m) : moe_model_load(&d->m, dir);
    if (s != MOE_OK) {
        if (mtp) moe_error_prefix("--spec mtp: %s: ", o->model.path ? o->model.path : "the model");
        else moe_error_prefix("--draft %s: ", dir);
        goto fail;
    }
    if (o->kv_budget && (s = split_budget(o, m, &d->m, eo->kv_dtype, &eo->n_blocks)) != MOE_OK) goto fail;
    if (!mtp && !strcmp(be->ops->name, "cuda") && o->gpu_experts > 0) {
        struct moe_cli_engine bo = *o;
        bo.backend = "cuda";
        bo.gpu_experts = 0;
        bo.gpu_experts_warm = NULL;
        bo.gpu_experts_cpu_rows = 0;
        if ((s = moe_cli_backend_start(&d->be, &bo)) != MOE_OK) goto fail;
        d->own_be = true;
    }
    eo->spec.kind = mtp ? MOE_SPEC_MTP : MOE_SPEC_DRAFT;
    eo->spec.draft = &d->m;
    eo->spec.draft_be = d->own_be ? &d->be : NULL;
    eo->spec.draft_blocks = eo->n_blocks;
    eo->spec.draft_release = draft_release;
    eo->spec.draft_ctx = d;
    return MOE_OK;
fail:
    draft_release(d);
    return s;
}
