/* gemm_fast.c - choice of the fast kernel set and the parallel driver (see
 * gemm_fast.h); the kernels are in gemm_avx2.c and gemm_avx512.c, those over
 * weights in panels in gemm_panel_avx2.c, gemm_panel.c and (AMX tiles)
 * gemm_amx.c, those over Q8_0
 * and the four-bit formats (Q4_1, Q4_G32, Q4_G128, Q4_K) in gemm_q8.c and
 * gemm_q4.c (AVX2 instructions for both sets; on AVX-512 processors that
 * have AVX512-VNNI, Q8_0 weights take gemm_q8_vnni.c and four-bit weights
 * gemm_q4.c's VNNI instance; the AMX sets, where the processor has
 * AMX-INT8, take gemm_q8_amx.c and gemm_q4_amx.c for both, Q4_K
 * included), Q4_K under the AVX2 and AVX-512 sets in gemm_q4_k.c and
 * gemm_q4_k_avx512.c (input blocks of 256, the same bits), Q5_K in
 * gemm_q5_k.c and gemm_q5_k_avx512.c and Q6_K in gemm_q6_k.c and
 * gemm_q6_k_avx512.c (the same bits each, under every set). */
#include "runtime/cpu/gemm_fast.h"

#include <cpuid.h>
#include <omp.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "runtime/cpu/gemm_fast_impl.h"
#include "runtime/core/par.h"
#include "runtime/core/status.h"

static bool cpu_has_f16c(void)
{
    unsigned a, b, c, d;
    if (!__get_cpuid(1, &a, &b, &c, &d)) return false;
    return (c & bit_F16C) != 0;
}

/* AMX-TILE and AMX-BF16 (cpuid 7.0 EDX bits 24 and 22), AVX512-BF16
 * (7.1 EAX bit 5), the tile state enabled by the OS (XCR0 bits 17, 18) and
 * this process let use it (moe_amx_permit, asked once); amx_int8 too when
 * AMX-INT8 (7.0 EDX bit 25) and AVX512-VNNI are there. */
static bool amx_ok, amx_int8;
static pthread_once_t amx_once = PTHREAD_ONCE_INIT;

static void amx_probe(void)
{
    unsigned a, b, c, d;
    if (!__get_cpuid_count(7, 0, &a, &b, &c, &d) || !(d & (1u << 24)) || !(d & (1u << 22))) return;
    const bool int8 = (d & (1u << 25)) && (c & (1u << 11));
    if (!__get_cpuid_count(7, 1, &a, &b, &c, &d) || !(a & (1u << 5))) return;
    if (!__get_cpuid(1, &a, &b, &c, &d) || !(c & bit_OSXSAVE)) return;
    unsigned lo, hi;
    __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
    if ((lo & (3u << 17)) != (3u << 17)) return;
    amx_ok = moe_amx_permit();
    amx_int8 = amx_ok && int8;
}

bool moe_cpu_amx_int8(void)
{
    pthread_once(&amx_once, amx_probe);
    return amx_int8;
}

enum moe_cpu_isa moe_cpu_isa_detect(void)
{
    __builtin_cpu_init();
    enum moe_cpu_isa isa = MOE_CPU_ISA_REF;
    if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && cpu_has_f16c()) {
        isa = MOE_CPU_ISA_AVX2;
        if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
            __builtin_cpu_supports("avx512vl")) {
            isa = MOE_CPU_ISA_AVX512;
            if (__builtin_cpu_supports("avx512bf16")) isa = MOE_CPU_ISA_AVX512_BF16;
            pthread_once(&amx_once, amx_probe);
            if (amx_ok) isa = MOE_CPU_ISA_AMX;
        }
    }
    return isa;
}

enum moe_cpu_isa moe_cpu_isa_choose(enum moe_cpu_isa cap)
{
    const enum moe_cpu_isa best = moe_cpu_isa_detect();
    if (best == MOE_CPU_ISA_AMX && cap >= MOE_CPU_ISA_AMX) return cap;
    if (cap == MOE_CPU_ISA_AMX_BF16) cap = MOE_CPU_ISA_AVX512_BF16;
    else if (cap >= MOE_CPU_ISA_AMX) cap = MOE_CPU_ISA_AVX512;
    return best < cap ? best : cap;
}

const char *moe_cpu_isa_name(enum moe_cpu_isa isa)
{
    switch (isa) {
    case MOE_CPU_ISA_AVX2: return "avx2";
    case MOE_CPU_ISA_AVX512: return "avx512";
    case MOE_CPU_ISA_AVX512_BF16: return "avx512-bf16";
    case MOE_CPU_ISA_AMX: return "amx";
    case MOE_CPU_ISA_AMX_EXACT: return "amx-exact";
    case MOE_CPU_ISA_AMX_BF16: return "amx-bf16";
    default: return "ref";
    }
}

bool moe_gemm_split_wanted(enum moe_cpu_isa isa, enum moe_dtype wt)
{
    return isa >= MOE_CPU_ISA_AVX512_BF16 && wt == MOE_DTYPE_BF16_PANEL;
}

void moe_gemm_fast_rows_split(enum moe_cpu_isa isa, float *y, size_t ldy, const float *x, size_t ldx,
                              const uint16_t *xs, size_t lds, int T, const void *w, enum moe_dtype wt,
                              int Din, int n0, int n1, const struct moe_tensor *b)
{
    if (n0 >= n1 || T <= 0) return;
    if (wt == MOE_DTYPE_BF16_PANEL) {
        if (isa >= MOE_CPU_ISA_AVX512_BF16) {
            if (!xs) { /* split here, for this slice alone */
                lds = moe_gemm_split_ld(isa, Din);
                uint16_t *own = moe_gemm_split_buffer(isa, (size_t)T, Din);
                MOE_ASSERT(own && "gemm amx: out of memory for the split inputs");
                moe_gemm_split_rows(isa, own, lds, x, ldx, 0, T, Din);
                xs = own;
            }
            if (isa == MOE_CPU_ISA_AVX512_BF16) moe_gemm_rows_panel_dp(y, ldy, xs, lds, T, w, Din, n0, n1, b);
            else moe_gemm_rows_panel_amx(isa, y, ldy, xs, lds, T, w, Din, n0, n1, b);
        } else if (isa == MOE_CPU_ISA_AVX512)
            moe_gemm_rows_panel_avx512(y, ldy, x, ldx, T, w, Din, n0, n1, b);
        else
            moe_gemm_rows_panel_avx2(y, ldy, x, ldx, T, w, Din, n0, n1, b);
    } else if (wt == MOE_DTYPE_Q5_K && isa >= MOE_CPU_ISA_AVX512 && __builtin_cpu_supports("avx512vnni"))
        moe_gemm_rows_q5_k_avx512(y, ldy, x, ldx, T, w, Din, n0, n1, b);
    else if (wt == MOE_DTYPE_Q5_K)
        moe_gemm_rows_q5_k_avx2(y, ldy, x, ldx, T, w, Din, n0, n1, b);
    else if (wt == MOE_DTYPE_Q6_K && isa >= MOE_CPU_ISA_AVX512 && __builtin_cpu_supports("avx512vnni"))
        moe_gemm_rows_q6_k_avx512(y, ldy, x, ldx, T, w, Din, n0, n1, b);
    else if (wt == MOE_DTYPE_Q6_K)
        moe_gemm_rows_q6_k_avx2(y, ldy, x, ldx, T, w, Din, n0, n1, b);
    else if (wt == MOE_DTYPE_Q8_0 && isa >= MOE_CPU_ISA_AMX && moe_cpu_amx_int8())
        moe_gemm_rows_q8_amx(y, ldy, x, ldx, T, w, Din, n0, n1, b);
    else if (wt == MOE_DTYPE_Q8_0 && isa >= MOE_CPU_ISA_AVX512 && __builtin_cpu_supports("avx512vnni"))
        moe_gemm_rows_q8_vnni(y, ldy, x, ldx, T, w, Din, n0, n1, b);
    else if (wt == MOE_DTYPE_Q8_0)
        moe_gemm_rows_q8_avx2(y, ldy, x, ldx, T, w, Din, n0, n1, b);
    else if (moe_dtype_is_q4(wt) && isa >= MOE_CPU_ISA_AMX && moe_cpu_amx_int8())
        moe_gemm_rows_q4_amx(y, ldy, x, ldx, T, w, wt, Din, n0, n1, b);
    else if (wt == MOE_DTYPE_Q4_K && isa >= MOE_CPU_ISA_AVX512 && __builtin_cpu_supports("avx512vnni"))
        moe_gemm_rows_q4_k_avx512(y, ldy, x, ldx, T, w, Din, n0, n1, b);
    else if (wt == MOE_DTYPE_Q4_K)
        moe_gemm_rows_q4_k_avx2(y, ldy, x, ldx, T, w, Din, n0, n1, b);
    else if (moe_dtype_is_q4(wt) && isa >= MOE_CPU_ISA_AVX512 && __builtin_cpu_supports("avx512vnni"))
        moe_gemm_rows_q4_vnni(y, ldy, x, ldx, T, w, wt, Din, n0, n1, b);
    else if (moe_dtype_is_q4(wt))
        moe_gemm_rows_q4_avx2(y, ldy, x, ldx, T, w, wt, Din, n0, n1, b);
    else if (isa >= MOE_CPU_ISA_AVX512)
        moe_gemm_rows_avx512(y, ldy, x, ldx, T, w, wt, Din, n0, n1, b);
    else
        moe_gemm_rows_avx2(y, ldy, x, ldx, T, w, wt, Din, n0, n1, b);
}

void moe_gemm_fast_rows(enum moe_cpu_isa isa, float *y, size_t ldy, const float *x, size_t ldx,
                        int T, const void *w, enum moe_dtype wt, int Din, int n0, int n1,
                        const struct moe_tensor *b)
{
    moe_gemm_fast_rows_split(isa, y, ldy, x, ldx, NULL, 0, T, w, wt, Din, n0, n1, b);
}

/* Rows [0, T) of x split into xs, work-shared by the team of the
 * caller's parallel region. */
static void split_shared(enum moe_cpu_isa isa, uint16_t *xs, size_t lds, const float *x, size_t ldx, int T,
                         int K)
{
#pragma omp for schedule(static)
    for (int r = 0; r < T; r += 16) moe_gemm_split_rows(isa, xs, lds, x, ldx, r, r + 16 < T ? r + 16 : T, K);
}

/* Output rows per slice for N rows of weights wt against T input rows:
 * about 8 slices per thread, taken dynamically, so a thread the scheduler
 * delays (the machine may be shared) holds up little.  A multiple of 48
 * (whole tiles of either natural kernel set, and of the Q8_0, four-bit
 * and Q6_K kernels) or, for panels, of the
 * outputs of the widest tile for T rows (only the last slice has an edge
 * tile), yet never fewer slices than threads while there are panels to
 * share; the panels of the int8-route kernels one slice a thread
 * (below). */
static int slice_rows(int N, int nth, enum moe_dtype wt, int T)
{
    /* the panels (gemm_k_panel.h, gemm_q8_panel.h, gemm_q4_panel.h)
     * quantize and lay out the T input rows again for every slice: from
     * 10 rows one slice a thread, whole bands of 8 */
    const bool panels = wt == MOE_DTYPE_Q8_0 || moe_dtype_is_q4(wt) || wt == MOE_DTYPE_Q5_K || wt == MOE_DTYPE_Q6_K;
    if (panels && T >= 10) return ((N + nth - 1) / nth + 7) / 8 * 8;
    int cs = (N + 8 * nth - 1) / (8 * nth);
    if (wt != MOE_DTYPE_BF16_PANEL) return (cs + 47) / 48 * 48;
    const int unit = moe_gemm_panel_slice_unit(T);
    cs = (cs + unit - 1) / unit * unit;
    if ((N + cs - 1) / cs < nth) cs = ((N + nth - 1) / nth + 15) / 16 * 16;
    return cs;
}

void moe_gemm_fast(enum moe_cpu_isa isa, float *y, int ldy, const float *x, int ldx,
                   const void *w, enum moe_dtype wt, int N, int Din, int T,
                   const struct moe_tensor *b)
{
    MOE_ASSERT(isa != MOE_CPU_ISA_REF);
    const bool split = moe_gemm_split_wanted(isa, wt) && T > 0;
    const size_t lds = split ? moe_gemm_split_ld(isa, Din) : 0;
    uint16_t *xs = split ? moe_gemm_split_buffer(isa, (size_t)T, Din) : NULL;
    MOE_ASSERT((!split || xs) && "gemm amx: out of memory for the split inputs");
    if (!moe_par_worth((size_t)N * Din * (size_t)T, 32768)) {
        if (split) moe_gemm_split_rows(isa, xs, lds, x, (size_t)ldx, 0, T, Din);
        moe_gemm_fast_rows_split(isa, y, (size_t)ldy, x, (size_t)ldx, xs, lds, T, w, wt, Din, 0, N, b);
        return;
    }
    const int cs = slice_rows(N, omp_get_max_threads(), wt, T);
    const int ns = (N + cs - 1) / cs;
#pragma omp parallel
    {
        if (split) split_shared(isa, xs, lds, x, (size_t)ldx, T, Din);
#pragma omp for schedule(dynamic, 1)
        for (int i = 0; i < ns; i++) {
            const int n0 = i * cs, n1 = n0 + cs < N ? n0 + cs : N;
            moe_gemm_fast_rows_split(isa, y, (size_t)ldy, x, (size_t)ldx, xs, lds, T, w, wt, Din, n0, n1, b);
        }
    }
}

void moe_gemm_fast_multi(enum moe_cpu_isa isa, int n, float *const *y, const float *x, int Din,
                         const void *const *w, const enum moe_dtype *wt, const int *N, int T,
                         const struct moe_tensor *const *b)
{
    MOE_ASSERT(isa != MOE_CPU_ISA_REF && n >= 1 && n <= 4);
    const int nth = omp_get_max_threads();
    int cs[4], first[5] = {0};
    size_t work = 0;
    bool split = false;
    for (int j = 0; j < n; j++) {
        cs[j] = slice_rows(N[j], nth, wt[j], T);
        first[j + 1] = first[j] + (N[j] + cs[j] - 1) / cs[j];
        work += (size_t)N[j] * Din * (size_t)T;
        split |= moe_gemm_split_wanted(isa, wt[j]) && T > 0;
    }
    const size_t lds = split ? moe_gemm_split_ld(isa, Din) : 0;
    uint16_t *xs = split ? moe_gemm_split_buffer(isa, (size_t)T, Din) : NULL;
    MOE_ASSERT((!split || xs) && "gemm amx: out of memory for the split inputs");
    if (!moe_par_worth(work, 32768)) { /* each product whole, in this thread */
        if (split) moe_gemm_split_rows(isa, xs, lds, x, (size_t)Din, 0, T, Din);
        for (int j = 0; j < n; j++)
            moe_gemm_fast_rows_split(isa, y[j], (size_t)N[j], x, (size_t)Din, xs, lds, T, w[j], wt[j], Din, 0,
                                     N[j], b ? b[j] : NULL);
        return;
    }
#pragma omp parallel
    {
        if (split) split_shared(isa, xs, lds, x, (size_t)Din, T, Din);
#pragma omp for schedule(dynamic, 1)
        for (int i = 0; i < first[n]; i++) {
            int j = 0;
            while (i >= first[j + 1]) j++;
            const int n0 = (i - first[j]) * cs[j], n1 = n0 + cs[j] < N[j] ? n0 + cs[j] : N[j];
            moe_gemm_fast_rows_split(isa, y[j], (size_t)N[j], x, (size_t)Din, xs, lds, T, w[j], wt[j], Din, n0,
                                     n1, b ? b[j] : NULL);
        }
    }
}

/* Each thread's buffers (0: moe_gemm_thread_buffer, 1: the split inputs):
 * grown when a call needs more, freed by the key's destructor when the
 * thread exits (engine threads and their OpenMP teams come and go in a
 * server). */
struct xs_buf {
    void *p[2];
    size_t cap[2]; /* bytes */
};
static pthread_key_t xs_key;
static pthread_once_t xs_once = PTHREAD_ONCE_INIT;
static bool xs_key_ok;

static void xs_free(void *v)
{
    struct xs_buf *b = v;
    free(b->p[0]);
    free(b->p[1]);
    free(b);
}

static void xs_key_init(void) { xs_key_ok = pthread_key_create(&xs_key, xs_free) == 0; }

static void *thread_buffer(int slot, size_t bytes)
{
    pthread_once(&xs_once, xs_key_init);
    if (!xs_key_ok) return NULL;
    struct xs_buf *b = pthread_getspecific(xs_key);
    if (!b) {
        if (!(b = calloc(1, sizeof *b))) return NULL;
        if (pthread_setspecific(xs_key, b)) {
            free(b);
            return NULL;
        }
    }
    if (bytes > b->cap[slot]) {
        free(b->p[slot]);
        b->cap[slot] = 0;
        /* 2 MiB pages where the kernel gives them: the AMX input tiles read
         * 16 rows a whole row apart, each on a page of its own otherwise */
        const size_t huge = (size_t)2 << 20, cap = bytes >= huge ? (bytes + huge - 1) / huge * huge
                                                                  : (bytes + 4095) / 4096 * 4096;
        if (cap < bytes || !(b->p[slot] = aligned_alloc(cap >= huge ? huge : 64, cap))) return b->p[slot] = NULL;
        if (cap >= huge) (void)madvise(b->p[slot], cap, MADV_HUGEPAGE);
        b->cap[slot] = cap;
    }
    return b->p[slot];
}

float *moe_gemm_thread_buffer(size_t n)
{
    size_t bytes;
    return moe_mul_size(n, sizeof(float), &bytes) ? thread_buffer(0, bytes) : NULL;
}

uint16_t *moe_gemm_split_buffer(enum moe_cpu_isa isa, size_t rows, int K)
{
    size_t bytes;
    if (K <= 0 || !moe_mul_size(rows, moe_gemm_split_ld(isa, K), &bytes) || !moe_mul_size(bytes, sizeof(uint16_t), &bytes))
        return NULL;
    return thread_buffer(1, bytes ? bytes : 64);
}

uint64_t moe_read_sweep(const void *p, size_t n)
{
    if (moe_cpu_isa_detect() >= MOE_CPU_ISA_AVX2) return moe_read_sweep_avx2(p, n);
    const unsigned char *c = p;
    uint64_t r = 0;
    for (size_t i = 0; i < n; i++) r ^= (uint64_t)c[i] << (i % 8 * 8);
    return r;
}
