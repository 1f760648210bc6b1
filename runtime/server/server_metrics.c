/* server_metrics.c - GET /metrics: the server's counters, gauges and latency
 * histograms in the Prometheus text format (0.0.4), followed by the expert
 * load counters of the statistics recorder (router/stats_export.c). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "runtime/server/server.h"

static void hist(FILE *f, const char *name, const char *help, const struct srv_hist *h)
{
    fprintf(f, "# HELP %s %s\n# TYPE %s histogram\n", name, help, name);
    uint64_t cum = 0;
    for (int i = 0; i < SRV_HIST_N; i++) {
        cum += h->b[i];
        fprintf(f, "%s_bucket{le=\"%g\"} %llu\n", name, srv_hist_le[i], (unsigned long long)cum);
    }
    cum += h->b[SRV_HIST_N];
    fprintf(f, "%s_bucket{le=\"+Inf\"} %llu\n%s_sum %.9g\n%s_count %llu\n", name,
            (unsigned long long)cum, name, h->sum, name, (unsigned long long)h->n);
}

static void one(FILE *f, const char *name, const char *type, const char *help, unsigned long long v)
{
    fprintf(f, "# HELP %s %s\n# TYPE %s %s\n%s %llu\n", name, help, name, type, name, v);
}

/* Speculative decoding, by vLLM's names (spec_decode_*) with our prefix:
 * drafts (verification steps with at least one drafted token), drafted
 * tokens, accepted tokens, and accepted tokens per draft position. */
static void spec(FILE *f, const struct srv_metrics *m)
{
    if (m->spec_k == 0) return;
    one(f, "moerun_spec_decode_num_drafts_total", "counter",
        "speculative verification steps with at least one drafted token", m->spec_drafts);
    one(f, "moerun_spec_decode_num_draft_tokens_total", "counter", "tokens drafted by the proposer",
        m->spec_draft_tokens);
    one(f, "moerun_spec_decode_num_accepted_tokens_total", "counter",
        "drafted tokens the target confirmed and emitted", m->spec_accepted);
    fprintf(f, "# HELP moerun_spec_decode_num_accepted_tokens_per_pos_total drafted tokens accepted, by "
               "position in the draft (0: the first)\n"
               "# TYPE moerun_spec_decode_num_accepted_tokens_per_pos_total counter\n");
    for (int i = 0; i < m->spec_k && i < MOE_SPEC_MAX_TOKENS; i++)
        fprintf(f, "moerun_spec_decode_num_accepted_tokens_per_pos_total{position=\"%d\"} %llu\n", i,
                (unsigned long long)m->spec_accepted_at[i]);
}

/* Expert parallelism (docs/parallel.md), as rank 0 sees it. */
static void ep(FILE *f, const struct srv_metrics *m)
{
    if (m->ep_ranks < 2) return;
    const struct moe_ep_counters *n = &m->ep;
    one(f, "moerun_ep_ranks", "gauge", "ranks the experts are spread over", (unsigned long long)m->ep_ranks);
    one(f, "moerun_ep_steps_total", "counter", "forward steps run by every rank in lockstep", n->steps);
    fprintf(f, "# HELP moerun_ep_expert_rows_total routed rows whose expert FFN the rank computed\n"
               "# TYPE moerun_ep_expert_rows_total counter\n");
    for (int r = 0; r < m->ep_ranks && r < SRV_EP_RANKS; r++)
        fprintf(f, "moerun_ep_expert_rows_total{rank=\"%d\"} %llu\n", r, (unsigned long long)m->ep_rows[r]);
    fprintf(f, "# HELP moerun_ep_imbalance busiest rank's expert rows over the mean, per step and MoE layer, "
               "averaged (moerun stats --ep predicts it as max/mean)\n# TYPE moerun_ep_imbalance gauge\n"
               "moerun_ep_imbalance %.6g\n", n->cells ? n->ratio_sum / (double)n->cells : 0.0);
    fprintf(f, "# HELP moerun_ep_gather_seconds_total seconds rank 0 spent in the expert-row all-gathers\n"
               "# TYPE moerun_ep_gather_seconds_total counter\nmoerun_ep_gather_seconds_total %.9g\n", n->gather_s);
    one(f, "moerun_ep_gather_bytes_total", "counter", "bytes of expert rows rank 0 received from the others",
        n->gather_bytes);
    fprintf(f, "# HELP moerun_ep_step_seconds_total seconds rank 0 spent in forward steps\n"
               "# TYPE moerun_ep_step_seconds_total counter\nmoerun_ep_step_seconds_total %.9g\n", n->step_s);
    if (m->tp < 2) return;
    one(f, "moerun_tp_ranks", "gauge", "ranks of a tensor-parallel group (--tp)", (unsigned long long)m->tp);
    fprintf(f, "# HELP moerun_tp_seconds_total seconds rank 0 spent gathering its group's parts\n"
               "# TYPE moerun_tp_seconds_total counter\nmoerun_tp_seconds_total %.9g\n", m->tp_s);
    one(f, "moerun_tp_bytes_total", "counter", "bytes of the group's parts rank 0 received", m->tp_bytes);
}

char *srv_metrics_text(struct srv *s)
{
    char *buf = NULL;
    size_t n = 0;
    FILE *f = open_memstream(&buf, &n);
    if (!f) return NULL;
    pthread_mutex_lock(&s->m_mu);
    struct srv_metrics m = s->met;
    pthread_mutex_unlock(&s->m_mu);
    pthread_mutex_lock(&s->q_mu);
    int queued = s->q_len;
    pthread_mutex_unlock(&s->q_mu);
    fprintf(f, "# HELP moerun_http_requests_total HTTP requests answered, by status code (those "
               "libmicrohttpd answers itself included)\n"
               "# TYPE moerun_http_requests_total counter\n");
    for (int i = 100; i < 600; i++)
        if (i == 200 || m.by_status[i])
            fprintf(f, "moerun_http_requests_total{status=\"%d\"} %llu\n", i, (unsigned long long)m.by_status[i]);
    one(f, "moerun_prompt_tokens_total", "counter", "prompt tokens submitted to the engine",
        m.prompt_tokens);
    one(f, "moerun_generation_tokens_total", "counter", "tokens generated", m.generated_tokens);
    one(f, "moerun_requests_finished_total", "counter", "engine requests finished (stop or length)",
        m.finished);
    one(f, "moerun_requests_aborted_total", "counter",
        "engine requests cancelled (client gone or shutdown)", m.aborted);
    one(f, "moerun_preemptions_total", "counter", "requests preempted for KV blocks", m.preemptions);
    one(f, "moerun_requests_waiting", "gauge", "requests queued or waiting in the engine",
        (unsigned long long)(queued + atomic_load(&s->eng_waiting)));
    one(f, "moerun_requests_running", "gauge", "sequences running in the engine",
        (unsigned long long)m.running);
    fprintf(f, "# HELP moerun_kv_blocks KV cache blocks by state (used: referenced by a sequence; "
               "cached: prefix blocks nobody references, evictable; free)\n"
               "# TYPE moerun_kv_blocks gauge\n"
               "moerun_kv_blocks{state=\"used\"} %d\nmoerun_kv_blocks{state=\"cached\"} %d\n"
               "moerun_kv_blocks{state=\"free\"} %d\n",
            m.kv_used, m.kv_cached, m.kv_free);
    one(f, "moerun_kv_blocks_capacity", "gauge", "KV cache blocks in the pool",
        (unsigned long long)m.kv_total);
    hist(f, "moerun_time_to_first_token_seconds", "time from request arrival to its first token",
         &m.ttft);
    hist(f, "moerun_inter_token_latency_seconds", "time between consecutive tokens of a request",
         &m.itl);
    spec(f, &m);
    ep(f, &m);
    if (m.offload.layers > 0) {
        one(f, "moerun_offload_uses_total", "counter",
            "experts routed to in offloaded MoE layers (--gpu-experts), once per expert per layer step",
            (unsigned long long)m.offload.accesses);
        one(f, "moerun_offload_hits_total", "counter",
            "of those, experts already in a device slot", (unsigned long long)m.offload.hits);
        one(f, "moerun_offload_cpu_uses_total", "counter",
            "experts computed on the CPU instead of copied in (--gpu-experts-cpu-rows), not among the uses",
            (unsigned long long)m.offload.cpu_uses);
        one(f, "moerun_offload_bytes_in_total", "counter",
            "bytes of expert weights copied from host memory to the device", m.offload.bytes_in);
        one(f, "moerun_offload_host_bytes", "gauge",
            "bytes of expert weights held in pinned host memory", m.offload.host_bytes);
    }
    if (s->stats) {
        char *st = NULL;
        pthread_mutex_lock(&s->stats_mu);
        enum moe_status rc = moe_stats_prometheus_string(s->stats, &st);
        pthread_mutex_unlock(&s->stats_mu);
        if (rc == MOE_OK && st) fputs(st, f);
        free(st);
    }
    if (fclose(f)) {
        free(buf);
        return NULL;
    }
    return buf;
}
