/* plan_spec.c - see plan_spec.h. */
#include "runtime/cli/plan_spec.h"

#include <math.h>

double moe_plan_spec_tokens(double accept, int k)
{
    /* the geometric sum 1 + A + ... + A^K, summed term by term so that A
     * near 1 loses nothing to cancellation */
    double sum = 0, term = 1;
    for (int i = 0; i <= k; i++, term *= accept) sum += term;
    return sum;
}

double moe_plan_distinct_experts(double E, double k_top, double rows)
{
    if (E <= 0) return 0;
    return E * (1.0 - pow(1.0 - k_top / E, rows));
}

double moe_plan_spec_break_even(double cost, int k)
{
    if (cost <= 1) return 0;
    if (cost >= k + 1) return 1;
    double lo = 0, hi = 1; /* tokens(A) rises from 1 to K + 1 over [0, 1) */
    for (int i = 0; i < 60; i++) {
        const double mid = (lo + hi) / 2;
        if (moe_plan_spec_tokens(mid, k) < cost) lo = mid;
        else hi = mid;
    }
    return (lo + hi) / 2;
}
