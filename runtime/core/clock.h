/* clock.h - the one clock moerun measures with: monotonic seconds, for
 * timings and deadlines (never wall time). */
#pragma once

#ifdef __cplusplus
extern "C" {
#endif

/* Seconds on CLOCK_MONOTONIC, from an unspecified start. */
double moe_seconds(void);

#ifdef __cplusplus
}
#endif
