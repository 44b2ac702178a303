/*
 * testutil: helpers shared by the cmocka unit tests: where ../shared lives, temp files, reading files.
 */
#ifndef WAFER_TESTS_TESTUTIL_H
#define WAFER_TESTS_TESTUTIL_H

#include "engine/dtype.h"
#include "engine/gguf/model_gen.h"

#include <setjmp.h>
#include <stdbool.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

/* Path of rel inside the shared folder ($WAFER_SHARED, else ../shared from the repo root) in a static
 * buffer, or NULL when that file does not exist (the caller then calls skip() with a message). */
const char *test_shared_path(const char *rel);

/* Skips the current test with a clear message when the shared file is missing; returns its path. */
#define TEST_SHARED_OR_SKIP(rel)                                                                           \
    ({                                                                                                     \
        const char *p_ = test_shared_path(rel);                                                            \
        if (!p_) {                                                                                         \
            print_message("[  SKIPPED ] shared file %s not found (set WAFER_SHARED)\n", rel);              \
            skip();                                                                                        \
        }                                                                                                  \
        p_;                                                                                                \
    })

/* Creates a fresh temporary directory (removed at exit) and returns path/name in a static rotating buffer. */
const char *test_tmp_path(const char *name);

/* First call in a forked test child: puts back the default action of the signals cmocka catches, so that a
 * crash in the child shows as that signal in the parent's waitpid instead of a longjmp into the copy of the test
 * runner (which ends, from the wrong thread, in an unrelated exit status). */
void test_child_init(void);

/* Reads a whole file; caller frees. NULL on error. */
char *test_read_file(const char *path, size_t *len);

/* Writes text to path, making the folders above it (fs_mkdirs_for); fails the test when it cannot. */
void test_write_file(const char *path, const char *text);

/* Writes a small random model (dim 256, 2 layers, 8 heads, 2 KV heads, FFN 512, context 256, seed 42) of
 * architecture arch ("llama", "qwen2") and format ft, with the shared stories260K vocabulary, to a temporary
 * file `name`; tied: no output matrix. Its path, or NULL when the shared vocabulary is absent (the caller
 * skips); fails the test when the writer fails. */
const char *test_gen_model(const char *name, const char *arch, enum ftype ft, bool tied);

/* A minimal GGUF (v3, metadata only) assembled in memory, for synthetic vocabularies: begin, add keys, open.
 * p must outlive the gguf opened from it (free(b.p) after gguf_close). */
struct gguf;
struct test_gguf {
    unsigned char *p;
    size_t n, cap;
    uint64_t n_kv;
};
void test_gguf_begin(struct test_gguf *b);
void test_gguf_str(struct test_gguf *b, const char *key, const char *v);
void test_gguf_u32(struct test_gguf *b, const char *key, uint32_t v);
void test_gguf_bool(struct test_gguf *b, const char *key, bool v);
void test_gguf_strs(struct test_gguf *b, const char *key, const char *const *v, size_t n);
void test_gguf_i32s(struct test_gguf *b, const char *key, const int32_t *v, size_t n);
/* Opens what was built; fails the test when the file does not parse. */
struct gguf *test_gguf_open(struct test_gguf *b);

/* The first n16 rows (a multiple of 16) of w (rows of n elements of type t, ldw bytes apart) in quant.h's R16
 * layout, in a buffer the caller frees; fails the test unless the layout converts back to the same rows and
 * quant_r16_row reads every row out of it. */
uint8_t *test_r16_of(enum dtype t, const uint8_t *w, size_t ldw, int n16, int64_t n);

/* Deterministic xorshift random numbers for test data. */
uint64_t test_rand_u64(uint64_t *state);
float test_rand_f32(uint64_t *state); /* uniform in [-1, 1) */

#endif
