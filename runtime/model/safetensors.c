/* safetensors.c - reading safetensors files into one name-indexed set, and
 * in-memory tensors (see safetensors.h; folders are opened in
 * safetensors_dir.c, files written in safetensors_write.c).
 *
 * Mirrors the validation of the reference reader (huggingface/safetensors,
 * safetensors/src/tensor.rs, SafeTensors::read_metadata and
 * Metadata::validate): header length <= 100,000,000 and inside the file,
 * UTF-8 JSON object, entries {dtype, shape, data_offsets} with unknown keys
 * ignored, offsets sorted by (begin, end) contiguous from 0, byte length equal
 * to numel x dtype size, and the last end equal to the buffer size, and
 * "__metadata__" an object of strings (or null).  One addition: duplicate
 * JSON keys are rejected (the reference does not check for them).
 *
 * Invariants of a set:
 * - tensors[] is append-only; each file's tensors are appended in offset
 *   order once its whole header has validated, so a failed open leaves the
 *   set as it was.
 * - index[] is an open-addressing table (linear probing, power-of-two size,
 *   load <= 1/2) of tensor position + 1; 0 marks an empty slot.
 * - Every data pointer of a file tensor lies inside that file's mapping:
 *   data + nbytes <= map + size, checked before any pointer is formed. */
#include "runtime/model/safetensors.h"
#include "runtime/model/safetensors_impl.h"

#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>
#include <utf8proc.h>

/* ---- name index ---------------------------------------------------------- */

static uint64_t name_hash(const char *s)
{
    uint64_t h = 0xcbf29ce484222325ull; /* FNV-1a */
    for (; *s; s++) h = (h ^ (unsigned char)*s) * 0x100000001b3ull;
    return h;
}

static void index_insert(struct moe_safetensors *st, size_t pos)
{
    size_t mask = st->index_cap - 1;
    size_t i = name_hash(st->tensors[pos].name) & mask;
    while (st->index[i] != 0) i = (i + 1) & mask;
    st->index[i] = pos + 1;
}

static void index_rebuild(struct moe_safetensors *st)
{
    if (!st->index) return;
    memset(st->index, 0, st->index_cap * sizeof *st->index);
    for (size_t i = 0; i < st->n_tensors; i++) index_insert(st, i);
}

enum moe_status moe_safetensors_strip_prefix(struct moe_safetensors *st, const char *prefix, const char *to)
{
    const size_t n = strlen(prefix), m = strlen(to);
    MOE_ASSERT(m <= n);
    for (size_t i = 0; i < st->n_tensors; i++) { /* a new name must be new */
        const char *name = st->tensors[i].name;
        if (strncmp(name, prefix, n) != 0) continue;
        char *nn = malloc(m + strlen(name + n) + 1);
        if (!nn) return moe_fail(MOE_ERR_NOMEM, "checkpoint: tensor names");
        memcpy(nn, to, m);
        strcpy(nn + m, name + n);
        const bool taken = moe_safetensors_find(st, nn) != NULL;
        if (taken) moe_fail(MOE_ERR_FORMAT, "checkpoint: tensors '%s' and '%s' would have one name", name, nn);
        free(nn);
        if (taken) return MOE_ERR_FORMAT;
    }
    for (size_t i = 0; i < st->n_tensors; i++) {
        char *name = st->tensors[i].name;
        if (strncmp(name, prefix, n) != 0) continue;
        memmove(name + m, name + n, strlen(name + n) + 1);
        memcpy(name, to, m);
    }
    index_rebuild(st);
    return MOE_OK;
}

/* Makes room for n tensors in total: tensors[] capacity and an index with
 * load <= 1/2.  Changes no visible content, so callers may fail afterwards. */
static MOE_MUST_USE enum moe_status reserve(struct moe_safetensors *st, size_t n)
{
    if (n > st->cap_tensors) {
        size_t cap = st->cap_tensors ? st->cap_tensors : 16;
        size_t bytes;
        while (cap < n && moe_mul_size(cap, 2, &cap)) {
        }
        if (cap < n || !moe_mul_size(cap, sizeof *st->tensors, &bytes))
            return moe_fail(MOE_ERR_NOMEM, "safetensors: too many tensors (%zu)", n);
        void *p = realloc(st->tensors, bytes);
        if (!p) return moe_fail(MOE_ERR_NOMEM, "safetensors: out of memory for %zu tensors", n);
        st->tensors = p;
        st->cap_tensors = cap;
    }
    /* tensors[] holding n entries bounds n far below SIZE_MAX / 4, so the
     * doubling below cannot overflow. */
    size_t need = 2 * n;
    if (need > st->index_cap) {
        size_t cap = st->index_cap ? st->index_cap : 32;
        while (cap < need) cap *= 2;
        size_t *idx = calloc(cap, sizeof *idx);
        if (!idx) return moe_fail(MOE_ERR_NOMEM, "safetensors: out of memory for the name index");
        free(st->index);
        st->index = idx;
        st->index_cap = cap;
        index_rebuild(st);
    }
    return MOE_OK;
}

const struct moe_st_tensor *moe_safetensors_find(const struct moe_safetensors *st, const char *name)
{
    if (!st || !name || st->index_cap == 0) return NULL;
    size_t mask = st->index_cap - 1;
    for (size_t i = name_hash(name) & mask;; i = (i + 1) & mask) {
        size_t v = st->index[i];
        if (v == 0) return NULL;
        if (strcmp(st->tensors[v - 1].name, name) == 0) return &st->tensors[v - 1];
    }
}

/* Where an already-loaded tensor came from, for messages. */
const char *moe_st_origin(const struct moe_safetensors *st, const struct moe_st_tensor *t)
{
    if (t->file >= 0 && t->file < st->n_files) return st->files[t->file].path;
    return t->file < 0 ? "an in-memory tensor" : "another buffer";
}

/* Drops files and tensors added after the first nf files / nt tensors. */
void moe_st_truncate(struct moe_safetensors *st, int nf, size_t nt)
{
    for (size_t i = nt; i < st->n_tensors; i++) free(st->tensors[i].name);
    if (nt < st->n_tensors) st->n_tensors = nt;
    for (int i = nf; i < st->n_files; i++) {
        if (st->files[i].map) munmap(st->files[i].map, st->files[i].size);
        free(st->files[i].path);
    }
    if (nf < st->n_files) st->n_files = nf;
    index_rebuild(st);
}

/* ---- header parsing ------------------------------------------------------ */

const char *moe_st_json_kind(const json_t *v)
{
    switch (json_typeof(v)) {
    case JSON_OBJECT: return "an object";
    case JSON_ARRAY: return "an array";
    case JSON_STRING: return "a string";
    case JSON_INTEGER: return "an integer";
    case JSON_REAL: return "a real number";
    case JSON_TRUE: return "true";
    case JSON_FALSE: return "false";
    case JSON_NULL: return "null";
    }
    return "?";
}

/* One header entry while it is being validated. */
struct pending {
    char *name; /* owned until committed */
    enum moe_dtype dtype;
    int ndim;
    int64_t shape[MOE_MAX_DIMS];
    size_t begin, end;
};

/* Reads v as a non-negative JSON integer. */
static bool get_count(const json_t *v, size_t *out)
{
    if (!json_is_integer(v) || json_integer_value(v) < 0) return false;
    *out = (size_t)json_integer_value(v);
    return true;
}

/* Validates one tensor entry on its own (offsets are checked together
 * later).  Unknown keys are ignored, as serde does for the reference. */
static MOE_MUST_USE enum moe_status parse_entry(const char *what, const char *name, const json_t *v,
                                                struct pending *p)
{
    if (!json_is_object(v))
        return moe_fail(MOE_ERR_FORMAT,
                        "%s: tensor \"%s\": entry is %s, expected an object with dtype, "
                        "shape and data_offsets",
                        what, name, moe_st_json_kind(v));
    const json_t *dt = json_object_get(v, "dtype");
    if (!dt) return moe_fail(MOE_ERR_FORMAT, "%s: tensor \"%s\": missing \"dtype\"", what, name);
    if (!json_is_string(dt))
        return moe_fail(MOE_ERR_FORMAT, "%s: tensor \"%s\": \"dtype\" is %s, expected a string",
                        what, name, moe_st_json_kind(dt));
    if (!moe_dtype_parse(json_string_value(dt), &p->dtype))
        return moe_fail(MOE_ERR_FORMAT, "%s: tensor \"%s\": unknown dtype \"%.40s\"", what, name,
                        json_string_value(dt));

    const json_t *sh = json_object_get(v, "shape");
    if (!sh) return moe_fail(MOE_ERR_FORMAT, "%s: tensor \"%s\": missing \"shape\"", what, name);
    if (!json_is_array(sh))
        return moe_fail(MOE_ERR_FORMAT, "%s: tensor \"%s\": \"shape\" is %s, expected an array",
                        what, name, moe_st_json_kind(sh));
    if (json_array_size(sh) > MOE_MAX_DIMS)
        return moe_fail(MOE_ERR_FORMAT,
                        "%s: tensor \"%s\": shape has %zu dimensions, at most %d supported", what,
                        name, json_array_size(sh), MOE_MAX_DIMS);
    p->ndim = (int)json_array_size(sh);
    /* numel is folded left to right with overflow checks, like the
     * reference's try_fold: [huge, huge, 0] overflows before reaching 0. */
    size_t numel = 1, nbytes;
    for (int i = 0; i < p->ndim; i++) {
        const json_t *d = json_array_get(sh, (size_t)i);
        size_t n;
        if (!get_count(d, &n)) {
            if (json_is_integer(d))
                return moe_fail(MOE_ERR_FORMAT,
                                "%s: tensor \"%s\": shape[%d] is %lld, expected a non-negative "
                                "integer",
                                what, name, i, (long long)json_integer_value(d));
            return moe_fail(MOE_ERR_FORMAT,
                            "%s: tensor \"%s\": shape[%d] is %s, expected a non-negative integer",
                            what, name, i, moe_st_json_kind(d));
        }
        p->shape[i] = (int64_t)n;
        if (!moe_mul_size(numel, n, &numel))
            return moe_fail(MOE_ERR_FORMAT,
                            "%s: tensor \"%s\": element count of the shape overflows at shape[%d]",
                            what, name, i);
    }
    if (!moe_mul_size(numel, moe_dtype_size(p->dtype), &nbytes))
        return moe_fail(MOE_ERR_FORMAT,
                        "%s: tensor \"%s\": byte size overflows (%zu elements of %s)", what, name,
                        numel, moe_dtype_name(p->dtype));

    const json_t *off = json_object_get(v, "data_offsets");
    if (!off)
        return moe_fail(MOE_ERR_FORMAT, "%s: tensor \"%s\": missing \"data_offsets\"", what, name);
    if (!json_is_array(off) || json_array_size(off) != 2)
        return moe_fail(
            MOE_ERR_FORMAT, "%s: tensor \"%s\": \"data_offsets\" must be [begin, end], found %s%s",
            what, name, moe_st_json_kind(off), json_is_array(off) ? " of another length" : "");
    for (size_t i = 0; i < 2; i++) {
        const json_t *o = json_array_get(off, i);
        if (!get_count(o, i ? &p->end : &p->begin))
            return moe_fail(MOE_ERR_FORMAT,
                            "%s: tensor \"%s\": data_offsets[%zu] is %s, expected a "
                            "non-negative integer",
                            what, name, i, json_is_integer(o) ? "negative" : moe_st_json_kind(o));
    }
    if (p->begin > p->end)
        return moe_fail(MOE_ERR_FORMAT,
                        "%s: tensor \"%s\": data_offsets [%zu, %zu] have begin > end", what, name,
                        p->begin, p->end);
    if (p->end - p->begin != nbytes)
        return moe_fail(MOE_ERR_FORMAT,
                        "%s: tensor \"%s\": data_offsets [%zu, %zu] hold %zu bytes, but %zu "
                        "elements of %s need %zu bytes",
                        what, name, p->begin, p->end, p->end - p->begin, numel,
                        moe_dtype_name(p->dtype), nbytes);
    return MOE_OK;
}

static MOE_MUST_USE enum moe_status check_metadata(const char *what, const json_t *m)
{
    if (!json_is_object(m))
        return moe_fail(MOE_ERR_FORMAT, "%s: \"__metadata__\" is %s, expected an object of strings",
                        what, moe_st_json_kind(m));
    const char *k;
    const json_t *v;
    json_object_foreach((json_t *)m, k, v)
    {
        if (!json_is_string(v))
            return moe_fail(MOE_ERR_FORMAT,
                            "%s: \"__metadata__\" value of \"%s\" is %s, expected a string", what,
                            k, moe_st_json_kind(v));
    }
    return MOE_OK;
}

/* Sorts by (begin, end) as the reference does; the name breaks ties between
 * zero-size tensors so the set's order does not depend on qsort. */
static int cmp_pending(const void *a, const void *b)
{
    const struct pending *x = a, *y = b;
    if (x->begin != y->begin) return x->begin < y->begin ? -1 : 1;
    if (x->end != y->end) return x->end < y->end ? -1 : 1;
    return strcmp(x->name, y->name);
}

static uint64_t read_le64(const unsigned char *b)
{
    uint64_t n = 0;
    for (int i = 7; i >= 0; i--) n = (n << 8) | b[i];
    return n;
}

enum moe_status moe_safetensors_parse(struct moe_safetensors *st, const void *buf, size_t size,
                                      const char *what, int file)
{
    const unsigned char *bytes = buf;
    struct pending *ps = NULL;
    size_t np = 0;
    json_t *root = NULL, *merged = NULL;
    enum moe_status s;

    if (!what) what = "safetensors buffer";
    if (size < 8) {
        s = moe_fail(MOE_ERR_FORMAT,
                     "%s: file is %zu bytes, too short for the 8-byte header length", what, size);
        goto fail;
    }
    uint64_t n = read_le64(bytes);
    if (n > MOE_ST_MAX_HEADER) {
        s = moe_fail(MOE_ERR_FORMAT, "%s: header length %llu exceeds the limit of %llu bytes", what,
                     (unsigned long long)n, MOE_ST_MAX_HEADER);
        goto fail;
    }
    if (n > size - 8) {
        s = moe_fail(MOE_ERR_FORMAT,
                     "%s: header length %llu runs past the end of the file (8 + %llu > %zu bytes)",
                     what, (unsigned long long)n, (unsigned long long)n, size);
        goto fail;
    }
    const unsigned char *hdr = bytes + 8;
    /* Checked apart from JSON syntax, as the reference does, so the message
     * says which of the two is wrong. */
    for (size_t i = 0; i < n;) {
        utf8proc_int32_t cp;
        utf8proc_ssize_t r = utf8proc_iterate(hdr + i, (utf8proc_ssize_t)(n - i), &cp);
        if (r <= 0) {
            s = moe_fail(MOE_ERR_FORMAT,
                         "%s: header is not valid UTF-8 (bad byte 0x%02x at header offset %zu)",
                         what, hdr[i], i);
            goto fail;
        }
        i += (size_t)r;
    }
    /* Jansson skips whitespace on both sides of the value and rejects
     * anything else after it, which is what the reference accepts. */
    json_error_t err;
    root = json_loadb((const char *)hdr, (size_t)n, JSON_REJECT_DUPLICATES, &err);
    if (!root) {
        s = moe_fail(MOE_ERR_FORMAT, "%s: header is not valid JSON: %s (line %d, column %d)", what,
                     err.text, err.line, err.column);
        goto fail;
    }
    if (!json_is_object(root)) {
        s = moe_fail(MOE_ERR_FORMAT, "%s: header is %s, expected a JSON object", what,
                     moe_st_json_kind(root));
        goto fail;
    }

    ps = calloc(json_object_size(root) + 1, sizeof *ps);
    if (!ps) {
        s = moe_fail(MOE_ERR_NOMEM, "%s: out of memory for %zu header entries", what,
                     json_object_size(root));
        goto fail;
    }
    const json_t *meta = NULL;
    const char *key;
    json_t *val;
    json_object_foreach(root, key, val)
    {
        if (strcmp(key, "__metadata__") == 0) {
            /* The reference reads it as an Option, so null means absent. */
            if (json_is_null(val)) continue;
            s = check_metadata(what, val);
            if (s != MOE_OK) goto fail;
            meta = val;
            continue;
        }
        s = parse_entry(what, key, val, &ps[np]);
        if (s != MOE_OK) goto fail;
        ps[np].name = strdup(key);
        if (!ps[np].name) {
            s = moe_fail(MOE_ERR_NOMEM, "%s: out of memory", what);
            goto fail;
        }
        np++;
    }

    qsort(ps, np, sizeof *ps, cmp_pending);
    size_t expect = 0;
    for (size_t i = 0; i < np; i++) {
        if (ps[i].begin != expect) {
            if (ps[i].begin > expect)
                s = moe_fail(MOE_ERR_FORMAT,
                             "%s: tensor \"%s\": data starts at offset %zu, expected %zu (a gap of "
                             "%zu unused bytes before it)",
                             what, ps[i].name, ps[i].begin, expect, ps[i].begin - expect);
            else
                s = moe_fail(MOE_ERR_FORMAT,
                             "%s: tensor \"%s\": data starts at offset %zu, expected %zu (it "
                             "overlaps tensor \"%s\")",
                             what, ps[i].name, ps[i].begin, expect, ps[i - 1].name);
            goto fail;
        }
        expect = ps[i].end;
    }
    size_t buffer = size - 8 - (size_t)n;
    if (expect != buffer) {
        s = moe_fail(MOE_ERR_FORMAT,
                     "%s: data buffer is %zu bytes but the tensors cover %zu bytes (%s)", what,
                     buffer, expect, expect < buffer ? "trailing bytes" : "file truncated");
        goto fail;
    }
    for (size_t i = 0; i < np; i++) {
        const struct moe_st_tensor *t = moe_safetensors_find(st, ps[i].name);
        if (t) {
            s = moe_fail(MOE_ERR_FORMAT, "%s: tensor \"%s\" is already loaded from %s", what,
                         ps[i].name, moe_st_origin(st, t));
            goto fail;
        }
    }

    /* Everything that can fail happens before the set changes. */
    if (meta && json_object_size(meta) > 0) {
        merged = st->metadata ? json_copy(st->metadata) : json_object();
        if (!merged || json_object_update_missing(merged, (json_t *)meta) != 0) {
            s = moe_fail(MOE_ERR_NOMEM, "%s: out of memory for __metadata__", what);
            goto fail;
        }
    }
    size_t total;
    if (!moe_add_size(st->n_tensors, np, &total)) {
        s = moe_fail(MOE_ERR_NOMEM, "%s: too many tensors", what);
        goto fail;
    }
    s = reserve(st, total);
    if (s != MOE_OK) goto fail;

    const unsigned char *data = hdr + n;
    for (size_t i = 0; i < np; i++) {
        struct moe_st_tensor *t = &st->tensors[st->n_tensors];
        memset(t, 0, sizeof *t);
        t->name = ps[i].name;
        ps[i].name = NULL;
        t->dtype = ps[i].dtype;
        t->ndim = ps[i].ndim;
        memcpy(t->shape, ps[i].shape, sizeof t->shape);
        t->data = data + ps[i].begin;
        t->nbytes = ps[i].end - ps[i].begin;
        t->file = file;
        index_insert(st, st->n_tensors++);
    }
    if (merged) {
        json_decref(st->metadata);
        st->metadata = merged;
    }
    free(ps);
    json_decref(root);
    return MOE_OK;

fail:
    json_decref(merged);
    for (size_t i = 0; ps && i <= np; i++) free(ps[i].name);
    free(ps);
    json_decref(root);
    return s;
}

/* ---- files --------------------------------------------------------------- */

enum moe_status moe_safetensors_open_file(struct moe_safetensors *st, const char *path)
{
    int fd = -1;
    void *map = NULL;
    size_t size = 0;
    char *copy = NULL;
    enum moe_status s;

    fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        s = moe_fail(MOE_ERR_IO, "%s: cannot open: %s", path, strerror(errno));
        goto fail;
    }
    struct stat sb;
    if (fstat(fd, &sb) != 0) {
        s = moe_fail(MOE_ERR_IO, "%s: cannot stat: %s", path, strerror(errno));
        goto fail;
    }
    if (!S_ISREG(sb.st_mode)) {
        s = moe_fail(MOE_ERR_IO, "%s: not a regular file", path);
        goto fail;
    }
    size = (size_t)sb.st_size;
    if (size > 0) { /* mmap rejects length 0; parse reports the short file */
        map = mmap(NULL, size, PROT_READ, MAP_PRIVATE, fd, 0);
        if (map == MAP_FAILED) {
            map = NULL;
            s = moe_fail(MOE_ERR_IO, "%s: cannot map %zu bytes: %s", path, size, strerror(errno));
            goto fail;
        }
    }
    close(fd);
    fd = -1;

    copy = strdup(path);
    struct moe_st_file *files = realloc(st->files, ((size_t)st->n_files + 1) * sizeof *files);
    if (!copy || !files) {
        s = moe_fail(MOE_ERR_NOMEM, "%s: out of memory", path);
        goto fail;
    }
    st->files = files;
    s = moe_safetensors_parse(st, map, size, path, st->n_files);
    if (s != MOE_OK) goto fail;
    st->files[st->n_files++] = (struct moe_st_file){.path = copy, .map = map, .size = size};
    return MOE_OK;

fail:
    free(copy);
    if (map) munmap(map, size);
    if (fd >= 0) close(fd);
    return s;
}

/* ---- in-memory tensors --------------------------------------------------- */

enum moe_status moe_safetensors_add(struct moe_safetensors *st, const char *name,
                                    enum moe_dtype dtype, int ndim, const int64_t *shape,
                                    void *data)
{
    char *copy = NULL;
    enum moe_status s;
    const char *what = name ? name : "(null)";

    if (!st || !name || (unsigned)dtype >= MOE_DTYPE_COUNT || ndim < 0 || ndim > MOE_MAX_DIMS ||
        (ndim > 0 && !shape)) {
        s = moe_fail(MOE_ERR_INVALID_ARG, "safetensors_add \"%s\": bad set, name, dtype or ndim %d",
                     what, ndim);
        goto fail;
    }
    size_t nbytes = moe_dtype_size(dtype);
    for (int i = 0; i < ndim; i++) {
        if (shape[i] < 0) {
            s = moe_fail(MOE_ERR_INVALID_ARG, "safetensors_add \"%s\": shape[%d] is %lld", what, i,
                         (long long)shape[i]);
            goto fail;
        }
        if ((uint64_t)shape[i] > SIZE_MAX || !moe_mul_size(nbytes, (size_t)shape[i], &nbytes)) {
            s = moe_fail(MOE_ERR_NOMEM, "safetensors_add \"%s\": byte size overflows", what);
            goto fail;
        }
    }
    if (!data && nbytes > 0) {
        s = moe_fail(MOE_ERR_INVALID_ARG, "safetensors_add \"%s\": no data for %zu bytes", what,
                     nbytes);
        goto fail;
    }
    const struct moe_st_tensor *old = moe_safetensors_find(st, name);
    if (old) {
        s = moe_fail(MOE_ERR_INVALID_ARG, "safetensors_add \"%s\": already loaded from %s", what,
                     moe_st_origin(st, old));
        goto fail;
    }
    /* owned[] has no capacity field: it holds 8 slots, then doubles each
     * time its count reaches a power of two. */
    size_t no = st->n_owned;
    if (no == 0 || (no >= 8 && (no & (no - 1)) == 0)) {
        size_t cap = no ? no * 2 : 8;
        void **p = cap > no ? realloc(st->owned, cap * sizeof *p) : NULL;
        if (!p) {
            s = moe_fail(MOE_ERR_NOMEM, "safetensors_add \"%s\": out of memory", what);
            goto fail;
        }
        st->owned = p;
    }
    copy = strdup(name);
    if (!copy) {
        s = moe_fail(MOE_ERR_NOMEM, "safetensors_add \"%s\": out of memory", what);
        goto fail;
    }
    s = reserve(st, st->n_tensors + 1);
    if (s != MOE_OK) goto fail;

    struct moe_st_tensor *t = &st->tensors[st->n_tensors];
    memset(t, 0, sizeof *t);
    t->name = copy;
    t->dtype = dtype;
    t->ndim = ndim;
    for (int i = 0; i < ndim; i++) t->shape[i] = shape[i];
    t->data = data;
    t->nbytes = nbytes;
    t->file = -1;
    index_insert(st, st->n_tensors++);
    st->owned[st->n_owned++] = data;
    return MOE_OK;

fail:
    free(copy);
    free(data);
    return s;
}

void moe_safetensors_close(struct moe_safetensors *st)
{
    if (!st) return;
    for (int i = 0; i < st->n_files; i++) {
        if (st->files[i].map) munmap(st->files[i].map, st->files[i].size);
        free(st->files[i].path);
    }
    for (size_t i = 0; i < st->n_tensors; i++) free(st->tensors[i].name);
    for (size_t i = 0; i < st->n_owned; i++) free(st->owned[i]);
    free(st->files);
    free(st->tensors);
    free(st->owned);
    free(st->index);
    json_decref(st->metadata);
    memset(st, 0, sizeof *st);
}

static void drop_pages(const void *p, size_t n)
{
    const uintptr_t a = (uintptr_t)p, page = (uintptr_t)sysconf(_SC_PAGESIZE);
    const uintptr_t lo = (a + page - 1) / page * page, hi = (a + n) / page * page;
    if (lo < hi) (void)madvise((void *)lo, hi - lo, MADV_DONTNEED);
}

void moe_safetensors_release(const struct moe_safetensors *st, const void *p, size_t n,
                             bool files_only)
{
    const uintptr_t a = (uintptr_t)p;
    for (int i = 0; i < st->n_files; i++) {
        const uintptr_t m0 = (uintptr_t)st->files[i].map, m1 = m0 + st->files[i].size;
        if (!st->files[i].map || a < m0 || a + n > m1) continue;
        drop_pages(p, n);
        return;
    }
    if (files_only) return;
    for (size_t i = 0; i < st->n_tensors; i++) {
        const struct moe_st_tensor *t = &st->tensors[i];
        const uintptr_t t0 = (uintptr_t)t->data, t1 = t0 + t->nbytes;
        if (t->file >= 0 || !t->data || a < t0 || a + n > t1) continue;
        drop_pages(p, n);
        return;
    }
}
