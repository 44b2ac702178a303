/* Tests for the GGUF reader and writer: the real shared models and vocabularies, a writer -> reader round
 * trip over every metadata type, and a table of hand-broken files that must each fail with a precise
 * message. */
#include "testutil.h"

#include "core/err.h"
#include "engine/gguf/gguf.h"

#include <math.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <dirent.h>
#include <string.h>
#include <sys/stat.h>

static void test_stories260k(void **state)
{
    (void)state;
    const char *path = TEST_SHARED_OR_SKIP("models/stories260K/stories260K.gguf");
    char err[ERR_MSG_MAX] = "";
    struct gguf *g = gguf_open(path, err);
    if (!g)
        fail_msg("%s", err);
    assert_int_equal(gguf_version(g), 3);
    assert_int_equal(gguf_alignment(g), 32);
    struct gguf_str s;
    assert_int_equal(gguf_get_str(g, "general.architecture", &s), 0);
    assert_true(gguf_str_eq(s, "llama"));
    uint32_t u;
    assert_int_equal(gguf_get_u32(g, "llama.embedding_length", &u), 0);
    assert_int_equal(u, 64);
    int64_t i64;
    assert_int_equal(gguf_get_i64(g, "llama.block_count", &i64), 0);
    assert_int_equal(i64, 5);
    float eps;
    assert_int_equal(gguf_get_f32(g, "llama.attention.layer_norm_rms_epsilon", &eps), 0);
    assert_true(eps > 0 && eps < 1e-3f);
    assert_int_equal(gguf_tensor_count(g), 48);
    const struct gguf_kv *kv;
    assert_int_equal(gguf_get_arr(g, "tokenizer.ggml.tokens", &kv), 0);
    assert_int_equal(kv->arr_type, GGUF_TYPE_STRING);
    assert_int_equal(kv->arr_len, 512);
    assert_true(gguf_str_eq(kv->strs[0], "<unk>"));
    assert_true(gguf_str_eq(kv->strs[1], "<s>"));
    const struct gguf_tensor *t = gguf_tensor_find(g, "token_embd.weight");
    assert_non_null(t);
    assert_int_equal(t->type, DTYPE_F32);
    assert_int_equal(t->ne[0], 64);
    assert_int_equal(t->ne[1], 512);
    assert_int_equal(t->nbytes, 64 * 512 * 4);
    assert_ptr_equal((const char *)t->data, (const char *)gguf_tensor_at(g, 0)->data);
    assert_null(gguf_tensor_find(g, "nope.weight"));
    assert_int_equal(gguf_get_u32(g, "nope", &u), ERR_NOT_FOUND);
    assert_int_equal(gguf_get_u32(g, "general.architecture", &u), ERR_FORMAT);
    gguf_close(g);
}


static struct gguf *open_or_fail(const char *path)
{
    char err[ERR_MSG_MAX] = "";
    struct gguf *g = gguf_open(path, err);
    if (!g)
        fail_msg("%s", err);
    return g;
}

/* The vocabulary-only files: no tensors, big string arrays (50k tokens + 50k merges for gpt-2). */
static void test_shared_vocab(void **state)
{
    (void)state;
    const char *gpt2 = TEST_SHARED_OR_SKIP("tokenizer/ggml-vocab-gpt-2.gguf");
    struct gguf *g = open_or_fail(gpt2);
    assert_int_equal(gguf_tensor_count(g), 0);
    struct gguf_str s;
    assert_int_equal(gguf_get_str(g, "tokenizer.ggml.model", &s), 0);
    assert_true(gguf_str_eq(s, "gpt2"));
    const struct gguf_kv *kv;
    assert_int_equal(gguf_get_arr(g, "tokenizer.ggml.tokens", &kv), 0);
    assert_int_equal(kv->arr_len, 50257);
    assert_true(gguf_str_eq(kv->strs[0], "!"));
    assert_int_equal(gguf_get_arr(g, "tokenizer.ggml.merges", &kv), 0);
    assert_int_equal(kv->arr_len, 50000);
    assert_true(gguf_str_eq(kv->strs[0], "\xc4\xa0 t"));
    /* every string lies inside the mapping (its start: the first key sits 32 bytes in) and they are in order */
    const char *lo = gguf_kv_at(g, 0)->key.ptr - 32, *hi = lo + gguf_file_size(g);
    for (uint64_t i = 0; i < kv->arr_len; i++) {
        assert_true(kv->strs[i].ptr >= lo && kv->strs[i].ptr + kv->strs[i].len <= hi);
        if (i)
            assert_ptr_equal(kv->strs[i].ptr, kv->strs[i - 1].ptr + kv->strs[i - 1].len + 8);
    }
    gguf_close(g);

    const char *spm = TEST_SHARED_OR_SKIP("tokenizer/ggml-vocab-llama-spm.gguf");
    g = open_or_fail(spm);
    assert_int_equal(gguf_get_arr(g, "tokenizer.ggml.tokens", &kv), 0);
    assert_int_equal(kv->arr_len, 32000);
    assert_int_equal(gguf_get_arr(g, "tokenizer.ggml.scores", &kv), 0);
    assert_int_equal(kv->arr_type, GGUF_TYPE_FLOAT32);
    assert_int_equal(kv->arr_len, 32000);
    assert_int_equal(gguf_get_arr(g, "tokenizer.ggml.token_type", &kv), 0);
    assert_int_equal(kv->arr_type, GGUF_TYPE_INT32);
    assert_true(gguf_arr_num(kv, 0) == 2.0); /* <unk> is UNKNOWN */
    assert_true(gguf_arr_num(kv, 1) == 3.0); /* <s> is CONTROL */
    bool b;
    assert_int_equal(gguf_get_bool(g, "tokenizer.ggml.add_bos_token", &b), 0);
    assert_true(b);
    gguf_close(g);
}

/* Q4_K_M mixes types: output.weight Q6_K, most matrices Q4_K, some attn_v/ffn_down Q6_K, norms F32. */
static void test_shared_q4_k_m(void **state)
{
    (void)state;
    const char *path = TEST_SHARED_OR_SKIP("models/llama-19M/llama-19M-Q4_K_M.gguf");
    struct gguf *g = open_or_fail(path);
    assert_int_equal(gguf_tensor_count(g), 39);
    uint32_t ft;
    assert_int_equal(gguf_get_u32(g, "general.file_type", &ft), 0);
    assert_int_equal(ft, 15);
    const struct gguf_tensor *t = gguf_tensor_find(g, "output.weight");
    assert_non_null(t);
    assert_int_equal(t->type, DTYPE_Q6_K);
    assert_int_equal(t->nbytes, 32000 / 1 * 210);
    t = gguf_tensor_find(g, "token_embd.weight");
    assert_int_equal(t->type, DTYPE_Q4_K);
    assert_int_equal(t->ne[0], 256);
    assert_int_equal(t->ne[1], 32000);
    t = gguf_tensor_find(g, "blk.0.attn_norm.weight");
    assert_int_equal(t->type, DTYPE_F32);
    assert_int_equal(t->n_dims, 1);
    int n_q6 = 0, n_q4 = 0;
    size_t end = 0;
    for (int64_t i = 0; i < gguf_tensor_count(g); i++) {
        t = gguf_tensor_at(g, i);
        n_q6 += t->type == DTYPE_Q6_K;
        n_q4 += t->type == DTYPE_Q4_K;
        assert_int_equal(t->offset % gguf_alignment(g), 0);
        assert_ptr_equal(gguf_tensor_find(g, t->name), t);
        size_t e = gguf_data_offset(g) + t->offset + t->nbytes;
        end = e > end ? e : end;
    }
    assert_true(n_q6 >= 2 && n_q4 > n_q6);
    assert_true(end <= gguf_file_size(g) && end + 32 > gguf_file_size(g));
    gguf_close(g);
}

static void test_open_errors(void **state)
{
    (void)state;
    char err[ERR_MSG_MAX] = "";
    assert_null(gguf_open("/nonexistent/model.gguf", err));
    assert_non_null(strstr(err, "/nonexistent/model.gguf: cannot open: No such file"));
    const char *dir = test_tmp_path("adir");
    assert_int_equal(mkdir(dir, 0700), 0);
    assert_null(gguf_open(dir, err));
    assert_non_null(strstr(err, "is a directory"));
    const char *empty = test_tmp_path("empty.gguf");
    FILE *f = fopen(empty, "wb");
    assert_non_null(f);
    fclose(f);
    assert_null(gguf_open(empty, err));
    assert_non_null(strstr(err, "empty.gguf: file is empty"));
    assert_null(gguf_open_buffer(NULL, 0, err));
    assert_non_null(strstr(err, "file is empty"));
    /* gguf_open_mem shares the checks */
    assert_null(gguf_open_mem("/nonexistent/model.gguf", err));
    assert_non_null(strstr(err, "/nonexistent/model.gguf: cannot open: No such file"));
    assert_null(gguf_open_mem(dir, err));
    assert_non_null(strstr(err, "is a directory"));
    assert_null(gguf_open_mem(empty, err));
    assert_non_null(strstr(err, "empty.gguf: file is empty"));
    const char *bad = test_tmp_path("notgguf.gguf");
    f = fopen(bad, "wb");
    assert_non_null(f);
    fputs("GGML this is not a gguf file at all, just text long enough", f);
    fclose(f);
    assert_null(gguf_open_mem(bad, err));
    assert_non_null(strstr(err, "notgguf.gguf"));
}

/* A file read into memory (gguf_open_mem) gives the same metadata and tensor bytes as the mapped file, and the
 * copy is read-only like the mapping. */
static void test_open_mem_equals_mmap(void **state)
{
    (void)state;
    /* 40 MB: read by two threads, one half each */
    const char *path = TEST_SHARED_OR_SKIP("models/llama-19M/llama-19M-F16.gguf");
    char err[ERR_MSG_MAX] = "";
    struct gguf *a = gguf_open(path, err), *b = gguf_open_mem(path, err);
    if (!a || !b)
        fail_msg("%s", err);
    assert_int_equal(gguf_file_size(a), gguf_file_size(b));
    assert_int_equal(gguf_kv_count(a), gguf_kv_count(b));
    assert_int_equal(gguf_tensor_count(a), gguf_tensor_count(b));
    for (int64_t i = 0; i < gguf_tensor_count(a); i++) {
        const struct gguf_tensor *ta = gguf_tensor_at(a, i), *tb = gguf_tensor_at(b, i);
        assert_string_equal(ta->name, tb->name);
        assert_int_equal(ta->nbytes, tb->nbytes);
        assert_ptr_not_equal(ta->data, tb->data);
        assert_memory_equal(ta->data, tb->data, ta->nbytes);
    }
    gguf_close(a);
    gguf_close(b);
}

/* A placer for test_open_mem_placed: tensors named "p.*" are placed a group of 16 rows at a time with the rows
 * of each group in reverse order; "bad.*" asks for a unit that does not divide the tensor. */
struct placed_log {
    atomic_size_t bytes, calls, misplaced; /* misplaced: calls off the units (checked after: place runs on a helper
                                              thread too, where a cmocka assertion must not jump) */
};

static size_t placed_unit(void *ctx, const struct gguf_tensor *t)
{
    (void)ctx;
    size_t row = t->nbytes / (size_t)t->ne[1];
    return !strncmp(t->name, "p.", 2) ? 16 * row : !strncmp(t->name, "bad.", 4) ? 3 * row : 0;
}

static void placed_place(void *ctx, const struct gguf_tensor *t, const void *src, void *dst, size_t n)
{
    struct placed_log *log = ctx;
    size_t row = t->nbytes / (size_t)t->ne[1];
    if (n % (16 * row) || ((const uint8_t *)dst - (const uint8_t *)t->data) % (16 * row)) {
        atomic_fetch_add(&log->misplaced, 1);
        return;
    }
    for (size_t g = 0; g < n; g += 16 * row)
        for (size_t r = 0; r < 16; r++)
            memcpy((uint8_t *)dst + g + r * row, (const uint8_t *)src + g + (15 - r) * row, row);
    atomic_fetch_add(&log->bytes, n);
    atomic_fetch_add(&log->calls, 1);
}

/* gguf_open_mem_placed: a header larger than the first read (parsed again with more), tensors placed while
 * read wherever they lie (inside the first read, across its end, past it; in several pieces), every other byte
 * as in the file; a placer unit that does not divide a tensor is refused. */
static void test_open_mem_placed(void **state)
{
    (void)state;
    char err[ERR_MSG_MAX] = "";
    const char *path = test_tmp_path("placed.gguf");
    struct gguf_writer *w = gguf_writer_create();
    assert_non_null(w);
    size_t big_len = (size_t)6 << 20; /* past the first 4 MiB read */
    char *big = malloc(big_len);
    for (size_t i = 0; i < big_len; i++)
        big[i] = (char)('a' + i % 26);
    assert_int_equal(gguf_writer_set_strn(w, "big.str", (struct gguf_str){big_len, big}), 0);
    static const struct {
        const char *name;
        int64_t cols, rows;
    } ts[] = {{"p.small", 256, 32}, {"plain.a", 100, 3}, {"p.across", 4096, 1024}, {"plain.b", 4096, 512},
              {"p.far", 2048, 2048}, {"bad.x", 256, 16}};
    enum { NT = sizeof ts / sizeof ts[0] };
    float *data[NT];
    size_t total_placed = 0;
    for (int i = 0; i < NT; i++) {
        int64_t ne[2] = {ts[i].cols, ts[i].rows};
        assert_int_equal(gguf_writer_add_tensor(w, ts[i].name, DTYPE_F32, 2, ne), i);
        size_t n = (size_t)(ts[i].cols * ts[i].rows);
        data[i] = malloc(n * 4);
        for (size_t k = 0; k < n; k++)
            data[i][k] = (float)(k * 7 + (size_t)i);
        if (!strncmp(ts[i].name, "p.", 2))
            total_placed += n * 4;
    }
    assert_int_equal(gguf_writer_begin(w, path, err), 0);
    for (int i = 0; i < NT; i++)
        assert_int_equal(gguf_writer_write_tensor(w, i, data[i], (size_t)(ts[i].cols * ts[i].rows) * 4, err), 0);
    assert_int_equal(gguf_writer_finish(w, err), 0);
    gguf_writer_destroy(w);

    /* "bad.x" in the file: its unit (3 rows of 16) does not divide it */
    struct placed_log log = {0, 0, 0};
    struct gguf_placer pl = {&log, placed_unit, placed_place};
    assert_null(gguf_open_mem_placed(path, &pl, err));
    print_message("    refused: %s\n", err);
    assert_non_null(strstr(err, "bad.x"));

    /* the same file without "bad.x" */
    w = gguf_writer_create();
    assert_int_equal(gguf_writer_set_strn(w, "big.str", (struct gguf_str){big_len, big}), 0);
    for (int i = 0; i < NT - 1; i++) {
        int64_t ne[2] = {ts[i].cols, ts[i].rows};
        assert_int_equal(gguf_writer_add_tensor(w, ts[i].name, DTYPE_F32, 2, ne), i);
    }
    assert_int_equal(gguf_writer_begin(w, path, err), 0);
    for (int i = 0; i < NT - 1; i++)
        assert_int_equal(gguf_writer_write_tensor(w, i, data[i], (size_t)(ts[i].cols * ts[i].rows) * 4, err), 0);
    assert_int_equal(gguf_writer_finish(w, err), 0);
    gguf_writer_destroy(w);
    atomic_store(&log.bytes, 0);
    atomic_store(&log.calls, 0);
    struct gguf *g = gguf_open_mem_placed(path, &pl, err);
    if (!g)
        fail_msg("%s", err);
    assert_true(gguf_data_offset(g) > ((size_t)4 << 20)); /* the header needed a second read */
    assert_true(gguf_file_size(g) > ((size_t)24 << 20));  /* two readers */
    struct gguf_str s;
    assert_int_equal(gguf_get_str(g, "big.str", &s), 0);
    assert_int_equal(s.len, big_len);
    assert_memory_equal(s.ptr, big, big_len);
    for (int i = 0; i < NT - 1; i++) {
        const struct gguf_tensor *t = gguf_tensor_find(g, ts[i].name);
        assert_non_null(t);
        size_t row = (size_t)ts[i].cols * 4;
        bool placed = !strncmp(ts[i].name, "p.", 2);
        for (int64_t r = 0; r < ts[i].rows; r++) {
            int64_t from = placed ? r / 16 * 16 + 15 - r % 16 : r;
            if (memcmp((const uint8_t *)t->data + (size_t)r * row, (const uint8_t *)data[i] + (size_t)from * row, row))
                fail_msg("tensor %s row %lld is not file row %lld", ts[i].name, (long long)r, (long long)from);
        }
    }
    assert_int_equal(atomic_load(&log.misplaced), 0);
    assert_int_equal(atomic_load(&log.bytes), total_placed);
    assert_true(atomic_load(&log.calls) > 3); /* p.across and p.far in several pieces */
    print_message("    header %zu bytes, %zu placed in %zu pieces\n", gguf_data_offset(g), (size_t)atomic_load(&log.bytes),
                  (size_t)atomic_load(&log.calls));
    gguf_close(g);
    for (int i = 0; i < NT; i++)
        free(data[i]);
    free(big);
}

/* ---- writer -> reader round trip ---- */

struct rt_tensor {
    const char *name;
    enum dtype type;
    uint32_t n_dims;
    int64_t ne[4];
};

static const struct rt_tensor rt_tensors[] = {
    {"a.f32", DTYPE_F32, 1, {5, 1, 1, 1}},        /* 20 bytes: needs padding */
    {"b.f16", DTYPE_F16, 2, {3, 2, 1, 1}},
    {"c.q8_0", DTYPE_Q8_0, 2, {64, 3, 1, 1}},
    {"d.q4_k", DTYPE_Q4_K, 2, {256, 2, 1, 1}},
    {"e.q6_k", DTYPE_Q6_K, 1, {256, 1, 1, 1}},
    {"f.bf16", DTYPE_BF16, 4, {7, 1, 2, 3}},
    {"g.q5_k", DTYPE_Q5_K, 2, {256, 1, 1, 1}}, /* known, not supported: still written and read */
};
#define RT_N (sizeof rt_tensors / sizeof rt_tensors[0])

static void test_round_trip(void **state)
{
    (void)state;
    char err[ERR_MSG_MAX] = "";
    const char *path = test_tmp_path("rt.gguf");
    struct gguf_writer *w = gguf_writer_create();
    assert_non_null(w);
    uint8_t u8 = 250;
    int8_t i8 = -120;
    uint16_t u16 = 65000;
    int16_t i16 = -32000;
    int64_t i64 = -5000000000ll;
    double f64 = 1e300;
    assert_int_equal(gguf_writer_set_scalar(w, "s.u8", GGUF_TYPE_UINT8, &u8), 0);
    assert_int_equal(gguf_writer_set_scalar(w, "s.i8", GGUF_TYPE_INT8, &i8), 0);
    assert_int_equal(gguf_writer_set_scalar(w, "s.u16", GGUF_TYPE_UINT16, &u16), 0);
    assert_int_equal(gguf_writer_set_scalar(w, "s.i16", GGUF_TYPE_INT16, &i16), 0);
    assert_int_equal(gguf_writer_set_u32(w, "s.u32", 4000000000u), 0);
    assert_int_equal(gguf_writer_set_i32(w, "s.i32", -7), 0);
    assert_int_equal(gguf_writer_set_f32(w, "s.f32", 0.125f), 0);
    assert_int_equal(gguf_writer_set_bool(w, "s.bool", true), 0);
    assert_int_equal(gguf_writer_set_str(w, "s.str", "first"), 0);
    assert_int_equal(gguf_writer_set_u64(w, "s.u64", 1ull << 63), 0);
    assert_int_equal(gguf_writer_set_scalar(w, "s.i64", GGUF_TYPE_INT64, &i64), 0);
    assert_int_equal(gguf_writer_set_scalar(w, "s.f64", GGUF_TYPE_FLOAT64, &f64), 0);
    assert_int_equal(gguf_writer_set_str(w, "s.str", "second wins"), 0); /* replaces, keeps position 8 */
    assert_int_equal(gguf_writer_set_scalar(w, "s.bad", GGUF_TYPE_STRING, "x"), ERR_INVALID_ARG);
    uint8_t bin[] = {'a', 0, 'b'};
    struct gguf_str sbin = {3, (const char *)bin};
    assert_int_equal(gguf_writer_set_strn(w, "s.bin", sbin), 0);
    /* one array of every scalar type, elements 0..n-1 scaled so each type's range is exercised */
    static const enum gguf_vtype arr_types[] = {GGUF_TYPE_UINT8, GGUF_TYPE_INT8, GGUF_TYPE_UINT16, GGUF_TYPE_INT16,
                                                GGUF_TYPE_UINT32, GGUF_TYPE_INT32, GGUF_TYPE_FLOAT32, GGUF_TYPE_BOOL,
                                                GGUF_TYPE_UINT64, GGUF_TYPE_INT64, GGUF_TYPE_FLOAT64};
    for (size_t k = 0; k < sizeof arr_types / sizeof arr_types[0]; k++) {
        uint8_t buf[5 * 8];
        for (int j = 0; j < 5; j++) {
            double v = arr_types[k] == GGUF_TYPE_BOOL ? (j & 1) : (j * 3 + (int)k);
            switch (arr_types[k]) {
            case GGUF_TYPE_UINT8: case GGUF_TYPE_BOOL: buf[j] = (uint8_t)v; break;
            case GGUF_TYPE_INT8: ((int8_t *)buf)[j] = (int8_t)-v; break;
            case GGUF_TYPE_UINT16: { uint16_t x = (uint16_t)v; memcpy(buf + 2 * j, &x, 2); break; }
            case GGUF_TYPE_INT16: { int16_t x = (int16_t)-v; memcpy(buf + 2 * j, &x, 2); break; }
            case GGUF_TYPE_UINT32: { uint32_t x = (uint32_t)v; memcpy(buf + 4 * j, &x, 4); break; }
            case GGUF_TYPE_INT32: { int32_t x = (int32_t)-v; memcpy(buf + 4 * j, &x, 4); break; }
            case GGUF_TYPE_FLOAT32: { float x = (float)v / 4; memcpy(buf + 4 * j, &x, 4); break; }
            case GGUF_TYPE_UINT64: { uint64_t x = (uint64_t)v; memcpy(buf + 8 * j, &x, 8); break; }
            case GGUF_TYPE_INT64: { int64_t x = (int64_t)-v; memcpy(buf + 8 * j, &x, 8); break; }
            case GGUF_TYPE_FLOAT64: { double x = v / 8; memcpy(buf + 8 * j, &x, 8); break; }
            default: break;
            }
        }
        char key[32];
        snprintf(key, sizeof key, "a.%s", gguf_vtype_name(arr_types[k]));
        assert_int_equal(gguf_writer_set_arr(w, key, arr_types[k], buf, 5), 0);
    }
    assert_int_equal(gguf_writer_set_arr(w, "a.empty", GGUF_TYPE_INT32, NULL, 0), 0);
    assert_int_equal(gguf_writer_set_arr(w, "a.bad", GGUF_TYPE_STRING, "x", 1), ERR_INVALID_ARG);
    struct gguf_str strs[] = {{3, "one"}, {0, ""}, {5, "three"}, {3, (const char *)bin}};
    assert_int_equal(gguf_writer_set_str_arr(w, "a.strs", strs, 4), 0);
    assert_int_equal(gguf_writer_set_u32(w, "general.alignment", 64), 0);

    uint64_t rng = 42;
    uint8_t *data[RT_N];
    size_t nbytes[RT_N];
    for (size_t i = 0; i < RT_N; i++) {
        const struct rt_tensor *t = &rt_tensors[i];
        assert_int_equal(gguf_writer_add_tensor(w, t->name, t->type, t->n_dims, t->ne), (int)i);
        nbytes[i] = dtype_row_bytes(t->type, t->ne[0]) * (size_t)(t->ne[1] * t->ne[2] * t->ne[3]);
        data[i] = malloc(nbytes[i]);
        for (size_t j = 0; j < nbytes[i]; j++)
            data[i][j] = (uint8_t)test_rand_u64(&rng);
    }
    int64_t bad_ne[2] = {33, 1};
    assert_int_equal(gguf_writer_add_tensor(w, "bad", DTYPE_Q8_0, 2, bad_ne), ERR_INVALID_ARG);
    assert_int_equal(gguf_writer_add_tensor(w, "a.f32", DTYPE_F32, 1, bad_ne), ERR_INVALID_ARG); /* duplicate */
    assert_int_equal(gguf_writer_add_tensor(w, "zero", DTYPE_F32, 0, bad_ne), ERR_INVALID_ARG);
    assert_int_equal(gguf_writer_add_tensor(w, "five", DTYPE_F32, 5, bad_ne), ERR_INVALID_ARG);

    assert_int_equal(gguf_writer_begin(w, path, err), 0);
    assert_int_equal(gguf_writer_write_tensor(w, 1, data[1], nbytes[1], err), ERR_INVALID_ARG);
    assert_non_null(strstr(err, "out of order"));
    assert_int_equal(gguf_writer_write_tensor(w, 0, data[0], nbytes[0] + 1, err), ERR_INVALID_ARG);
    assert_non_null(strstr(err, "a.f32"));
    for (size_t i = 0; i < RT_N; i++)
        assert_int_equal(gguf_writer_write_tensor(w, (int)i, data[i], nbytes[i], err), 0);
    assert_int_equal(gguf_writer_finish(w, err), 0);
    gguf_writer_destroy(w);

    struct gguf *g = open_or_fail(path);
    assert_int_equal(gguf_version(g), 3);
    assert_int_equal(gguf_alignment(g), 64);
    assert_int_equal(gguf_data_offset(g) % 64, 0);
    assert_int_equal(gguf_kv_count(g), 13 + 11 + 3); /* scalars, typed arrays, empty + string arrays + alignment */
    const struct gguf_kv *kv = gguf_kv_at(g, 8);
    assert_true(gguf_str_eq(kv->key, "s.str"));
    assert_true(gguf_str_eq(kv->str, "second wins"));
    assert_int_equal(gguf_kv_find(g, "s.str") - gguf_kv_at(g, 0), 8);
    /* scalars through the getters, including width conversions */
    uint32_t u32;
    int64_t v64;
    float f;
    bool b;
    struct gguf_str s;
    assert_int_equal(gguf_get_u32(g, "s.u8", &u32), 0);
    assert_int_equal(u32, 250);
    assert_int_equal(gguf_get_u32(g, "s.u16", &u32), 0);
    assert_int_equal(u32, 65000);
    assert_int_equal(gguf_get_u32(g, "s.u32", &u32), 0);
    assert_int_equal(u32, 4000000000u);
    assert_int_equal(gguf_get_u32(g, "s.i8", &u32), ERR_FORMAT);   /* negative */
    assert_int_equal(gguf_get_u32(g, "s.u64", &u32), ERR_FORMAT);  /* 2^63 does not fit */
    assert_int_equal(gguf_get_u32(g, "s.f32", &u32), ERR_FORMAT);  /* not an integer type */
    assert_int_equal(gguf_get_i64(g, "s.i8", &v64), 0);
    assert_int_equal(v64, -120);
    assert_int_equal(gguf_get_i64(g, "s.i16", &v64), 0);
    assert_int_equal(v64, -32000);
    assert_int_equal(gguf_get_i64(g, "s.i32", &v64), 0);
    assert_int_equal(v64, -7);
    assert_int_equal(gguf_get_i64(g, "s.i64", &v64), 0);
    assert_true(v64 == -5000000000ll);
    assert_int_equal(gguf_get_i64(g, "s.u32", &v64), 0);
    assert_true(v64 == 4000000000ll);
    assert_int_equal(gguf_get_i64(g, "s.u64", &v64), ERR_FORMAT);
    assert_int_equal(gguf_get_i64(g, "s.bool", &v64), ERR_FORMAT);
    assert_int_equal(gguf_get_f32(g, "s.f32", &f), 0);
    assert_true(f == 0.125f);
    assert_int_equal(gguf_get_f32(g, "s.f64", &f), 0);
    assert_true(isinf(f)); /* 1e300 does not fit a float: converts to inf rather than failing */
    assert_int_equal(gguf_get_f32(g, "s.u32", &f), ERR_FORMAT);
    assert_int_equal(gguf_get_bool(g, "s.bool", &b), 0);
    assert_true(b);
    assert_int_equal(gguf_get_bool(g, "s.u8", &b), ERR_FORMAT);
    assert_int_equal(gguf_get_str(g, "s.bin", &s), 0);
    assert_int_equal(s.len, 3);
    assert_memory_equal(s.ptr, bin, 3);
    char *dup = gguf_str_dup(s);
    assert_int_equal(dup[0], 'a');
    assert_int_equal(dup[3], 0);
    free(dup);
    assert_int_equal(gguf_get_str(g, "s.u8", &s), ERR_FORMAT);
    assert_int_equal(gguf_get_str(g, "missing", &s), ERR_NOT_FOUND);
    assert_int_equal(gguf_get_arr(g, "s.u8", &kv), ERR_FORMAT);
    for (size_t k = 0; k < sizeof arr_types / sizeof arr_types[0]; k++) {
        char key[32];
        snprintf(key, sizeof key, "a.%s", gguf_vtype_name(arr_types[k]));
        assert_int_equal(gguf_get_arr(g, key, &kv), 0);
        assert_int_equal(kv->arr_type, arr_types[k]);
        assert_int_equal(kv->arr_len, 5);
        for (int j = 0; j < 5; j++) {
            double v = arr_types[k] == GGUF_TYPE_BOOL ? (j & 1) : (j * 3 + (int)k);
            if (arr_types[k] == GGUF_TYPE_INT8 || arr_types[k] == GGUF_TYPE_INT16 ||
                arr_types[k] == GGUF_TYPE_INT32 || arr_types[k] == GGUF_TYPE_INT64)
                v = -v;
            if (arr_types[k] == GGUF_TYPE_FLOAT32)
                v /= 4;
            if (arr_types[k] == GGUF_TYPE_FLOAT64)
                v /= 8;
            if (gguf_arr_num(kv, (uint64_t)j) != v)
                fail_msg("%s[%d] = %g, want %g", key, j, gguf_arr_num(kv, (uint64_t)j), v);
        }
    }
    assert_int_equal(gguf_get_arr(g, "a.empty", &kv), 0);
    assert_int_equal(kv->arr_len, 0);
    assert_int_equal(gguf_get_arr(g, "a.strs", &kv), 0);
    assert_int_equal(kv->arr_type, GGUF_TYPE_STRING);
    assert_int_equal(kv->arr_len, 4);
    for (int j = 0; j < 4; j++) {
        assert_int_equal(kv->strs[j].len, strs[j].len);
        assert_memory_equal(kv->strs[j].ptr, strs[j].ptr, strs[j].len);
    }
    assert_int_equal(gguf_tensor_count(g), RT_N);
    for (size_t i = 0; i < RT_N; i++) {
        const struct gguf_tensor *t = gguf_tensor_at(g, (int64_t)i);
        assert_string_equal(t->name, rt_tensors[i].name);
        assert_ptr_equal(gguf_tensor_find(g, rt_tensors[i].name), t);
        assert_int_equal(t->type, rt_tensors[i].type);
        assert_int_equal(t->n_dims, rt_tensors[i].n_dims);
        for (int d = 0; d < 4; d++)
            assert_int_equal(t->ne[d], rt_tensors[i].ne[d]);
        assert_int_equal(t->nbytes, nbytes[i]);
        assert_int_equal(t->offset % 64, 0);
        assert_memory_equal(t->data, data[i], nbytes[i]);
        free(data[i]);
    }
    gguf_close(g);
}

static void test_writer_errors(void **state)
{
    (void)state;
    char err[ERR_MSG_MAX] = "";
    struct gguf_writer *w = gguf_writer_create();
    int64_t ne[1] = {4};
    assert_int_equal(gguf_writer_add_tensor(w, "x", DTYPE_F32, 1, ne), 0);
    assert_int_equal(gguf_writer_add_tensor(w, "y", DTYPE_F32, 1, ne), 1);
    assert_int_equal(gguf_writer_begin(w, "/nonexistent/dir/out.gguf", err), ERR_IO);
    assert_non_null(strstr(err, "/nonexistent/dir/out.gguf: cannot create"));
    gguf_writer_destroy(w);

    w = gguf_writer_create();
    assert_int_equal(gguf_writer_set_u32(w, "general.alignment", 48), 0);
    assert_int_equal(gguf_writer_begin(w, test_tmp_path("bad_align.gguf"), err), ERR_INVALID_ARG);
    assert_non_null(strstr(err, "general.alignment 48"));
    gguf_writer_destroy(w);

    w = gguf_writer_create();
    assert_int_equal(gguf_writer_add_tensor(w, "x", DTYPE_F32, 1, ne), 0);
    assert_int_equal(gguf_writer_add_tensor(w, "y", DTYPE_F32, 1, ne), 1);
    assert_int_equal(gguf_writer_begin(w, test_tmp_path("short.gguf"), err), 0);
    float v[4] = {1, 2, 3, 4};
    assert_int_equal(gguf_writer_write_tensor(w, 0, v, sizeof v, err), 0);
    assert_int_equal(gguf_writer_write_data(w, 1, v, 8, err), 0); /* half of y */
    assert_int_equal(gguf_writer_write_tensor(w, 1, v, sizeof v, err), ERR_INVALID_ARG); /* y already started */
    assert_int_equal(gguf_writer_write_data(w, 1, v, 12, err), ERR_INVALID_ARG);        /* 8 + 12 > 16 */
    assert_non_null(strstr(err, "would exceed the 16"));
    assert_int_equal(gguf_writer_finish(w, err), ERR_INVALID_ARG);
    assert_non_null(strstr(err, "only 1 of 2 tensors were written (next: 'y', 8 of 16 bytes)"));
    gguf_writer_destroy(w);

    /* chunked writes give the same file as whole-tensor writes */
    w = gguf_writer_create();
    int64_t ne3[1] = {3};
    assert_int_equal(gguf_writer_add_tensor(w, "x", DTYPE_F32, 1, ne), 0);
    assert_int_equal(gguf_writer_add_tensor(w, "z", DTYPE_F32, 1, ne3), 1);
    const char *chunked = test_tmp_path("chunked.gguf");
    assert_int_equal(gguf_writer_begin(w, chunked, err), 0);
    for (int k = 0; k < 4; k++)
        assert_int_equal(gguf_writer_write_data(w, 0, &v[k], 4, err), 0);
    assert_int_equal(gguf_writer_write_data(w, 1, v, 0, err), 0);
    assert_int_equal(gguf_writer_write_data(w, 1, v + 1, 12, err), 0);
    assert_int_equal(gguf_writer_finish(w, err), 0);
    gguf_writer_destroy(w);
    struct gguf *c = open_or_fail(chunked);
    assert_memory_equal(gguf_tensor_at(c, 0)->data, v, 16);
    assert_memory_equal(gguf_tensor_at(c, 1)->data, v + 1, 12);
    assert_int_equal(gguf_tensor_at(c, 1)->offset, 32);
    assert_int_equal(gguf_file_size(c), gguf_data_offset(c) + 64);
    gguf_close(c);

    /* copy_kv: a reader's pairs re-written give the same pairs */
    const char *src = "tests/fuzz/corpus/gguf/valid_all_types.gguf";
    struct gguf *g = open_or_fail(src);
    w = gguf_writer_create();
    for (int64_t i = 0; i < gguf_kv_count(g); i++)
        assert_int_equal(gguf_writer_copy_kv(w, gguf_kv_at(g, i)), 0);
    const char *out = test_tmp_path("copy.gguf");
    assert_int_equal(gguf_writer_begin(w, out, err), 0);
    assert_int_equal(gguf_writer_finish(w, err), 0);
    gguf_writer_destroy(w);
    struct gguf *h = open_or_fail(out);
    assert_int_equal(gguf_kv_count(h), gguf_kv_count(g));
    for (int64_t i = 0; i < gguf_kv_count(g); i++) {
        const struct gguf_kv *a = gguf_kv_at(g, i), *b = gguf_kv_at(h, i);
        assert_int_equal(a->key.len, b->key.len);
        assert_memory_equal(a->key.ptr, b->key.ptr, a->key.len);
        assert_int_equal(a->type, b->type);
        if (a->type == GGUF_TYPE_STRING) {
            assert_int_equal(a->str.len, b->str.len);
            assert_memory_equal(a->str.ptr, b->str.ptr, a->str.len);
        } else if (a->type == GGUF_TYPE_ARRAY) {
            assert_int_equal(a->arr_type, b->arr_type);
            assert_int_equal(a->arr_len, b->arr_len);
            if (a->arr_type == GGUF_TYPE_STRING) {
                for (uint64_t j = 0; j < a->arr_len; j++)
                    assert_true(a->strs[j].len == b->strs[j].len &&
                                !memcmp(a->strs[j].ptr, b->strs[j].ptr, a->strs[j].len));
            } else if (a->arr_len) {
                assert_memory_equal(a->data, b->data, a->arr_len * gguf_vtype_size(a->arr_type));
            }
        } else {
            assert_memory_equal(a->data, b->data, gguf_vtype_size(a->type));
        }
    }
    gguf_close(h);
    gguf_close(g);
}

/* The C writer and the Python corpus generator are independent encoders: given the same pairs and tensors
 * they must produce the same header bytes. */
static void test_writer_matches_python(void **state)
{
    (void)state;
    char err[ERR_MSG_MAX] = "";
    const char *src = "tests/fuzz/corpus/gguf/valid_small.gguf";
    struct gguf *g = open_or_fail(src);
    struct gguf_writer *w = gguf_writer_create();
    for (int64_t i = 0; i < gguf_kv_count(g); i++)
        assert_int_equal(gguf_writer_copy_kv(w, gguf_kv_at(g, i)), 0);
    for (int64_t i = 0; i < gguf_tensor_count(g); i++) {
        const struct gguf_tensor *t = gguf_tensor_at(g, i);
        assert_int_equal(gguf_writer_add_tensor(w, t->name, t->type, t->n_dims, t->ne), (int)i);
    }
    const char *out = test_tmp_path("small_c.gguf");
    assert_int_equal(gguf_writer_begin(w, out, err), 0);
    for (int64_t i = 0; i < gguf_tensor_count(g); i++)
        assert_int_equal(gguf_writer_write_tensor(w, (int)i, gguf_tensor_at(g, i)->data, gguf_tensor_at(g, i)->nbytes, err), 0);
    assert_int_equal(gguf_writer_finish(w, err), 0);
    gguf_writer_destroy(w);
    size_t n_py, n_c;
    char *py = test_read_file(src, &n_py), *c = test_read_file(out, &n_c);
    assert_int_equal(n_py, n_c);
    assert_memory_equal(py, c, gguf_data_offset(g));
    for (int64_t i = 0; i < gguf_tensor_count(g); i++) {
        const struct gguf_tensor *t = gguf_tensor_at(g, i);
        size_t at = gguf_data_offset(g) + t->offset;
        assert_memory_equal(py + at, c + at, t->nbytes);
    }
    free(py);
    free(c);
    gguf_close(g);
}

/* ---- the corpus table ---- */

#define CORPUS_DIR "tests/fuzz/corpus/gguf"

struct broken_case {
    const char *file;
    const char *expect; /* substring of the error message */
};

static const struct broken_case broken_cases[] = {
    {"empty.gguf", "file is empty (0 bytes)"},
    {"truncated_magic.gguf", "truncated at offset 0 while reading magic"},
    {"bad_magic.gguf", "bad magic 'GGML' at offset 0"},
    {"truncated_header.gguf", "truncated at offset 8 while reading tensor count"},
    {"version1.gguf", "GGUF version 1 (offset 4) is not supported"},
    {"version99.gguf", "GGUF version 99 (offset 4) is not supported"},
    {"big_endian.gguf", "big-endian GGUF files are not supported"},
    {"huge_tensor_count.gguf", "tensor count 1152921504606846976 (offset 8) cannot fit"},
    {"huge_kv_count.gguf", "kv count 4611686018427387909 (offset 16) cannot fit"},
    {"string_len_past_eof.gguf", "kv 0 key: string length 1099511627776 at offset 24 runs past end of file"},
    {"truncated_kv.gguf", "kv 6 ('tokenizer.ggml.token_type') value: array of 4 i32 at offset 348 runs past end"},
    {"bad_value_type.gguf", "kv 2 ('llama.block_count'): unknown value type 13 at offset 132"},
    {"nested_array.gguf", "kv 2 ('x.nested') value: arrays of arrays are not supported"},
    {"bad_array_type.gguf", "kv 2 ('x.badarr') value: unknown array element type 99"},
    {"array_len_past_eof.gguf", "('tokenizer.ggml.token_type') value: array of 1125899906842624 i32"},
    {"string_array_huge.gguf", "('tokenizer.ggml.tokens') value: array length 1099511627776 at offset 254 cannot fit"},
    {"string_array_elem_past_eof.gguf", "('tokenizer.ggml.tokens') value element 2: string length 8589934592"},
    {"duplicate_key.gguf", "kv 7: duplicate key 'general.name' (also kv 1)"},
    {"empty_key.gguf", "kv 1: empty key at offset 69"},
    {"bad_bool.gguf", "('tokenizer.ggml.add_bos_token') value: bool value 2 at offset 216 is not 0 or 1"},
    {"bad_alignment.gguf", "general.alignment 48 (offset 401) is not a nonzero power of two"},
    {"zero_alignment.gguf", "general.alignment 0 (offset 401) is not a nonzero power of two"},
    {"alignment_wrong_type.gguf", "general.alignment (offset 397) has type u64, expected u32"},
    {"zero_dim.gguf", "tensor 1 ('blk.0.attn_q.weight'): ne[1] = 0 at offset 461"},
    {"too_many_dims.gguf", "tensor 1 ('blk.0.attn_q.weight'): n_dims 5 at offset 449 is not in 1..4"},
    {"zero_dims.gguf", "tensor 1 ('blk.0.attn_q.weight'): n_dims 0 at offset 449"},
    {"dims_overflow.gguf", "tensor 1 ('blk.0.attn_q.weight'): element count overflows at ne[1]"},
    {"ne_negative.gguf", "ne[1] = 9223372036854775808 at offset 461 is not in 1..2^63-1"},
    {"bytes_overflow.gguf", "tensor 1 ('blk.0.attn_q.weight'): byte size overflows (4611686018427387904 elements of f32, dims at offset 453)"},
    {"unknown_tensor_type.gguf", "tensor 1 ('blk.0.attn_q.weight'): unknown type 4 at offset 469"},
    {"bad_block_multiple.gguf", "ne[0] = 33 (offset 453) is not a multiple of the q8_0 block size 32"},
    {"misaligned_offset.gguf", "data offset 36 at offset 473 is not a multiple of the alignment 32"},
    {"tensor_offset_huge.gguf", "data offset 9223372036854775808 (data section at 544) is past the end of file"},
    {"tensor_past_eof.gguf",
     "tensor 2 ('blk.0.ffn_up.weight'): data [offset 704, 68 bytes] extends past end of file (760 bytes)"},
    {"overlapping_tensors.gguf", "tensor 1 ('blk.0.attn_q.weight'): data [offset 0, 128 bytes] overlaps tensor 0"},
    {"duplicate_tensor.gguf", "tensor 1: duplicate name 'output_norm.weight' (also tensor 0)"},
    {"empty_tensor_name.gguf", "tensor 1: empty name at offset 422"},
    {"tensor_name_nul.gguf", "tensor 1 ('blk.0\\x00attn_q.weight'): name at offset 430 contains a NUL byte"},
    {"truncated_tensor_info.gguf", "truncated at offset 453 while reading tensor 1 ('blk.0.attn_q.weight') ne[0]"},
};
#define N_BROKEN (sizeof broken_cases / sizeof broken_cases[0])

static void test_corpus_table(void **state)
{
    (void)state;
    assert_true(N_BROKEN >= 20);
    char path[512], err[ERR_MSG_MAX];
    for (size_t i = 0; i < N_BROKEN; i++) {
        snprintf(path, sizeof path, CORPUS_DIR "/%s", broken_cases[i].file);
        struct stat st;
        if (stat(path, &st) != 0)
            fail_msg("corpus file %s is missing (run scripts/make_gguf_corpus.py)", path);
        err[0] = 0;
        struct gguf *g = gguf_open(path, err);
        if (g)
            fail_msg("%s opened, expected an error containing \"%s\"", path, broken_cases[i].expect);
        char want[600];
        snprintf(want, sizeof want, "%s: ", path); /* the message names the file first */
        if (strncmp(err, want, strlen(want)) != 0 || !strstr(err, broken_cases[i].expect))
            fail_msg("%s: message \"%s\" lacks \"%s\"", path, err, broken_cases[i].expect);
        /* same verdict from a buffer */
        size_t len;
        char *buf = test_read_file(path, &len);
        assert_non_null(buf);
        assert_null(gguf_open_buffer(buf, len, err));
        assert_non_null(strstr(err, broken_cases[i].expect));
        free(buf);
    }
    /* every other file: valid_* must open, anything else (fuzzer finds) must just not crash */
    DIR *d = opendir(CORPUS_DIR);
    assert_non_null(d);
    int n_valid = 0;
    struct dirent *e;
    while ((e = readdir(d))) {
        if (e->d_name[0] == '.')
            continue;
        snprintf(path, sizeof path, CORPUS_DIR "/%s", e->d_name);
        struct gguf *g = gguf_open(path, err);
        if (!strncmp(e->d_name, "valid_", 6)) {
            if (!g)
                fail_msg("%s must open: %s", path, err);
            n_valid++;
        }
        gguf_close(g);
    }
    closedir(d);
    assert_true(n_valid >= 5);
}

/* Every prefix of a valid file fails (until the last tensor's data is complete) and every single-byte
 * corruption either opens or fails with a message: never a crash (this also runs under ASan). */
static void test_prefixes_and_flips(void **state)
{
    (void)state;
    const char *files[] = {CORPUS_DIR "/valid_small.gguf", CORPUS_DIR "/valid_all_types.gguf"};
    for (size_t k = 0; k < 2; k++) {
        size_t len;
        char *buf = test_read_file(files[k], &len), err[ERR_MSG_MAX];
        assert_non_null(buf);
        struct gguf *g = gguf_open_buffer(buf, len, err);
        assert_non_null(g);
        size_t need = 0;
        for (int64_t i = 0; i < gguf_tensor_count(g); i++) {
            const struct gguf_tensor *t = gguf_tensor_at(g, i);
            size_t e = gguf_data_offset(g) + t->offset + t->nbytes;
            need = e > need ? e : need;
        }
        gguf_close(g);
        for (size_t n = 0; n < len; n++) {
            char *cut = malloc(n ? n : 1); /* exact-size copy so ASan sees any over-read */
            memcpy(cut, buf, n);
            err[0] = 0;
            g = gguf_open_buffer(cut, n, err);
            if ((g != NULL) != (n >= need))
                fail_msg("%s cut to %zu bytes (needs %zu): %s", files[k], n, need, g ? "opened" : err);
            assert_true(g || err[0]);
            gguf_close(g);
            free(cut);
        }
        for (size_t pos = 0; pos < len; pos++) {
            for (int m = 0; m < 2; m++) {
                buf[pos] ^= m ? 0x80 : 0xff;
                err[0] = 0;
                g = gguf_open_buffer(buf, len, err);
                assert_true(g || err[0]);
                gguf_close(g);
                buf[pos] ^= m ? 0x80 : 0xff;
            }
        }
        free(buf);
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_stories260k),
        cmocka_unit_test(test_shared_vocab),
        cmocka_unit_test(test_shared_q4_k_m),
        cmocka_unit_test(test_open_errors),
        cmocka_unit_test(test_round_trip),
        cmocka_unit_test(test_writer_errors),
        cmocka_unit_test(test_writer_matches_python),
        cmocka_unit_test(test_corpus_table),
        cmocka_unit_test(test_open_mem_equals_mmap),
        cmocka_unit_test(test_open_mem_placed),
        cmocka_unit_test(test_prefixes_and_flips),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
