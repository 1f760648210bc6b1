/* argmax.c - see argmax.h. */
#include "runtime/core/argmax.h"

#include <math.h>

int32_t moe_argmax(const float *x, int n)
{
    int32_t best = 0;
    for (int i = 1; i < n; i++)
        if (x[i] > x[best] || (isnan(x[best]) && !isnan(x[i]))) best = i;
    return best;
}
