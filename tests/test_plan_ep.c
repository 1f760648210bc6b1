/* test_plan_ep.c - `moerun plan --ep N --dp-attention`'s two forms
 * (plan_ep.h): the bytes a rank receives, the comm seconds and the FLOPs
 * at small shapes whose values are worked out by hand in each test's
 * comment, and the gathering form (the CUDA backend's) against the
 * all-to-all form (the CPU backend's) on the same shape. */
#include <criterion/criterion.h>
#include <math.h>

#include "runtime/cli/plan_ep.h"

/* Two ranks, one MoE layer and one attention layer, E = 4 (2 a rank),
 * D = 8 (a row 32 bytes), decode at batch 4 (2 sequences a rank), a
 * prefill chunk of 4 rows of one sequence; no embedding, head or
 * logits to gather, no latency, 1 GB/s (a byte 1 ns); nothing to read,
 * 1 FLOP/s, so a step's local seconds are its FLOPs. */
static struct moe_plan_ep shape(double K, bool a2a)
{
    struct moe_plan_ep p = {.ranks = 2, .tp = 1, .shards = 2, .dp = true, .a2a = a2a, .n_attn = 1, .n_moe = 1,
                            .E = 4, .K = K, .D = 8, .batch = 4, .chunk = 4, .ctx = 16, .net_bw = 1e9,
                            .latency = 0, .dev_bw = 1e30, .dev_flops = 1, .mem = 1e12, .f_attn = 10,
                            .f_dense = 100, .f_experts = 40};
    moe_plan_ep_compute(&p);
    return p;
}

static void expect_near(double got, double want, const char *what)
{
    cr_expect(fabs(got - want) <= 1e-9 * fmax(1, fabs(want)), "%s: %.17g, want %.17g", what, got, want);
}

/* K = 1: a row's one expert is on the other rank with probability 2/4 =
 * 1/2.  Decode: the rank holds 2 rows, the other rank 2.  Received: rows
 * 2 x 1/2 x 32 = 32 B; pair slots and rows 2 rows x 1 pair x 1/2 x 8 B =
 * 8 B; outputs back 2 rows x 1 pair x 1/2 x 32 = 32 B; the count matrix
 * the other rank's 2 x 2 int32 = 16 B; the logit rows the other rank's 2
 * x 32 = 64 B: 152 B.  Routing (statistics): 2 rows x (2 x 1 + 4) x 4 =
 * 48 B.  Both ranks alike, so the seconds are 152 ns.
 * Prefill: the chunk's 4 rows on this rank: outputs back 4 x 1/2 x 32 =
 * 64 B and the count matrix 16 B: 80 B.  The seconds follow the other
 * rank where it receives more: the count matrix 16 ns (all-gather of 32
 * B, half received), rows max(0, 4 x 1/2 x 32) = 64 ns, pairs max(0, 4 x
 * 1/2 x 8) = 16 ns, outputs max(64, 0) = 64 ns, the one logit row max(0,
 * 32) = 32 ns: 192 ns. */
Test(plan_ep, a2a_bytes_two_ranks_top1)
{
    const struct moe_plan_ep p = shape(1, true);
    expect_near(p.reach, 0.5, "reach");
    expect_near(p.dec_a2a.rows, 32, "decode rows");
    expect_near(p.dec_a2a.pairs, 8, "decode pairs");
    expect_near(p.dec_a2a.outputs, 32, "decode outputs");
    expect_near(p.dec_a2a.counts, 16, "decode counts");
    expect_near(p.dec_a2a.logit_rows, 64, "decode logit rows");
    expect_near(p.dec_a2a.routing, 48, "decode routing");
    expect_near(p.dec_bytes_comm, 152, "decode bytes");
    expect_near(p.dec_comm, 152e-9, "decode seconds");
    expect_near(p.pre_a2a.rows, 0, "prefill rows");
    expect_near(p.pre_a2a.outputs, 64, "prefill outputs");
    expect_near(p.pre_a2a.logit_rows, 0, "prefill logit rows");
    expect_near(p.pre_bytes_comm, 80, "prefill bytes");
    expect_near(p.pre_comm, 192e-9, "prefill seconds");
}

/* K = 2 distinct of 4: no pair on the other rank's 2 experts with
 * probability C(2, 2) / C(4, 2) = 1/6, so a row goes there with 5/6 (not
 * 1 - (1/2)^2 = 3/4, as draws with replacement would give).  Decode: rows
 * 2 x 5/6 x 32 = 53.33 B; pairs 2 x 2 x 1/2 x 8 = 16 B; outputs 2 x 2 x
 * 1/2 x 32 = 64 B; counts 16 B; logit rows 64 B: 640/3 = 213.33 B. */
Test(plan_ep, a2a_bytes_two_ranks_top2)
{
    const struct moe_plan_ep p = shape(2, true);
    expect_near(p.reach, 5.0 / 6, "reach");
    expect_near(p.dec_a2a.rows, 160.0 / 3, "decode rows");
    expect_near(p.dec_a2a.pairs, 16, "decode pairs");
    expect_near(p.dec_a2a.outputs, 64, "decode outputs");
    expect_near(p.dec_bytes_comm, 640.0 / 3, "decode bytes");
    expect_near(p.pre_bytes_comm, 4 * 2 * 0.5 * 32 + 16, "prefill bytes: outputs back 128 B and counts");
}

/* K = 3 of 4 cannot miss a rank of 2: every row goes to the other rank,
 * rows 2 x 32 = 64 B. */
Test(plan_ep, a2a_every_row_travels_when_k_exceeds_the_rest)
{
    const struct moe_plan_ep p = shape(3, true);
    expect_near(p.reach, 1, "reach");
    expect_near(p.dec_a2a.rows, 64, "decode rows");
}

/* The MoE layer last (K = 1): moerun runs its FFN for the logit rows
 * alone.  Decode, every row a logit row: as above, 152 B.  Prefill: the
 * chunk's one logit row, on this rank, its pair's output back with 1/2 x
 * 32 = 16 B and the count matrix 16 B: 32 B (80 B when the layer runs
 * every row); the routing of every row is still gathered (0 B: the rows
 * are all on this rank). */
Test(plan_ep, a2a_last_layer_for_logit_rows)
{
    struct moe_plan_ep p = {.ranks = 2, .tp = 1, .shards = 2, .dp = true, .a2a = true, .n_attn = 1, .n_moe = 1,
                            .last_moe = true, .E = 4, .K = 1, .D = 8, .batch = 4, .chunk = 4, .ctx = 16,
                            .net_bw = 1e9, .dev_bw = 1e30, .dev_flops = 1, .mem = 1e12};
    moe_plan_ep_compute(&p);
    expect_near(p.dec_bytes_comm, 152, "decode bytes");
    expect_near(p.pre_a2a.outputs, 16, "prefill outputs");
    expect_near(p.pre_bytes_comm, 32, "prefill bytes");
}

/* The gathering form on the same shapes: K = 1, every routed row's
 * output all-gathered, the other rank's half of 4 x 1 x 32 = 64 B, and
 * the attention layer's rows, half of 4 x 32 = 64 B: 128 B; K = 2: 64 +
 * 128 = 192 B; no all-to-all figures.  The two forms differ. */
Test(plan_ep, gathering_form_differs)
{
    const struct moe_plan_ep g1 = shape(1, false), g2 = shape(2, false);
    expect_near(g1.dec_bytes_comm, 128, "K = 1");
    expect_near(g2.dec_bytes_comm, 192, "K = 2");
    expect_near(g1.dec_a2a.outputs + g1.dec_a2a.rows + g1.reach, 0, "no all-to-all");
    cr_expect(fabs(shape(1, true).dec_bytes_comm - g1.dec_bytes_comm) > 1);
    cr_expect(fabs(shape(2, true).dec_bytes_comm - g2.dec_bytes_comm) > 1);
}

/* The last layer a MoE layer: its FFN runs for the logit rows alone.
 * Replicated attention (no --dp-attention), K = 1: a prefill chunk of 4
 * rows and one logit row gathers 4 x 32 B over one layer that is not the
 * last, half received, 64 B, then the logit row's 32 B, 16 received: 80
 * B; decode (every row a logit row) 4 x 32 / 2 per layer, twice: 128 B. */
Test(plan_ep, last_moe_layer_gathers_the_logit_rows)
{
    struct moe_plan_ep p = {.ranks = 2, .tp = 1, .shards = 2, .n_attn = 2, .n_moe = 2, .last_moe = true,
                            .E = 4, .K = 1, .D = 8, .batch = 4, .chunk = 4, .ctx = 16, .net_bw = 1e9,
                            .latency = 0, .dev_bw = 1e30, .dev_flops = 1, .mem = 1e12, .f_attn = 10,
                            .f_dense = 100, .f_experts = 40};
    moe_plan_ep_compute(&p);
    expect_near(p.pre_bytes_comm, 80, "prefill, last layer MoE");
    expect_near(p.dec_bytes_comm, 128, "decode, last layer MoE");
    p.last_moe = false;
    moe_plan_ep_compute(&p);
    expect_near(p.pre_bytes_comm, 128, "prefill, last layer dense");
}

/* FLOPs (f_dense 100 a token, 10 of it the attention projections;
 * f_experts 40; f_pos 0), decode: the all-to-all form computes everything
 * but the experts for its 2 rows and 1/2 of the experts of all 4: 2 x 100
 * + 4 x 20 = 280; the gathering form the attention for its 2 rows and the
 * rest for all 4: 2 x 10 + 4 x (90 + 20) = 460. */
Test(plan_ep, a2a_flops_on_own_rows)
{
    expect_near(shape(1, true).dec_local, 280, "all-to-all");
    expect_near(shape(1, false).dec_local, 460, "gathering");
}
