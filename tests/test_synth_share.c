/* test_synth_share.c - a rank's share of a synthetic model
 * (moe_model_synthetic_part with held experts, runtime/model/synth.c):
 * every expert it holds has, byte for byte, the values the whole model
 * has (the generator's streams entered mid-chunk), with and without a
 * router skew; the others are not held (NULL) and their parts of the
 * stacks are left zero, never made; every other weight is the whole
 * model's. */
#include <criterion/criterion.h>
#include <jansson.h>
#include <stdlib.h>
#include <string.h>

#include "runtime/model/model.h"
#include "runtime/model/synth_skew.h"
#include "tests/testutil.h"

/* experts of 48 x 100 values: a gate/up pair is 9600 values, so the
 * generator's chunks of 65536 values start and end inside experts */
static const char *cfg_json =
    "{\"architectures\": [\"Qwen3MoeForCausalLM\"], \"hidden_size\": 48,"
    " \"moe_intermediate_size\": 100, \"num_hidden_layers\": 3, \"num_attention_heads\": 4,"
    " \"num_key_value_heads\": 2, \"head_dim\": 12, \"vocab_size\": 64,"
    " \"max_position_embeddings\": 64, \"rope_theta\": 10000.0, \"rms_norm_eps\": 1e-06,"
    " \"num_experts\": 16, \"num_experts_per_tok\": 2, \"norm_topk_prob\": true,"
    " \"mlp_only_layers\": [1], \"intermediate_size\": 64, \"tie_word_embeddings\": false, \"initializer_range\": 0.1}";

static struct moe_config load_cfg(void) { return tu_config_json(cfg_json); }

static bool all_zero(const void *p, size_t n)
{
    const unsigned char *b = p;
    for (size_t i = 0; i < n; i++)
        if (b[i]) return false;
    return true;
}

static void check_share(const char *skew)
{
    const struct moe_config c = load_cfg();
    const int L = c.n_layers, E = c.n_experts;
    struct moe_router_skew sk;
    if (skew) cr_assert_eq(moe_router_skew_parse(skew, &sk), MOE_OK);
    uint8_t *held = calloc((size_t)L * E, 1);
    for (int l = 0; l < L; l++) /* an irregular share: every third expert, and 7 */
        for (int e = 0; e < E; e++) held[l * E + e] = e % 3 == l % 3 || e == 7;
    struct moe_model whole, part;
    const struct moe_synth_part wo = {.skew = skew ? &sk : NULL}, po = {.skew = skew ? &sk : NULL, .held = held};
    cr_assert_eq(moe_model_synthetic_part(&whole, &c, MOE_DTYPE_BF16, 9, &wo), MOE_OK, "%s", moe_last_error());
    cr_assert_eq(moe_model_synthetic_part(&part, &c, MOE_DTYPE_BF16, 9, &po), MOE_OK, "%s", moe_last_error());
    const size_t D = (size_t)c.d_model, F = (size_t)c.d_expert, mat = F * D * 2;
    int checked = 0;
    for (int l = 0; l < L; l++) {
        const struct moe_expert_weights *w = &whole.layers[l].experts, *p = &part.layers[l].experts;
        cr_assert_eq(!w->gate, !c.layer_moe[l]);
        if (!w->gate) continue;
        cr_assert_eq(memcmp(whole.layers[l].router.data, part.layers[l].router.data, (size_t)E * D * 2), 0,
                     "layer %d: the router differs", l);
        for (int e = 0; e < E; e++) {
            cr_assert_eq(moe_model_holds(&part, l, e), held[l * E + e]);
            if (!held[l * E + e]) {
                cr_assert(!p->gate[e] && !p->up[e] && !p->down[e], "layer %d expert %d: not held, yet bound", l, e);
                continue;
            }
            cr_assert_eq(memcmp(w->gate[e], p->gate[e], mat), 0, "layer %d expert %d: gate differs", l, e);
            cr_assert_eq(memcmp(w->up[e], p->up[e], mat), 0, "layer %d expert %d: up differs", l, e);
            cr_assert_eq(memcmp(w->down[e], p->down[e], mat), 0, "layer %d expert %d: down differs", l, e);
            checked++;
        }
        /* the stacks' parts of the experts not held: zero, never made */
        char name[96];
        snprintf(name, sizeof name, "model.layers.%d.mlp.experts.gate_up_proj", l);
        const struct moe_st_tensor *gu = moe_safetensors_find(&part.st, name);
        snprintf(name, sizeof name, "model.layers.%d.mlp.experts.down_proj", l);
        const struct moe_st_tensor *dn = moe_safetensors_find(&part.st, name);
        cr_assert(gu && dn);
        for (int e = 0; e < E; e++)
            if (!held[l * E + e]) {
                cr_assert(all_zero((const char *)gu->data + 2 * mat * e, 2 * mat), "layer %d expert %d made", l, e);
                cr_assert(all_zero((const char *)dn->data + mat * e, mat), "layer %d expert %d made", l, e);
            }
    }
    cr_assert_gt(checked, 10);
    const size_t V = (size_t)c.vocab;
    cr_assert_eq(memcmp(whole.embed.data, part.embed.data, V * D * 2), 0, "the embedding differs");
    cr_assert_eq(memcmp(whole.lm_head.data, part.lm_head.data, V * D * 2), 0, "the LM head differs");
    for (int l = 0; l < L; l++)
        cr_assert_eq(memcmp(whole.layers[l].wo.data, part.layers[l].wo.data, D * (size_t)c.n_heads * c.head_dim * 2),
                     0, "layer %d: o_proj differs", l);
    moe_model_free(&whole);
    moe_model_free(&part);
    free(held);
}

Test(synth_share, held_experts_are_the_whole_models) { check_share(NULL); }

Test(synth_share, held_experts_are_the_whole_models_with_a_skewed_router) { check_share("zipf:1.2"); }

/* A skew needs a block of 2E hidden dimensions per MoE layer it codes:
 * 16 experts in a hidden state of 24 is refused, naming why (it divided by
 * zero before). */
Test(synth_share, a_skew_wider_than_the_hidden_state_is_refused)
{
    struct moe_config c = load_cfg();
    c.d_model = 24;
    struct moe_router_skew sk;
    cr_assert_eq(moe_router_skew_parse("zipf:1.2", &sk), MOE_OK);
    struct moe_model m;
    const struct moe_synth_part o = {.skew = &sk};
    cr_assert_eq(moe_model_synthetic_part(&m, &c, MOE_DTYPE_BF16, 9, &o), MOE_ERR_INVALID_ARG);
    cr_assert(strstr(moe_last_error(), "less than twice num_experts"), "%s", moe_last_error());
}
