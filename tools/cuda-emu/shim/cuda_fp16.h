#pragma once
#include "emu.h"
#include "runtime/core/tensor.h"
struct __half { uint16_t u; };
struct __half2 { __half x, y; };
static inline float __half2float(__half h) { return moe_f16_to_f32(h.u); }
static inline __half __float2half_rn(float f) { return __half{moe_f32_to_f16(f)}; }
static inline float2 __half22float2(__half2 h) { return float2{__half2float(h.x), __half2float(h.y)}; }
static inline __half2 __floats2half2_rn(float a, float b) { return __half2{__float2half_rn(a), __float2half_rn(b)}; }
static inline __half2 __halves2half2(__half a, __half b) { return __half2{a, b}; }
