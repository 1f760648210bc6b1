/* tensor.h - element types and tensor views.
 *
 * A struct moe_tensor is a view: it never owns its data.  Weights point into
 * the memory-mapped checkpoint (or into buffers the model owns); activations
 * point into workspaces the backend owns.  Layout is always row-major and
 * contiguous: shape[0] is the slowest dimension.
 *
 * The dtype list is the safetensors list (every dtype string the reference
 * implementation knows, except the sub-byte ones), then the runtime's own
 * storage formats (MOE_DTYPE_BF16_PANEL: bf16 weights repacked for the fast
 * CPU kernels, which changes how a matrix's bytes are ordered, so it is a
 * dtype: every (data, dtype) pair that reaches a kernel says how to read the
 * bytes, and code that does not know the format stops at its "not a float
 * weight type" check instead of reading panels as rows); the CPU backend
 * computes in fp32 and reads F32, F16 and BF16 weights directly. */
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#ifdef __cplusplus
extern "C" {
#endif

#define MOE_MAX_DIMS 8

enum moe_dtype {
    MOE_DTYPE_F32,
    MOE_DTYPE_F16,
    MOE_DTYPE_BF16,
    MOE_DTYPE_F8E4M3,
    MOE_DTYPE_F8E5M2,
    MOE_DTYPE_F64,
    MOE_DTYPE_I8,
    MOE_DTYPE_I16,
    MOE_DTYPE_I32,
    MOE_DTYPE_I64,
    MOE_DTYPE_U8,
    MOE_DTYPE_U16,
    MOE_DTYPE_U32,
    MOE_DTYPE_U64,
    MOE_DTYPE_BOOL,
    MOE_DTYPE_COUNT, /* the safetensors dtypes above; storage formats of the runtime below */
    /* bf16 weights of a 2-D (N, K) matrix, K even, repacked by the fast CPU
     * backend (runtime/gemm_fast.h, moe_gemm_pack_panels) into panels of 16
     * outputs: panel p (outputs 16p .. 16p+15, N padded up to a multiple of
     * 16 with zero rows) is K/2 64-byte lines, line i holding 16 32-bit
     * lanes, lane j = w[16p+j][2i] | w[16p+j][2i+1] << 16.  Panel p starts
     * at byte p*32*K.  The tensor keeps its logical shape (N, K); only the
     * fast AVX2 and AVX-512 kernels read it (same bits with either;
     * moe_dtype_name says "BF16_PANEL"; it is never parsed, written to a
     * file or converted by moe_convert_row_f32). */
    MOE_DTYPE_BF16_PANEL,
    /* Weights quantized at load (--quantize q8_0) as ggml's Q8_0 quantizes
     * them: per block of 32 values a scale d (an f16 value) and 32 int8 q,
     * the value (float)q * d.  Stored per row of K values (K a multiple of
     * 32) as K/32 blocks of 36 bytes: d widened to f32 (exactly), then the
     * 32 q; ggml stores d as f16 (34 bytes), but an f32 scale is one
     * broadcast from memory in the kernels where an f16 one costs three
     * shuffle-port instructions per block and row.  Made by
     * moe_quantize_row_q8_0 (the q and d of ggml-quants.c and gguf-py, bit
     * for bit); read by the CPU kernels (fast and reference), refused by
     * CUDA.  moe_dtype_size says 1 (the int8 part); rows take
     * moe_dtype_row_bytes. */
    MOE_DTYPE_Q8_0,
};

#define MOE_Q8_0_BLOCK 32 /* values per block */
#define MOE_Q8_0_BYTES 36 /* bytes per block: f32 scale, 32 int8 */

struct moe_tensor {
    enum moe_dtype dtype;
    int ndim;
    int64_t shape[MOE_MAX_DIMS];
    void *data; /* borrowed; NULL for an absent optional tensor */
    int device; /* -1 host, >= 0 device ordinal */
};

/* Bytes per element. */
size_t moe_dtype_size(enum moe_dtype t);
/* Bytes of a row of n elements (block formats: n a multiple of the block). */
size_t moe_dtype_row_bytes(enum moe_dtype t, size_t n);
/* safetensors name ("F32", "BF16", ...). */
const char *moe_dtype_name(enum moe_dtype t);
/* Parses a safetensors dtype string; false if unknown. */
bool moe_dtype_parse(const char *s, enum moe_dtype *out);

/* Number of elements; -1 on overflow or a negative dimension. */
int64_t moe_tensor_numel(const struct moe_tensor *t);
static inline bool moe_tensor_present(const struct moe_tensor *t) { return t && t->data; }

/* Scalar conversions (round-to-nearest-even on narrowing). */
static inline float moe_bf16_to_f32(uint16_t h)
{
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}
static inline uint16_t moe_f32_to_bf16(float f)
{
    uint32_t u;
    memcpy(&u, &f, 4);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40); /* quiet NaN */
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}
float moe_f16_to_f32(uint16_t h);
uint16_t moe_f32_to_f16(float f);

/* Converts n elements of row `src` (dtype t) to fp32. */
void moe_convert_row_f32(float *dst, const void *src, enum moe_dtype t, size_t n);
/* Converts n fp32 values to dtype t (F32, F16 or BF16). */
void moe_convert_from_f32(void *dst, const float *src, enum moe_dtype t, size_t n);
/* Quantizes n values (a multiple of 32) to Q8_0 blocks as ggml does: per
 * block d = max|x| / 127, q = roundf(x * (1/d)) (0 when d is 0), d rounded
 * to f16 (and stored widened, see MOE_DTYPE_Q8_0).  False, dst unspecified,
 * when a value is not finite or d overflows f16. */
bool moe_quantize_row_q8_0(void *dst, const float *src, size_t n);

#ifdef __cplusplus
}
#endif
