/* cli_par.c - the command line across several processes (see cli_par.h). */
#include "runtime/cli/cli_par.h"

#include <jansson.h>
#include <signal.h>
#include <sys/resource.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "runtime/backend/backend.h"
#include "runtime/engine/runner.h"
#include "runtime/model/model.h"
#include "runtime/stats/stats_analyze.h"

/* The process's layout: MPI is one per process, so is this. */
static struct {
    bool on;
    struct moe_ep ep;
    char *hello; /* rank 0: the JSON description the runners carry */
} par;

void moe_cli_par_start(struct moe_comm *c)
{
    moe_ep_init(&par.ep, c);
    par.on = moe_ep_on(&par.ep);
}

struct moe_ep *moe_cli_par_ep(void) { return par.on ? &par.ep : NULL; }

enum moe_ep_coll moe_cli_par_collectives(const char *name)
{
    return !name || !strcmp(name, "auto") ? MOE_EP_COLL_AUTO
           : !strcmp(name, "nccl")        ? MOE_EP_COLL_DEVICE
                                          : MOE_EP_COLL_HOST;
}

/* The placement text: the follower's copy of rank 0's, or the file's
 * (rank 0), or NULL. */
static enum moe_status placement_text(const struct moe_cli_model_opts *o, char **text)
{
    *text = NULL;
    if (o->ep_placement_text) {
        if (!(*text = strdup(o->ep_placement_text))) return moe_fail(MOE_ERR_NOMEM, "placement");
        return MOE_OK;
    }
    if (!o->ep_placement) return MOE_OK;
    if (!strncmp(o->ep_placement, "balanced:", 9)) { /* from statistics: written here */
        struct moe_sdata d = {0};
        double ratio;
        MOE_TRY(moe_sdata_load(&d, o->ep_placement + 9));
        enum moe_status s = moe_ep_placement_write(par.ep.size, d.Lm, d.layers, d.E, d.load, 0, d.path, text, &ratio);
        moe_sdata_free(&d);
        return s;
    }
    json_error_t err;
    json_t *j = json_load_file(o->ep_placement, 0, &err);
    if (!j) return moe_fail(MOE_ERR_FORMAT, "--ep-placement %s: line %d: %s", o->ep_placement, err.line, err.text);
    *text = json_dumps(j, JSON_COMPACT);
    json_decref(j);
    return *text ? MOE_OK : moe_fail(MOE_ERR_NOMEM, "placement");
}

enum moe_status moe_cli_par_share(const struct moe_cli_model_opts *o, const struct moe_config *c, uint8_t **held)
{
    *held = NULL;
    const int n_experts = c->n_experts;
    const int world = par.on ? par.ep.size : 1;
    const long tp = o->tp > 1 ? o->tp : 1;
    if (!par.on) {
        if (o->dp_attention)
            return moe_fail(MOE_ERR_INVALID_ARG, "--dp-attention needs several ranks: start moerun with mpirun -n N");
        if (o->ep > 1 || tp > 1)
            return moe_fail(MOE_ERR_INVALID_ARG, "--%s %ld needs %ld ranks: start moerun with mpirun -n %ld",
                            o->ep > 1 ? "ep" : "tp", o->ep > 1 ? o->ep : tp, o->ep > 1 ? o->ep * tp : tp,
                            o->ep > 1 ? o->ep * tp : tp);
        return MOE_OK;
    }
    if (o->ep && o->ep != world && o->ep * tp != world)
        return moe_fail(MOE_ERR_INVALID_ARG, "--ep %ld%s, but the launch has %d ranks (the experts spread over "
                        "every rank, or over the groups of --tp ranks: --ep times --tp ranks)", o->ep,
                        tp > 1 ? " with --tp" : "", world);
    if (n_experts <= 0)
        return moe_fail(MOE_ERR_UNSUPPORTED, "%d ranks, but the model has no experts to spread over them", world);
    MOE_TRY(moe_ep_set_tp(&par.ep, (int)o->ep, (int)tp));
    MOE_TRY(moe_ep_set_dp(&par.ep, o->dp_attention));
    char *text;
    MOE_TRY(placement_text(o, &text));
    enum moe_status s = moe_ep_place(&par.ep, c->n_layers, c->layer_moe, n_experts, text);
    if (s != MOE_OK && o->ep_placement) moe_error_prefix("--ep-placement %s: ", o->ep_placement);
    free(text);
    MOE_TRY(s);
    return moe_ep_held(&par.ep, held);
}

/* Sets key to the string s when s is not NULL. */
static int set_str(json_t *o, const char *key, const char *s)
{
    return s ? json_object_set_new(o, key, json_string(s)) : 0;
}

enum moe_status moe_cli_par_describe(const struct moe_cli_engine *o, const struct moe_backend *be)
{
    if (!par.on) return MOE_OK;
    if (o->gpu_experts)
        return moe_fail(MOE_ERR_UNSUPPORTED, "--gpu-experts with several ranks (each rank holds its share of "
                        "the experts resident instead)");
    char cwd[4096];
    json_t *j = json_object();
    int bad = !j || !getcwd(cwd, sizeof cwd);
    if (!bad)
        bad = set_str(j, "cwd", cwd) || set_str(j, "path", o->model.path) ||
              set_str(j, "synthetic", o->model.synthetic) || set_str(j, "dtype", o->model.dtype) ||
              set_str(j, "router_skew", o->model.router_skew) || set_str(j, "backend", be->ops->name) ||
              set_str(j, "quantize", o->quantize) || set_str(j, "expert_plan", o->expert_plan) ||
              set_str(j, "ep_placement", par.ep.placement_text) ||
              json_object_set_new(j, "seed", json_integer((json_int_t)o->model.seed)) ||
              json_object_set_new(j, "top_k", json_integer(o->model.top_k)) ||
              json_object_set_new(j, "ep", json_integer(o->model.ep)) ||
              json_object_set_new(j, "tp", json_integer(o->model.tp)) ||
              json_object_set_new(j, "dp_attention", json_boolean(o->model.dp_attention)) ||
              json_object_set_new(j, "device_weights", json_boolean(o->model.device_weights)) ||
              json_object_set_new(j, "threads", json_integer(o->threads)) ||
              json_object_set_new(j, "hot_share", json_real(o->hot_share)) ||
              json_object_set_new(j, "comm_timeout", json_real(o->comm_timeout)) ||
              set_str(j, "collectives", o->collectives);
    char *text = bad ? NULL : json_dumps(j, JSON_COMPACT);
    json_decref(j);
    if (!text) return moe_fail(MOE_ERR_NOMEM, "expert parallelism: the model description");
    free(par.hello);
    par.hello = text;
    par.ep.hello = text;
    par.ep.hello_bytes = strlen(text) + 1;
    par.ep.coll = moe_cli_par_collectives(o->collectives);
    moe_comm_set_timeout(par.ep.comm, o->comm_timeout);
    moe_comm_set_timeout(par.ep.tp_comm, o->comm_timeout);
    return MOE_OK;
}

enum moe_status moe_cli_par_runner(const struct moe_cli_engine *o, const struct moe_backend *be,
                                   struct moe_runner_opts *ro)
{
    MOE_TRY(moe_cli_par_describe(o, be));
    ro->ep = moe_cli_par_ep();
    return MOE_OK;
}

/* ---- a follower ---- */

struct follower {
    json_t *desc;             /* the description; the options' strings point into it */
    bool tried;               /* open ran (once: a model that failed stays failed) */
    struct moe_cli_engine eng;
    struct moe_model m;
    struct moe_backend be;
    bool have_m, have_be;
};

static const char *str_of(json_t *d, const char *key)
{
    return json_string_value(json_object_get(d, key));
}

static enum moe_status follower_open(void *ctx, const void *blob, size_t bytes, const struct moe_model **m,
                                     struct moe_backend **be)
{
    struct follower *f = ctx;
    if (f->tried)
        return moe_fail(MOE_ERR_INVALID_ARG, "rank %d: the model did not open at the first runner", par.ep.rank);
    f->tried = true;
    json_error_t err;
    const char *text = blob;
    if (bytes == 0 || text[bytes - 1] != '\0' || !(f->desc = json_loads(text, 0, &err)))
        return moe_fail(MOE_ERR_FORMAT, "expert parallelism: rank 0's model description is not JSON");
    struct moe_cli_engine *e = &f->eng;
    moe_cli_engine_defaults(e);
    json_t *d = f->desc;
    const char *cwd = str_of(d, "cwd");
    if (cwd && chdir(cwd) != 0)
        return moe_fail(MOE_ERR_IO, "expert parallelism: rank %d cannot enter rank 0's folder %s", par.ep.rank, cwd);
    e->model.path = str_of(d, "path");
    e->model.synthetic = str_of(d, "synthetic");
    e->model.dtype = str_of(d, "dtype");
    e->model.router_skew = str_of(d, "router_skew");
    e->model.seed = (uint64_t)json_integer_value(json_object_get(d, "seed"));
    e->model.top_k = (long)json_integer_value(json_object_get(d, "top_k"));
    e->model.ep = (long)json_integer_value(json_object_get(d, "ep"));
    e->model.tp = (long)json_integer_value(json_object_get(d, "tp"));
    e->model.dp_attention = json_is_true(json_object_get(d, "dp_attention"));
    e->model.device_weights = json_is_true(json_object_get(d, "device_weights"));
    e->model.ep_placement_text = str_of(d, "ep_placement");
    e->backend = str_of(d, "backend") ? str_of(d, "backend") : "auto";
    e->quantize = str_of(d, "quantize");
    e->expert_plan = str_of(d, "expert_plan");
    e->threads = (long)json_integer_value(json_object_get(d, "threads"));
    e->hot_share = json_real_value(json_object_get(d, "hot_share"));
    e->comm_timeout = json_real_value(json_object_get(d, "comm_timeout"));
    e->collectives = str_of(d, "collectives");
    par.ep.coll = moe_cli_par_collectives(e->collectives);
    moe_comm_set_timeout(par.ep.comm, e->comm_timeout);
    MOE_TRY(moe_cli_open_model(&f->m, &e->model));
    f->have_m = true;
    MOE_TRY(moe_cli_backend_start(&f->be, e));
    f->have_be = true;
    *m = &f->m;
    *be = &f->be;
    return MOE_OK;
}

static void follower_close(void *ctx)
{
    struct follower *f = ctx;
    if (f->have_be) moe_backend_free(&f->be);
    if (f->have_m) moe_model_free(&f->m);
    json_decref(f->desc);
}

/* Every rank's peak resident memory, gathered at the end (after STOP);
 * rank 0 prints it.  kib: (size) filled on rank 0. */
static void gather_peaks(int64_t *kib)
{
    struct rusage ru;
    int64_t mine = getrusage(RUSAGE_SELF, &ru) == 0 ? (int64_t)ru.ru_maxrss : -1;
    if (moe_comm_allgather(par.ep.comm, &mine, kib, sizeof mine, "gathering peak memory") != MOE_OK)
        fprintf(stderr, "moerun: rank %d: %s\n", par.ep.rank, moe_last_error());
}

int moe_cli_par_follow(void)
{
    /* rank 0 decides when the job ends (a server drains first): the
     * signals mpirun forwards to every rank are its to act on */
    signal(SIGINT, SIG_IGN);
    signal(SIGTERM, SIG_IGN);
    struct follower f = {0};
    const struct moe_ep_follower hooks = {follower_open, follower_close, &f};
    enum moe_status s = moe_ep_follow(&par.ep, &hooks);
    if (s != MOE_OK) fprintf(stderr, "moerun: rank %d: %s\n", par.ep.rank, moe_last_error());
    int64_t *kib = calloc((size_t)par.ep.size, sizeof *kib);
    if (kib && s == MOE_OK) gather_peaks(kib);
    free(kib);
    moe_ep_free(&par.ep);
    return s == MOE_OK ? 0 : 1;
}

void moe_cli_par_finish(void)
{
    if (!par.on) return;
    const struct moe_ep_counters *n = &par.ep.n;
    if (n->steps > 0 && par.ep.bounds)
        fprintf(stderr, "moerun: expert parallelism over %d ranks (%s placement, %d slots in the largest layer): "
                "%llu steps; rank 0 computed "
                "%llu of %llu expert rows; imbalance (busiest rank / mean, per step and layer) %.3f; rank 0's "
                "%s %.3f s of its steps' %.3f s (%.1f%%), %.2f MB received\n", par.ep.size,
                par.ep.placement ? par.ep.placement : "contiguous", par.ep.max_slots, (unsigned long long)n->steps,
                (unsigned long long)n->rows_own, (unsigned long long)n->rows_all,
                n->cells ? n->ratio_sum / (double)n->cells : 0.0,
                par.ep.dp && par.ep.dp_local ? "all-to-alls of expert pairs" : "all-gathers", n->gather_s, n->step_s,
                n->step_s > 0 ? 100 * n->gather_s / n->step_s : 0.0, (double)n->gather_bytes / 1e6);
    if (n->steps > 0 && par.ep.tp > 1)
        fprintf(stderr, "moerun: tensor parallelism in groups of %d ranks (the experts in %d shards): rank 0's "
                "group collectives %.3f s of its steps' %.3f s (%.1f%%), %.2f MB received\n", par.ep.tp,
                par.ep.groups ? par.ep.groups : par.ep.size, par.ep.tp_s, n->step_s,
                n->step_s > 0 ? 100 * par.ep.tp_s / n->step_s : 0.0, (double)par.ep.tp_bytes / 1e6);
    if (n->steps > 0 && par.ep.dp)
        fprintf(stderr, "moerun: data-parallel attention over %d ranks: rank 0 computed %llu of %llu attention "
                "rows; its all-gathers of %s %.3f s of its steps' %.3f s (%.1f%%), %.2f MB received\n",
                par.ep.size, (unsigned long long)par.ep.dp_rows, (unsigned long long)par.ep.dp_rows_all,
                par.ep.dp_local ? "routing and final rows" : "attention rows",
                par.ep.dp_s, n->step_s, n->step_s > 0 ? 100 * par.ep.dp_s / n->step_s : 0.0,
                (double)par.ep.dp_bytes / 1e6);
    int64_t *kib = calloc((size_t)par.ep.size, sizeof *kib);
    if (moe_ep_stop(&par.ep) != MOE_OK) {
        fprintf(stderr, "moerun: %s\n", moe_last_error());
    } else if (kib) {
        gather_peaks(kib);
        fprintf(stderr, "moerun: peak resident memory by rank, when the last runner opened:");
        for (int r = 0; r < par.ep.size && par.ep.open_kib; r++)
            fprintf(stderr, " %.2f GiB", (double)par.ep.open_kib[r] / (1 << 20));
        fprintf(stderr, "; at the end:");
        for (int r = 0; r < par.ep.size; r++) fprintf(stderr, " %.2f GiB", (double)kib[r] / (1 << 20));
        fprintf(stderr, "\n");
    }
    free(kib);
    moe_ep_free(&par.ep);
    free(par.hello);
    par.hello = NULL;
    par.on = false;
}
