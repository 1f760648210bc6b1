/* test_config_defaults.c - a configuration that leaves a key out means
 * what transformers makes of it: for each fixture family and each key of
 * tests/fixtures/config_defaults.json (experts per token, RoPE theta,
 * RMSNorm epsilon, context length, tied embeddings, the sliding-window
 * switches and layer pattern, the routing switches and which layers are
 * MoE; and the shapes the modeling code builds: head dimension, KV heads,
 * rotated dimensions, q/k norms, attention and MLP biases, expert,
 * shared-expert and dense FFN widths, latent-attention dimensions, gpt-oss's
 * activation limit; Qwen3-Next's and Qwen3.5-MoE's gated attention output,
 * which layers are linear attention and the Gated DeltaNet's heads, head
 * widths and convolution width; GLM-MoE-DSA's sparse-attention indexer and
 * which layers run one), the config without that key parses to the values
 * transformers gives (recorded by tests/reference/make_config_defaults.py,
 * the shapes off a model it builds on the meta device; a multimodal config's
 * keys removed from its text_config).  Where transformers has no
 * value (DeepSeek-V2's num_experts_per_tok is None) moerun requires the
 * key; where its defaults cannot run (more expert groups chosen than there
 * are) moerun refuses the config. */
#include <criterion/criterion.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "runtime/model/config.h"
#include "tests/testutil.h"

static int check_case(json_t *c)
{
    const char *fixture = json_string_value(json_object_get(c, "fixture")),
               *what = json_string_value(json_object_get(c, "what"));
    char path[512];
    snprintf(path, sizeof path, "%s/%s/config.json", FIXTURE_DIR, fixture);
    json_t *cfgj = json_load_file(path, 0, NULL);
    cr_assert(cfgj, "%s", path);
    /* where the keys are set and removed: the config, or (a multimodal config) its text_config */
    json_t *within = json_object_get(c, "within"),
           *keys = within ? json_object_get(cfgj, json_string_value(within)) : cfgj;
    cr_assert(json_is_object(keys), "%s: %s", path, within ? json_string_value(within) : "");
    cr_assert_eq(json_object_update(keys, json_object_get(c, "set")), 0);
    size_t i;
    json_t *k;
    json_array_foreach(json_object_get(c, "remove"), i, k) json_object_del(keys, json_string_value(k));
    char label[256];
    snprintf(label, sizeof label, "%s (%s)", fixture, what);
    struct moe_config cfg;
    enum moe_status s = moe_config_parse(&cfg, cfgj, label);
    json_decref(cfgj);
    json_t *e = json_object_get(c, "expect");
    if (s != MOE_OK) { /* a key transformers leaves None (DeepSeek-V2's num_experts_per_tok): required */
        size_t n;
        json_t *key;
        json_array_foreach(json_object_get(e, "none"), n, key) {
            char want[128];
            snprintf(want, sizeof want, "missing required field '%s'", json_string_value(key));
            if (strstr(what, json_string_value(key)) && strstr(moe_last_error(), want)) return 0;
        }
    }
    json_t *ng = json_object_get(e, "n_group"), *tg = json_object_get(e, "topk_group");
    if (json_object_get(json_object_get(e, "shapes"), "error")) { /* transformers cannot build it */
        cr_assert_neq(s, MOE_OK, "%s: transformers cannot build this model (%s), moerun reads it", label,
                      json_string_value(json_object_get(json_object_get(e, "shapes"), "error")));
        return 0;
    }
    if (s != MOE_OK && ng && tg && json_integer_value(tg) > json_integer_value(ng)) {
        /* more groups chosen than there are: transformers' topk fails on it */
        cr_assert(strstr(moe_last_error(), "topk_group"), "%s: %s", label, moe_last_error());
        return 0;
    }
    if (s != MOE_OK) {
        cr_log_error("%s: %s", label, moe_last_error());
        return 1;
    }
    int bad = 0;
#define DIFF(cond, ...) do { if (cond) { cr_log_error(__VA_ARGS__); bad++; } } while (0)
    const double theta = json_number_value(json_object_get(e, "rope_theta")),
                 eps = json_number_value(json_object_get(e, "rms_eps"));
    DIFF(fabs(cfg.rope_theta - theta) > 1e-6 * theta, "%s: rope theta %g, transformers %g", label,
         (double)cfg.rope_theta, theta);
    DIFF(fabs(cfg.rms_eps - eps) > 1e-6 * eps, "%s: rms eps %g, transformers %g", label, (double)cfg.rms_eps, eps);
    DIFF(cfg.max_pos != json_integer_value(json_object_get(e, "max_pos")), "%s: context %d, transformers %lld",
         label, cfg.max_pos, json_integer_value(json_object_get(e, "max_pos")));
    DIFF(cfg.tie_embeddings != json_is_true(json_object_get(e, "tie")), "%s: tied embeddings %d, transformers %d",
         label, cfg.tie_embeddings, json_is_true(json_object_get(e, "tie")));
    json_t *tk = json_object_get(e, "top_k");
    DIFF(tk && cfg.top_k != json_integer_value(tk), "%s: experts per token %d, transformers %lld", label,
         cfg.top_k, json_integer_value(tk));
    json_t *v;
    if ((v = json_object_get(e, "norm_topk")))
        DIFF(cfg.norm_topk != json_is_true(v), "%s: renormalised top-k %d, transformers %d", label, cfg.norm_topk,
             json_is_true(v));
    if ((v = json_object_get(e, "routed_scale")))
        DIFF(fabs(cfg.routed_scale - json_number_value(v)) > 1e-6 * fabs(json_number_value(v)),
             "%s: routed scaling %g, transformers %g", label, (double)cfg.routed_scale, json_number_value(v));
    if ((v = json_object_get(e, "n_group")))
        DIFF(cfg.n_group != json_integer_value(v), "%s: expert groups %d, transformers %lld", label, cfg.n_group,
             json_integer_value(v));
    if ((v = json_object_get(e, "topk_group")))
        DIFF(cfg.topk_group != json_integer_value(v), "%s: groups chosen %d, transformers %lld", label,
             cfg.topk_group, json_integer_value(v));
    if ((v = json_object_get(e, "moe_layers")))
        for (int l = 0; l < cfg.n_layers && l < (int)json_array_size(v); l++)
            DIFF(cfg.layer_moe[l] != json_is_true(json_array_get(v, (size_t)l)), "%s: layer %d MoE %d, transformers %d",
                 label, l, cfg.layer_moe[l], json_is_true(json_array_get(v, (size_t)l)));
    /* which layers are linear attention (Qwen3-Next's layer_types, or full_attention_interval);
     * a family without them has none */
    json_t *ll = json_object_get(e, "layer_linear");
    DIFF(ll && (int)json_array_size(ll) != cfg.n_layers, "%s: %d layers, transformers %zu", label, cfg.n_layers,
         json_array_size(ll));
    for (int l = 0; l < cfg.n_layers; l++)
        DIFF(cfg.layer_linear[l] != json_is_true(json_array_get(ll, (size_t)l)),
             "%s: layer %d linear attention %d, transformers %d", label, l, cfg.layer_linear[l],
             json_is_true(json_array_get(ll, (size_t)l)));
    json_t *sl = json_object_get(e, "sliding");
    cr_assert_eq((int)json_array_size(sl), cfg.n_layers, "%s", label);
    bool any = false;
    for (int l = 0; l < cfg.n_layers; l++) {
        bool want = json_is_true(json_array_get(sl, (size_t)l));
        any |= cfg.layer_sliding[l];
        DIFF(cfg.layer_sliding[l] != want, "%s: layer %d sliding %d, transformers %d", label, l,
             cfg.layer_sliding[l], want);
    }
    DIFF(any && cfg.sliding_window != json_integer_value(json_object_get(e, "sliding_window")),
         "%s: sliding window %d, transformers %lld", label, cfg.sliding_window,
         json_integer_value(json_object_get(e, "sliding_window")));
    /* the shapes the modeling code builds from the configuration */
    json_t *sh = json_object_get(e, "shapes");
    const struct { const char *key; int have; } ints[] = {
        {"head_dim", cfg.head_dim},       {"n_kv_heads", cfg.n_kv_heads}, {"rope_dim", cfg.rope_dim},
        {"d_expert", cfg.d_expert},       {"d_shared", cfg.d_shared},     {"d_ff", cfg.d_ff},
        {"kv_lora_rank", cfg.kv_lora_rank}, {"q_lora_rank", cfg.q_lora_rank}, {"qk_nope_dim", cfg.qk_nope_dim},
        {"v_head_dim", cfg.v_head_dim}};
    for (size_t j = 0; j < sizeof ints / sizeof *ints; j++)
        if ((v = json_object_get(sh, ints[j].key)))
            DIFF(ints[j].have != json_integer_value(v), "%s: %s %d, transformers builds %lld", label, ints[j].key,
                 ints[j].have, json_integer_value(v));
    const struct { const char *key; bool have; } bools[] = {
        {"qkv_bias", cfg.qkv_bias}, {"o_bias", cfg.o_bias}, {"mlp_bias", cfg.mlp_bias},
        {"qk_norm", cfg.qk_norm != MOE_QK_NORM_NONE}};
    for (size_t j = 0; j < sizeof bools / sizeof *bools; j++)
        if ((v = json_object_get(sh, bools[j].key)))
            DIFF(bools[j].have != json_is_true(v), "%s: %s %d, transformers builds %d", label, bools[j].key,
                 bools[j].have, json_is_true(v));
    /* the gated attention output: q_proj gives 2 Hq Dh (Qwen3-Next, Qwen3.5-MoE); none elsewhere.  A model
     * whose layers are all linear attention (Qwen3.5-MoE's 3 layers by full_attention_interval's default, 4)
     * has no attention to gate: transformers builds no q_proj to tell, and the layers are compared below */
    DIFF(moe_config_linear_layers(&cfg) < cfg.n_layers &&
         cfg.attn_out_gate != json_is_true(json_object_get(sh, "attn_out_gate")),
         "%s: attention output gate %d, transformers builds %d", label, cfg.attn_out_gate,
         json_is_true(json_object_get(sh, "attn_out_gate")));
    if ((v = json_object_get(sh, "linear_attn"))) { /* the Gated DeltaNet's geometry; its layers */
        const struct { const char *key; int have; } lin[] = {
            {"k_heads", cfg.lin_k_heads}, {"v_heads", cfg.lin_v_heads}, {"k_dim", cfg.lin_k_dim},
            {"v_dim", cfg.lin_v_dim},     {"conv", cfg.lin_conv}};
        for (size_t j = 0; j < sizeof lin / sizeof *lin; j++)
            DIFF(lin[j].have != json_integer_value(json_object_get(v, lin[j].key)),
                 "%s: linear attention %s %d, transformers builds %lld", label, lin[j].key, lin[j].have,
                 json_integer_value(json_object_get(v, lin[j].key)));
        json_t *built = json_object_get(v, "layers");
        int n_linear = 0;
        for (int l = 0; l < cfg.n_layers; l++) {
            bool want = json_is_true(json_array_get(built, (size_t)l));
            n_linear += want;
            DIFF(cfg.layer_linear[l] != want, "%s: layer %d linear attention %d, transformers builds %d", label,
                 l, cfg.layer_linear[l], want);
        }
        DIFF(moe_config_linear_layers(&cfg) != n_linear, "%s: %d linear-attention layers, transformers builds %d",
             label, moe_config_linear_layers(&cfg), n_linear);
    } else
        DIFF(moe_config_linear_layers(&cfg) != 0, "%s: %d linear-attention layers, transformers builds none",
             label, moe_config_linear_layers(&cfg));
    if ((v = json_object_get(sh, "llama4"))) { /* per layer: no RoPE, chunked; the q/k L2 norm, temperature */
        json_t *nope = json_object_get(v, "nope"), *chunked = json_object_get(v, "chunked");
        bool any_chunked = false, any_rope = false;
        for (int l = 0; l < cfg.n_layers; l++) {
            DIFF(cfg.layer_nope[l] != json_is_true(json_array_get(nope, (size_t)l)),
                 "%s: layer %d without RoPE %d, transformers %d", label, l, cfg.layer_nope[l],
                 json_is_true(json_array_get(nope, (size_t)l)));
            DIFF(cfg.layer_chunked[l] != json_is_true(json_array_get(chunked, (size_t)l)),
                 "%s: layer %d chunked %d, transformers %d", label, l, cfg.layer_chunked[l],
                 json_is_true(json_array_get(chunked, (size_t)l)));
            any_chunked |= cfg.layer_chunked[l];
            any_rope |= !cfg.layer_nope[l];
        }
        DIFF(any_chunked && cfg.attn_chunk != json_integer_value(json_object_get(v, "chunk")),
             "%s: attention chunk %d, transformers %lld", label, cfg.attn_chunk,
             json_integer_value(json_object_get(v, "chunk")));
        DIFF((cfg.qk_l2_norm && any_rope) != json_is_true(json_object_get(v, "qk_l2")),
             "%s: q/k L2 norm %d, transformers %d", label, cfg.qk_l2_norm && any_rope,
             json_is_true(json_object_get(v, "qk_l2")));
        const long long floor_want = json_integer_value(json_object_get(v, "temp_floor"));
        DIFF(cfg.attn_temp_floor != floor_want, "%s: temperature floor_scale %d, transformers %lld", label,
             cfg.attn_temp_floor, floor_want);
        DIFF(floor_want && fabs(cfg.attn_temp_scale - json_number_value(json_object_get(v, "temp_scale"))) > 1e-6,
             "%s: temperature attn_scale %g, transformers %g", label, (double)cfg.attn_temp_scale,
             json_number_value(json_object_get(v, "temp_scale")));
    }
    if ((v = json_object_get(sh, "dsa"))) { /* DeepSeek sparse attention: the indexer, its layers */
        const struct { const char *key; int have; } ix[] = {
            {"topk", cfg.dsa_topk}, {"heads", cfg.dsa_heads}, {"dim", cfg.dsa_dim}};
        for (size_t j = 0; j < sizeof ix / sizeof *ix; j++)
            DIFF(ix[j].have != json_integer_value(json_object_get(v, ix[j].key)),
                 "%s: indexer %s %d, transformers builds %lld", label, ix[j].key, ix[j].have,
                 json_integer_value(json_object_get(v, ix[j].key)));
        json_t *full = json_object_get(v, "full");
        for (int l = 0; l < cfg.n_layers; l++)
            DIFF(cfg.layer_dsa_shared[l] == json_is_true(json_array_get(full, (size_t)l)),
                 "%s: layer %d indexer shared %d, transformers builds %s", label, l, cfg.layer_dsa_shared[l],
                 json_is_true(json_array_get(full, (size_t)l)) ? "one" : "none");
    } else
        DIFF(cfg.dsa_topk != 0, "%s: an indexer (top %d), transformers builds none", label, cfg.dsa_topk);
    if ((v = json_object_get(sh, "swiglu_limit")))
        DIFF(fabs(cfg.swiglu_limit - json_number_value(v)) > 1e-6 * json_number_value(v),
             "%s: swiglu limit %g, transformers builds %g", label, (double)cfg.swiglu_limit, json_number_value(v));
#undef DIFF
    return bad;
}

Test(config_defaults, absent_keys_read_as_transformers_reads_them)
{
    json_error_t err;
    json_t *root = json_load_file(FIXTURE_DIR "/config_defaults.json", 0, &err);
    cr_assert(root, "%s", err.text);
    json_t *cases = json_object_get(root, "cases"), *c;
    cr_assert(json_array_size(cases) >= 100, "the table has its cases");
    size_t i;
    int bad = 0, cases_bad = 0;
    json_array_foreach(cases, i, c) {
        int b = check_case(c);
        bad += b;
        cases_bad += b > 0;
    }
    cr_assert_eq(bad, 0, "%d differences in %d of %zu cases (listed above)", bad, cases_bad, json_array_size(cases));
    json_decref(root);
}
