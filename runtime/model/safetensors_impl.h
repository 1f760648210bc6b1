/* safetensors_impl.h - helpers shared by safetensors.c and
 * safetensors_dir.c; not part of the interface. */
#pragma once

#include "runtime/model/safetensors.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Where a loaded tensor came from (its file's path, or a phrase), for
 * messages.  Borrowed from st. */
const char *moe_st_origin(const struct moe_safetensors *st, const struct moe_st_tensor *t);
/* Drops every file after the first nf and every tensor after the first nt,
 * unmapping and freeing them, and rebuilds the name index.  Used to undo a
 * partly opened folder. */
void moe_st_truncate(struct moe_safetensors *st, int nf, size_t nt);
/* "an object", "an integer", ...: the kind of a JSON value, for messages. */
const char *moe_st_json_kind(const json_t *v);

#ifdef __cplusplus
}
#endif
