/*
 * testutil: shared folder lookup, temp paths and deterministic random data for the unit tests.
 */
#include "testutil.h"

#include "core/err.h"
#include "core/fsutil.h"
#include "engine/gguf/gguf.h"
#include "engine/gguf/quant.h"

#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

const char *test_shared_path(const char *rel)
{
    static char buf[4][4096];
    static int k;
    char *out = buf[k++ & 3];
    const char *root = getenv("WAFER_SHARED");
    snprintf(out, 4096, "%s/%s", root && *root ? root : "../shared", rel);
    struct stat st;
    return stat(out, &st) == 0 ? out : NULL;
}

static char test_tmp_dir[256];

static void test_tmp_cleanup(void)
{
    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", test_tmp_dir);
    if (system(cmd) != 0)
        fprintf(stderr, "could not remove %s\n", test_tmp_dir);
}

const char *test_tmp_path(const char *name)
{
    static char buf[8][4096];
    static int k;
    if (!test_tmp_dir[0]) {
        snprintf(test_tmp_dir, sizeof test_tmp_dir, "/tmp/wafer-test-XXXXXX");
        if (!mkdtemp(test_tmp_dir))
            abort();
        atexit(test_tmp_cleanup);
    }
    char *out = buf[k++ & 7];
    snprintf(out, 4096, "%s/%s", test_tmp_dir, name);
    return out;
}

void test_child_init(void)
{
    static const int sigs[] = {SIGSEGV, SIGBUS, SIGILL, SIGFPE, SIGSYS};
    for (size_t i = 0; i < sizeof sigs / sizeof sigs[0]; i++)
        signal(sigs[i], SIG_DFL);
}

void test_write_file(const char *path, const char *text)
{
    char err[ERR_MSG_MAX];
    if (fs_mkdirs_for(path, 0755, err))
        fail_msg("%s", err);
    FILE *f = fopen(path, "wb");
    if (!f)
        fail_msg("cannot write %s", path);
    fputs(text, f);
    fclose(f);
}

char *test_read_file(const char *path, size_t *len)
{
    FILE *f = fopen(path, "rb");
    if (!f)
        return NULL;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *buf = malloc((size_t)n + 1);
    if (buf && fread(buf, 1, (size_t)n, f) != (size_t)n) {
        free(buf);
        buf = NULL;
    }
    fclose(f);
    if (buf) {
        buf[n] = 0;
        if (len)
            *len = (size_t)n;
    }
    return buf;
}

uint64_t test_rand_u64(uint64_t *s)
{
    uint64_t x = *s ? *s : 0x9e3779b97f4a7c15ull;
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    return *s = x;
}

float test_rand_f32(uint64_t *s) { return (float)((test_rand_u64(s) >> 40) * (2.0 / 16777216.0) - 1.0); }

const char *test_gen_model(const char *name, const char *arch, enum ftype ft, bool tied)
{
    const char *vocab = test_shared_path("models/stories260K/stories260K.gguf");
    if (!vocab)
        return NULL;
    struct model_gen_params p;
    model_gen_params_default(&p);
    p.arch = arch;
    p.dim = 256, p.layers = 2, p.heads = 8, p.kv_heads = 2, p.ffn = 512, p.ctx = 256;
    p.vocab_from = vocab;
    p.ftype = ft;
    p.tied = tied;
    p.std = 0.08f;
    p.seed = 42;
    const char *path = test_tmp_path(name);
    char err[ERR_MSG_MAX];
    if (model_gen_write(&p, path, err))
        fail_msg("%s", err);
    return path;
}

/* ---- synthetic GGUF metadata (independent of the writer under test elsewhere) ---- */

static void tg_put(struct test_gguf *b, const void *s, size_t n)
{
    if (b->n + n > b->cap) {
        b->cap = (b->n + n) * 2 + 64;
        b->p = realloc(b->p, b->cap);
    }
    memcpy(b->p + b->n, s, n);
    b->n += n;
}
static void tg_u32(struct test_gguf *b, uint32_t v) { tg_put(b, &v, 4); }
static void tg_u64(struct test_gguf *b, uint64_t v) { tg_put(b, &v, 8); }
static void tg_string(struct test_gguf *b, const char *s)
{
    tg_u64(b, strlen(s));
    tg_put(b, s, strlen(s));
}

void test_gguf_begin(struct test_gguf *b)
{
    memset(b, 0, sizeof *b);
    tg_put(b, "GGUF", 4);
    tg_u32(b, 3);
    tg_u64(b, 0); /* tensors */
    tg_u64(b, 0); /* kv count, patched by test_gguf_open */
}

void test_gguf_str(struct test_gguf *b, const char *key, const char *v)
{
    tg_string(b, key);
    tg_u32(b, GGUF_TYPE_STRING);
    tg_string(b, v);
    b->n_kv++;
}

void test_gguf_u32(struct test_gguf *b, const char *key, uint32_t v)
{
    tg_string(b, key);
    tg_u32(b, GGUF_TYPE_UINT32);
    tg_u32(b, v);
    b->n_kv++;
}

void test_gguf_bool(struct test_gguf *b, const char *key, bool v)
{
    unsigned char c = v;
    tg_string(b, key);
    tg_u32(b, GGUF_TYPE_BOOL);
    tg_put(b, &c, 1);
    b->n_kv++;
}

void test_gguf_strs(struct test_gguf *b, const char *key, const char *const *v, size_t n)
{
    tg_string(b, key);
    tg_u32(b, GGUF_TYPE_ARRAY);
    tg_u32(b, GGUF_TYPE_STRING);
    tg_u64(b, n);
    for (size_t i = 0; i < n; i++)
        tg_string(b, v[i]);
    b->n_kv++;
}

void test_gguf_i32s(struct test_gguf *b, const char *key, const int32_t *v, size_t n)
{
    tg_string(b, key);
    tg_u32(b, GGUF_TYPE_ARRAY);
    tg_u32(b, GGUF_TYPE_INT32);
    tg_u64(b, n);
    tg_put(b, v, n * 4);
    b->n_kv++;
}

struct gguf *test_gguf_open(struct test_gguf *b)
{
    memcpy(b->p + 16, &b->n_kv, 8);
    char err[ERR_MSG_MAX];
    struct gguf *g = gguf_open_buffer(b->p, b->n, err);
    if (!g)
        fail_msg("synthetic gguf: %s", err);
    return g;
}

uint8_t *test_r16_of(enum dtype t, const uint8_t *w, size_t ldw, int n16, int64_t n)
{
    size_t rb = dtype_row_bytes(t, n);
    uint8_t *rows = malloc(rb * (size_t)n16), *w16 = malloc(rb * (size_t)n16), *back = malloc(rb * (size_t)n16);
    assert_non_null(rows);
    assert_non_null(w16);
    assert_non_null(back);
    assert_true(quant_r16_supported(t));
    for (int r = 0; r < n16; r++)
        memcpy(rows + (size_t)r * rb, w + (size_t)r * ldw, rb);
    assert_int_equal(quant_r16_convert(t, rows, w16, n16, n, true), 0);
    assert_int_equal(quant_r16_convert(t, w16, back, n16, n, false), 0);
    assert_memory_equal(back, rows, rb * (size_t)n16);
    for (int r = 0; r < n16; r++) {
        memset(back, 0, rb);
        quant_r16_row(t, w16, r, n, back);
        assert_memory_equal(back, rows + (size_t)r * rb, rb);
    }
    free(rows);
    free(back);
    return w16;
}
