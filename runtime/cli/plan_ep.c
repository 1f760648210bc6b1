/* plan_ep.c - expert parallelism's predictions (see plan_ep.h). */
#include "runtime/cli/plan_ep.h"

#include <math.h>
#include <stdbool.h>
#include <stdio.h>

#include "runtime/cli/cli_common.h"
#include "runtime/model/model.h"

/* Seconds of one ring all-gather of `bytes` (all N ranks' parts together). */
static double allgather_s(const struct moe_plan_ep *p, double N, double bytes)
{
    return N > 1 ? (N - 1) * p->latency + (N - 1) / N * bytes / p->net_bw : 0;
}

/* The expected distinct experts of the busiest rank in a step of `rows`
 * rows: each of a rank's E/N experts is touched with probability q =
 * 1 - (1 - K/E)^rows, the ranks' counts taken as independent binomials
 * B(E/N, q); E[max of N] = sum over k >= 1 of 1 - P(count < k)^N. */
static double busiest_experts(const struct moe_plan_ep *p, double rows)
{
    const int n = (int)(p->E / p->shards);
    if (n <= 0) return 0;
    const double q = 1.0 - pow(1.0 - p->K / p->E, rows);
    double pmf = pow(1.0 - q, n), cdf = 0, expect = 0; /* P(count = 0) */
    for (int k = 1; k <= n; k++) {
        cdf += pmf; /* P(count < k) */
        expect += 1.0 - pow(fmin(cdf, 1.0), p->shards);
        pmf = q < 1 ? pmf * (double)(n - k + 1) / k * q / (1.0 - q) : (k == n ? 1 : 0);
    }
    return expect;
}

/* The chance that a row's K distinct experts (of E, uniform) put a pair
 * on a given other rank, which holds E/N of them: 1 - C(E - E/N, K) /
 * C(E, K), the ratio taken as a product of K factors. */
static double a2a_reach(double E, double K, double N)
{
    double none = 1;
    for (int i = 0; i < (int)K && none > 0; i++) none *= fmax(E - E / N - i, 0) / (E - i);
    return 1 - none;
}

/* One MoE layer of the all-to-all form over `rows` rows, `own` of them
 * on the busiest rank and an even share of the rest on each other rank:
 * each row (fp32) to the ranks of its pairs, two int32 a pair, each
 * pair's output back, after the count matrices' all-gather.  Adds what
 * the busiest rank receives to *a; returns the seconds, each exchange
 * taking (N - 1) hops and the most any rank receives in it. */
static double a2a_layer(const struct moe_plan_ep *p, double rows, double own, struct moe_plan_a2a *a)
{
    const double N = p->ranks, K = p->K, row = p->D * 4;
    const double each = (rows - own) / (N - 1), r = p->reach; /* one other rank's rows */
    /* the busiest rank (b) and another (o) */
    const double rows_b = (rows - own) * r * row, rows_o = (rows - each) * r * row;
    const double pairs_b = (rows - own) * K / N * 8, pairs_o = (rows - each) * K / N * 8;
    const double out_b = own * K * (N - 1) / N * row, out_o = each * K * (N - 1) / N * row;
    a->rows += rows_b;
    a->pairs += pairs_b;
    a->outputs += out_b;
    a->counts += (N - 1) * 2 * N * 4;
    return allgather_s(p, N, N * 2 * N * 4) + 3 * (N - 1) * p->latency +
           (fmax(rows_b, rows_o) + fmax(pairs_b, pairs_o) + fmax(out_b, out_o)) / p->net_bw;
}

/* The all-to-all form's exchanges in a step of `rows` rows, `logit` of
 * them wanting logits (plan_ep.h): the busiest rank holds `own` rows and
 * `lown` logit rows.  A last MoE layer exchanges the logit rows alone (its
 * FFN runs for them only); every MoE layer's routing is gathered on rank 0
 * when statistics are on.  Fills *a; returns the seconds. */
static double a2a_comm(const struct moe_plan_ep *p, double rows, double own, double logit, double lown,
                       struct moe_plan_a2a *a)
{
    const double N = p->ranks, row = p->D * 4;
    *a = (struct moe_plan_a2a){.routing = p->n_moe * (rows - own) * (2 * p->K + p->E) * 4};
    const int full = p->n_moe - (p->last_moe && p->n_moe > 0);
    double s = 0;
    for (int l = 0; l < p->n_moe; l++) s += l < full ? a2a_layer(p, rows, own, a) : a2a_layer(p, logit, lown, a);
    const double lrow_b = (logit - lown) * row, lrow_o = (logit - (logit - lown) / (N - 1)) * row;
    a->logit_rows = lrow_b;
    return s + (N - 1) * p->latency + fmax(lrow_b, lrow_o) / p->net_bw;
}

/* A rank's step of `rows` rows of `seqs` sequences at context ctx_avg:
 * roofline seconds (*local), all-gather seconds (*comm) and the bytes a
 * rank receives (*recv); the all-to-all form's bytes by kind in *a. */
static void step(const struct moe_plan_ep *p, double rows, double seqs, double ctx_avg, bool all_weights,
                 double *local, double *comm, double *recv, double *tp_s, struct moe_plan_a2a *a)
{
    const double N = p->ranks, M = p->tp;
    /* a shard's rows are split between its ranks */
    const double shard_rows = rows * p->shards / N;
    const double head_cut = p->head * (N - 1) / N; /* the LM head's rows other ranks hold */
    /* data-parallel attention: the busiest rank's sequences and their rows */
    const double att_seqs = p->dp ? ceil(seqs / N) : seqs, att_rows = rows * att_seqs / seqs;
    const double bytes = all_weights ? p->W_rank
                                     : p->non_expert - p->saved - head_cut +
                                           p->n_moe * busiest_experts(p, shard_rows) * p->one_expert +
                                           att_seqs * p->kv_tok * p->kv_share * p->ctx;
    /* moved from every row to the rank's rows: the attention projections;
     * in the all-to-all form everything but the experts */
    const bool a2a = p->dp && p->a2a;
    const double f_att = a2a ? p->f_dense : p->dp ? p->f_attn : 0;
    const double flops = rows * (p->f_dense - p->f_saved - f_att + p->f_experts / N) +
                         att_rows * (f_att + p->f_pos * ctx_avg / M);
    *local = fmax(bytes / p->dev_bw, flops / p->dev_flops);
    *a = (struct moe_plan_a2a){0};
    const double gathered = rows * p->K * p->D * 4; /* every routed row's output, fp32 */
    /* a split layer's sum: a reduce-scatter and an all-gather of its rows (fp32) */
    const double vec = rows * p->D * 4;
    *tp_s = p->tp_sums * 2 * allgather_s(p, M, vec);
    /* the logits of the step's logit rows (decode: every row; a prefill
     * chunk: its sequences' last) gathered on rank 0 */
    const double logits = (all_weights ? seqs : rows) * p->vocab * 4 * (N - 1) / N;
    /* the embedding's rows added up over every rank (a ring all-reduce) */
    const double embed_s = p->embed > 0 ? 2 * allgather_s(p, N, vec) : 0;
    const double embed_recv = p->embed > 0 ? 2 * (N - 1) / N * vec : 0;
    if (a2a) {
        const double logit = all_weights ? seqs : rows;
        *comm = a2a_comm(p, rows, att_rows, logit, logit * att_seqs / seqs, a) + embed_s + logits / p->net_bw +
                p->latency;
        *recv = a->rows + a->pairs + a->outputs + a->counts + a->logit_rows + logits + embed_recv;
        return;
    }
    /* data-parallel attention: each attention layer's rows all-gathered */
    const double dp_s = p->dp ? p->n_attn * allgather_s(p, N, vec) : 0;
    /* a last MoE layer runs its FFN for the logit rows alone */
    const bool last = p->last_moe && p->n_moe > 0;
    const double full = p->n_moe - last, g_last = last ? (all_weights ? seqs : rows) * p->K * p->D * 4 : 0;
    *comm = full * allgather_s(p, N, gathered) + (last ? allgather_s(p, N, g_last) : 0) + *tp_s + embed_s + dp_s +
            logits / p->net_bw + p->latency;
    *recv = (N - 1) / N * (full * gathered + g_last) + p->tp_sums * 2 * (M - 1) / M * vec + logits + embed_recv +
            (p->dp ? p->n_attn * (N - 1) / N * vec : 0);
}

void moe_plan_ep_compute(struct moe_plan_ep *p)
{
    if (p->tp < 1) p->tp = 1;
    if (p->shards < 1) p->shards = p->ranks;
    if (p->kv_share <= 0) p->kv_share = 1;
    p->W_rank = p->W - p->experts * (p->shards - 1) / p->shards - p->saved -
                (p->head + p->embed) * (p->ranks - 1) / p->ranks;
    const double usable = 0.9 * p->mem;
    p->fit_seqs = p->W_rank < usable ? floor((usable - p->W_rank) / (p->kv_tok * p->kv_share * p->ctx)) : -1;
    if (p->dp && p->fit_seqs > 0) p->fit_seqs *= p->ranks; /* each rank holds its sequences' KV */
    p->reach = p->dp && p->a2a ? a2a_reach(p->E, p->K, p->ranks) : 0;
    step(p, p->batch, p->batch, p->ctx, false, &p->dec_local, &p->dec_comm, &p->dec_bytes_comm, &p->dec_tp,
         &p->dec_a2a);
    step(p, p->chunk, 1, p->chunk / 2, true, &p->pre_local, &p->pre_comm, &p->pre_bytes_comm, &p->pre_tp,
         &p->pre_a2a);
}

/* One step's all-to-all bytes by kind. */
static void print_a2a(const char *what, const struct moe_plan_a2a *x)
{
    char a[5][96], r[96];
    printf("    %-8s rows %s, pair slots and rows %s, outputs back %s, count matrices %s, logit rows %s "
           "(rank 0 with statistics on: + %s of routing)\n", what, moe_cli_bytes(a[0], sizeof a[0], x->rows),
           moe_cli_bytes(a[1], sizeof a[1], x->pairs), moe_cli_bytes(a[2], sizeof a[2], x->outputs),
           moe_cli_bytes(a[3], sizeof a[3], x->counts), moe_cli_bytes(a[4], sizeof a[4], x->logit_rows),
           moe_cli_bytes(r, sizeof r, x->routing));
}

void moe_plan_ep_print(const struct moe_plan_ep *p)
{
    char a[96], b[96], c[96];
    if (p->tp > 1)
        printf("\nexpert parallelism  %d ranks in groups of %d (tensor parallelism: heads, dense FFNs and shared "
               "experts split in each group), experts in %d shards of %.0f (contiguous)%s, the embedding's and "
               "the LM head's rows split over every rank; network %.0f GB/s, "
               "%.1f us a hop (ring all-gathers, not overlapped)\n", p->ranks, p->tp, p->shards, p->E / p->shards,
               p->shards < p->ranks ? ", a shard on its group's ranks" : "", p->net_bw / 1e9, p->latency * 1e6);
    else
        printf("\nexpert parallelism  %d ranks, %.0f experts each (contiguous), attention %s, the "
               "embedding's and the LM head's rows split; network %.0f "
               "GB/s, %.1f us a hop (%s, not overlapped)\n", p->ranks, p->E / p->ranks,
               !p->dp    ? "replicated"
               : p->a2a  ? "data-parallel (each sequence's on one rank; all-to-all form, the CPU backend's: the "
                           "rows stay on their ranks, the expert pairs travel)"
                         : "data-parallel (each sequence's on one rank; gathering form, the CUDA backend's: the "
                           "rows all-gathered after each attention layer)",
               p->net_bw / 1e9, p->latency * 1e6,
               p->dp && p->a2a ? "all-to-alls and ring all-gathers" : "ring all-gathers");
    printf("  per rank   %s of weights (experts %s of %s)", moe_cli_bytes(a, sizeof a, p->W_rank),
           moe_cli_bytes(b, sizeof b, p->experts / p->shards), moe_cli_bytes(c, sizeof c, p->experts));
    if (p->fit_seqs >= 0)
        printf("; %.0f sequences of %.0f tokens fit beside them (90%% of memory; every rank holds %s)\n",
               p->fit_seqs, p->ctx, p->dp ? "the KV of its own sequences"
                                    : p->kv_share < 1 ? "its key/value heads' KV of every sequence"
                                                      : "every sequence's KV");
    else
        printf("; they do not fit in 90%% of %s\n", moe_cli_bytes(a, sizeof a, p->mem));
    const double dt = p->dec_local + p->dec_comm, pt = p->pre_local + p->pre_comm;
    const char *verb = p->dp && p->a2a ? "exchanging" : "all-gathering";
    printf("  decode     batch %.0f: %.3f ms per step = %.3f ms on the rank + %.3f ms %s %s a rank "
           "receives", p->batch, dt * 1e3, p->dec_local * 1e3, p->dec_comm * 1e3, verb,
           moe_cli_bytes(a, sizeof a, p->dec_bytes_comm));
    if (p->tp > 1) printf(" (%.3f ms of it in the groups)", p->dec_tp * 1e3);
    printf("; %.0f tokens/s\n", p->batch / dt);
    printf("  prefill    chunk of %.0f: %.3f ms per chunk = %.3f ms on the rank + %.3f ms %s %s", p->chunk,
           pt * 1e3, p->pre_local * 1e3, p->pre_comm * 1e3, verb, moe_cli_bytes(a, sizeof a, p->pre_bytes_comm));
    if (p->tp > 1) printf(" (%.3f ms of it in the groups)", p->pre_tp * 1e3);
    printf("; %.0f tokens/s\n", p->chunk / pt);
    if (p->dp && p->a2a) {
        printf("  all-to-all a row reaches another rank with probability %.4f; the busiest rank receives\n",
               p->reach);
        print_a2a("decode", &p->dec_a2a);
        print_a2a("prefill", &p->pre_a2a);
    }
}

/* --tp M: refused where moerun would refuse it (moe_model_tp_split). */
int moe_plan_tp_check(const struct moe_config *cfg, int M)
{
    if (M <= 1) return 0;
    if (moe_config_linear_layers(cfg) > 0 && (cfg->lin_k_heads % M || cfg->lin_v_heads % M))
        return moe_cli_error("plan", "--tp %d: the linear-attention layers' %d q/k and %d value heads do not split "
                             "evenly over %d ranks", M, cfg->lin_k_heads, cfg->lin_v_heads, M);
    if (cfg->n_heads % M || (cfg->n_kv_heads % M && M % cfg->n_kv_heads))
        return moe_cli_error("plan", "--tp %d: the model's %d query and %d key/value heads do not split evenly "
                             "over %d ranks", M, cfg->n_heads, cfg->n_kv_heads, M);
    const int dense = cfg->n_layers - moe_config_moe_layers(cfg);
    if ((dense > 0 && cfg->d_ff % M) || (cfg->d_shared > 0 && cfg->d_shared % M))
        return moe_cli_error("plan", "--tp %d: the dense or shared-expert width does not split evenly over %d "
                             "ranks", M, M);
    return 0;
}

/* The attention layers' weights (params, all layers) and the share of
 * them one rank of a --tp group of M holds (moe_model_tp_split): its query
 * heads (and their gates) and their output columns, its key/value heads;
 * of MLA its heads' query rows, latent maps (kv_b_proj) and output
 * columns, the latent projections whole; of a linear-attention layer 1/M
 * of its projections. */
void moe_plan_tp_attn_params(const struct moe_config *c, int M, double *all, double *rank)
{
    const double D = c->d_model, H = c->n_heads, n_lin = moe_config_linear_layers(c),
                 n_std = moe_config_kv_layers(c);
    double a = 0, r = 0; /* one standard layer */
    if (c->kv_lora_rank > 0) {
        const double QK = (double)c->qk_nope_dim + c->rope_dim, Rc = c->kv_lora_rank, Rq = c->q_lora_rank,
                     V = c->v_head_dim;
        const double heads = H * QK * (Rq > 0 ? Rq : D) + H * (c->qk_nope_dim + V) * Rc + D * H * V;
        a = heads + (Rq > 0 ? Rq * D : 0) + (Rc + c->rope_dim) * D;
        r = a - heads * (M - 1) / M;
    } else {
        const double Dh = c->head_dim, q = c->attn_out_gate ? 3.0 : 2.0; /* q (and gates), o */
        a = D * Dh * (q * H + 2.0 * c->n_kv_heads);
        r = D * Dh * (q * H / M + 2.0 * moe_tp_kv_heads(c->n_kv_heads, M));
    }
    const double Kd = (double)c->lin_k_heads * c->lin_k_dim, Vd = (double)c->lin_v_heads * c->lin_v_dim;
    const double lin = D * (2 * Kd + 2 * Vd + 2.0 * c->lin_v_heads + Vd); /* in_proj_qkvz, _ba, out_proj */
    *all = n_std * a + n_lin * lin;
    *rank = n_std * r + n_lin * lin / M;
}
