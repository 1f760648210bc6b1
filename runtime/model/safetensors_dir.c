/* safetensors_dir.c - opening a model folder (see safetensors.h).
 *
 * Resolution order, as Hugging Face transformers loads a checkpoint folder:
 * model.safetensors.index.json if present, else model.safetensors, else every
 * *.safetensors file in byte order of name.  The index is trusted no further
 * than the folder: shard names must be plain file names, and a shard that
 * resolves (through symlinks) outside realpath(dir) is rejected, except
 * the blobs of a Hugging Face cache snapshot (see inside_hf_blobs).  Every
 * tensor the index names must be in exactly the shard it names.
 *
 * A failed open_dir leaves the set as it was before the call. */
#include "runtime/model/safetensors.h"
#include "runtime/model/safetensors_impl.h"

#include <dirent.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#define INDEX_NAME "model.safetensors.index.json"
#define SINGLE_NAME "model.safetensors"
#define SUFFIX ".safetensors"

static char *path_join(const char *dir, const char *name)
{
    size_t n = strlen(dir) + strlen(name) + 2;
    char *p = malloc(n);
    if (p) snprintf(p, n, "%s/%s", dir, name);
    return p;
}

/* A shard name from the index must name a file directly inside the folder. */
static bool plain_file_name(const char *s)
{
    return s[0] != '\0' && strchr(s, '/') == NULL && strcmp(s, ".") != 0 && strcmp(s, "..") != 0;
}

/* True if path resolves to a location strictly inside the resolved folder. */
static bool inside(const char *real_dir, const char *real_path)
{
    size_t n = strlen(real_dir);
    if (n > 0 && real_dir[n - 1] == '/') n--; /* real_dir is "/" */
    return strncmp(real_path, real_dir, n) == 0 && real_path[n] == '/';
}

/* The Hugging Face hub cache keeps a revision in REPO/snapshots/REV/ whose
 * files are symlinks to REPO/blobs/HASH: those links are part of the same
 * checkout, so they are allowed, and nothing else outside the folder. */
static bool inside_hf_blobs(const char *real_dir, const char *real_path)
{
    const char *rev = strrchr(real_dir, '/');
    if (!rev || rev == real_dir) return false;
    size_t snap_end = (size_t)(rev - real_dir); /* ".../snapshots" */
    static const char snapshots[] = "/snapshots";
    const size_t ls = sizeof snapshots - 1;
    if (snap_end < ls || strncmp(real_dir + snap_end - ls, snapshots, ls) != 0) return false;
    size_t repo_len = snap_end - ls;
    static const char blobs[] = "/blobs/";
    return strncmp(real_path, real_dir, repo_len) == 0 &&
           strncmp(real_path + repo_len, blobs, sizeof blobs - 1) == 0 &&
           strchr(real_path + repo_len + sizeof blobs - 1, '/') == NULL;
}

static MOE_MUST_USE enum moe_status open_index(struct moe_safetensors *st, const char *dir,
                                               const char *index_path)
{
    json_t *root = NULL, *shards = NULL;
    char *real_dir = NULL, *path = NULL, *real = NULL;
    enum moe_status s;

    FILE *f = fopen(index_path, "rb");
    if (!f) {
        s = moe_fail(MOE_ERR_IO, "%s: cannot open: %s", index_path, strerror(errno));
        goto fail;
    }
    json_error_t err;
    root = json_loadf(f, JSON_REJECT_DUPLICATES, &err);
    fclose(f);
    if (!root) {
        s = moe_fail(MOE_ERR_FORMAT, "%s: not valid JSON: %s (line %d, column %d)", index_path,
                     err.text, err.line, err.column);
        goto fail;
    }
    json_t *map = json_object_get(root, "weight_map");
    if (!json_is_object(map)) {
        s = moe_fail(MOE_ERR_FORMAT,
                     "%s: \"weight_map\" is %s, expected an object of tensor "
                     "name -> shard file",
                     index_path, map ? moe_st_json_kind(map) : "missing");
        goto fail;
    }
    real_dir = realpath(dir, NULL);
    if (!real_dir) {
        s = moe_fail(MOE_ERR_IO, "%s: cannot resolve: %s", dir, strerror(errno));
        goto fail;
    }
    shards = json_object(); /* shard name -> index in st->files */
    if (!shards) {
        s = moe_fail(MOE_ERR_NOMEM, "%s: out of memory", index_path);
        goto fail;
    }

    const char *name;
    json_t *v;
    json_object_foreach(map, name, v)
    {
        if (!json_is_string(v)) {
            s = moe_fail(MOE_ERR_FORMAT, "%s: weight_map[\"%s\"] is %s, expected a shard file name",
                         index_path, name, moe_st_json_kind(v));
            goto fail;
        }
        const char *shard = json_string_value(v);
        if (json_object_get(shards, shard)) continue;
        if (!plain_file_name(shard)) {
            s = moe_fail(MOE_ERR_FORMAT,
                         "%s: weight_map[\"%s\"] names shard \"%s\", expected a plain file name "
                         "inside %s",
                         index_path, name, shard, dir);
            goto fail;
        }
        path = path_join(dir, shard);
        if (!path) {
            s = moe_fail(MOE_ERR_NOMEM, "%s: out of memory", index_path);
            goto fail;
        }
        int file = st->n_files;
        s = moe_safetensors_open_file(st, path);
        if (s != MOE_OK) {
            moe_error_prefix("%s: shard \"%s\": ", index_path, shard);
            goto fail;
        }
        /* A plain name can still be a symlink that leads elsewhere. */
        real = realpath(path, NULL);
        if (!real) {
            s = moe_fail(MOE_ERR_IO, "%s: cannot resolve: %s", path, strerror(errno));
            goto fail;
        }
        if (!inside(real_dir, real) && !inside_hf_blobs(real_dir, real)) {
            s = moe_fail(MOE_ERR_FORMAT,
                         "%s: shard \"%s\" resolves to %s, outside the model folder %s", index_path,
                         shard, real, real_dir);
            goto fail;
        }
        free(real);
        real = NULL;
        free(path);
        path = NULL;
        if (json_object_set_new(shards, shard, json_integer(file)) != 0) {
            s = moe_fail(MOE_ERR_NOMEM, "%s: out of memory", index_path);
            goto fail;
        }
    }
    json_object_foreach(map, name, v)
    {
        const char *shard = json_string_value(v);
        int want = (int)json_integer_value(json_object_get(shards, shard));
        const struct moe_st_tensor *t = moe_safetensors_find(st, name);
        if (!t) {
            s = moe_fail(MOE_ERR_FORMAT,
                         "%s: tensor \"%s\" is listed in shard \"%s\", but that shard has no such "
                         "tensor",
                         index_path, name, shard);
            goto fail;
        }
        if (t->file != want) {
            s = moe_fail(MOE_ERR_FORMAT,
                         "%s: tensor \"%s\" is listed in shard \"%s\", but found in %s", index_path,
                         name, shard, moe_st_origin(st, t));
            goto fail;
        }
    }
    s = MOE_OK;

fail:
    free(real);
    free(path);
    free(real_dir);
    json_decref(shards);
    json_decref(root);
    return s;
}

static int is_safetensors_name(const struct dirent *e)
{
    size_t n = strlen(e->d_name), k = strlen(SUFFIX);
    /* Like the shell glob *.safetensors: hidden files are not matched. */
    return e->d_name[0] != '.' && n > k && strcmp(e->d_name + n - k, SUFFIX) == 0;
}

/* Byte order, not the locale's collation, so every machine agrees. */
static int cmp_dirent(const struct dirent **a, const struct dirent **b)
{
    return strcmp((*a)->d_name, (*b)->d_name);
}

static MOE_MUST_USE enum moe_status open_all(struct moe_safetensors *st, const char *dir)
{
    struct dirent **list = NULL;
    int n = scandir(dir, &list, is_safetensors_name, cmp_dirent);
    if (n < 0) return moe_fail(MOE_ERR_IO, "%s: cannot list folder: %s", dir, strerror(errno));
    enum moe_status s = MOE_OK;
    if (n == 0) s = moe_fail(MOE_ERR_IO, "no .safetensors file in %s", dir);
    for (int i = 0; i < n && s == MOE_OK; i++) {
        char *path = path_join(dir, list[i]->d_name);
        s = path ? moe_safetensors_open_file(st, path)
                 : moe_fail(MOE_ERR_NOMEM, "%s: out of memory", dir);
        free(path);
    }
    for (int i = 0; i < n; i++) free(list[i]);
    free(list);
    return s;
}

enum moe_status moe_safetensors_open_dir(struct moe_safetensors *st, const char *dir)
{
    int nf = st->n_files;
    size_t nt = st->n_tensors;
    /* parse() swaps in a new metadata object rather than editing the old
     * one, so holding a reference is enough to restore it. */
    json_t *meta0 = json_incref(st->metadata);
    char *index_path = path_join(dir, INDEX_NAME), *single = path_join(dir, SINGLE_NAME);
    enum moe_status s;
    struct stat sb;

    if (!index_path || !single) {
        s = moe_fail(MOE_ERR_NOMEM, "%s: out of memory", dir);
    } else if (stat(index_path, &sb) == 0) {
        s = open_index(st, dir, index_path);
    } else if (errno != ENOENT) {
        s = moe_fail(MOE_ERR_IO, "%s: cannot stat: %s", index_path, strerror(errno));
    } else if (stat(single, &sb) == 0) {
        s = moe_safetensors_open_file(st, single);
    } else {
        s = open_all(st, dir);
    }
    if (s != MOE_OK) {
        moe_st_truncate(st, nf, nt);
        json_decref(st->metadata);
        st->metadata = meta0;
    } else {
        json_decref(meta0);
    }
    free(index_path);
    free(single);
    return s;
}
