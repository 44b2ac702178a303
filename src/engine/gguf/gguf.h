/*
 * gguf: reader and writer of GGUF files (versions 2 and 3), the llama.cpp model format.
 *
 * Reader: the file is mmapped read-only and validated once at open: every count, string length, array
 * length, tensor shape, type, offset, size and the alignment are checked against the file's length before
 * anything is dereferenced, so a truncated or corrupted file yields one precise message naming the bad field
 * (never a crash or an out-of-bounds read). After a successful open every pointer handed out points inside
 * the mapping and stays valid until gguf_close.
 *
 * Layout (little endian): magic "GGUF", u32 version, u64 n_tensors, u64 n_kv, then n_kv of
 * {string key, u32 value type, value}, then n_tensors of {string name, u32 n_dims, u64 ne[n_dims], u32 type,
 * u64 offset}, padding to general.alignment (default 32), then the tensor data; a string is {u64 len, bytes}.
 * Version 1 (u32 counts) is refused.
 *
 * Writer: declare metadata and tensors, then stream the tensor data in declaration order, so a multi-GB
 * model is written without holding it in memory.
 */
#ifndef WAFER_ENGINE_GGUF_H
#define WAFER_ENGINE_GGUF_H

#include "engine/dtype.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define GGUF_DEFAULT_ALIGNMENT 32
#define GGUF_MAX_DIMS 4

enum gguf_vtype {
    GGUF_TYPE_UINT8 = 0,
    GGUF_TYPE_INT8 = 1,
    GGUF_TYPE_UINT16 = 2,
    GGUF_TYPE_INT16 = 3,
    GGUF_TYPE_UINT32 = 4,
    GGUF_TYPE_INT32 = 5,
    GGUF_TYPE_FLOAT32 = 6,
    GGUF_TYPE_BOOL = 7,
    GGUF_TYPE_STRING = 8,
    GGUF_TYPE_ARRAY = 9,
    GGUF_TYPE_UINT64 = 10,
    GGUF_TYPE_INT64 = 11,
    GGUF_TYPE_FLOAT64 = 12,
    GGUF_TYPE_COUNT_ = 13
};

/* A string inside the mapping: NOT NUL-terminated. */
struct gguf_str {
    uint64_t len;
    const char *ptr;
};

/* One metadata pair. For scalars `data` points at the (possibly unaligned: use memcpy) value; for strings
 * `str` is set; for arrays `arr_type`/`arr_len` are set and `data` points at the first element (numeric
 * arrays, contiguous, possibly unaligned) or `strs` holds arr_len strings (string arrays).
 * Arrays of arrays are refused at open. */
struct gguf_kv {
    struct gguf_str key;
    enum gguf_vtype type;
    struct gguf_str str;
    enum gguf_vtype arr_type;
    uint64_t arr_len;
    const void *data;
    const struct gguf_str *strs;
};

/* One tensor. ne[0] is the innermost (contiguous) dimension; unused dims are 1. `data` points into the
 * mapping (data section start + offset); nbytes = row bytes of ne[0] times the product of the other dims. */
struct gguf_tensor {
    const char *name; /* NUL-terminated copy owned by the reader */
    uint32_t n_dims;
    int64_t ne[GGUF_MAX_DIMS];
    enum dtype type;
    uint64_t offset; /* relative to the data section */
    size_t nbytes;
    const void *data;
};

struct gguf; /* opaque reader handle */

/* Opens and validates a GGUF file. Returns NULL and writes a message (ERR_MSG_MAX bytes) into err on any
 * problem: "path: truncated at offset N while reading tensor 3 ('blk.0.attn_q.weight') dims" and the like.
 * Caller frees with gguf_close. */
struct gguf *gguf_open(const char *path, char *err);

/* Same, but reads the whole file into private anonymous memory (read-only once loaded) instead of mapping
 * the file. Costs a copy at load (two reader threads: about 0.2 s for 640 MB from the page cache) and memory the page cache
 * cannot share between processes; buys faster streaming reads: decode, which reads every weight once per
 * token, measured 12-20% faster from anonymous pages than from the file's page-cache pages on this machine
 * (docs/performance.md). The memory comes from bigmem_alloc: 2 MiB huge pages where the kernel gives them
 * (core/bigmem.h has the measurement). Caller frees with gguf_close. */
struct gguf *gguf_open_mem(const char *path, char *err);

/* How gguf_open_mem_placed puts tensors into memory: a tensor t for which unit(ctx, t) returns a nonzero number
 * of bytes (which must divide t->nbytes) is read through a buffer, whole units at a time, and place(ctx, t, src,
 * dst, n) writes those n bytes of it (src, the file's) to dst, their place in memory, in whatever order it keeps
 * its tensors in (dst - t->data is a multiple of the unit). unit is called once per tensor after the header is
 * parsed; place runs on two threads at once, on disjoint pieces. Every other byte is copied as it is. */
struct gguf_placer {
    void *ctx;
    size_t (*unit)(void *ctx, const struct gguf_tensor *t);
    void (*place)(void *ctx, const struct gguf_tensor *t, const void *src, void *dst, size_t n);
};

/* gguf_open_mem with the tensors placed by pl (NULL: copied as they are, which is gguf_open_mem). The header is
 * parsed before the tensors are read, so the placer sees them all; transforming while reading costs no pass
 * over memory of its own. */
struct gguf *gguf_open_mem_placed(const char *path, const struct gguf_placer *pl, char *err);

/* For a handle from gguf_open_mem: makes its memory writable (true) or read-only again (false), so tensors can
 * be rearranged in place (model_relayout). 0; ERR_UNSUPPORTED for another handle (a mapped file, a caller's
 * buffer); ERR_IO when mprotect fails. */
int gguf_set_writable(struct gguf *g, bool writable);

/* Same, over a caller-owned buffer that must outlive the handle (used by the fuzzer and tests). */
struct gguf *gguf_open_buffer(const void *buf, size_t len, char *err);

void gguf_close(struct gguf *g);

uint32_t gguf_version(const struct gguf *g);
size_t gguf_alignment(const struct gguf *g);
size_t gguf_file_size(const struct gguf *g);
size_t gguf_data_offset(const struct gguf *g); /* start of the tensor data section in the file */

int64_t gguf_kv_count(const struct gguf *g);
const struct gguf_kv *gguf_kv_at(const struct gguf *g, int64_t i);
const struct gguf_kv *gguf_kv_find(const struct gguf *g, const char *key); /* NULL when absent */

/* Typed getters. Return 0, ERR_NOT_FOUND when the key is absent, or ERR_FORMAT when the stored type does
 * not fit (integers convert between widths when the value is in range; a float getter accepts f32/f64). */
int gguf_get_u32(const struct gguf *g, const char *key, uint32_t *out);
int gguf_get_i64(const struct gguf *g, const char *key, int64_t *out);
int gguf_get_f32(const struct gguf *g, const char *key, float *out);
int gguf_get_bool(const struct gguf *g, const char *key, bool *out);
int gguf_get_str(const struct gguf *g, const char *key, struct gguf_str *out);
/* Array getter: *kv gets the pair so callers read arr_type/arr_len/data/strs. ERR_FORMAT if not an array. */
int gguf_get_arr(const struct gguf *g, const char *key, const struct gguf_kv **kv);

/* Reads element i of a numeric array as double (any numeric element type). */
double gguf_arr_num(const struct gguf_kv *kv, uint64_t i);

/* Returns a malloc'd NUL-terminated copy of a string (caller frees), or NULL on OOM. */
char *gguf_str_dup(struct gguf_str s);
/* true when s equals the C string z. */
bool gguf_str_eq(struct gguf_str s, const char *z);

int64_t gguf_tensor_count(const struct gguf *g);
const struct gguf_tensor *gguf_tensor_at(const struct gguf *g, int64_t i);
const struct gguf_tensor *gguf_tensor_find(const struct gguf *g, const char *name); /* NULL when absent */

const char *gguf_vtype_name(enum gguf_vtype t);
/* Bytes of one scalar of type t (bool: 1); 0 for strings, arrays and unknown types. */
size_t gguf_vtype_size(enum gguf_vtype t);

/* ---- writer ---- */

struct gguf_writer; /* opaque */

/* Caller frees with gguf_writer_destroy. NULL on OOM. */
struct gguf_writer *gguf_writer_create(void);
void gguf_writer_destroy(struct gguf_writer *w);

/* Metadata setters; a key set twice keeps the last value; strings and arrays are copied. 0 or ERR_NOMEM. */
int gguf_writer_set_u32(struct gguf_writer *w, const char *key, uint32_t v);
int gguf_writer_set_i32(struct gguf_writer *w, const char *key, int32_t v);
int gguf_writer_set_u64(struct gguf_writer *w, const char *key, uint64_t v);
int gguf_writer_set_f32(struct gguf_writer *w, const char *key, float v);
int gguf_writer_set_bool(struct gguf_writer *w, const char *key, bool v);
int gguf_writer_set_str(struct gguf_writer *w, const char *key, const char *v);
/* Additions: a scalar of any numeric/bool type t read from v (gguf_vtype_size(t) bytes; ERR_INVALID_ARG for
 * string/array types), and a string given as pointer + length (may hold any bytes). */
int gguf_writer_set_scalar(struct gguf_writer *w, const char *key, enum gguf_vtype t, const void *v);
int gguf_writer_set_strn(struct gguf_writer *w, const char *key, struct gguf_str s);
/* Numeric array of n elements of type t (stored as given, little endian). */
int gguf_writer_set_arr(struct gguf_writer *w, const char *key, enum gguf_vtype t, const void *data, uint64_t n);
int gguf_writer_set_str_arr(struct gguf_writer *w, const char *key, const struct gguf_str *strs, uint64_t n);
/* Copies one pair from a reader (used by quantize and model new --vocab-from). */
int gguf_writer_copy_kv(struct gguf_writer *w, const struct gguf_kv *kv);

/* Declares a tensor; returns its index (>= 0) or a negative error. ne[0] must be a multiple of the type's
 * block size. */
int gguf_writer_add_tensor(struct gguf_writer *w, const char *name, enum dtype type, uint32_t n_dims,
                           const int64_t *ne);

/* Writes the header, metadata and tensor infos to path (created/truncated). */
int gguf_writer_begin(struct gguf_writer *w, const char *path, char *err);
/* Writes tensor i's data (exactly its nbytes) and padding; tensors must come in declaration order. */
int gguf_writer_write_tensor(struct gguf_writer *w, int i, const void *data, size_t nbytes, char *err);
/* Addition: streams part of tensor i's data (for tensors too big to convert in one buffer); chunks of tensor i
 * are appended until its nbytes are complete, then the padding is written and tensor i+1 becomes next. */
int gguf_writer_write_data(struct gguf_writer *w, int i, const void *data, size_t n, char *err);
/* Checks every tensor was written, flushes and closes the file. */
int gguf_writer_finish(struct gguf_writer *w, char *err);

#endif
