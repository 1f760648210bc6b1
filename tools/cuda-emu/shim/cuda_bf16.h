#pragma once
#include "emu.h"
#include "runtime/core/tensor.h"
struct __nv_bfloat16 { uint16_t u; };
struct __nv_bfloat162 { __nv_bfloat16 x, y; };
static inline float __bfloat162float(__nv_bfloat16 h) { return moe_bf16_to_f32(h.u); }
static inline __nv_bfloat16 __float2bfloat16_rn(float f) { return __nv_bfloat16{moe_f32_to_bf16(f)}; }
static inline float2 __bfloat1622float2(__nv_bfloat162 h) { return float2{__bfloat162float(h.x), __bfloat162float(h.y)}; }
static inline __nv_bfloat162 __floats2bfloat162_rn(float a, float b) { return __nv_bfloat162{__float2bfloat16_rn(a), __float2bfloat16_rn(b)}; }
