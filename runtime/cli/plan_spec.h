/* plan_spec.h - the formulas `moerun plan` predicts speculative decoding
 * with (docs/plan.md, "Speculative decoding").
 *
 * A proposer drafts K tokens; the target verifies them and its own next
 * token in one step of K + 1 rows.  If each drafted token is accepted with
 * probability A, independently of the others (Leviathan et al. 2023,
 * "Fast Inference from Transformers via Speculative Decoding", eq. 1), a
 * step emits (1 - A^(K+1)) / (1 - A) tokens on average.  The verification
 * step's experts are the union of its rows' choices: with uniform routing,
 * T rows choosing k_top of E experts touch E (1 - (1 - k_top/E)^T)
 * distinct experts per MoE layer. */
#pragma once

#ifdef __cplusplus
extern "C" {
#endif

/* Expected tokens one speculative step emits: (1 - A^(K+1)) / (1 - A),
 * for acceptance 0 <= A < 1 and K >= 0 (1 at A = 0 or K = 0). */
double moe_plan_spec_tokens(double accept, int k);
/* Expected distinct experts per MoE layer of rows rows, each choosing
 * k_top of E uniformly: E (1 - (1 - k_top/E)^rows); 0 when E is 0. */
double moe_plan_distinct_experts(double E, double k_top, double rows);
/* The acceptance at which a step that costs cost times a plain decode step
 * emits as many tokens per second as plain decoding, with K drafted:
 * the A with moe_plan_spec_tokens(A, k) = cost; 0 when cost <= 1, and 1
 * (never) when cost >= K + 1. */
double moe_plan_spec_break_even(double cost, int k);

#ifdef __cplusplus
}
#endif
