/* server.h - `moerun serve`: the OpenAI-compatible HTTP server (private to
 * runtime/server*.c and cli_serve.c; docs/server.md describes the API).
 *
 * Threads.  libmicrohttpd runs one thread per connection; those threads only
 * parse, validate, tokenize and enqueue (server_api.c).  One engine thread
 * (server_engine.c, named "moerun-engine") owns the engine: it drains the
 * submission queue, steps, turns tokens into text (stop strings included) and
 * writes each job's response bytes - SSE events or the final JSON body - into
 * the job's buffer.  For a stream, the connection thread's content reader
 * (server.c) copies those bytes out, waiting on the job's condition
 * variable; while it waits it sends keep-alive SSE comments so that a client
 * that hung up is noticed.  For a non-streaming request the connection
 * thread waits for the whole body before the status line goes out (so a job
 * cut at shutdown answers 503), peeking at the socket every keep-alive
 * interval for a client that hung up.  A job whose client is gone before it
 * is done is marked abandoned and the engine thread cancels its requests
 * (freeing their KV blocks).
 *
 * Ownership.  A job is reference counted: one reference for the HTTP side
 * (the handler, then the response), one for the engine thread from the
 * moment it is queued.  Whoever drops the last one frees it; jobs_live
 * counts the jobs not yet freed, so shutdown knows when every response has
 * been sent.
 *
 * Shutdown (cli_serve.c): the daemon stops listening and q_mu's draining
 * refuses new jobs; running ones finish; at the drain timeout `cut` makes
 * the engine thread end each active job with an error (job_cut), then
 * `stopping` ends the thread.
 *
 * Locks: q_mu (submission queue), stats_mu (held by the engine thread
 * around a step, by readers of the expert-load recorder), job->mu (a job's
 * buffer and flags), m_mu (metrics), tok_mu (the HTTP side's tokenizer and
 * chat template).  Order: q_mu or stats_mu, then job->mu or m_mu; job->mu
 * and m_mu are leaves (nothing is taken while holding them). */
#pragma once

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

#include <jansson.h>

#include "runtime/chat/chat.h"
#include "runtime/engine/engine.h"
#include "runtime/engine/ep.h"
#include "router/stats.h"
#include "runtime/chat/reasoning.h"
#include "runtime/text/textgen.h"
#include "runtime/text/tokenizer.h"

struct MHD_Daemon;

#define SRV_HIST_N 14   /* histogram buckets (+Inf apart) */
#define SRV_MAX_N 16    /* choices per request */

struct srv_opts {
    const char *host;
    int port;                 /* 0: any free port */
    const char *port_file;    /* the chosen port is written here, or NULL */
    const char *served_name;  /* model name; NULL: the folder's base name */
    size_t max_body;          /* bytes */
    int max_queue;            /* waiting requests before 429 */
    int max_conns;
    int max_conns_per_ip;     /* simultaneous connections from one address */
    int timeout_s;            /* idle connection timeout */
    int header_timeout_s;     /* a request's headers must be in within this (idle) time */
    int drain_timeout_s;      /* shutdown: how long running requests may finish */
    double keepalive_s;       /* reader wake-up while waiting */
    const char *api_key;      /* /v1/ endpoints want "Authorization: Bearer KEY"; NULL: open */
    bool no_gen_defaults;     /* ignore generation_config.json's sampling values */
    const char *reasoning;    /* --reasoning-parser: auto (from the chat template), none, think,
                                 harmony (runtime/chat/reasoning.h) */
    const char *tool_parser;  /* --tool-call-parser: auto (from the chat template), none, or a
                                 format's name (runtime/chat/toolcall.h) */
};

struct srv_job;

struct srv_choice {
    struct srv_job *job;
    int index;
    struct moe_request *r;    /* engine request, engine thread only */
    struct moe_textgen tg;
    bool tg_on, done, role_sent;
    struct moe_reasoning rs;  /* chat with a reasoning parser: the output's two parts */
    bool rs_on;
    struct moe_tool_calls tc; /* chat with tools: calls found in the answer */
    bool tc_on;
    int calls_sent;           /* streaming: calls already sent */
    char *reason;             /* reasoning text (non-streaming) */
    size_t n_reason, cap_reason;
    enum moe_finish finish;
    char *text;               /* generated text (non-streaming) */
    size_t n_text, cap_text;
    json_t *lp;               /* logprobs entries (non-streaming), or NULL */
    long long text_offset;    /* completions logprobs: characters of token text so far */
    int n_gen;
    int n_cached;             /* prompt tokens the prefix cache gave it (at its end) */
    int counted;              /* expert load: positions already counted */
    int64_t *load;            /* (Lm, E) tokens per expert, or NULL */
};

enum srv_phase { SRV_QUEUED, SRV_ACCEPTED, SRV_REJECTED };

struct srv_job {
    struct srv *s;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int refs;                 /* under mu */
    /* the request (HTTP thread, read-only once queued) */
    bool chat, stream, include_usage, expert_load;
    bool think_open;          /* chat: the rendered prompt ends inside a <think> block */
    bool tools;               /* chat: the request gave tools (tool_choice not none) */
    json_t *tool_defs;        /* owned, or NULL: those tools (the parser reads their types) */
    bool tool_forced;         /* tool_choice "required" or a named function: a grammar writes the call */
    const char *tool_forced_name; /* in tool_defs, or NULL ("required"): the named function */
    int n;                    /* choices: n_prompts x n_per */
    int n_per;                /* choices per prompt ("n") */
    int logprobs;             /* completions: top n (0 = none, -1 = off); chat: top_logprobs */
    bool chat_logprobs;       /* chat: logprobs true */
    int32_t *prompt;          /* (n_prompt) owned: the first prompt */
    int n_prompt;             /* the longest prompt (what the limits are checked against) */
    int n_prompts;            /* completions may send several prompts; choice i is of prompt i / n_per */
    int32_t *prompts[SRV_MAX_N]; /* (prompt_len[p]) owned; prompts[0] == prompt once read */
    int prompt_len[SRV_MAX_N];
    int prompt_tokens;        /* the sum of the prompts' lengths (usage) */
    struct moe_request_params rp;
    struct moe_grammar *grammar; /* owned: the request's "grammar" (rp.grammar points to it or
                                    to the server's json_grammar) */
    char *stops[MOE_MAX_STOP_STRINGS]; /* owned */
    int n_stops;
    char id[48];
    long long created;
    double t_recv;            /* monotonic seconds */
    struct srv_choice ch[SRV_MAX_N];
    /* engine-thread state */
    int n_done;
    struct srv_job *next;     /* queue / active list link */
    /* shared, under mu */
    enum srv_phase phase;
    int reject_status;
    char *reject_msg;
    char *out;                /* response bytes ready to send */
    size_t n_out, cap_out, sent;
    bool done;                /* every byte of the response is in out */
    bool abandoned;           /* the client is gone */
    int status;               /* non-streaming: the HTTP status of out (0 = 200) */
};

struct srv_hist {
    uint64_t b[SRV_HIST_N + 1]; /* cumulative only when rendered */
    double sum;
    uint64_t n;
};

#define SRV_EP_RANKS 64

struct srv_metrics {
    uint64_t by_status[600];  /* by HTTP status code (100..599) */
    struct srv_hist ttft, itl;
    uint64_t prompt_tokens, generated_tokens, preemptions, aborted, finished;
    int waiting, running;
    int kv_used, kv_cached, kv_free, kv_total;
    struct moe_offload_stats offload; /* --gpu-experts (CUDA) */
    /* speculative decoding (--spec): the engine's counters; spec_k = 0 when off */
    int spec_k;
    uint64_t spec_drafts, spec_draft_tokens, spec_accepted;
    uint64_t spec_accepted_at[MOE_SPEC_MAX_TOKENS];
    /* expert parallelism (runtime/engine/ep.h): ep_ranks 0 when off; rows per
     * rank for the first SRV_EP_RANKS ranks */
    int ep_ranks;
    struct moe_ep_counters ep;
    uint64_t ep_rows[SRV_EP_RANKS];
    int tp;                   /* tensor-parallel group size (1: none) and rank 0's group collectives */
    double tp_s;
    uint64_t tp_bytes;
};

struct srv {
    struct srv_opts o;
    atomic_int ready;         /* 0 loading, 1 serving, 2 stopping */
    char *model_name;         /* owned */
    long long created;        /* start-up time (Unix seconds): the model's "created" */
    const char *model_dir;
    struct moe_model m;
    struct moe_backend be;
    struct moe_engine e;
    struct moe_stats *stats;      /* the engine's recorder (borrowed), or NULL: none */
    struct moe_tokenizer tok;     /* HTTP side (encode), under tok_mu */
    struct moe_tokenizer tok_eng; /* engine thread (decode) */
    bool have_tok, have_chat;
    struct moe_grammar_vocab gvocab;   /* the model's token bytes for grammar masks (have_tok) */
    struct moe_grammar *json_grammar;  /* response_format json_object (have_tok), else NULL */
    enum moe_reasoning_format reasoning; /* chat completions' parser (runtime/chat/reasoning.h) */
    enum moe_tool_format tool_fmt;       /* chat completions' tool call format (runtime/chat/toolcall.h) */
    struct moe_chat_template tmpl;
    json_t *special;              /* chat template extras */
    struct moe_sampling defaults; /* a request's sampling before its own fields: the OpenAI
                                     API's, overlaid with generation_config.json's */
    pthread_mutex_t tok_mu;
    /* limits read by the HTTP threads once ready */
    int vocab, max_pos, kv_blocks, kv_block;
    int Lm, E, K;
    int32_t moe_layer[256];       /* (Lm) model layer of each MoE layer */
    /* submission queue */
    pthread_mutex_t q_mu;
    pthread_cond_t q_cv;
    struct srv_job *q_head, *q_tail;
    int q_len;
    bool stopping;                /* the engine thread ends */
    bool draining;                /* shutdown: new jobs are refused (503) */
    bool cut;                     /* the drain timeout is over: active jobs end now */
    atomic_int jobs_live;         /* jobs not yet freed (a response still being sent counts) */
    atomic_int eng_waiting;       /* engine's waiting requests */
    pthread_t engine_thread;
    bool engine_started;
    struct srv_job *active;       /* engine thread only */
    struct moe_route_trace trace;
    /* statistics recorder vs. engine steps */
    pthread_mutex_t stats_mu;
    pthread_mutex_t m_mu;
    struct srv_metrics met;
    atomic_llong next_id;
    struct MHD_Daemon *d;
};

extern const double srv_hist_le[SRV_HIST_N];

/* server_api.c: the POST handlers.  body is NUL-terminated; returns the
 * HTTP status and sets *job (accepted, one HTTP reference) or *err_body
 * (new string, the OpenAI error JSON). */
int srv_handle_completion(struct srv *s, bool chat, const char *body, size_t n,
                          struct srv_job **job, char **err_body);
/* The OpenAI error JSON (new string). */
char *srv_error_json(int status, const char *param, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* server_engine.c */
MOE_MUST_USE enum moe_status srv_engine_start(struct srv *s);
void srv_engine_stop(struct srv *s);
/* Queues a job (takes the engine reference): 0, or the refusal's status
 * (429 the queue is full, 503 shutting down). */
int srv_enqueue(struct srv *s, struct srv_job *j);
/* Shutdown: refuse new jobs; later, end the running ones now (server_engine.c's job_cut). */
void srv_drain_begin(struct srv *s);
void srv_drain_cut(struct srv *s);
void srv_job_unref(struct srv_job *j);
/* Prometheus text (new string). */
char *srv_metrics_text(struct srv *s);
void srv_count_status(struct srv *s, int status);

/* server.c */
MOE_MUST_USE enum moe_status srv_http_start(struct srv *s);
/* Stops listening (connections already open stay). */
void srv_http_quiesce(struct srv *s);
void srv_http_stop(struct srv *s);
