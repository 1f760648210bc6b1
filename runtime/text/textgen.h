/* textgen.h - generated ids to streamed text, with stop strings.
 *
 * Ids go through the streaming decoder; the text is held in a small pending
 * buffer while its tail could still be the start of a stop string, so a
 * stop string split across tokens is caught and never emitted.  When a stop
 * string appears, the text before it is emitted and the stream is stopped
 * (OpenAI semantics: the stop string itself is not returned). */
#pragma once

#include <stdbool.h>
#include <stddef.h>

#include "runtime/text/tokenizer.h"

#ifdef __cplusplus
extern "C" {
#endif

#define MOE_MAX_STOP_STRINGS 8

struct moe_textgen {
    struct moe_detok dt;
    char *stops[MOE_MAX_STOP_STRINGS]; /* owned copies */
    int n_stops;
    char *pending;        /* decoded text not yet emitted */
    size_t n_pending, cap;
    char *out;            /* last emitted text, owned */
    bool stopped;
};

/* stops may be NULL when n_stops is 0; empty strings are refused. */
MOE_MUST_USE enum moe_status moe_textgen_init(struct moe_textgen *g, const struct moe_tokenizer *tok,
                                               const char *const *stops, int n_stops,
                                               bool skip_special);
/* Feeds one id; *text (borrowed until the next call) is what may be shown
 * now.  After a stop string, g->stopped is set and later ids are ignored. */
MOE_MUST_USE enum moe_status moe_textgen_push(struct moe_textgen *g, int32_t id, const char **text);
/* End of generation: returns what was held back. */
MOE_MUST_USE enum moe_status moe_textgen_finish(struct moe_textgen *g, const char **text);
void moe_textgen_free(struct moe_textgen *g);

#ifdef __cplusplus
}
#endif
