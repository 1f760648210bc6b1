/* test_safetensors_dir.c - opening model folders: sharded checkpoints with
 * model.safetensors.index.json (shard names confined to the folder, each
 * tensor in the shard the index names), model.safetensors, and every
 * *.safetensors in name order. */
#include "tests/safetensors_testutil.h"

TestSuite(safetensors, .init = setup, .fini = teardown);

/* ---- folders -------------------------------------------------------------- */

#define SHARD1 "{\"a\":{\"dtype\":\"U8\",\"shape\":[2],\"data_offsets\":[0,2]}}"
#define SHARD2                                                                                     \
    "{\"b\":{\"dtype\":\"U8\",\"shape\":[3],\"data_offsets\":[0,3]},"                              \
    "\"c\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[3,4]}}"

/* Writes two valid shards and an index whose weight_map body is `map`. */
static void write_sharded(const char *map)
{
    write_raw("s-1.safetensors", SHARD1, 2);
    write_raw("s-2.safetensors", SHARD2, 4);
    char index[1024];
    snprintf(index, sizeof index, "{\"metadata\":{\"total_size\":6},\"weight_map\":{%s}}", map);
    write_text(tpath("model.safetensors.index.json"), index);
}

static void expect_dir_fails(enum moe_status want, const char *msg)
{
    struct moe_safetensors st = {0};
    enum moe_status s = moe_safetensors_open_dir(&st, tmpdir);
    cr_assert_eq(s, want, "status %s, want %s (message: %s)", moe_status_str(s),
                 moe_status_str(want), moe_last_error());
    cr_assert(strstr(moe_last_error(), msg), "message \"%s\" lacks \"%s\"", moe_last_error(), msg);
    cr_assert_eq(st.n_files, 0, "a failed open_dir must leave the set as it was");
    cr_assert_eq(st.n_tensors, 0);
    moe_safetensors_close(&st);
}

#define GOOD_MAP "\"a\":\"s-1.safetensors\",\"b\":\"s-2.safetensors\",\"c\":\"s-2.safetensors\""

Test(safetensors, sharded_index_opens_each_shard_once)
{
    write_sharded(GOOD_MAP);
    struct moe_safetensors st = {0};
    cr_assert_eq(moe_safetensors_open_dir(&st, tmpdir), MOE_OK, "%s", moe_last_error());
    cr_assert_eq(st.n_files, 2);
    cr_assert_eq(st.n_tensors, 3);
    const struct moe_st_tensor *a = moe_safetensors_find(&st, "a"),
                               *c = moe_safetensors_find(&st, "c");
    cr_assert(strstr(st.files[a->file].path, "s-1.safetensors"));
    cr_assert(strstr(st.files[c->file].path, "s-2.safetensors"));
    cr_assert_eq(((const unsigned char *)c->data)[0], 3);
    moe_safetensors_close(&st);
}

Test(safetensors, sharded_rejects_parent_shard_name)
{
    write_sharded(GOOD_MAP ",\"d\":\"../x.safetensors\"");
    expect_dir_fails(MOE_ERR_FORMAT,
                     "names shard \"../x.safetensors\", expected a plain file name");
}

Test(safetensors, sharded_rejects_absolute_shard_name)
{
    write_sharded(GOOD_MAP ",\"d\":\"/etc/passwd\"");
    expect_dir_fails(MOE_ERR_FORMAT, "names shard \"/etc/passwd\", expected a plain file name");
}

Test(safetensors, sharded_rejects_empty_shard_name)
{
    write_sharded("\"a\":\"\"");
    expect_dir_fails(MOE_ERR_FORMAT, "names shard \"\", expected a plain file name");
}

Test(safetensors, sharded_rejects_symlink_outside_folder)
{
    /* The model folder is tmpdir/m; its second shard links to tmpdir. */
    char model[128];
    snprintf(model, sizeof model, "%s/m", tmpdir);
    cr_assert_eq(mkdir(model, 0700), 0);
    write_raw("outside.safetensors", SHARD2, 4);
    write_raw("m/s-1.safetensors", SHARD1, 2);
    cr_assert_eq(symlink("../outside.safetensors", tpath("m/s-2.safetensors")), 0);
    write_text(tpath("m/model.safetensors.index.json"), "{\"weight_map\":{" GOOD_MAP "}}");
    struct moe_safetensors st = {0};
    cr_assert_eq(moe_safetensors_open_dir(&st, model), MOE_ERR_FORMAT, "%s", moe_last_error());
    cr_assert(strstr(moe_last_error(), "shard \"s-2.safetensors\" resolves to"), "%s",
              moe_last_error());
    cr_assert(strstr(moe_last_error(), "outside the model folder"), "%s", moe_last_error());
    cr_assert_eq(st.n_files, 0);
    moe_safetensors_close(&st);
    /* A link that stays inside the folder is fine. */
    cr_assert_eq(unlink(tpath("m/s-2.safetensors")), 0);
    write_raw("m/real-2.safetensors", SHARD2, 4);
    cr_assert_eq(symlink("real-2.safetensors", tpath("m/s-2.safetensors")), 0);
    cr_assert_eq(moe_safetensors_open_dir(&st, model), MOE_OK, "%s", moe_last_error());
    moe_safetensors_close(&st);
}

Test(safetensors, sharded_accepts_hub_cache_blobs_only)
{
    /* REPO/snapshots/REV/shard -> ../../blobs/HASH is the hub cache layout. */
    char model[192];
    cr_assert_eq(mkdir(tpath("repo"), 0700), 0);
    cr_assert_eq(mkdir(tpath("repo/blobs"), 0700), 0);
    cr_assert_eq(mkdir(tpath("repo/snapshots"), 0700), 0);
    cr_assert_eq(mkdir(tpath("repo/snapshots/abc"), 0700), 0);
    snprintf(model, sizeof model, "%s/repo/snapshots/abc", tmpdir);
    write_raw("repo/blobs/h1", SHARD1, 2);
    write_raw("repo/blobs/h2", SHARD2, 4);
    cr_assert_eq(symlink("../../blobs/h1", tpath("repo/snapshots/abc/s-1.safetensors")), 0);
    cr_assert_eq(symlink("../../blobs/h2", tpath("repo/snapshots/abc/s-2.safetensors")), 0);
    write_text(tpath("repo/snapshots/abc/model.safetensors.index.json"),
               "{\"weight_map\":{" GOOD_MAP "}}");
    struct moe_safetensors st = {0};
    cr_assert_eq(moe_safetensors_open_dir(&st, model), MOE_OK, "%s", moe_last_error());
    moe_safetensors_close(&st);
    /* but not a link out of the repository */
    write_raw("elsewhere", SHARD2, 4);
    cr_assert_eq(unlink(tpath("repo/snapshots/abc/s-2.safetensors")), 0);
    cr_assert_eq(symlink("../../../elsewhere", tpath("repo/snapshots/abc/s-2.safetensors")), 0);
    cr_assert_eq(moe_safetensors_open_dir(&st, model), MOE_ERR_FORMAT);
    cr_assert(strstr(moe_last_error(), "outside the model folder"), "%s", moe_last_error());
    moe_safetensors_close(&st);
}

Test(safetensors, sharded_rejects_tensor_missing_from_its_shard)
{
    write_sharded(GOOD_MAP ",\"d\":\"s-1.safetensors\"");
    expect_dir_fails(MOE_ERR_FORMAT,
                     "tensor \"d\" is listed in shard \"s-1.safetensors\", but that shard has no "
                     "such tensor");
}

Test(safetensors, sharded_rejects_tensor_in_another_shard)
{
    write_sharded("\"a\":\"s-1.safetensors\",\"b\":\"s-2.safetensors\",\"c\":\"s-1.safetensors\"");
    expect_dir_fails(MOE_ERR_FORMAT, "tensor \"c\" is listed in shard \"s-1.safetensors\", but "
                                     "found in");
}

Test(safetensors, sharded_rejects_tensor_listed_twice)
{
    write_sharded(GOOD_MAP ",\"a\":\"s-1.safetensors\"");
    expect_dir_fails(MOE_ERR_FORMAT, "duplicate object key");
}

Test(safetensors, sharded_rejects_missing_shard_file)
{
    write_sharded(GOOD_MAP ",\"d\":\"s-3.safetensors\"");
    expect_dir_fails(MOE_ERR_IO, "shard \"s-3.safetensors\": ");
    cr_assert(strstr(moe_last_error(), "No such file"), "%s", moe_last_error());
}

Test(safetensors, sharded_rejects_bad_weight_map)
{
    write_text(tpath("model.safetensors.index.json"), "{\"weight_map\":[]}");
    expect_dir_fails(MOE_ERR_FORMAT, "\"weight_map\" is an array");
    write_text(tpath("model.safetensors.index.json"), "{\"weight_map\":{\"a\":1}}");
    expect_dir_fails(MOE_ERR_FORMAT, "weight_map[\"a\"] is an integer");
    write_text(tpath("model.safetensors.index.json"), "{\"weight_map\":");
    expect_dir_fails(MOE_ERR_FORMAT, "not valid JSON");
}

Test(safetensors, folder_prefers_model_safetensors)
{
    write_raw("model.safetensors", SHARD1, 2);
    write_raw("other.safetensors", SHARD2, 4);
    struct moe_safetensors st = {0};
    cr_assert_eq(moe_safetensors_open_dir(&st, tmpdir), MOE_OK, "%s", moe_last_error());
    cr_assert_eq(st.n_files, 1);
    cr_assert_not_null(moe_safetensors_find(&st, "a"));
    cr_assert_null(moe_safetensors_find(&st, "b"));
    moe_safetensors_close(&st);
}

Test(safetensors, folder_without_index_opens_all_in_name_order)
{
    write_raw("z.safetensors", SHARD1, 2);
    write_raw("y.safetensors", SHARD2, 4);
    write_raw(".hidden.safetensors", GOOD_HEADER, 16);
    write_text(tpath("notes.txt"), "not a checkpoint");
    struct moe_safetensors st = {0};
    cr_assert_eq(moe_safetensors_open_dir(&st, tmpdir), MOE_OK, "%s", moe_last_error());
    cr_assert_eq(st.n_files, 2);
    cr_assert(strstr(st.files[0].path, "y.safetensors"));
    cr_assert(strstr(st.files[1].path, "z.safetensors"));
    cr_assert_null(moe_safetensors_find(&st, "w"));
    moe_safetensors_close(&st);
}

Test(safetensors, folder_with_no_safetensors_is_io_error)
{
    write_text(tpath("config.json"), "{}");
    expect_dir_fails(MOE_ERR_IO, "no .safetensors file in");
    cr_assert(strstr(moe_last_error(), tmpdir));
}

Test(safetensors, failed_folder_keeps_earlier_tensors)
{
    struct moe_safetensors st = {0};
    cr_assert_eq(moe_safetensors_add(&st, "mem", MOE_DTYPE_U8, 1, (int64_t[]){1}, malloc(1)),
                 MOE_OK);
    write_raw("a.safetensors", SHARD1, 2);
    write_raw("b.safetensors", "{\"mem\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,1]}}",
              1);
    cr_assert_eq(moe_safetensors_open_dir(&st, tmpdir), MOE_ERR_FORMAT);
    cr_assert(strstr(moe_last_error(), "\"mem\" is already loaded from an in-memory tensor"), "%s",
              moe_last_error());
    cr_assert_eq(st.n_files, 0);
    cr_assert_eq(st.n_tensors, 1);
    cr_assert_null(moe_safetensors_find(&st, "a"));
    cr_assert_not_null(moe_safetensors_find(&st, "mem"));
    moe_safetensors_close(&st);
}
