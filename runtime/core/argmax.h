/* argmax.h - the argmax of a row, with the tie and NaN policy every
 * backend's argmax op and the greedy sampler share. */
#pragma once

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* argmax of x (n) with ties to the lower id; NaN never wins (all NaN: 0). */
int32_t moe_argmax(const float *x, int n);

#ifdef __cplusplus
}
#endif
