/* test_safetensors.c - safetensors reader and writer, and robustness
 * against malformed headers (folders are in test_safetensors_dir.c).
 *
 * Malformed files are built from header strings written here, so each case
 * names exactly one violation; the expected bytes of the writer come from the
 * reference implementation's own tests (safetensors/src/tensor.rs). */
#include "tests/safetensors_testutil.h"
#include "tests/testutil.h"

TestSuite(safetensors, .init = setup, .fini = teardown);

/* ---- valid files ---------------------------------------------------------- */

Test(safetensors, round_trip_through_write_and_open)
{
    float f32[6];
    tu_fill_uniform(f32, 6, 1, -1, 1);
    uint16_t bf16[3] = {0x3f80, 0x4000, 0xc040}; /* odd count: would misalign later F32 data */
    int32_t i32[4] = {-7, 0, 1 << 30, 42};
    void *bufs[3] = {malloc(sizeof f32), malloc(sizeof bf16), malloc(sizeof i32)};
    memcpy(bufs[0], f32, sizeof f32);
    memcpy(bufs[1], bf16, sizeof bf16);
    memcpy(bufs[2], i32, sizeof i32);

    struct moe_safetensors mem = {0};
    cr_assert_eq(moe_safetensors_add(&mem, "b.bf16", MOE_DTYPE_BF16, 1, (int64_t[]){3}, bufs[1]),
                 MOE_OK);
    cr_assert_eq(moe_safetensors_add(&mem, "a.f32", MOE_DTYPE_F32, 2, (int64_t[]){2, 3}, bufs[0]),
                 MOE_OK);
    cr_assert_eq(moe_safetensors_add(&mem, "c.i32", MOE_DTYPE_I32, 1, (int64_t[]){4}, bufs[2]),
                 MOE_OK);
    cr_assert_eq(moe_safetensors_add(&mem, "d.empty", MOE_DTYPE_F32, 2, (int64_t[]){0, 5}, NULL),
                 MOE_OK);
    const struct moe_st_tensor *list[4];
    for (int i = 0; i < 4; i++) list[i] = &mem.tensors[i];
    json_t *meta = json_pack("{s:s, s:s}", "format", "pt", "note", "round trip");
    const char *path = tpath("rt.safetensors");
    cr_assert_eq(moe_safetensors_write(path, list, 4, meta), MOE_OK, "%s", moe_last_error());
    cr_assert_neq(access(tpath("rt.safetensors.tmp"), F_OK), 0, "temporary file left behind");

    struct moe_safetensors st = {0};
    cr_assert_eq(moe_safetensors_open_file(&st, path), MOE_OK, "%s", moe_last_error());
    cr_assert_eq(st.n_tensors, 4);
    cr_assert_eq(st.n_files, 1);
    for (int i = 0; i < 4; i++) {
        const struct moe_st_tensor *a = &mem.tensors[i], *b = moe_safetensors_find(&st, a->name);
        cr_assert(b, "%s missing after round trip", a->name);
        cr_assert_eq(b->dtype, a->dtype);
        cr_assert_eq(b->ndim, a->ndim);
        for (int d = 0; d < a->ndim; d++) cr_assert_eq(b->shape[d], a->shape[d]);
        cr_assert_eq(b->nbytes, a->nbytes);
        cr_assert_eq(b->file, 0);
        if (a->nbytes) cr_assert_eq(memcmp(a->data, b->data, a->nbytes), 0, "%s data", a->name);
        /* Widest dtypes first keeps every tensor aligned to its element. */
        cr_assert_eq((uintptr_t)b->data % moe_dtype_size(b->dtype), 0, "%s misaligned", a->name);
    }
    cr_assert_str_eq(json_string_value(json_object_get(st.metadata, "format")), "pt");
    cr_assert_str_eq(json_string_value(json_object_get(st.metadata, "note")), "round trip");
    cr_assert_null(moe_safetensors_find(&st, "absent"));
    json_decref(meta);
    moe_safetensors_close(&st);
    moe_safetensors_close(&mem);
}

/* The exact bytes of the reference's test_serialization and test_empty. */
Test(safetensors, write_matches_reference_bytes)
{
    float v[6] = {0, 1, 2, 3, 4, 5};
    struct moe_st_tensor t = {.name = "attn.0",
                              .dtype = MOE_DTYPE_F32,
                              .ndim = 3,
                              .shape = {1, 2, 3},
                              .data = v,
                              .nbytes = sizeof v,
                              .file = -1};
    const struct moe_st_tensor *list[] = {&t};
    const char *hdr = "{\"attn.0\":{\"dtype\":\"F32\",\"shape\":[1,2,3],\"data_offsets\":[0,24]}}";
    struct {
        const struct moe_st_tensor *const *list;
        size_t n;
        json_t *meta;
        const char *header; /* unpadded */
    } cases[] = {
        {list, 1, NULL, hdr},
        {NULL, 0, NULL, "{}"},
        {NULL, 0, json_pack("{s:s}", "framework", "pt"),
         "{\"__metadata__\":{\"framework\":\"pt\"}}"},
    };
    for (size_t c = 0; c < 3; c++) {
        const char *path = tpath("ref.safetensors");
        cr_assert_eq(moe_safetensors_write(path, cases[c].list, cases[c].n, cases[c].meta), MOE_OK,
                     "%s", moe_last_error());
        size_t h = strlen(cases[c].header), padded = (h + 7) / 8 * 8;
        size_t data = cases[c].n ? sizeof v : 0, size = 8 + padded + data;
        unsigned char want[256] = {0}, got[256];
        want[0] = (unsigned char)padded;
        memcpy(want + 8, cases[c].header, h);
        memset(want + 8 + h, ' ', padded - h);
        memcpy(want + 8 + padded, v, data);
        FILE *f = fopen(path, "rb");
        cr_assert(f);
        size_t got_n = fread(got, 1, sizeof got, f);
        fclose(f);
        cr_assert_eq(got_n, size, "case %zu: %zu bytes, want %zu", c, got_n, size);
        cr_assert_eq(memcmp(got, want, size), 0, "case %zu: bytes differ", c);
        json_decref(cases[c].meta);
    }
}

Test(safetensors, write_orders_by_alignment_then_name)
{
    uint8_t u8[1] = {1};
    uint16_t f16[1] = {2};
    double f64[1] = {3};
    struct moe_st_tensor a = {
        .name = "a", .dtype = MOE_DTYPE_U8, .ndim = 1, .shape = {1}, .data = u8, .nbytes = 1};
    struct moe_st_tensor b = {
        .name = "b", .dtype = MOE_DTYPE_F16, .ndim = 1, .shape = {1}, .data = f16, .nbytes = 2};
    struct moe_st_tensor c = {
        .name = "c", .dtype = MOE_DTYPE_F64, .ndim = 1, .shape = {1}, .data = f64, .nbytes = 8};
    struct moe_st_tensor d = {
        .name = "d", .dtype = MOE_DTYPE_F16, .ndim = 1, .shape = {1}, .data = f16, .nbytes = 2};
    const struct moe_st_tensor *list[] = {&d, &a, &b, &c};
    const char *path = tpath("order.safetensors");
    cr_assert_eq(moe_safetensors_write(path, list, 4, NULL), MOE_OK, "%s", moe_last_error());
    struct moe_safetensors st = {0};
    cr_assert_eq(moe_safetensors_open_file(&st, path), MOE_OK, "%s", moe_last_error());
    const char *want[] = {"c", "b", "d", "a"}; /* F64, F16 by name, U8 */
    for (int i = 0; i < 4; i++) cr_assert_str_eq(st.tensors[i].name, want[i]);
    moe_safetensors_close(&st);
}

Test(safetensors, write_rejects_bad_tensors_and_leaves_no_file)
{
    float v[4] = {0};
    struct moe_st_tensor t = {
        .name = "x", .dtype = MOE_DTYPE_F32, .ndim = 1, .shape = {4}, .data = v, .nbytes = 12};
    const struct moe_st_tensor *list[] = {&t, &t};
    const char *path = tpath("w.safetensors");
    cr_assert_eq(moe_safetensors_write(path, list, 1, NULL), MOE_ERR_INVALID_ARG);
    cr_assert(strstr(moe_last_error(), "need 16"), "%s", moe_last_error());
    t.nbytes = 16;
    cr_assert_eq(moe_safetensors_write(path, list, 2, NULL), MOE_ERR_INVALID_ARG);
    cr_assert(strstr(moe_last_error(), "twice"), "%s", moe_last_error());
    json_t *meta = json_pack("{s:i}", "n", 1);
    cr_assert_eq(moe_safetensors_write(path, list, 1, meta), MOE_ERR_INVALID_ARG);
    json_decref(meta);
    cr_assert_neq(access(path, F_OK), 0);
    cr_assert_neq(access(tpath("w.safetensors.tmp"), F_OK), 0);
    /* A folder that does not exist: an i/o error naming the file. */
    cr_assert_eq(moe_safetensors_write(tpath("no/such/dir.safetensors"), list, 1, NULL),
                 MOE_ERR_IO);
    cr_assert(strstr(moe_last_error(), "no/such/dir.safetensors.tmp"), "%s", moe_last_error());
}

Test(safetensors, accepts_whitespace_around_json)
{
    const char *path = write_raw("ws.safetensors", " \n\t" GOOD_HEADER "\r\n    ", 16);
    struct moe_safetensors st = {0};
    cr_assert_eq(moe_safetensors_open_file(&st, path), MOE_OK, "%s", moe_last_error());
    const struct moe_st_tensor *t = moe_safetensors_find(&st, "w");
    cr_assert(t);
    cr_assert_eq(t->nbytes, 16);
    cr_assert_eq(((const unsigned char *)t->data)[5], 5);
    moe_safetensors_close(&st);
}

Test(safetensors, accepts_zero_size_scalar_and_unknown_keys)
{
    /* Two zero-size tensors share offset 4 with a scalar before them; an
     * unknown key is ignored as the reference does. */
    const char *hdr = "{\"s\":{\"dtype\":\"I32\",\"shape\":[],\"data_offsets\":[0,4]},"
                      "\"z\":{\"dtype\":\"BF16\",\"shape\":[3,0],\"data_offsets\":[4,4]},"
                      "\"y\":{\"dtype\":\"U8\",\"shape\":[0],\"data_offsets\":[4,4],\"extra\":1}}";
    struct moe_safetensors st = {0};
    cr_assert_eq(moe_safetensors_open_file(&st, write_raw("z.safetensors", hdr, 4)), MOE_OK, "%s",
                 moe_last_error());
    cr_assert_eq(st.n_tensors, 3);
    cr_assert_str_eq(st.tensors[0].name, "s");
    cr_assert_str_eq(st.tensors[1].name, "y"); /* ties broken by name */
    cr_assert_eq(moe_safetensors_find(&st, "s")->ndim, 0);
    cr_assert_eq(moe_safetensors_find(&st, "z")->nbytes, 0);
    moe_safetensors_close(&st);

    /* A null __metadata__ reads as none, as in the reference. */
    cr_assert_eq(
        moe_safetensors_open_file(&st, write_raw("n.safetensors", "{\"__metadata__\":null}", 0)),
        MOE_OK, "%s", moe_last_error());
    cr_assert_null(st.metadata);
    moe_safetensors_close(&st);

    /* A header with no tensors and an empty buffer is a valid file. */
    cr_assert_eq(moe_safetensors_open_file(&st, write_raw("e.safetensors", "{}      ", 0)), MOE_OK,
                 "%s", moe_last_error());
    cr_assert_eq(st.n_tensors, 0);
    moe_safetensors_close(&st);
}

/* ---- malformed files: one violation each ---------------------------------- */

Test(safetensors, missing_file_is_io_error)
{
    expect_open_fails(tpath("nope.safetensors"), MOE_ERR_IO, "No such file");
}

Test(safetensors, rejects_empty_file)
{
    const char *p = tpath("empty.safetensors");
    write_bytes(p, "", 0);
    expect_open_fails(p, MOE_ERR_FORMAT, "too short for the 8-byte header length");
}

Test(safetensors, rejects_7_byte_file)
{
    const char *p = tpath("seven.safetensors");
    write_bytes(p, "\x02\0\0\0\0\0\0", 7);
    expect_open_fails(p, MOE_ERR_FORMAT, "7 bytes, too short");
}

Test(safetensors, rejects_header_length_zero)
{
    expect_header_fails("", 0, "header is not valid JSON");
}

Test(safetensors, rejects_header_length_7)
{
    expect_header_fails("{\"a\":{}", 0, "header is not valid JSON");
}

Test(safetensors, rejects_header_over_limit)
{
    size_t size;
    unsigned char *b = build("{}", 0, 100000001, &size);
    write_bytes(tpath("big.safetensors"), b, size);
    free(b);
    expect_open_fails(tpath("big.safetensors"), MOE_ERR_FORMAT,
                      "header length 100000001 exceeds the limit");
    b = build("{}", 0, 0x7fffffffffffffffll, &size);
    memset(b, 0xff, 8); /* 2^64 - 1 */
    write_bytes(tpath("huge.safetensors"), b, size);
    free(b);
    expect_open_fails(tpath("huge.safetensors"), MOE_ERR_FORMAT,
                      "header length 18446744073709551615 exceeds");
}

Test(safetensors, rejects_header_past_end_of_file)
{
    size_t size;
    unsigned char *b = build(GOOD_HEADER, 0, 1000, &size);
    write_bytes(tpath("past.safetensors"), b, size);
    free(b);
    expect_open_fails(tpath("past.safetensors"), MOE_ERR_FORMAT, "runs past the end of the file");
}

Test(safetensors, rejects_invalid_utf8)
{
    expect_header_fails("{\"w\xc3\x28\":{\"dtype\":\"F32\",\"shape\":[],\"data_offsets\":[0,4]}}",
                        4, "not valid UTF-8");
}

Test(safetensors, rejects_invalid_json)
{
    expect_header_fails("{\"w\":{\"dtype\":\"F32\",}", 0, "header is not valid JSON");
}

Test(safetensors, rejects_trailing_garbage_after_json)
{
    expect_header_fails(GOOD_HEADER " x", 16, "header is not valid JSON");
}

Test(safetensors, rejects_non_object_json)
{
    expect_header_fails("[1, 2]  ", 0, "header is an array, expected a JSON object");
}

Test(safetensors, rejects_duplicate_tensor_name)
{
    expect_header_fails("{\"w\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,1]},"
                        "\"w\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[1,2]}}",
                        2, "duplicate object key");
}

Test(safetensors, rejects_metadata_not_object)
{
    expect_header_fails("{\"__metadata__\":[\"a\"]}", 0,
                        "\"__metadata__\" is an array, expected an object of strings");
}

Test(safetensors, rejects_metadata_non_string_value)
{
    expect_header_fails("{\"__metadata__\":{\"ok\":\"x\",\"n\":3}}", 0,
                        "\"__metadata__\" value of \"n\" is an integer, expected a string");
}

Test(safetensors, rejects_entry_not_object)
{
    expect_header_fails("{\"w\":[1,2]}", 0, "tensor \"w\": entry is an array");
}

Test(safetensors, rejects_missing_dtype)
{
    expect_header_fails("{\"w\":{\"shape\":[1],\"data_offsets\":[0,4]}}", 4,
                        "tensor \"w\": missing \"dtype\"");
}

Test(safetensors, rejects_non_string_dtype)
{
    expect_header_fails("{\"w\":{\"dtype\":4,\"shape\":[1],\"data_offsets\":[0,4]}}", 4,
                        "tensor \"w\": \"dtype\" is an integer, expected a string");
}

Test(safetensors, rejects_unknown_dtype)
{
    expect_header_fails("{\"w\":{\"dtype\":\"F4\",\"shape\":[1],\"data_offsets\":[0,1]}}", 1,
                        "tensor \"w\": unknown dtype \"F4\"");
}

Test(safetensors, rejects_missing_shape)
{
    expect_header_fails("{\"w\":{\"dtype\":\"F32\",\"data_offsets\":[0,4]}}", 4,
                        "tensor \"w\": missing \"shape\"");
}

Test(safetensors, rejects_shape_not_array)
{
    expect_header_fails("{\"w\":{\"dtype\":\"F32\",\"shape\":4,\"data_offsets\":[0,16]}}", 16,
                        "tensor \"w\": \"shape\" is an integer, expected an array");
}

Test(safetensors, rejects_negative_shape)
{
    expect_header_fails("{\"w\":{\"dtype\":\"F32\",\"shape\":[2,-2],\"data_offsets\":[0,16]}}", 16,
                        "tensor \"w\": shape[1] is -2, expected a non-negative integer");
}

Test(safetensors, rejects_float_shape)
{
    expect_header_fails("{\"w\":{\"dtype\":\"F32\",\"shape\":[2.0,2],\"data_offsets\":[0,16]}}", 16,
                        "tensor \"w\": shape[0] is a real number");
}

Test(safetensors, rejects_too_many_dims)
{
    expect_header_fails("{\"w\":{\"dtype\":\"U8\",\"shape\":[1,1,1,1,1,1,1,1,1],"
                        "\"data_offsets\":[0,1]}}",
                        1, "shape has 9 dimensions, at most 8 supported");
}

Test(safetensors, rejects_shape_product_overflow)
{
    /* 2^32 * 2^32 overflows before the trailing 0 is reached. */
    expect_header_fails("{\"w\":{\"dtype\":\"F32\",\"shape\":[4294967296,4294967296,0],"
                        "\"data_offsets\":[0,0]}}",
                        0, "element count of the shape overflows at shape[1]");
}

Test(safetensors, rejects_shape_too_big_for_json_integer)
{
    expect_header_fails("{\"w\":{\"dtype\":\"F32\",\"shape\":[99999999999999999999],"
                        "\"data_offsets\":[0,0]}}",
                        0, "too big integer");
}

Test(safetensors, rejects_byte_size_overflow)
{
    /* 2^62 elements fit in size_t; 2^62 * 4 bytes do not. */
    expect_header_fails("{\"w\":{\"dtype\":\"F32\",\"shape\":[4611686018427387904],"
                        "\"data_offsets\":[0,0]}}",
                        0, "byte size overflows");
}

Test(safetensors, rejects_missing_offsets)
{
    expect_header_fails("{\"w\":{\"dtype\":\"F32\",\"shape\":[1]}}", 4,
                        "tensor \"w\": missing \"data_offsets\"");
}

Test(safetensors, rejects_offsets_wrong_length)
{
    expect_header_fails("{\"w\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4,8]}}", 4,
                        "\"data_offsets\" must be [begin, end], found an array of another length");
}

Test(safetensors, rejects_float_offsets)
{
    expect_header_fails("{\"w\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4.0]}}", 4,
                        "data_offsets[1] is a real number");
}

Test(safetensors, rejects_negative_offsets)
{
    expect_header_fails("{\"w\":{\"dtype\":\"U8\",\"shape\":[0],\"data_offsets\":[-1,-1]}}", 0,
                        "data_offsets[0] is negative");
}

Test(safetensors, rejects_begin_after_end)
{
    expect_header_fails("{\"w\":{\"dtype\":\"U8\",\"shape\":[0],\"data_offsets\":[4,0]}}", 4,
                        "data_offsets [4, 0] have begin > end");
}

Test(safetensors, rejects_size_mismatch)
{
    expect_header_fails("{\"w\":{\"dtype\":\"F32\",\"shape\":[2,2],\"data_offsets\":[0,12]}}", 12,
                        "tensor \"w\": data_offsets [0, 12] hold 12 bytes, but 4 elements of F32 "
                        "need 16 bytes");
}

Test(safetensors, rejects_gap_between_tensors)
{
    expect_header_fails("{\"a\":{\"dtype\":\"U8\",\"shape\":[2],\"data_offsets\":[0,2]},"
                        "\"b\":{\"dtype\":\"U8\",\"shape\":[2],\"data_offsets\":[3,5]}}",
                        5, "tensor \"b\": data starts at offset 3, expected 2 (a gap");
}

Test(safetensors, rejects_first_tensor_not_at_zero)
{
    expect_header_fails("{\"a\":{\"dtype\":\"U8\",\"shape\":[2],\"data_offsets\":[1,3]}}", 3,
                        "tensor \"a\": data starts at offset 1, expected 0");
}

Test(safetensors, rejects_overlapping_tensors)
{
    expect_header_fails(
        "{\"a\":{\"dtype\":\"U8\",\"shape\":[4],\"data_offsets\":[0,4]},"
        "\"b\":{\"dtype\":\"U8\",\"shape\":[2],\"data_offsets\":[2,4]}}",
        4, "tensor \"b\": data starts at offset 2, expected 4 (it overlaps tensor \"a\")");
}

Test(safetensors, rejects_trailing_bytes_after_last_tensor)
{
    expect_header_fails(GOOD_HEADER, 17,
                        "data buffer is 17 bytes but the tensors cover 16 bytes "
                        "(trailing bytes)");
}

Test(safetensors, rejects_truncated_file)
{
    expect_header_fails(GOOD_HEADER, 10,
                        "data buffer is 10 bytes but the tensors cover 16 bytes "
                        "(file truncated)");
}

Test(safetensors, rejects_folder_as_file)
{
    expect_open_fails(tmpdir, MOE_ERR_IO, "not a regular file");
}

Test(safetensors, rejects_name_in_two_files_and_keeps_the_set)
{
    const char *a = write_raw("a.safetensors", GOOD_HEADER, 16);
    const char *b = write_raw("b.safetensors", GOOD_HEADER, 16);
    struct moe_safetensors st = {0};
    cr_assert_eq(moe_safetensors_open_file(&st, a), MOE_OK, "%s", moe_last_error());
    cr_assert_eq(moe_safetensors_open_file(&st, b), MOE_ERR_FORMAT);
    cr_assert(strstr(moe_last_error(), "tensor \"w\" is already loaded from"), "%s",
              moe_last_error());
    cr_assert(strstr(moe_last_error(), "a.safetensors"), "%s", moe_last_error());
    cr_assert_eq(st.n_files, 1);
    cr_assert_eq(st.n_tensors, 1);
    cr_assert_eq(moe_safetensors_find(&st, "w")->file, 0);
    moe_safetensors_close(&st);
}

/* ---- in-memory tensors, lookup, close ------------------------------------- */

Test(safetensors, add_and_find_many)
{
    struct moe_safetensors st = {0};
    char name[32];
    for (int i = 0; i < 5000; i++) {
        int32_t *v = malloc(sizeof *v);
        *v = i;
        snprintf(name, sizeof name, "layers.%d.w", i);
        cr_assert_eq(moe_safetensors_add(&st, name, MOE_DTYPE_I32, 1, (int64_t[]){1}, v), MOE_OK,
                     "%s", moe_last_error());
    }
    for (int i = 0; i < 5000; i++) {
        snprintf(name, sizeof name, "layers.%d.w", i);
        const struct moe_st_tensor *t = moe_safetensors_find(&st, name);
        cr_assert(t, "%s", name);
        cr_assert_eq(*(const int32_t *)t->data, i);
        cr_assert_eq(t->file, -1);
    }
    cr_assert_null(moe_safetensors_find(&st, "layers.5000.w"));
    moe_safetensors_close(&st);
}

Test(safetensors, add_rejects_duplicates_and_overflow_and_frees_the_buffer)
{
    struct moe_safetensors st = {0};
    cr_assert_eq(moe_safetensors_add(&st, "x", MOE_DTYPE_U8, 1, (int64_t[]){1}, malloc(1)), MOE_OK);
    /* Ownership passes even on failure: ASan's leak check sees these freed. */
    cr_assert_eq(moe_safetensors_add(&st, "x", MOE_DTYPE_U8, 1, (int64_t[]){1}, malloc(1)),
                 MOE_ERR_INVALID_ARG);
    cr_assert(strstr(moe_last_error(), "\"x\": already loaded"), "%s", moe_last_error());
    cr_assert_eq(
        moe_safetensors_add(&st, "big", MOE_DTYPE_F32, 2, (int64_t[]){INT64_MAX, 2}, malloc(1)),
        MOE_ERR_NOMEM);
    cr_assert(strstr(moe_last_error(), "overflows"), "%s", moe_last_error());
    cr_assert_eq(moe_safetensors_add(&st, "neg", MOE_DTYPE_F32, 1, (int64_t[]){-1}, malloc(1)),
                 MOE_ERR_INVALID_ARG);
    cr_assert_eq(st.n_tensors, 1);
    moe_safetensors_close(&st);
}

/* A multimodal checkpoint's text model read by its text-only names
 * (Llama4ForConditionalGeneration: language_model.model.*). */
Test(safetensors, strip_prefix_renames_and_refuses_collisions)
{
    struct moe_safetensors st = {0};
    cr_assert_eq(moe_safetensors_add(&st, "lm.model.a", MOE_DTYPE_U8, 1, (int64_t[]){1}, malloc(1)), MOE_OK);
    cr_assert_eq(moe_safetensors_add(&st, "vision.b", MOE_DTYPE_U8, 1, (int64_t[]){2}, malloc(2)), MOE_OK);
    cr_assert_eq(moe_safetensors_strip_prefix(&st, "lm.", ""), MOE_OK, "%s", moe_last_error());
    const struct moe_st_tensor *t = moe_safetensors_find(&st, "model.a");
    cr_assert(t && t->shape[0] == 1);
    cr_assert_null(moe_safetensors_find(&st, "lm.model.a"));
    cr_assert_not_null(moe_safetensors_find(&st, "vision.b"), "other names kept");
    cr_assert_eq(moe_safetensors_add(&st, "lm.vision.b", MOE_DTYPE_U8, 1, (int64_t[]){3}, malloc(3)), MOE_OK);
    cr_assert_eq(moe_safetensors_strip_prefix(&st, "lm.", ""), MOE_ERR_FORMAT);
    cr_assert(strstr(moe_last_error(), "'lm.vision.b' and 'vision.b'"), "%s", moe_last_error());
    cr_assert_eq(moe_safetensors_find(&st, "vision.b")->shape[0], 2, "unchanged");
    moe_safetensors_close(&st);
}

/* Qwen3_5MoeForConditionalGeneration: model.language_model.* read as model.* */
Test(safetensors, strip_prefix_replaces_it_by_a_shorter_one)
{
    struct moe_safetensors st = {0};
    cr_assert_eq(moe_safetensors_add(&st, "model.language_model.layers.0.w", MOE_DTYPE_U8, 1, (int64_t[]){1},
                                     malloc(1)), MOE_OK);
    cr_assert_eq(moe_safetensors_add(&st, "model.visual.w", MOE_DTYPE_U8, 1, (int64_t[]){2}, malloc(2)), MOE_OK);
    cr_assert_eq(moe_safetensors_strip_prefix(&st, "model.language_model.", "model."), MOE_OK, "%s",
                 moe_last_error());
    cr_assert_not_null(moe_safetensors_find(&st, "model.layers.0.w"));
    cr_assert_null(moe_safetensors_find(&st, "model.language_model.layers.0.w"));
    cr_assert_not_null(moe_safetensors_find(&st, "model.visual.w"));
    moe_safetensors_close(&st);
}

Test(safetensors, close_is_safe_on_zeroed_and_twice)
{
    struct moe_safetensors st = {0};
    moe_safetensors_close(&st);
    moe_safetensors_close(&st);
    cr_assert_eq(moe_safetensors_open_file(&st, write_raw("c.safetensors", GOOD_HEADER, 16)),
                 MOE_OK);
    moe_safetensors_close(&st);
    moe_safetensors_close(&st);
    moe_safetensors_close(NULL);
    cr_assert_null(moe_safetensors_find(&st, "w"));
}

/* ---- robustness ----------------------------------------------------------- */

/* 1000 seeded mutations of a valid two-tensor file, parsed from an exactly
 * sized heap copy so any read past the end trips ASan.  Mutations land in
 * the header mostly, where they matter. */
Test(safetensors, random_mutations_never_crash)
{
    const char *hdr = "{\"__metadata__\":{\"k\":\"v\"},"
                      "\"a\":{\"dtype\":\"F32\",\"shape\":[2,3],\"data_offsets\":[0,24]},"
                      "\"b\":{\"dtype\":\"BF16\",\"shape\":[0],\"data_offsets\":[24,24]},"
                      "\"c\":{\"dtype\":\"I32\",\"shape\":[1],\"data_offsets\":[24,28]}}";
    size_t size;
    unsigned char *good = build(hdr, 28, -1, &size);
    {
        struct moe_safetensors st = {0};
        cr_assert_eq(moe_safetensors_parse(&st, good, size, "good", -1), MOE_OK, "%s",
                     moe_last_error());
        moe_safetensors_close(&st);
    }
    static const char alphabet[] = "{}[]\",:-0123456789. e\\\x80\xff\x00";
    uint64_t rng = 12345;
    int ok = 0;
    for (int it = 0; it < 1000; it++) {
        size_t n = size;
        if (tu_rand_u64(&rng) % 8 == 0) n = tu_rand_u64(&rng) % (size + 1); /* truncate */
        unsigned char *b = malloc(n ? n : 1);
        memcpy(b, good, n);
        int edits = 1 + (int)(tu_rand_u64(&rng) % 4);
        size_t span = n < 8 + strlen(hdr) ? n : 8 + strlen(hdr); /* length + JSON */
        for (int e = 0; e < edits && n > 0; e++) {
            uint64_t r = tu_rand_u64(&rng);
            size_t pos = (size_t)(r >> 16) % (r % 4 ? span : n);
            unsigned char c = r & 4 ? (unsigned char)(r >> 8)
                                    : (unsigned char)alphabet[(r >> 8) % (sizeof alphabet - 1)];
            b[pos] = c;
        }
        struct moe_safetensors st = {0};
        enum moe_status s = moe_safetensors_parse(&st, b, n, "mutant", -1);
        cr_assert(s == MOE_OK || s == MOE_ERR_FORMAT, "iteration %d: %s", it, moe_status_str(s));
        if (s == MOE_OK) {
            ok++;
            for (size_t i = 0; i < st.n_tensors; i++) {
                const unsigned char *d = st.tensors[i].data;
                cr_assert(d >= b && d + st.tensors[i].nbytes <= b + n,
                          "iteration %d: %s out of range", it, st.tensors[i].name);
            }
        } else {
            cr_assert_eq(st.n_tensors, 0);
            cr_assert(strstr(moe_last_error(), "mutant"), "%s", moe_last_error());
        }
        moe_safetensors_close(&st);
        free(b);
    }
    cr_log_info("random mutations: %d of 1000 still valid", ok);
    free(good);
}
