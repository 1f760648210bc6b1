/* safetensors_write.c - writing a safetensors file (see safetensors.h).
 *
 * Produces the bytes the reference writer does (huggingface/safetensors,
 * safetensors/src/tensor.rs, prepare + serialize_to_file): tensors ordered by
 * dtype, widest alignment first in the reference's Dtype order, then by name;
 * compact JSON with "__metadata__" first and each entry as
 * {"dtype","shape","data_offsets"}; the header padded with spaces to a
 * multiple of 8 bytes, so every tensor's data stays aligned to its element
 * size inside a page-aligned mapping.  Metadata keys are written in byte
 * order (the reference uses a hash map, so its order is unspecified).
 *
 * The file is written to PATH.tmp and renamed over PATH only when complete:
 * a reader never sees a half-written checkpoint. */
#include "runtime/model/safetensors.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* Position of each dtype in the reference's Dtype enum, which lists types in
 * increasing alignment; the writer sorts by it, descending. */
static int dtype_rank(enum moe_dtype t)
{
    switch (t) {
    case MOE_DTYPE_BOOL: return 0;
    case MOE_DTYPE_U8: return 1;
    case MOE_DTYPE_I8: return 2;
    case MOE_DTYPE_F8E5M2: return 3;
    case MOE_DTYPE_F8E4M3: return 4;
    case MOE_DTYPE_I16: return 5;
    case MOE_DTYPE_U16: return 6;
    case MOE_DTYPE_F16: return 7;
    case MOE_DTYPE_BF16: return 8;
    case MOE_DTYPE_I32: return 9;
    case MOE_DTYPE_U32: return 10;
    case MOE_DTYPE_F32: return 11;
    case MOE_DTYPE_F64: return 12;
    case MOE_DTYPE_I64: return 13;
    case MOE_DTYPE_U64: return 14;
    case MOE_DTYPE_COUNT:
    case MOE_DTYPE_BF16_PANEL:
    case MOE_DTYPE_Q8_0:
    case MOE_DTYPE_MXFP4:
    case MOE_DTYPE_Q4_1:
    case MOE_DTYPE_Q4_G32:
    case MOE_DTYPE_Q4_G128:
    case MOE_DTYPE_Q4_K:
    case MOE_DTYPE_Q6_K:
    case MOE_DTYPE_Q5_K:
    case MOE_DTYPE_FP8_B128: break; /* not safetensors dtypes: the writer refuses them */
    }
    return -1;
}

static int cmp_tensor(const void *a, const void *b)
{
    const struct moe_st_tensor *x = *(const struct moe_st_tensor *const *)a;
    const struct moe_st_tensor *y = *(const struct moe_st_tensor *const *)b;
    int rx = dtype_rank(x->dtype), ry = dtype_rank(y->dtype);
    if (rx != ry) return ry - rx;
    return strcmp(x->name, y->name);
}

static int cmp_str(const void *a, const void *b)
{
    return strcmp(*(const char *const *)a, *(const char *const *)b);
}

/* Copies metadata (an object of strings) with its keys in byte order. */
static MOE_MUST_USE enum moe_status sorted_metadata(const char *path, json_t *metadata,
                                                    json_t **out)
{
    if (!json_is_object(metadata))
        return moe_fail(MOE_ERR_INVALID_ARG, "%s: metadata must be a JSON object of strings", path);
    size_t n = json_object_size(metadata), i = 0;
    const char **keys = calloc(n + 1, sizeof *keys);
    json_t *m = json_object();
    enum moe_status s = MOE_OK;
    if (!keys || !m) {
        s = moe_fail(MOE_ERR_NOMEM, "%s: out of memory", path);
        goto fail;
    }
    const char *k;
    json_t *v;
    json_object_foreach(metadata, k, v)
    {
        if (!json_is_string(v)) {
            s = moe_fail(MOE_ERR_INVALID_ARG, "%s: metadata value of \"%s\" must be a string", path,
                         k);
            goto fail;
        }
        keys[i++] = k;
    }
    qsort(keys, n, sizeof *keys, cmp_str);
    for (i = 0; i < n; i++) {
        if (json_object_set(m, keys[i], json_object_get(metadata, keys[i])) != 0) {
            s = moe_fail(MOE_ERR_NOMEM, "%s: out of memory", path);
            goto fail;
        }
    }
    free(keys);
    *out = m;
    return MOE_OK;

fail:
    free(keys);
    json_decref(m);
    return s;
}

/* Checks one tensor and appends its header entry at offset *off. */
static MOE_MUST_USE enum moe_status add_entry(const char *path, json_t *header,
                                              const struct moe_st_tensor *t, size_t *off)
{
    if (!t->name || strcmp(t->name, "__metadata__") == 0 || json_object_get(header, t->name))
        return moe_fail(MOE_ERR_INVALID_ARG,
                        "%s: tensor name \"%s\" is missing, reserved or "
                        "used twice",
                        path, t->name ? t->name : "(null)");
    if ((unsigned)t->dtype >= MOE_DTYPE_COUNT || t->ndim < 0 || t->ndim > MOE_MAX_DIMS)
        return moe_fail(MOE_ERR_INVALID_ARG, "%s: tensor \"%s\": bad dtype %d or ndim %d", path,
                        t->name, (int)t->dtype, t->ndim);
    size_t want = moe_dtype_size(t->dtype);
    json_t *shape = json_array();
    for (int i = 0; shape && i < t->ndim; i++) {
        if (t->shape[i] < 0 || (uint64_t)t->shape[i] > SIZE_MAX ||
            !moe_mul_size(want, (size_t)t->shape[i], &want)) {
            json_decref(shape);
            return moe_fail(MOE_ERR_INVALID_ARG,
                            "%s: tensor \"%s\": shape[%d] = %lld is negative or overflows", path,
                            t->name, i, (long long)t->shape[i]);
        }
        if (json_array_append_new(shape, json_integer(t->shape[i])) != 0) {
            json_decref(shape);
            shape = NULL;
        }
    }
    if (!shape) return moe_fail(MOE_ERR_NOMEM, "%s: out of memory", path);
    if (t->nbytes != want || (!t->data && want > 0)) {
        json_decref(shape);
        return moe_fail(MOE_ERR_INVALID_ARG,
                        "%s: tensor \"%s\": has %zu bytes%s, its shape and dtype need %zu", path,
                        t->name, t->nbytes, t->data ? "" : " and no data", want);
    }
    size_t end;
    if (!moe_add_size(*off, want, &end) || end > (size_t)INT64_MAX) {
        json_decref(shape);
        return moe_fail(MOE_ERR_INVALID_ARG, "%s: total data size overflows", path);
    }
    json_t *e = json_pack("{s:s, s:o, s:[I,I]}", "dtype", moe_dtype_name(t->dtype), "shape", shape,
                          "data_offsets", (json_int_t)*off, (json_int_t)end);
    /* json_pack steals shape even when it fails. */
    if (!e || json_object_set_new(header, t->name, e) != 0)
        return moe_fail(MOE_ERR_INVALID_ARG,
                        "%s: tensor \"%s\": cannot encode the header entry "
                        "(name not UTF-8, or out of memory)",
                        path, t->name);
    *off = end;
    return MOE_OK;
}

enum moe_status moe_safetensors_write(const char *path, const struct moe_st_tensor *const *tensors,
                                      size_t n, json_t *metadata)
{
    const struct moe_st_tensor **order = NULL;
    json_t *header = NULL, *meta = NULL;
    char *text = NULL, *tmp = NULL;
    FILE *f = NULL;
    bool created = false; /* tmp is ours to remove */
    enum moe_status s;

    if (!path || (n > 0 && !tensors)) {
        s = moe_fail(MOE_ERR_INVALID_ARG, "safetensors_write: no path or no tensors");
        goto fail;
    }
    order = calloc(n + 1, sizeof *order);
    header = json_object();
    size_t tmp_len = strlen(path) + 5;
    tmp = malloc(tmp_len);
    if (!order || !header || !tmp) {
        s = moe_fail(MOE_ERR_NOMEM, "%s: out of memory", path);
        goto fail;
    }
    snprintf(tmp, tmp_len, "%s.tmp", path);
    for (size_t i = 0; i < n; i++) {
        if (!tensors[i]) {
            s = moe_fail(MOE_ERR_INVALID_ARG, "%s: tensor %zu is NULL", path, i);
            goto fail;
        }
        order[i] = tensors[i];
    }
    qsort(order, n, sizeof *order, cmp_tensor);

    if (metadata) {
        s = sorted_metadata(path, metadata, &meta);
        if (s != MOE_OK) goto fail;
        if (json_object_set(header, "__metadata__", meta) != 0) {
            s = moe_fail(MOE_ERR_NOMEM, "%s: out of memory", path);
            goto fail;
        }
    }
    size_t data_bytes = 0;
    for (size_t i = 0; i < n; i++) {
        s = add_entry(path, header, order[i], &data_bytes);
        if (s != MOE_OK) goto fail;
    }
    text = json_dumps(header, JSON_COMPACT);
    if (!text) {
        s = moe_fail(MOE_ERR_NOMEM, "%s: cannot encode the header", path);
        goto fail;
    }
    size_t len = strlen(text), padded = (len + 7) & ~(size_t)7;
    if (padded > MOE_ST_MAX_HEADER) {
        s = moe_fail(MOE_ERR_INVALID_ARG, "%s: header of %zu bytes exceeds the limit of %llu", path,
                     padded, MOE_ST_MAX_HEADER);
        goto fail;
    }

    f = fopen(tmp, "wb");
    if (!f) {
        s = moe_fail(MOE_ERR_IO, "%s: cannot create: %s", tmp, strerror(errno));
        goto fail;
    }
    created = true;
    unsigned char le[8];
    for (int i = 0; i < 8; i++) le[i] = (unsigned char)((uint64_t)padded >> (8 * i));
    static const char spaces[8] = "        ";
    bool ok = fwrite(le, 1, 8, f) == 8 && fwrite(text, 1, len, f) == len &&
              fwrite(spaces, 1, padded - len, f) == padded - len;
    for (size_t i = 0; ok && i < n; i++)
        ok = order[i]->nbytes == 0 ||
             fwrite(order[i]->data, 1, order[i]->nbytes, f) == order[i]->nbytes;
    ok = ok && fflush(f) == 0 && fsync(fileno(f)) == 0;
    int saved = errno;
    int closed = fclose(f);
    f = NULL;
    if (!ok || closed != 0) {
        s = moe_fail(MOE_ERR_IO, "%s: write failed: %s", tmp, strerror(ok ? errno : saved));
        goto fail;
    }
    if (rename(tmp, path) != 0) {
        s = moe_fail(MOE_ERR_IO, "%s: cannot rename %s into place: %s", path, tmp, strerror(errno));
        goto fail;
    }
    free(text);
    free(tmp);
    json_decref(meta);
    json_decref(header);
    free(order);
    return MOE_OK;

fail:
    if (f) fclose(f);
    if (created) unlink(tmp);
    free(text);
    free(tmp);
    json_decref(meta);
    json_decref(header);
    free(order);
    return s;
}
