/* test_tensor.c - dtype table and fp16/bf16 conversions. */
#include <criterion/criterion.h>
#include <math.h>

#include "runtime/core/tensor.h"

Test(tensor, dtype_names_round_trip)
{
    for (int i = 0; i < MOE_DTYPE_COUNT; i++) {
        enum moe_dtype t;
        cr_assert(moe_dtype_parse(moe_dtype_name((enum moe_dtype)i), &t));
        cr_assert_eq((int)t, i);
    }
    enum moe_dtype t;
    cr_assert_not(moe_dtype_parse("F4", &t));
    cr_assert_not(moe_dtype_parse("f32", &t));
}

Test(tensor, bf16_rounds_to_nearest_even)
{
    /* 1 + 2^-8 is exactly halfway between two bf16 values: ties to even (1.0). */
    cr_assert_eq(moe_f32_to_bf16(1.0f + 0x1p-8f), 0x3f80);
    /* 1 + 3*2^-8 is halfway, rounds up to the even mantissa 0x3f82. */
    cr_assert_eq(moe_f32_to_bf16(1.0f + 3 * 0x1p-8f), 0x3f82);
    cr_assert_eq(moe_bf16_to_f32(0x4049), 3.140625f);
    cr_assert(isnan(moe_bf16_to_f32(moe_f32_to_bf16(NAN))));
}

Test(tensor, f16_matches_ieee_binary16)
{
    cr_assert_eq(moe_f32_to_f16(1.0f), 0x3c00);
    cr_assert_eq(moe_f32_to_f16(-2.0f), 0xc000);
    cr_assert_eq(moe_f32_to_f16(65504.0f), 0x7bff);
    cr_assert_eq(moe_f32_to_f16(65520.0f), 0x7c00); /* rounds to inf */
    cr_assert_eq(moe_f32_to_f16(0x1p-24f), 0x0001); /* smallest subnormal */
    cr_assert_eq(moe_f16_to_f32(0x0001), 0x1p-24f);
    cr_assert_eq(moe_f16_to_f32(0x3555), 0.333251953125f);
    cr_assert(isinf(moe_f16_to_f32(0xfc00)) && moe_f16_to_f32(0xfc00) < 0);
    /* Every finite f16 value survives f16 -> f32 -> f16. */
    for (uint32_t h = 0; h < 0x10000; h++) {
        if ((h & 0x7c00) == 0x7c00) continue;
        cr_assert_eq(moe_f32_to_f16(moe_f16_to_f32((uint16_t)h)), h, "h=%#x", h);
    }
}
