/* safetensors.h - reading and writing safetensors checkpoints.
 *
 * Format (https://github.com/huggingface/safetensors): an 8-byte
 * little-endian header length N, N bytes of UTF-8 JSON mapping tensor names to
 * {"dtype", "shape", "data_offsets": [begin, end]} (plus an optional
 * "__metadata__" object of string to string), then the byte buffer.  Files
 * are memory-mapped once; tensors point into the mapping.
 *
 * Validation follows the reference implementation: header length at most
 * 100,000,000 and inside the file; UTF-8 JSON (leading/trailing whitespace
 * allowed); known dtype strings; __metadata__ string-to-string only; offsets
 * contiguous from 0 with no gaps or overlaps when sorted; byte length equal
 * to numel x dtype size (overflow-checked); the buffer ends exactly at the end
 * of the file; duplicate names rejected; zero-size tensors accepted.  Each
 * violation fails with MOE_ERR_FORMAT and a message naming the file, the
 * tensor and what was expected versus found.
 *
 * A set can span several files (a sharded checkpoint described by
 * model.safetensors.index.json) and can also hold in-memory tensors (synthetic
 * weights), so the model loader binds names the same way in every case. */
#pragma once

#include <jansson.h>

#include "runtime/core/status.h"
#include "runtime/core/tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

#define MOE_ST_MAX_HEADER 100000000ull

struct moe_st_tensor {
    char *name;           /* owned by the set */
    enum moe_dtype dtype;
    int ndim;
    int64_t shape[MOE_MAX_DIMS];
    const void *data;     /* borrowed: into a mapping, or an owned buffer of the set */
    size_t nbytes;
    int file;             /* index into files[], or -1 for an in-memory tensor */
};

struct moe_st_file {
    char *path;           /* owned */
    void *map;            /* mmap of the whole file (NULL for an empty buffer) */
    size_t size;
};

struct moe_safetensors {
    struct moe_st_file *files;     /* (n_files) */
    int n_files;
    struct moe_st_tensor *tensors; /* (n_tensors), in file order */
    size_t n_tensors, cap_tensors;
    void **owned;                  /* buffers of in-memory tensors */
    size_t n_owned;
    json_t *metadata;              /* merged __metadata__ objects, owned (may be NULL) */
    size_t *index;                 /* open-addressing hash of names -> tensor + 1 */
    size_t index_cap;
};

/* Opens one .safetensors file and appends its tensors to st (which must be
 * zeroed or already open).  A name already in st is an error.  On failure st
 * is left as it was. */
MOE_MUST_USE enum moe_status moe_safetensors_open_file(struct moe_safetensors *st,
                                                        const char *path);
/* Opens a model folder: model.safetensors.index.json if present (every shard
 * must be a plain file name inside dir; each tensor must be in the shard the
 * index names, and each listed once), else model.safetensors, else every
 * *.safetensors file in dir in byte order of name (hidden files skipped).
 * On failure st is left as it was. */
MOE_MUST_USE enum moe_status moe_safetensors_open_dir(struct moe_safetensors *st,
                                                       const char *dir);
/* Parses a header from a buffer already in memory (used by open_file and by
 * tests).  `what` names the source in messages.  buf stays borrowed and must
 * outlive st. */
MOE_MUST_USE enum moe_status moe_safetensors_parse(struct moe_safetensors *st, const void *buf,
                                                    size_t size, const char *what, int file);
/* Adds an in-memory tensor; takes ownership of data (malloc'd; may be NULL
 * when the tensor has no elements), which is freed at close, or at once when
 * the add fails. */
MOE_MUST_USE enum moe_status moe_safetensors_add(struct moe_safetensors *st, const char *name,
                                                  enum moe_dtype dtype, int ndim,
                                                  const int64_t *shape, void *data);
/* NULL if absent.  Borrowed: valid until the next open, parse, add or close
 * on st (tensors[] may move as it grows).  O(1) expected. */
const struct moe_st_tensor *moe_safetensors_find(const struct moe_safetensors *st,
                                                 const char *name);
/* Drops this process's pages of [p, p + n) once a loader or backend has
 * copied what it needs from them, when st holds the range: in one of its
 * file mappings (read-only and private: a page touched again is read from
 * the file again), or, unless files_only, in one of its own in-memory
 * tensors (a page touched again reads zeros: only for memory nothing reads
 * again).  Pages the range shares with its neighbours stay; memory st does
 * not hold is left alone. */
/* Replaces prefix by `to` (no longer than prefix; "" removes it) in every
 * tensor name that starts with it (a multimodal checkpoint's text model,
 * `language_model.model.*` or `model.language_model.*`, read by the names
 * of the text-only model).  An error (the set unchanged) when a new name is
 * another tensor's. */
MOE_MUST_USE enum moe_status moe_safetensors_strip_prefix(struct moe_safetensors *st, const char *prefix,
                                                           const char *to);
void moe_safetensors_release(const struct moe_safetensors *st, const void *p, size_t n,
                             bool files_only);
/* Unmaps, frees; safe on a zeroed struct and twice. */
void moe_safetensors_close(struct moe_safetensors *st);

/* Writes tensors to path in the reference layout: widest dtype first, then
 * by name (so each tensor's data is aligned to its element size), header
 * padded with spaces to a multiple of 8 bytes.  metadata may be NULL
 * (borrowed; an object of strings).  Writes path.tmp and renames it, so path
 * is either untouched or complete. */
MOE_MUST_USE enum moe_status moe_safetensors_write(const char *path,
                                                    const struct moe_st_tensor *const *tensors,
                                                    size_t n, json_t *metadata);

#ifdef __cplusplus
}
#endif
