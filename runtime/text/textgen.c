/* textgen.c - see textgen.h. */
#include "runtime/text/textgen.h"

#include <stdlib.h>
#include <string.h>

enum moe_status moe_textgen_init(struct moe_textgen *g, const struct moe_tokenizer *tok,
                                 const char *const *stops, int n_stops, bool skip_special)
{
    memset(g, 0, sizeof *g);
    if (n_stops < 0 || n_stops > MOE_MAX_STOP_STRINGS)
        return moe_fail(MOE_ERR_INVALID_ARG, "at most %d stop strings (got %d)", MOE_MAX_STOP_STRINGS,
                        n_stops);
    moe_detok_init(&g->dt, tok, skip_special);
    for (int i = 0; i < n_stops; i++) {
        if (!stops[i][0]) {
            moe_textgen_free(g);
            return moe_fail(MOE_ERR_INVALID_ARG, "stop string %d is empty", i + 1);
        }
        g->stops[i] = strdup(stops[i]);
        if (!g->stops[i]) {
            moe_textgen_free(g);
            return moe_fail(MOE_ERR_NOMEM, "stop strings");
        }
        g->n_stops = i + 1;
    }
    return MOE_OK;
}

void moe_textgen_free(struct moe_textgen *g)
{
    moe_detok_free(&g->dt);
    for (int i = 0; i < g->n_stops; i++) free(g->stops[i]);
    free(g->pending);
    free(g->out);
    memset(g, 0, sizeof *g);
}

static enum moe_status append(struct moe_textgen *g, const char *s)
{
    size_t n = strlen(s);
    if (g->n_pending + n + 1 > g->cap) {
        size_t cap = g->cap ? g->cap : 64;
        while (cap < g->n_pending + n + 1) cap *= 2;
        char *p = realloc(g->pending, cap);
        if (!p) return moe_fail(MOE_ERR_NOMEM, "text stream buffer");
        g->pending = p;
        g->cap = cap;
    }
    memcpy(g->pending + g->n_pending, s, n + 1);
    g->n_pending += n;
    return MOE_OK;
}

/* Moves pending[0..n) to g->out and shifts the rest down. */
static enum moe_status emit(struct moe_textgen *g, size_t n, const char **text)
{
    char *o = realloc(g->out, n + 1);
    if (!o) return moe_fail(MOE_ERR_NOMEM, "text stream output");
    g->out = o;
    memcpy(o, g->pending, n);
    o[n] = '\0';
    memmove(g->pending, g->pending + n, g->n_pending - n + 1);
    g->n_pending -= n;
    *text = o;
    return MOE_OK;
}

enum moe_status moe_textgen_push(struct moe_textgen *g, int32_t id, const char **text)
{
    *text = "";
    if (g->stopped) return MOE_OK;
    const char *piece;
    MOE_TRY(moe_detok_push(&g->dt, id, &piece));
    MOE_TRY(append(g, piece));
    if (!g->pending) return MOE_OK;
    /* the earliest complete stop string ends the stream */
    size_t cut = g->n_pending;
    for (int i = 0; i < g->n_stops; i++) {
        const char *hit = strstr(g->pending, g->stops[i]);
        if (hit && (size_t)(hit - g->pending) < cut) cut = (size_t)(hit - g->pending);
    }
    if (cut < g->n_pending) {
        g->stopped = true;
        MOE_TRY(emit(g, cut, text));
        g->n_pending = 0;
        g->pending[0] = '\0';
        return MOE_OK;
    }
    /* hold back the longest tail that could begin a stop string */
    size_t hold = 0;
    for (int i = 0; i < g->n_stops; i++) {
        size_t ls = strlen(g->stops[i]);
        for (size_t k = ls - 1; k > hold; k--)
            if (k <= g->n_pending && !memcmp(g->pending + g->n_pending - k, g->stops[i], k)) {
                hold = k;
                break;
            }
    }
    return emit(g, g->n_pending - hold, text);
}

enum moe_status moe_textgen_finish(struct moe_textgen *g, const char **text)
{
    *text = "";
    if (g->stopped) return MOE_OK;
    const char *piece;
    MOE_TRY(moe_detok_flush(&g->dt, &piece));
    MOE_TRY(append(g, piece));
    return g->pending ? emit(g, g->n_pending, text) : MOE_OK;
}
