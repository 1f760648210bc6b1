/* plan_ep.h - what `moerun plan --ep N` predicts for expert parallelism as
 * moerun runs it (docs/parallel.md): attention, dense layers, embeddings
 * and head replicated on every rank, 1/N of each MoE layer's experts per
 * rank, and per MoE layer one all-gather of every routed row's expert
 * output (fp32, D floats a row) so each rank can combine every token.
 *
 * A rank's step: its roofline (the replicated weights read once, the
 * distinct experts the rows touch on the busiest rank (uniform routing,
 * expected maximum over the ranks), each sequence's KV; FLOPs of the dense part
 * and attention for every row plus 1/N of the experts'), then the
 * all-gathers, not overlapped: a ring all-gather of M bytes over N ranks
 * takes (N - 1) latency + (N - 1) / N x M / bandwidth (each rank receives
 * the other ranks' rows).  A last MoE layer gathers the logit rows' alone
 * (moerun runs its FFN for them only: a prefill chunk's last row).
 *
 * With --tp M (plan --ep N --tp M: N x M ranks, the experts in N shards,
 * each on the M ranks of its group, whose rows those ranks split; --tp M
 * alone: M ranks, the experts over all of them): a rank holds 1/M of the
 * attention (its query heads, their output columns, its key/value heads;
 * MLA's latent projection whole), dense FFN and shared-expert weights and
 * its key/value heads' KV (moe_tp_kv_heads; MLA's latents whole), computes
 * its share of their FLOPs and 1/M of the attention over the cache, and each attention
 * layer, dense FFN and shared expert ends in a sum over the group (a
 * reduce-scatter and an all-gather of its rows, fp32: each takes (M - 1)
 * hops and moves (M - 1) / M of the rows, as a ring), over the same
 * network (tensor-parallel groups usually sit inside one host).
 *
 * With --dp-attention each sequence's attention layers run on one rank:
 * the busiest rank computes the projections and the attention of
 * ceil(sequences / N) sequences' rows (a prefill chunk: its one sequence)
 * and reads their KV alone; every attention layer ends in an all-gather of
 * the step's rows (fp32); the sequences that fit are N times one rank's.
 * That is the gathering form, the CUDA backend's.  On the CPU (a2a: plan
 * --device cpu) moerun runs the all-to-all form (forward_dp_local.c): each
 * rank keeps its rows through the layers and computes everything but the
 * experts for them alone; per MoE layer the ranks all-gather the N x N
 * count matrix (2N int32 from each), a rank sends each of its rows (fp32)
 * once to each other rank that one of its K pairs goes to, with each
 * pair's slot and row (two int32), and each pair's output (fp32) comes
 * back; at the end the logit rows are all-gathered for the LM head.  Under
 * uniform routing a row reaches a given other rank with probability
 * 1 - C(E - E/N, K) / C(E, K) (K distinct experts, E/N on each rank) and
 * sends it K/N pairs.  The predicted rank is the busiest (ceil(sequences /
 * N) of them); the others share the other rows evenly, and each exchange
 * takes (N - 1) hops and the most bytes any rank receives in it.  A last
 * MoE layer exchanges the logit rows alone (moerun runs its FFN for them
 * only). */
#pragma once

#include <stdbool.h>

#ifdef __cplusplus
extern "C" {
#endif

struct moe_plan_ep {
    /* in */
    int ranks;                     /* the world */
    int tp, shards;                /* tensor-parallel group size (1: none); expert shards (ranks or
                                      ranks / tp) */
    double saved, f_saved;         /* --tp: the weight bytes a rank does not hold and the FLOPs per
                                      token it does not compute of what the group splits (attention,
                                      dense FFNs, shared experts) */
    double kv_share;               /* the share of the KV a rank holds */
    double head, vocab;            /* the LM head's bytes (0 tied to the embedding) and rows: split over
                                      every rank, each row's logits gathered on rank 0 */
    double embed;                  /* the embedding's bytes: split over every rank, each step's rows
                                      added up (an all-reduce of T x D fp32) */
    int tp_sums;                   /* the group's all-gathers a step (split layers) */
    bool dp;                       /* --dp-attention: each sequence's attention on one rank, its KV
                                      there alone, the rows all-gathered after each of n_attn layers */
    bool a2a;                      /* with dp: the all-to-all form (the CPU backend's), not the
                                      gathering form */
    int n_attn;                    /* attention layers (linear ones included) */
    double f_attn;                 /* FLOPs per token of their projections (and delta rules) */
    double net_bw, latency;        /* bytes/s, seconds per ring hop */
    double dev_bw, dev_flops, mem; /* one rank's device: bytes/s, FLOP/s, bytes */
    double W, experts, non_expert; /* weight bytes: all, the experts', read once per step (no experts, no
                                      embedding) */
    double one_expert;             /* bytes of one expert of one MoE layer */
    double E, K, D;
    int n_moe;
    bool last_moe;                 /* the last layer is a MoE layer (a2a: its FFN for the logit rows) */
    double f_dense, f_experts;     /* FLOPs per token outside the experts / in its K experts */
    double f_pos, kv_tok;          /* FLOPs per cached position; KV bytes per token */
    double batch, chunk, ctx;
    /* out */
    double W_rank;                 /* weight bytes per rank */
    double fit_seqs;               /* sequences of ctx fitting beside them in 90% of mem (-1: none) */
    double dec_local, dec_comm, dec_bytes_comm; /* decode step: roofline s, all-gathers s, bytes received */
    double pre_local, pre_comm, pre_bytes_comm; /* prefill chunk alike */
    double dec_tp, pre_tp;         /* of dec_comm and pre_comm: the groups' all-gathers */
    struct moe_plan_a2a {          /* a2a: the predicted rank's bytes received in a step, all MoE
                                      layers together, by what they carry */
        double rows, pairs, outputs; /* rows dispatched to it, their pairs' slots and rows, its
                                        pairs' outputs back */
        double counts, logit_rows;   /* the count matrices; the logit rows gathered at the end */
        double routing;              /* rank 0, only with statistics on: every other row's ids,
                                        weights and router logits (not in the totals) */
    } dec_a2a, pre_a2a;
    double reach;                  /* a2a: the chance that a row has a pair on a given other rank */
};

struct moe_config;
/* --tp M: 0, or 1 after printing why moerun would refuse the split
 * (moe_model_tp_split). */
int moe_plan_tp_check(const struct moe_config *cfg, int M);
/* The attention layers' weights (params, every layer) and the share of
 * them one rank of a --tp group of M holds. */
void moe_plan_tp_attn_params(const struct moe_config *cfg, int M, double *all, double *rank);
/* Fills p's outputs from its inputs. */
void moe_plan_ep_compute(struct moe_plan_ep *p);
/* The report's section. */
void moe_plan_ep_print(const struct moe_plan_ep *p);

#ifdef __cplusplus
}
#endif
