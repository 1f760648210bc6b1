/* backend_cuda_graphs.c - step graphs: forward.c brackets a step's ops with
 * graph_begin / graph_end (backend.h); a decode-sized step is recorded
 * once per (forward workspace, rows, logit rows) by stream capture and
 * replayed by one launch after that.  A recorded step holds the addresses
 * of every buffer it touched, so freeing any buffer retires them all.  The
 * recorded cuBLAS calls need a workspace of their own, set at init.  Calls
 * no other file of the backend. */
#include "runtime/backend/backend_cuda_impl.h"

enum moe_status moe_cuda_graphs_init(struct cuda_graphs *g, cublasHandle_t blas, bool on)
{
    g->on = on;
    if (!on) return MOE_OK;
    MOE_CUDA_TRY(cudaMalloc(&g->blas_ws, BLAS_WS_BYTES));
    MOE_CUBLAS_TRY(cublasSetWorkspace(blas, g->blas_ws, BLAS_WS_BYTES));
    return MOE_OK;
}

void moe_cuda_graphs_drop(struct cuda_graphs *g)
{
    for (int i = 0; i < g->n; i++)
        if (g->list[i].exec) cudaGraphExecDestroy(g->list[i].exec);
    g->n = 0;
    g->next_evict = 0;
}

void moe_cuda_graphs_free(struct cuda_graphs *g)
{
    moe_cuda_graphs_drop(g);
    cudaFree(g->blas_ws);
    g->blas_ws = NULL;
}

enum moe_status moe_cuda_graphs_begin(struct cuda_graphs *g, cudaStream_t s, const void *key, int rows,
                                      int n_logits, bool *replay)
{
    *replay = false;
    g->replaying = 0;
    if (!g->on) return MOE_OK;
    for (int i = 0; i < g->n; i++)
        if (g->list[i].key == key && g->list[i].rows == rows && g->list[i].n_logits == n_logits) {
            *replay = true;
            g->replaying = i + 1;
            return MOE_OK;
        }
    MOE_CUDA_TRY(cudaStreamBeginCapture(s, cudaStreamCaptureModeRelaxed));
    g->capturing = 1;
    g->pending = (struct step_graph){key, rows, n_logits, NULL};
    return MOE_OK;
}

enum moe_status moe_cuda_graphs_end(struct cuda_graphs *g, cudaStream_t s, bool ok)
{
    if (g->replaying) {
        int i = g->replaying - 1;
        g->replaying = 0;
        if (ok) {
            MOE_CUDA_TRY(cudaGraphLaunch(g->list[i].exec, s));
            g->replays++;
        }
        return MOE_OK;
    }
    if (!g->capturing) return MOE_OK;
    g->capturing = 0;
    cudaGraph_t graph = NULL;
    cudaError_t e = cudaStreamEndCapture(s, &graph);
    if (!ok || e != cudaSuccess) {
        if (graph) cudaGraphDestroy(graph);
        cudaGetLastError();
        if (!ok) return MOE_OK; /* the caller reports its own error */
        return moe_fail(MOE_ERR_DEVICE, "cuda graph: recording a step failed: %s", cudaGetErrorString(e));
    }
    cudaGraphExec_t exec = NULL;
    e = cudaGraphInstantiate(&exec, graph, 0);
    cudaGraphDestroy(graph);
    if (e != cudaSuccess) return moe_fail(MOE_ERR_DEVICE, "cuda graph: instantiate: %s", cudaGetErrorString(e));
    struct step_graph *sg;
    if (g->n < MAX_GRAPHS) {
        sg = &g->list[g->n++];
    } else { /* full: replace the oldest */
        sg = &g->list[g->next_evict];
        g->next_evict = (g->next_evict + 1) % MAX_GRAPHS;
        cudaGraphExecDestroy(sg->exec);
    }
    *sg = g->pending;
    sg->exec = exec;
    MOE_CUDA_TRY(cudaGraphLaunch(exec, s));
    return MOE_OK;
}
