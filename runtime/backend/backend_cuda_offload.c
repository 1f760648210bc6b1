/* backend_cuda_offload.c - expert offload: with moe_offload_opts.gpu_experts = C
 * below a layer's E experts, prepare_model keeps the layer's experts in
 * pinned host memory (in the device layout) and gives it C device slots.
 * Each step of the layer copies the routing counts to the host, and the
 * experts it routes to that are not in a slot are copied in (PCIe, host to
 * device) before they run; experts/expert_cache.h decides which slot each
 * takes (LRU).  A step that needs more than C experts runs in rounds of at
 * most C.  Every step synchronises with the host, so step graphs are off
 * while a layer is offloaded.  With moe_offload_opts.cpu_rows = R,
 * a missed expert with at most R rows in the step is not copied in: the
 * CPU multiplies its rows by the host copy (moe_experts_ffn_stacks_cpu)
 * while the device runs the resident experts, and the results join the
 * device's before the combine.  The layer's expert table holds its
 * struct offload_layer (backend_layer); layers live until the backend is
 * freed, those of a model freed before it too.  Calls
 * backend_cuda_experts.c and backend_cuda_mem.c.  See docs/offload.md. */
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "runtime/backend/backend_cuda_impl.h"

/* Releases a layer and its host memory (its device slots are struct
 * cuda_mem's). */
static void layer_free(struct offload_layer *ol)
{
    if (!ol) return;
    cudaFreeHost(ol->host_gu);
    cudaFreeHost(ol->host_dn);
    free(ol->h_map);
    free(ol->order);
    free(ol->slot);
    free(ol->loaded);
    free(ol->h_bias);
    moe_expert_cache_free(&ol->cache);
    free(ol);
}

static void cpu_free(struct offload_cpu *p)
{
    cudaFreeHost(p->h_perm);
    cudaFreeHost(p->h_tok);
    cudaFreeHost(p->h_x);
    cudaFreeHost(p->h_y);
    cudaFreeHost(p->h_yh);
    cudaFree(p->d_tok);
    cudaFree(p->d_x);
    if (p->x_ready) cudaEventDestroy(p->x_ready);
    free(p->list);
    free(p->scratch);
    memset(p, 0, sizeof *p);
}

void moe_cuda_offload_free(struct cuda_offload *o)
{
    for (int i = 0; i < o->n; i++) layer_free(o->layers[i]);
    free(o->layers);
    free((double *)o->opts.warm);
    cpu_free(&o->cpu);
    memset(o, 0, sizeof *o);
}

enum moe_status moe_cuda_offload_reserve(struct cuda_ctx *c, int n)
{
    struct offload_cpu *p = &c->off.cpu;
    const int R = c->off.opts.cpu_rows;
    if (R <= 0 || c->off.n == 0) return MOE_OK;
    /* the largest layer: rows a step may send to the CPU (at most R for
     * each of E experts, at most the n routed), the scratch for them */
    int E = 0, D = 0, rows = 0;
    size_t scratch = 0;
    const int threads = omp_get_max_threads();
    for (int i = 0; i < c->off.n; i++) {
        const struct moe_expert_stacks *h = &c->off.layers[i]->host;
        const long long r = (long long)h->E * R < n ? (long long)h->E * R : n;
        E = h->E > E ? h->E : E;
        D = h->D > D ? h->D : D;
        rows = r > rows ? (int)r : rows;
    }
    for (int i = 0; i < c->off.n; i++) {
        const size_t b = moe_experts_stacks_scratch_bytes(&c->off.layers[i]->host, rows, threads);
        if (!b) return moe_fail(MOE_ERR_INVALID_ARG, "cuda offload: CPU scratch for %d rows overflows", rows);
        scratch = b > scratch ? b : scratch;
    }
    if (p->R == R && rows <= p->rows && n <= p->n_perm && E <= p->max_e && D <= p->width &&
        scratch <= p->scratch_bytes && threads <= p->threads)
        return MOE_OK;
    MOE_CUDA_TRY(cudaStreamSynchronize(c->stream));
    cpu_free(p);
    size_t xb;
    if (!moe_mul_size((size_t)rows, (size_t)D * sizeof(float), &xb))
        return moe_fail(MOE_ERR_INVALID_ARG, "cuda offload: %d CPU rows of %d overflow", rows, D);
    MOE_CUDA_TRY(cudaMallocHost((void **)&p->h_perm, (size_t)n * sizeof(int32_t)));
    MOE_CUDA_TRY(cudaMallocHost((void **)&p->h_tok, (size_t)rows * sizeof(int32_t)));
    MOE_CUDA_TRY(cudaMallocHost((void **)&p->h_x, xb));
    MOE_CUDA_TRY(cudaMallocHost((void **)&p->h_y, xb));
    MOE_CUDA_TRY(cudaMallocHost((void **)&p->h_yh, xb / 2));
    MOE_CUDA_TRY(cudaMalloc((void **)&p->d_tok, (size_t)rows * sizeof(int32_t)));
    MOE_CUDA_TRY(cudaMalloc((void **)&p->d_x, xb));
    MOE_CUDA_TRY(cudaEventCreateWithFlags(&p->x_ready, cudaEventDisableTiming));
    p->list = malloc((3 * (size_t)E + 1) * sizeof(int32_t));
    p->scratch = malloc(scratch);
    if (!p->list || !p->scratch)
        return moe_fail(MOE_ERR_NOMEM, "cuda offload: %.1f MB of CPU scratch", scratch / 1e6);
    p->gpu_counts = p->list + E;
    p->off = p->gpu_counts + E;
    p->R = R, p->rows = rows, p->n_perm = n, p->max_e = E, p->width = D;
    p->threads = threads, p->scratch_bytes = scratch;
    p->isa = c->cpu_isa;
    return MOE_OK;
}

static enum moe_status load_expert(struct cuda_ctx *c, const struct offload_layer *ol, int e, int s);

/* Bytes of n experts' shares a and b, or 0 on overflow. */
static size_t shares(size_t n, size_t a, size_t b)
{
    size_t r;
    return a + b >= a && moe_mul_size(n, a + b, &r) ? r : 0;
}

/* The layer's biases (device f32, or absent) in one host block for the
 * CPU (ol->h_bias): b_gate (E, F), b_up (E, F), b_down (E, D), each
 * ol->host's view of its part when present. */
static enum moe_status host_biases(struct offload_layer *ol, const struct moe_expert_weights *ex, int E,
                                   int D, int F)
{
    const struct moe_tensor *b[3] = {&ex->b_gate, &ex->b_up, &ex->b_down};
    struct moe_tensor *h[3] = {&ol->host.b_gate, &ol->host.b_up, &ol->host.b_down};
    const int N[3] = {F, F, D};
    if (!b[0]->data && !b[1]->data && !b[2]->data) return MOE_OK;
    float *blk = calloc((size_t)E * (2 * (size_t)F + D), sizeof(float));
    if (!blk) return moe_fail(MOE_ERR_NOMEM, "cuda offload: a layer's biases");
    ol->h_bias = blk;
    for (int i = 0; i < 3; i++) {
        float *at = blk + (i > 0 ? (size_t)E * F : 0) + (i > 1 ? (size_t)E * F : 0);
        if (!b[i]->data) continue;
        if (b[i]->dtype != MOE_DTYPE_F32)
            return moe_fail(MOE_ERR_UNSUPPORTED, "cuda offload: %s expert biases", moe_dtype_name(b[i]->dtype));
        MOE_CUDA_TRY(cudaMemcpy(at, b[i]->data, (size_t)E * N[i] * sizeof(float), cudaMemcpyDeviceToHost));
        *h[i] = (struct moe_tensor){.dtype = MOE_DTYPE_F32, .ndim = 2, .shape = {E, N[i]}, .data = at, .device = -1};
    }
    return MOE_OK;
}

enum moe_status moe_cuda_offload_layer(struct cuda_ctx *c, struct moe_expert_weights *ex, int C, bool lfu,
                                       const double *warm, int E, int D, int F, const void *gu,
                                       const void *dn, size_t ge, size_t gs, size_t de, size_t ds)
{
    const size_t hg = shares((size_t)E, ge, gs), hd = shares((size_t)E, de, ds);
    if (C < 1 || C >= E || !hg || !hd)
        return moe_fail(MOE_ERR_INVALID_ARG, "cuda offload: %d slots for %d experts", C, E);
    struct cuda_offload *o = &c->off;
    if (o->n == o->cap) {
        int n = o->cap ? 2 * o->cap : 16;
        struct offload_layer **p = realloc(o->layers, (size_t)n * sizeof *p);
        if (!p) return moe_fail(MOE_ERR_NOMEM, "cuda offload: layer table");
        o->layers = p;
        o->cap = n;
    }
    struct offload_layer *ol = calloc(1, sizeof *ol);
    if (!ol) return moe_fail(MOE_ERR_NOMEM, "cuda offload: a layer");
    ol->ge = ge, ol->gs = gs, ol->de = de, ol->ds = ds;
    enum moe_status s = moe_expert_cache_init(&ol->cache, E, C, lfu);
    if (s != MOE_OK) {
        free(ol);
        return s;
    }
    o->layers[o->n++] = ol; /* from here moe_cuda_offload_free releases what the layer holds */
    ol->h_map = malloc((size_t)E * sizeof *ol->h_map);
    ol->order = malloc((size_t)E * sizeof *ol->order);
    ol->slot = malloc((size_t)E * sizeof *ol->slot);
    ol->loaded = malloc((size_t)E * sizeof *ol->loaded);
    if (!ol->h_map || !ol->order || !ol->slot || !ol->loaded)
        return moe_fail(MOE_ERR_NOMEM, "cuda offload: %d experts", E);
    cudaError_t ce = cudaMallocHost(&ol->host_gu, hg);
    if (ce == cudaSuccess) ce = cudaMallocHost(&ol->host_dn, hd);
    if (ce != cudaSuccess)
        return moe_fail(MOE_ERR_NOMEM, "cuda offload: %.2f GiB of pinned host memory for a layer's "
                        "experts: %s", (hg + hd) / 1073741824.0, cudaGetErrorString(ce));
    /* the stacks were filled on the legacy stream and on c->stream */
    MOE_CUDA_TRY(cudaDeviceSynchronize());
    MOE_CUDA_TRY(cudaMemcpy(ol->host_gu, gu, hg, cudaMemcpyDeviceToHost));
    MOE_CUDA_TRY(cudaMemcpy(ol->host_dn, dn, hd, cudaMemcpyDeviceToHost));
    ol->host = (struct moe_expert_stacks){.dtype = ex->dtype, .gu = ol->host_gu, .dn = ol->host_dn, .E = E,
                                          .D = D, .F = F, .alpha = ex->alpha, .limit = ex->limit};
    MOE_TRY(host_biases(ol, ex, E, D, F));
    MOE_TRY(moe_cuda_mem_buffer(&c->mem, shares((size_t)C, ge, gs), &ol->gu));
    MOE_TRY(moe_cuda_mem_buffer(&c->mem, shares((size_t)C, de, ds), &ol->dn));
    MOE_TRY(moe_cuda_mem_buffer(&c->mem, (size_t)E * sizeof(int32_t), (void **)&ol->d_map));
    /* the table points at the slots and holds the layer; only this file
     * reads either */
    for (int e = 0; e < E; e++) {
        ex->gate[e] = ex->up[e] = ol->gu;
        ex->down[e] = ol->dn;
    }
    ex->backend_layer = ol;
    c->mem.part_bytes[P_EXPERTS] += shares((size_t)C, ge, gs) + shares((size_t)C, de, ds);
    c->off.host_bytes += hg + hd;
    if (warm) { /* the most loaded experts copied in now, not counted as step traffic */
        const uint64_t before = c->off.bytes_in;
        const int n = moe_expert_cache_warm(&ol->cache, warm);
        for (int i = 0; i < n; i++) MOE_TRY(load_expert(c, ol, ol->cache.owner[i], i));
        c->off.bytes_in = before;
    }
    return MOE_OK;
}

/* Copies expert e's weights from host memory into slot s (stream order). */
static enum moe_status load_expert(struct cuda_ctx *c, const struct offload_layer *ol, int e, int s)
{
    const int E = ol->cache.E, C = ol->cache.C;
    const char *hg = ol->host_gu, *hd = ol->host_dn;
    char *g = ol->gu, *d = ol->dn;
    MOE_CUDA_TRY(cudaMemcpyAsync(g + s * ol->ge, hg + e * ol->ge, ol->ge, cudaMemcpyHostToDevice, c->stream));
    MOE_CUDA_TRY(cudaMemcpyAsync(d + s * ol->de, hd + e * ol->de, ol->de, cudaMemcpyHostToDevice, c->stream));
    if (ol->gs) /* planes: the scales follow all the experts' values */
        MOE_CUDA_TRY(cudaMemcpyAsync(g + C * ol->ge + s * ol->gs, hg + E * ol->ge + e * ol->gs, ol->gs,
                                     cudaMemcpyHostToDevice, c->stream));
    if (ol->ds)
        MOE_CUDA_TRY(cudaMemcpyAsync(d + C * ol->de + s * ol->ds, hd + E * ol->de + e * ol->ds, ol->ds,
                                     cudaMemcpyHostToDevice, c->stream));
    c->off.bytes_in += ol->ge + ol->gs + ol->de + ol->ds;
    return MOE_OK;
}

/* Checks a step's counts: none negative, n in all. */
static enum moe_status check_counts(const int32_t *counts, int E, int n)
{
    int sum = 0;
    for (int e = 0; e < E; e++) {
        if (counts[e] < 0 || counts[e] > n - sum)
            return moe_fail(MOE_ERR_DEVICE, "cuda experts: expert %d has %d rows (of %d)", e, counts[e], n);
        sum += counts[e];
    }
    if (sum != n) return moe_fail(MOE_ERR_DEVICE, "cuda experts: counts sum to %d, not %d", sum, n);
    return MOE_OK;
}

/* One round over the experts ol->h_map places (moe_cuda_run_stack over
 * the slots). */
static enum moe_status run_round(struct cuda_ctx *c, struct offload_layer *ol, enum expert_path path,
                                 const float *x, const struct moe_dispatch *plan,
                                 const struct moe_expert_weights *ex, const struct moe_expert_ws *ws,
                                 int T, int K, int D, int F, int E)
{
    if (path != PATH_CUBLAS)
        MOE_CUDA_TRY(cudaMemcpyAsync(ol->d_map, ol->h_map, (size_t)E * sizeof(int32_t),
                                     cudaMemcpyHostToDevice, c->stream));
    enum moe_dtype ydt;
    return moe_cuda_run_stack(c, path, ol->gu, ol->dn, ol->cache.C, ol->h_map, ol->d_map, x, plan, ex, ws, T, K,
                              D, F, E, &ydt);
}

/* The step's experts for the CPU (struct offload_cpu): those with rows,
 * at most R of them, and not resident; their number.  Fills p->list,
 * p->gpu_counts (the counts less theirs), p->off (every expert's first
 * row), *rows, and queues their rows' gather into p->h_x (x_ready). */
static enum moe_status cpu_split(struct cuda_ctx *c, const struct offload_layer *ol, const float *x, int K,
                                 int D, int *n_cpu, int *rows)
{
    struct offload_cpu *p = &c->off.cpu;
    const int32_t *counts = c->experts.h_counts;
    const int E = ol->cache.E, n = moe_expert_cache_split(&ol->cache, counts, p->R, p->gpu_counts, p->list);
    int r = 0;
    for (int i = 0; i < n; i++) r += counts[p->list[i]];
    *n_cpu = n, *rows = r;
    if (n == 0) return MOE_OK;
    if (r > p->rows || D > p->width)
        return moe_fail(MOE_ERR_INVALID_ARG, "cuda offload: %d CPU rows of %d (reserved %d of %d)", r, D,
                        p->rows, p->width);
    p->off[0] = 0;
    for (int e = 0; e < E; e++) p->off[e + 1] = p->off[e] + counts[e];
    for (int i = 0, at = 0; i < n; i++) {
        const int e = p->list[i];
        for (int j = 0; j < counts[e]; j++) p->h_tok[at + j] = p->h_perm[p->off[e] + j] / K;
        at += counts[e];
    }
    MOE_CUDA_TRY(cudaMemcpyAsync(p->d_tok, p->h_tok, (size_t)r * sizeof(int32_t), cudaMemcpyHostToDevice,
                                 c->stream));
    MOE_TRY(moe_ops_gather_rows_cuda(c->stream, p->d_x, x, p->d_tok, r, D));
    MOE_CUDA_TRY(cudaMemcpyAsync(p->h_x, p->d_x, (size_t)r * D * sizeof(float), cudaMemcpyDeviceToHost,
                                 c->stream));
    MOE_CUDA_TRY(cudaEventRecord(p->x_ready, c->stream));
    return MOE_OK;
}

/* The CPU's experts of the step (cpu_split's), while the device runs its
 * rounds: their rows of ye (ydt: F32 with the down bias, as the kernels
 * leave it, or half without, as the grouped GEMMs do) copied in after. */
static enum moe_status cpu_experts(struct cuda_ctx *c, struct offload_layer *ol, const struct moe_expert_ws *ws,
                                   enum moe_dtype ydt, int n_cpu, int rows, int D)
{
    struct offload_cpu *p = &c->off.cpu;
    MOE_CUDA_TRY(cudaEventSynchronize(p->x_ready));
    const bool half = ydt != MOE_DTYPE_F32;
    moe_experts_ffn_stacks_cpu(p->isa, p->h_y, p->h_x, c->experts.h_counts, p->list, n_cpu, &ol->host, !half,
                               p->threads, p->scratch);
    if (half) moe_convert_from_f32(p->h_yh, p->h_y, ydt, (size_t)rows * D);
    const size_t es = moe_dtype_size(ydt), row = (size_t)D * es;
    const char *src = half ? (const char *)p->h_yh : (const char *)p->h_y;
    for (int i = 0, at = 0; i < n_cpu; i++) {
        const int e = p->list[i];
        MOE_CUDA_TRY(cudaMemcpyAsync((char *)ws->ye + (size_t)p->off[e] * row, src + (size_t)at * row,
                                     (size_t)c->experts.h_counts[e] * row, cudaMemcpyHostToDevice, c->stream));
        at += c->experts.h_counts[e];
    }
    ol->cpu_uses += n_cpu;
    ol->cpu_rows += rows;
    return MOE_OK;
}

enum moe_status moe_cuda_offload_experts(struct cuda_ctx *c, struct offload_layer *ol, float *out,
                                         const float *x, const struct moe_dispatch *plan, const float *w,
                                         const struct moe_expert_weights *ex,
                                         const struct moe_expert_ws *ws, int T, int K, int D, int F,
                                         int E)
{
    if (E != ol->cache.E || E > c->work.max_e)
        return moe_fail(MOE_ERR_INVALID_ARG, "cuda experts: %d experts (layer of %d, %d reserved)", E,
                        ol->cache.E, c->work.max_e);
    if (T <= 0) return MOE_OK;
    const int n = T * K, C = ol->cache.C;
    const enum expert_path path = moe_cuda_expert_path(c, ex->dtype, T, K, D, F, E, C);
    const bool grouped = path != PATH_KERNELS; /* half activations */
    const enum moe_dtype ydt = grouped ? (ex->dtype == MOE_DTYPE_F16 ? MOE_DTYPE_F16 : MOE_DTYPE_BF16)
                                       : MOE_DTYPE_F32;
    /* reserved: some misses may run on the CPU */
    const bool hybrid = c->off.cpu.R > 0 && c->off.cpu.h_perm;
    if (hybrid && n > c->off.cpu.n_perm)
        return moe_fail(MOE_ERR_INVALID_ARG, "cuda offload: %d routed rows, %d reserved", n, c->off.cpu.n_perm);
    if (path == PATH_CUBLAS) /* the tensor-core kernels read x through perm */
        MOE_TRY(moe_experts_gather_half_cuda(c->stream, ws->xe, x, plan->perm, n, K, D, ydt,
                                             ex->cols ? ex->cols[0] : NULL, plan->offsets, E));
    MOE_CUDA_TRY(cudaMemcpyAsync(c->experts.h_counts, plan->counts, (size_t)E * sizeof(int32_t),
                                 cudaMemcpyDeviceToHost, c->stream));
    if (hybrid)
        MOE_CUDA_TRY(cudaMemcpyAsync(c->off.cpu.h_perm, plan->perm, (size_t)n * sizeof(int32_t),
                                     cudaMemcpyDeviceToHost, c->stream));
    MOE_CUDA_TRY(cudaStreamSynchronize(c->stream));
    MOE_TRY(check_counts(c->experts.h_counts, E, n));
    int n_cpu = 0, cpu_rows = 0;
    if (hybrid) MOE_TRY(cpu_split(c, ol, x, K, D, &n_cpu, &cpu_rows));
    const int m = moe_expert_cache_order(&ol->cache, n_cpu ? c->off.cpu.gpu_counts : c->experts.h_counts, ol->order);
    ol->steps++;
    ol->grouped_steps += grouped;
    for (int next = 0, round = 0; next < m; round++) {
        /* the last round's host arrays may still be in flight */
        if (round) MOE_CUDA_TRY(cudaStreamSynchronize(c->stream));
        const int k = moe_expert_cache_fill(&ol->cache, ol->order, m, &next, ol->slot, ol->loaded);
        if (k == 0) return moe_fail(MOE_ERR_DEVICE, "cuda offload: no slot for expert %d", ol->order[next]);
        ol->rounds++;
        for (int e = 0; e < E; e++) ol->h_map[e] = -1;
        for (int i = 0; i < k; i++) {
            const int e = ol->order[next - k + i];
            if (ol->loaded[i]) MOE_TRY(load_expert(c, ol, e, ol->slot[i]));
            ol->h_map[e] = ol->slot[i];
        }
        enum moe_status s = run_round(c, ol, path, x, plan, ex, ws, T, K, D, F, E);
        if (s == MOE_ERR_UNSUPPORTED && path == PATH_CUBLAS) {
            /* cuBLAS refused the grouped GEMM: the step again, and the
             * later ones, on the device-driven kernels (this step's uses
             * are counted twice) */
            moe_cuda_no_grouped(c);
            return moe_cuda_offload_experts(c, ol, out, x, plan, w, ex, ws, T, K, D, F, E);
        }
        MOE_TRY(s);
    }
    /* the device runs the last round meanwhile */
    if (n_cpu) MOE_TRY(cpu_experts(c, ol, ws, ydt, n_cpu, cpu_rows, D));
    return moe_experts_combine_cuda(c->stream, out, ws->ye, ydt, w, plan->pos, T, K, D, plan->offsets, E,
                                    grouped ? ex->b_down.data : NULL);
}
