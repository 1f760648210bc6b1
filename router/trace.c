/* trace.c - routing traces as .npy files, and a small .npy reader.
 *
 * The .npy format (numpy's NEP 1): magic "\x93NUMPY", version 1.0, a
 * little-endian uint16 header length, then an ASCII Python dict literal
 * {'descr': '<i2', 'fortran_order': False, 'shape': (N, L, K), } padded with
 * spaces and a final '\n' so that the data starts at a multiple of 64 bytes,
 * then the data in C order.  numpy.load reads these files directly.  The
 * reader accepts versions 1.0 and 2.0 (uint32 header length), C order, and
 * the descr strings moerun writes. */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "router/stats.h"

static size_t descr_size(const char *d)
{
    static const struct {
        const char *d;
        size_t n;
    } t[] = {{"<i2", 2}, {"<i4", 4}, {"<i8", 8}, {"<f4", 4}, {"<f8", 8}, {"|u1", 1}, {"<u1", 1}};
    for (size_t i = 0; i < sizeof t / sizeof t[0]; i++)
        if (!strcmp(d, t[i].d)) return t[i].n;
    return 0;
}

enum moe_status moe_npy_write(const char *path, const char *descr, int ndim, const int64_t *shape,
                              const void *data)
{
    size_t elem = descr_size(descr), n = 1;
    if (!elem || ndim < 0 || ndim > 8)
        return moe_fail(MOE_ERR_INVALID_ARG, "%s: .npy descr '%s' or %d dims", path, descr, ndim);
    char dict[256];
    int len = snprintf(dict, sizeof dict, "{'descr': '%s', 'fortran_order': False, 'shape': (", descr);
    for (int i = 0; i < ndim; i++) {
        const char *fmt = ndim == 1 ? "%lld," : i ? ", %lld" : "%lld"; /* (5,) for 1-D */
        len += snprintf(dict + len, sizeof dict - (size_t)len, fmt, (long long)shape[i]);
        if (!moe_mul_size(n, (size_t)shape[i], &n) || shape[i] < 0)
            return moe_fail(MOE_ERR_INVALID_ARG, "%s: .npy shape overflows", path);
    }
    len += snprintf(dict + len, sizeof dict - (size_t)len, "), }");
    size_t hlen = (size_t)len + 1; /* + '\n' */
    size_t total = (10 + hlen + 63) / 64 * 64;
    hlen = total - 10;
    unsigned char head[10] = {0x93, 'N', 'U', 'M', 'P', 'Y', 1, 0, (unsigned char)(hlen & 0xff),
                              (unsigned char)(hlen >> 8)};
    FILE *f = fopen(path, "wb");
    if (!f) return moe_fail(MOE_ERR_IO, "%s: %s", path, strerror(errno));
    fwrite(head, 1, 10, f);
    fwrite(dict, 1, (size_t)len, f);
    for (size_t i = (size_t)len; i < hlen - 1; i++) fputc(' ', f);
    fputc('\n', f);
    if (n) fwrite(data, elem, n, f);
    if (ferror(f) | (fclose(f) != 0)) return moe_fail(MOE_ERR_IO, "%s: write failed", path);
    return MOE_OK;
}

void moe_npy_free(struct moe_npy *a)
{
    free(a->data);
    memset(a, 0, sizeof *a);
}

/* Finds 'key': in the header dict and returns the text after it. */
static const char *dict_value(const char *h, const char *key)
{
    char pat[32];
    snprintf(pat, sizeof pat, "'%s':", key);
    const char *p = strstr(h, pat);
    if (!p) return NULL;
    p += strlen(pat);
    while (*p == ' ') p++;
    return p;
}

enum moe_status moe_npy_read(const char *path, struct moe_npy *a)
{
    memset(a, 0, sizeof *a);
    FILE *f = fopen(path, "rb");
    if (!f) return moe_fail(MOE_ERR_IO, "%s: %s", path, strerror(errno));
    enum moe_status s = MOE_ERR_FORMAT;
    unsigned char m[12];
    char *h = NULL;
    size_t hlen, pre;
    if (fread(m, 1, 8, f) != 8 || memcmp(m, "\x93NUMPY", 6) != 0) {
        s = moe_fail(MOE_ERR_FORMAT, "%s: not a .npy file", path);
        goto fail;
    }
    if (m[6] == 1) {
        if (fread(m + 8, 1, 2, f) != 2) goto trunc;
        hlen = m[8] | (size_t)m[9] << 8;
        pre = 10;
    } else if (m[6] == 2 || m[6] == 3) {
        if (fread(m + 8, 1, 4, f) != 4) goto trunc;
        hlen = m[8] | (size_t)m[9] << 8 | (size_t)m[10] << 16 | (size_t)m[11] << 24;
        pre = 12;
        if (hlen > (1u << 20)) goto bad;
    } else {
        s = moe_fail(MOE_ERR_UNSUPPORTED, "%s: .npy version %d", path, m[6]);
        goto fail;
    }
    h = malloc(hlen + 1);
    if (!h) {
        s = moe_fail(MOE_ERR_NOMEM, "%s: header", path);
        goto fail;
    }
    if (fread(h, 1, hlen, f) != hlen) goto trunc;
    h[hlen] = '\0';
    const char *d = dict_value(h, "descr"), *fo = dict_value(h, "fortran_order"),
               *sh = dict_value(h, "shape");
    if (!d || !fo || !sh || *d != '\'' || *sh != '(') goto bad;
    size_t dl = strcspn(d + 1, "'");
    if (dl >= sizeof a->descr) goto bad;
    memcpy(a->descr, d + 1, dl);
    a->descr[dl] = '\0';
    if (!(a->elem = descr_size(a->descr))) {
        s = moe_fail(MOE_ERR_UNSUPPORTED, "%s: .npy dtype '%s'", path, a->descr);
        goto fail;
    }
    if (strncmp(fo, "False", 5) != 0) {
        s = moe_fail(MOE_ERR_UNSUPPORTED, "%s: Fortran-order .npy", path);
        goto fail;
    }
    const char *p = sh + 1;
    a->n = 1;
    while (1) {
        while (*p == ' ' || *p == ',') p++;
        if (*p == ')') break;
        char *end;
        long long v = strtoll(p, &end, 10);
        if (end == p || v < 0 || a->ndim == 8 || !moe_mul_size(a->n, (size_t)v, &a->n)) goto bad;
        a->shape[a->ndim++] = v;
        p = end;
        if (*p == 'L') p++;
    }
    size_t bytes;
    if (!moe_mul_size(a->n, a->elem, &bytes)) goto bad;
    /* The shape is untrusted: compare it with the bytes the file really
     * holds before allocating, so a short file cannot claim terabytes. */
    struct stat sb;
    if (fstat(fileno(f), &sb) != 0) {
        s = moe_fail(MOE_ERR_IO, "%s: %s", path, strerror(errno));
        goto fail;
    }
    const size_t avail = (size_t)sb.st_size - pre - hlen; /* the header was read whole */
    if (bytes != avail) {
        s = moe_fail(MOE_ERR_FORMAT, "%s: %s .npy file: the header's shape (%zu elements of '%s') "
                     "needs %zu bytes of data, but the file holds %zu", path,
                     bytes > avail ? "truncated" : "oversized", a->n, a->descr, bytes, avail);
        goto fail;
    }
    a->data = malloc(bytes ? bytes : 1);
    if (!a->data) {
        s = moe_fail(MOE_ERR_NOMEM, "%s: %zu bytes", path, bytes);
        goto fail;
    }
    if (fread(a->data, 1, bytes, f) != bytes) goto trunc;
    free(h);
    fclose(f);
    return MOE_OK;
trunc:
    s = moe_fail(MOE_ERR_FORMAT, "%s: truncated .npy file", path);
    goto fail;
bad:
    s = moe_fail(MOE_ERR_FORMAT, "%s: malformed .npy header", path);
fail:
    free(h);
    fclose(f);
    moe_npy_free(a);
    return s;
}

enum moe_status moe_stats_write_trace(const struct moe_stats *st, const struct moe_stats_meta *mt,
                                      const char *prefix)
{
    const struct moe_stats_trace *tr = &st->tr;
    const int64_t N = tr->n, shape[3] = {N, st->Lm, st->K};
    const size_t n = (size_t)N * (size_t)st->Lm * (size_t)st->K;
    char path[4096];
    enum moe_status s = MOE_OK;
    const bool small = st->E <= 32767;
    void *ids = tr->ids;
    if (small && n) {
        int16_t *v = malloc(n * sizeof *v);
        if (!v) return moe_fail(MOE_ERR_NOMEM, "trace: %zu ids", n);
        for (size_t i = 0; i < n; i++) v[i] = (int16_t)tr->ids[i];
        ids = v;
    }
    snprintf(path, sizeof path, "%s.ids.npy", prefix);
    s = moe_npy_write(path, small ? "<i2" : "<i4", 3, shape, ids);
    if (ids != tr->ids) free(ids);
    if (s != MOE_OK) return s;
    snprintf(path, sizeof path, "%s.weights.npy", prefix);
    MOE_TRY(moe_npy_write(path, "<f4", 3, shape, tr->w));
    snprintf(path, sizeof path, "%s.tokens.npy", prefix);
    const int64_t mshape[2] = {N, 4};
    MOE_TRY(moe_npy_write(path, "<i8", 2, mshape, tr->meta));
    json_t *layers = json_array();
    for (int j = 0; j < st->Lm; j++) json_array_append_new(layers, json_integer(st->layers[j]));
    json_t *j = json_pack(
        "{s:s, s:i, s:I, s:i, s:i, s:o, s:b, s:i, s:i, s:i, s:o, s:{s:s, s:s, s:s}, s:[s,s,s,s]}",
        "format", MOE_TRACE_FORMAT, "version", MOE_TRACE_VERSION, "tokens", (json_int_t)N,
        "experts", st->E, "top_k", st->K, "moe_layers", layers, "truncated", tr->truncated,
        "d_model", mt ? mt->d_model : 0, "d_expert", mt ? mt->d_expert : 0, "weight_bytes",
        mt ? mt->weight_bytes : 0, "model", mt && mt->model ? json_string(mt->model) : json_null(),
        "files", "ids",
        small ? "ids.npy int16 (tokens, moe_layers, top_k)" : "ids.npy int32 (tokens, moe_layers, top_k)",
        "weights", "weights.npy float32 (tokens, moe_layers, top_k)", "tokens",
        "tokens.npy int64 (tokens, 4)", "token_columns", "step", "request", "position", "decode");
    if (!j) return moe_fail(MOE_ERR_NOMEM, "trace: description");
    snprintf(path, sizeof path, "%s.trace.json", prefix);
    if (j) json_object_set_new(j, "expert_bytes", json_integer(mt ? mt->expert_bytes : 0));
    int rc = json_dump_file(j, path, JSON_INDENT(1));
    json_decref(j);
    if (rc != 0) return moe_fail(MOE_ERR_IO, "%s: cannot write", path);
    return MOE_OK;
}
