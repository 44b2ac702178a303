/*
 * gguf reader: one validating pass over a read-only mapping (or a caller's buffer).
 *
 * Every read goes through a bounds-checked cursor, and every count is compared with the bytes left BEFORE
 * anything is allocated for it, so a header that claims 2^60 tensors fails at once instead of asking malloc
 * for exabytes. The first problem ends the parse with one message that names the field, its file offset and,
 * where known, the key or tensor it belongs to; nothing after it is reported, because once one field is
 * wrong every later offset is meaningless.
 *
 * After open nothing is validated again: the kv array, the string tables of string arrays and the tensor
 * array (with NUL-terminated name copies) are built once, and getters only look things up. Keys and tensor
 * names are indexed in open-addressing hash tables, which also give duplicate detection in linear time
 * (vocabularies hold 150k strings and fuzzed headers can claim millions of keys).
 */
#include "engine/gguf/gguf.h"

#include "core/bigmem.h"
#include "core/err.h"
#include "core/log.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <math.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#define GGUF_MAGIC "GGUF"
#define GGUF_SHOW_MAX 48 /* longest key/name quoted in a message (escapes take 4 bytes each) */
#define GGUF_SHOW_BUF (GGUF_SHOW_MAX * 4 + 8)
#define GGUF_WHAT_BUF 320

/* Open-addressing index over strings: slot holds index+1, 0 = empty. Capacity is a power of two >= 2n. */
struct gguf_index {
    uint32_t *slots;
    uint64_t mask;
};

struct gguf {
    const uint8_t *base;
    size_t size;
    size_t avail; /* bytes of the file at base the parse may read (gguf_open_mem parses before reading the rest) */
    bool mapped;
    bool in_memory; /* from gguf_open_mem: private anonymous memory, which gguf_set_writable may unprotect */
    uint32_t version;
    size_t alignment;
    size_t data_offset;
    int64_t n_kv;
    struct gguf_kv *kv;
    int64_t n_tensors;
    struct gguf_tensor *tensors;
    char *names; /* pool of the NUL-terminated tensor names */
    struct gguf_index kv_index;
    struct gguf_index tensor_index;
};

/* Parse state: the cursor plus what is being read, so a truncation message can say where it happened. */
struct gguf_cursor {
    const uint8_t *base;
    size_t size;
    size_t off;
    const char *label; /* path or "<buffer>" */
    char *err;
};

/* ---- small helpers ---- */

static uint64_t gguf_hash(const char *p, uint64_t n)
{
    uint64_t h = 0xcbf29ce484222325ull; /* FNV-1a */
    for (uint64_t i = 0; i < n; i++) {
        h ^= (uint8_t)p[i];
        h *= 0x100000001b3ull;
    }
    return h;
}

static int gguf_index_init(struct gguf_index *ix, uint64_t n)
{
    uint64_t cap = 16;
    while (cap < 2 * n)
        cap <<= 1;
    ix->slots = calloc(cap, sizeof *ix->slots);
    ix->mask = cap - 1;
    return ix->slots ? 0 : ERR_NOMEM;
}

/* Finds s among the strings already inserted (get(i) returns string i); returns its index or -1. When
 * insert_idx >= 0 and s is absent, inserts it. */
static int64_t gguf_index_lookup(const struct gguf_index *ix, const char *p, uint64_t n, int64_t insert_idx,
                                 struct gguf_str (*get)(const void *, int64_t), const void *ctx)
{
    if (!ix->slots)
        return -1;
    uint64_t h = gguf_hash(p, n) & ix->mask;
    for (;;) {
        uint32_t s = ix->slots[h];
        if (s == 0) {
            if (insert_idx >= 0)
                ix->slots[h] = (uint32_t)(insert_idx + 1);
            return -1;
        }
        struct gguf_str o = get(ctx, (int64_t)s - 1);
        if (o.len == n && memcmp(o.ptr, p, n) == 0)
            return (int64_t)s - 1;
        h = (h + 1) & ix->mask;
    }
}

static struct gguf_str gguf_kv_key_at(const void *ctx, int64_t i) { return ((const struct gguf *)ctx)->kv[i].key; }

static struct gguf_str gguf_tensor_name_at(const void *ctx, int64_t i)
{
    const struct gguf_tensor *t = &((const struct gguf *)ctx)->tensors[i];
    struct gguf_str s = {strlen(t->name), t->name};
    return s;
}

/* Quotes untrusted bytes for a message: printable ASCII as is, the rest as \xNN, cut at GGUF_SHOW_MAX. */
static const char *gguf_show(char *buf, size_t cap, struct gguf_str s)
{
    size_t o = 0;
    for (uint64_t i = 0; i < s.len && o + 8 < cap; i++) {
        if (i >= GGUF_SHOW_MAX) {
            o += (size_t)snprintf(buf + o, cap - o, "...");
            break;
        }
        uint8_t c = (uint8_t)s.ptr[i];
        if (c >= 0x20 && c < 0x7f && c != '\'' && c != '\\')
            buf[o++] = (char)c;
        else
            o += (size_t)snprintf(buf + o, cap - o, "\\x%02x", c);
    }
    buf[o] = 0;
    return buf;
}

static size_t gguf_vtype_size_(enum gguf_vtype t)
{
    switch (t) {
    case GGUF_TYPE_UINT8:
    case GGUF_TYPE_INT8:
    case GGUF_TYPE_BOOL:
        return 1;
    case GGUF_TYPE_UINT16:
    case GGUF_TYPE_INT16:
        return 2;
    case GGUF_TYPE_UINT32:
    case GGUF_TYPE_INT32:
    case GGUF_TYPE_FLOAT32:
        return 4;
    case GGUF_TYPE_UINT64:
    case GGUF_TYPE_INT64:
    case GGUF_TYPE_FLOAT64:
        return 8;
    default:
        return 0;
    }
}

size_t gguf_vtype_size(enum gguf_vtype t) { return gguf_vtype_size_(t); }

const char *gguf_vtype_name(enum gguf_vtype t)
{
    static const char *const names[GGUF_TYPE_COUNT_] = {
        "u8", "i8", "u16", "i16", "u32", "i32", "f32", "bool", "string", "array", "u64", "i64", "f64",
    };
    return (unsigned)t < GGUF_TYPE_COUNT_ ? names[t] : "unknown";
}

/* ---- cursor ---- */

/* what: a printf description of the field ("kv 3 ('general.name') value"). */
static int gguf_need(struct gguf_cursor *c, uint64_t n, const char *what)
{
    if (n > c->size - c->off)
        return err_set(c->err, ERR_FORMAT,
                       "%s: truncated at offset %zu while reading %s (%" PRIu64 " bytes needed, %zu left)",
                       c->label, c->off, what, n, c->size - c->off);
    return 0;
}

static int gguf_read(struct gguf_cursor *c, void *out, size_t n, const char *what)
{
    int rc = gguf_need(c, n, what);
    if (rc)
        return rc;
    memcpy(out, c->base + c->off, n);
    c->off += n;
    return 0;
}

static int gguf_read_u32(struct gguf_cursor *c, uint32_t *v, const char *what) { return gguf_read(c, v, 4, what); }
static int gguf_read_u64(struct gguf_cursor *c, uint64_t *v, const char *what) { return gguf_read(c, v, 8, what); }

/* A string: u64 length then bytes. The length is checked against the bytes left before it is used. */
static int gguf_read_str(struct gguf_cursor *c, struct gguf_str *s, const char *what)
{
    char w[GGUF_WHAT_BUF + 32];
    snprintf(w, sizeof w, "%s length", what);
    size_t at = c->off;
    int rc = gguf_read_u64(c, &s->len, w);
    if (rc)
        return rc;
    if (s->len > c->size - c->off)
        return err_set(c->err, ERR_FORMAT,
                       "%s: %s: string length %" PRIu64 " at offset %zu runs past end of file (%zu bytes left)",
                       c->label, what, s->len, at, c->size - c->off);
    s->ptr = (const char *)c->base + c->off;
    c->off += (size_t)s->len;
    return 0;
}

/* ---- metadata ---- */

static int gguf_check_bool(struct gguf_cursor *c, const uint8_t *p, uint64_t n, const char *what)
{
    for (uint64_t i = 0; i < n; i++)
        if (p[i] > 1)
            return err_set(c->err, ERR_FORMAT, "%s: %s: bool value %u at offset %zu is not 0 or 1", c->label, what,
                           p[i], (size_t)(p + i - c->base));
    return 0;
}

static int gguf_read_value(struct gguf_cursor *c, struct gguf_kv *kv, const char *what)
{
    char w[GGUF_WHAT_BUF + 32];
    size_t at = c->off;
    if (kv->type == GGUF_TYPE_STRING)
        return gguf_read_str(c, &kv->str, what);
    if (kv->type != GGUF_TYPE_ARRAY) {
        size_t n = gguf_vtype_size_(kv->type);
        int rc = gguf_need(c, n, what);
        if (rc)
            return rc;
        kv->data = c->base + c->off;
        if (kv->type == GGUF_TYPE_BOOL && (rc = gguf_check_bool(c, kv->data, 1, what)))
            return rc;
        c->off += n;
        return 0;
    }
    uint32_t et;
    snprintf(w, sizeof w, "%s array type", what);
    int rc = gguf_read_u32(c, &et, w);
    if (rc)
        return rc;
    if (et == GGUF_TYPE_ARRAY)
        return err_set(c->err, ERR_FORMAT, "%s: %s: arrays of arrays are not supported (element type at offset %zu)",
                       c->label, what, at);
    if (et >= GGUF_TYPE_COUNT_)
        return err_set(c->err, ERR_FORMAT, "%s: %s: unknown array element type %" PRIu32 " at offset %zu", c->label,
                       what, et, at);
    kv->arr_type = (enum gguf_vtype)et;
    snprintf(w, sizeof w, "%s array length", what);
    size_t len_at = c->off;
    if ((rc = gguf_read_u64(c, &kv->arr_len, w)))
        return rc;
    size_t left = c->size - c->off;
    if (et == GGUF_TYPE_STRING) {
        /* each element takes at least its 8-byte length: refuse before allocating the table */
        if (kv->arr_len > left / 8)
            return err_set(c->err, ERR_FORMAT,
                           "%s: %s: array length %" PRIu64 " at offset %zu cannot fit in the %zu bytes left "
                           "(each string needs at least 8)",
                           c->label, what, kv->arr_len, len_at, left);
        struct gguf_str *strs = malloc((kv->arr_len ? kv->arr_len : 1) * sizeof *strs);
        if (!strs)
            return err_set(c->err, ERR_NOMEM, "%s: %s: out of memory for %" PRIu64 " strings", c->label, what,
                           kv->arr_len);
        kv->strs = strs; /* owned by the kv from here on, freed by gguf_close */
        for (uint64_t i = 0; i < kv->arr_len; i++) {
            /* fast path for 150k-token vocabularies: the message is only formatted when a check fails */
            size_t rest = c->size - c->off;
            if (rest >= 8) {
                memcpy(&strs[i].len, c->base + c->off, 8);
                if (strs[i].len <= rest - 8) {
                    strs[i].ptr = (const char *)c->base + c->off + 8;
                    c->off += 8 + (size_t)strs[i].len;
                    continue;
                }
            }
            snprintf(w, sizeof w, "%s element %" PRIu64, what, i);
            rc = gguf_read_str(c, &strs[i], w);
            ASSERT(rc != 0); /* the same checks failed above */
            return rc;
        }
        return 0;
    }
    size_t es = gguf_vtype_size_(kv->arr_type);
    if (kv->arr_len > left / es)
        return err_set(c->err, ERR_FORMAT,
                       "%s: %s: array of %" PRIu64 " %s at offset %zu runs past end of file (%zu bytes left)",
                       c->label, what, kv->arr_len, gguf_vtype_name(kv->arr_type), len_at, left);
    kv->data = c->base + c->off;
    if (et == GGUF_TYPE_BOOL && (rc = gguf_check_bool(c, kv->data, kv->arr_len, what)))
        return rc;
    c->off += (size_t)(kv->arr_len * es);
    return 0;
}

static int gguf_read_kvs(struct gguf *g, struct gguf_cursor *c)
{
    char what[GGUF_WHAT_BUF], show[GGUF_SHOW_BUF];
    for (int64_t i = 0; i < g->n_kv; i++) {
        struct gguf_kv *kv = &g->kv[i];
        snprintf(what, sizeof what, "kv %" PRId64 " key", i);
        int rc = gguf_read_str(c, &kv->key, what);
        if (rc)
            return rc;
        if (kv->key.len == 0)
            return err_set(c->err, ERR_FORMAT, "%s: kv %" PRId64 ": empty key at offset %zu", c->label, i,
                           c->off - 8);
        gguf_show(show, sizeof show, kv->key);
        int64_t dup = gguf_index_lookup(&g->kv_index, kv->key.ptr, kv->key.len, i, gguf_kv_key_at, g);
        if (dup >= 0)
            return err_set(c->err, ERR_FORMAT, "%s: kv %" PRId64 ": duplicate key '%s' (also kv %" PRId64 ") at offset %zu",
                           c->label, i, show, dup, c->off - (size_t)kv->key.len - 8);
        snprintf(what, sizeof what, "kv %" PRId64 " ('%s') type", i, show);
        size_t at = c->off;
        uint32_t t;
        if ((rc = gguf_read_u32(c, &t, what)))
            return rc;
        if (t >= GGUF_TYPE_COUNT_)
            return err_set(c->err, ERR_FORMAT, "%s: kv %" PRId64 " ('%s'): unknown value type %" PRIu32 " at offset %zu",
                           c->label, i, show, t, at);
        kv->type = (enum gguf_vtype)t;
        snprintf(what, sizeof what, "kv %" PRId64 " ('%s') value", i, show);
        if ((rc = gguf_read_value(c, kv, what)))
            return rc;
    }
    return 0;
}

/* general.alignment: must be a nonzero power-of-two u32 when present. */
static int gguf_read_alignment(struct gguf *g, const char *label, char *err)
{
    g->alignment = GGUF_DEFAULT_ALIGNMENT;
    const struct gguf_kv *kv = gguf_kv_find(g, "general.alignment");
    if (!kv)
        return 0;
    size_t at = (size_t)((const uint8_t *)kv->key.ptr - g->base) + (size_t)kv->key.len;
    if (kv->type != GGUF_TYPE_UINT32)
        return err_set(err, ERR_FORMAT, "%s: general.alignment (offset %zu) has type %s, expected u32", label, at,
                       gguf_vtype_name(kv->type));
    uint32_t a;
    memcpy(&a, kv->data, 4);
    if (a == 0 || (a & (a - 1)) != 0)
        return err_set(err, ERR_FORMAT, "%s: general.alignment %" PRIu32 " (offset %zu) is not a nonzero power of two",
                       label, a, at + 4);
    g->alignment = a;
    return 0;
}

/* ---- tensors ---- */

static int gguf_read_tensor_infos(struct gguf *g, struct gguf_cursor *c, struct gguf_str *names)
{
    char what[GGUF_WHAT_BUF], show[GGUF_SHOW_BUF];
    for (int64_t i = 0; i < g->n_tensors; i++) {
        struct gguf_tensor *t = &g->tensors[i];
        snprintf(what, sizeof what, "tensor %" PRId64 " name", i);
        int rc = gguf_read_str(c, &names[i], what);
        if (rc)
            return rc;
        gguf_show(show, sizeof show, names[i]);
        if (names[i].len == 0)
            return err_set(c->err, ERR_FORMAT, "%s: tensor %" PRId64 ": empty name at offset %zu", c->label, i,
                           c->off - 8);
        if (memchr(names[i].ptr, 0, names[i].len))
            return err_set(c->err, ERR_FORMAT, "%s: tensor %" PRId64 " ('%s'): name at offset %zu contains a NUL byte",
                           c->label, i, show, c->off - (size_t)names[i].len);
        snprintf(what, sizeof what, "tensor %" PRId64 " ('%s') n_dims", i, show);
        size_t at = c->off;
        if ((rc = gguf_read_u32(c, &t->n_dims, what)))
            return rc;
        if (t->n_dims < 1 || t->n_dims > GGUF_MAX_DIMS)
            return err_set(c->err, ERR_FORMAT,
                           "%s: tensor %" PRId64 " ('%s'): n_dims %" PRIu32 " at offset %zu is not in 1..%d", c->label,
                           i, show, t->n_dims, at, GGUF_MAX_DIMS);
        int64_t nelem = 1;
        size_t dims_at = c->off;
        for (int d = 0; d < GGUF_MAX_DIMS; d++) {
            t->ne[d] = 1;
            if ((uint32_t)d >= t->n_dims)
                continue;
            uint64_t ne;
            snprintf(what, sizeof what, "tensor %" PRId64 " ('%s') ne[%d]", i, show, d);
            at = c->off;
            if ((rc = gguf_read_u64(c, &ne, what)))
                return rc;
            if (ne == 0 || ne > INT64_MAX)
                return err_set(c->err, ERR_FORMAT,
                               "%s: tensor %" PRId64 " ('%s'): ne[%d] = %" PRIu64 " at offset %zu is not in 1..2^63-1",
                               c->label, i, show, d, ne, at);
            if ((int64_t)ne > INT64_MAX / nelem)
                return err_set(c->err, ERR_FORMAT,
                               "%s: tensor %" PRId64 " ('%s'): element count overflows at ne[%d] = %" PRIu64
                               " (offset %zu)",
                               c->label, i, show, d, ne, at);
            nelem *= (int64_t)ne;
            t->ne[d] = (int64_t)ne;
        }
        snprintf(what, sizeof what, "tensor %" PRId64 " ('%s') type", i, show);
        at = c->off;
        uint32_t type;
        if ((rc = gguf_read_u32(c, &type, what)))
            return rc;
        if (!dtype_is_known(type))
            return err_set(c->err, ERR_FORMAT, "%s: tensor %" PRId64 " ('%s'): unknown type %" PRIu32 " at offset %zu",
                           c->label, i, show, type, at);
        t->type = (enum dtype)type;
        size_t be = dtype_block_elems(t->type), bb = dtype_block_bytes(t->type);
        if (t->ne[0] % (int64_t)be != 0)
            return err_set(c->err, ERR_FORMAT,
                           "%s: tensor %" PRId64 " ('%s'): ne[0] = %" PRId64 " (offset %zu) is not a multiple of the %s "
                           "block size %zu",
                           c->label, i, show, t->ne[0], dims_at, dtype_name(t->type), be);
        /* bytes = blocks * block bytes; blocks <= nelem fits, the multiply may not */
        uint64_t blocks = (uint64_t)nelem / be, nbytes;
        if (__builtin_mul_overflow(blocks, (uint64_t)bb, &nbytes) || nbytes > SIZE_MAX)
            return err_set(c->err, ERR_FORMAT, "%s: tensor %" PRId64 " ('%s'): byte size overflows (%" PRId64
                           " elements of %s, dims at offset %zu)", c->label, i, show, nelem, dtype_name(t->type), dims_at);
        t->nbytes = (size_t)nbytes;
        snprintf(what, sizeof what, "tensor %" PRId64 " ('%s') offset", i, show);
        at = c->off;
        if ((rc = gguf_read_u64(c, &t->offset, what)))
            return rc;
        if (t->offset % g->alignment != 0)
            return err_set(c->err, ERR_FORMAT,
                           "%s: tensor %" PRId64 " ('%s'): data offset %" PRIu64 " at offset %zu is not a multiple of "
                           "the alignment %zu",
                           c->label, i, show, t->offset, at, g->alignment);
    }
    return 0;
}

static int gguf_cmp_offset(const void *a, const void *b, void *ctx)
{
    const struct gguf_tensor *t = ctx;
    uint64_t x = t[*(const int64_t *)a].offset, y = t[*(const int64_t *)b].offset;
    return x < y ? -1 : x > y;
}

/* Data extents: inside the file and pairwise disjoint (checked on the tensors sorted by offset). */
static int gguf_check_extents(struct gguf *g, const char *label, char *err)
{
    char show[GGUF_SHOW_BUF], show2[GGUF_SHOW_BUF];
    for (int64_t i = 0; i < g->n_tensors; i++) {
        struct gguf_tensor *t = &g->tensors[i];
        uint64_t start = t->offset + g->data_offset; /* offset <= 2^64 - 1: check the sum */
        struct gguf_str s = {strlen(t->name), t->name};
        if (t->offset > g->size || start > g->size)
            return err_set(err, ERR_FORMAT,
                           "%s: tensor %" PRId64 " ('%s'): data offset %" PRIu64 " (data section at %zu) is past the "
                           "end of file (%zu bytes)",
                           label, i, gguf_show(show, sizeof show, s), t->offset, g->data_offset, g->size);
        if (t->nbytes > g->size - start)
            return err_set(err, ERR_FORMAT,
                           "%s: tensor %" PRId64 " ('%s'): data [offset %" PRIu64 ", %zu bytes] extends past end of "
                           "file (%zu bytes)",
                           label, i, gguf_show(show, sizeof show, s), start, t->nbytes, g->size);
        t->data = g->base + start;
    }
    if (g->n_tensors < 2)
        return 0;
    int64_t *order = malloc((size_t)g->n_tensors * sizeof *order);
    if (!order)
        return err_set(err, ERR_NOMEM, "%s: out of memory sorting %" PRId64 " tensors", label, g->n_tensors);
    for (int64_t i = 0; i < g->n_tensors; i++)
        order[i] = i;
    qsort_r(order, (size_t)g->n_tensors, sizeof *order, gguf_cmp_offset, g->tensors);
    int rc = 0;
    for (int64_t k = 1; k < g->n_tensors; k++) {
        const struct gguf_tensor *a = &g->tensors[order[k - 1]], *b = &g->tensors[order[k]];
        if (a->offset + a->nbytes > b->offset) {
            struct gguf_str sa = {strlen(a->name), a->name}, sb = {strlen(b->name), b->name};
            rc = err_set(err, ERR_FORMAT,
                         "%s: tensor %" PRId64 " ('%s'): data [offset %" PRIu64 ", %zu bytes] overlaps tensor %" PRId64
                         " ('%s') at offset %" PRIu64,
                         label, order[k], gguf_show(show, sizeof show, sb), b->offset, b->nbytes, order[k - 1],
                         gguf_show(show2, sizeof show2, sa), a->offset);
            break;
        }
    }
    free(order);
    return rc;
}

/* ---- open ---- */

static int gguf_parse(struct gguf *g, const char *label, char *err)
{
    struct gguf_cursor c = {g->base, g->avail, 0, label, err};
    int rc;
    if (g->size == 0)
        return err_set(err, ERR_FORMAT, "%s: file is empty (0 bytes), not a GGUF file", label);
    char magic[4];
    if ((rc = gguf_read(&c, magic, 4, "magic")))
        return rc;
    if (memcmp(magic, GGUF_MAGIC, 4) != 0) {
        struct gguf_str s = {4, magic};
        char show[64];
        return err_set(err, ERR_FORMAT, "%s: bad magic '%s' at offset 0 (expected 'GGUF'): not a GGUF file", label,
                       gguf_show(show, sizeof show, s));
    }
    if ((rc = gguf_read_u32(&c, &g->version, "version")))
        return rc;
    if (g->version == 1)
        return err_set(err, ERR_UNSUPPORTED,
                       "%s: GGUF version 1 (offset 4) is not supported (it predates 64-bit counts); re-convert the "
                       "model with a current llama.cpp",
                       label);
    if ((g->version & 0xffff) == 0 && g->version != 0)
        return err_set(err, ERR_UNSUPPORTED,
                       "%s: version field 0x%08" PRIx32 " (offset 4) looks byte-swapped: big-endian GGUF files are "
                       "not supported",
                       label, g->version);
    if (g->version != 2 && g->version != 3)
        return err_set(err, ERR_UNSUPPORTED, "%s: GGUF version %" PRIu32 " (offset 4) is not supported (only 2 and 3)",
                       label, g->version);
    uint64_t nt, nkv;
    if ((rc = gguf_read_u64(&c, &nt, "tensor count")) || (rc = gguf_read_u64(&c, &nkv, "kv count")))
        return rc;
    /* Smallest encodings: kv = key len 8 + 1 key byte + type 4 + 1 value byte; tensor = name len 8 + 1 byte +
     * n_dims 4 + one ne 8 + type 4 + offset 8. */
    size_t left = c.size - c.off;
    if (nkv > left / 14)
        return err_set(err, ERR_FORMAT, "%s: kv count %" PRIu64 " (offset 16) cannot fit in the %zu bytes left",
                       label, nkv, left);
    if (nt > left / 33 || nt > (left - nkv * 14) / 33)
        return err_set(err, ERR_FORMAT, "%s: tensor count %" PRIu64 " (offset 8) cannot fit in the %zu bytes left",
                       label, nt, left);
    if (nkv >= UINT32_MAX || nt >= UINT32_MAX) /* index slots are u32; cannot happen below 60 GB of header */
        return err_set(err, ERR_UNSUPPORTED, "%s: %" PRIu64 " kv / %" PRIu64 " tensors is too many", label, nkv, nt);
    g->n_kv = (int64_t)nkv;
    g->n_tensors = (int64_t)nt;
    g->kv = calloc(nkv ? nkv : 1, sizeof *g->kv);
    g->tensors = calloc(nt ? nt : 1, sizeof *g->tensors);
    if (!g->kv || !g->tensors || gguf_index_init(&g->kv_index, nkv) || gguf_index_init(&g->tensor_index, nt))
        return err_set(err, ERR_NOMEM, "%s: out of memory for %" PRIu64 " kv and %" PRIu64 " tensors", label, nkv, nt);
    if ((rc = gguf_read_kvs(g, &c)))
        return rc;
    if ((rc = gguf_read_alignment(g, label, err)))
        return rc;

    struct gguf_str *names = calloc(nt ? nt : 1, sizeof *names);
    if (!names)
        return err_set(err, ERR_NOMEM, "%s: out of memory for %" PRIu64 " tensor names", label, nt);
    if ((rc = gguf_read_tensor_infos(g, &c, names)))
        goto done;
    size_t pool = 0;
    for (uint64_t i = 0; i < nt; i++)
        pool += (size_t)names[i].len + 1; /* sum <= file size: names lie in the file */
    g->names = malloc(pool ? pool : 1);
    if (!g->names) {
        rc = err_set(err, ERR_NOMEM, "%s: out of memory for tensor names", label);
        goto done;
    }
    char *p = g->names;
    for (uint64_t i = 0; i < nt; i++) {
        memcpy(p, names[i].ptr, (size_t)names[i].len);
        p[names[i].len] = 0;
        g->tensors[i].name = p;
        p += names[i].len + 1;
        int64_t dup = gguf_index_lookup(&g->tensor_index, names[i].ptr, names[i].len, (int64_t)i, gguf_tensor_name_at, g);
        if (dup >= 0) {
            char show[GGUF_SHOW_BUF];
            rc = err_set(err, ERR_FORMAT, "%s: tensor %" PRIu64 ": duplicate name '%s' (also tensor %" PRId64 ") at offset %zu",
                         label, i, gguf_show(show, sizeof show, names[i]), dup,
                         (size_t)((const uint8_t *)names[i].ptr - g->base));
            goto done;
        }
    }
    /* The data section starts at the next multiple of the alignment; a file without tensors may end before. */
    size_t a = g->alignment;
    g->data_offset = c.off + (a - c.off % a) % a;
    rc = gguf_check_extents(g, label, err);
done:
    free(names);
    return rc;
}

/* Parses the header in base[0, avail) of a file of size bytes (the tensors' extents are checked against size).
 * mapped: the handle owns base (munmap at close, and here on failure). */
static struct gguf *gguf_open_impl(const uint8_t *base, size_t size, size_t avail, bool mapped, const char *label,
                                   char *err)
{
    struct gguf *g = calloc(1, sizeof *g);
    if (!g) {
        if (mapped)
            munmap((void *)base, size);
        err_set(err, ERR_NOMEM, "%s: out of memory", label);
        return NULL;
    }
    g->base = base;
    g->size = size;
    g->avail = avail;
    g->mapped = mapped;
    if (gguf_parse(g, label, err) != 0) {
        gguf_close(g);
        return NULL;
    }
    return g;
}

/* Opens path as a regular, non-empty file: the fd, and its size in *size; -1 with err set otherwise. */
static int gguf_file_open(const char *path, size_t *size, char *err)
{
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        err_set(err, errno == ENOENT ? ERR_NOT_FOUND : ERR_IO, "%s: cannot open: %s", path, strerror(errno));
        return -1;
    }
    struct stat st;
    if (fstat(fd, &st) != 0)
        err_set(err, ERR_IO, "%s: cannot stat: %s", path, strerror(errno));
    else if (S_ISDIR(st.st_mode))
        err_set(err, ERR_IO, "%s: is a directory, not a GGUF file", path);
    else if (!S_ISREG(st.st_mode))
        err_set(err, ERR_IO, "%s: not a regular file", path);
    else if (st.st_size == 0)
        err_set(err, ERR_FORMAT, "%s: file is empty (0 bytes), not a GGUF file", path);
    else {
        *size = (size_t)st.st_size;
        return fd;
    }
    close(fd);
    return -1;
}

struct gguf *gguf_open(const char *path, char *err)
{
    size_t size = 0;
    int fd = gguf_file_open(path, &size, err);
    if (fd < 0)
        return NULL;
    void *base = mmap(NULL, size, PROT_READ, MAP_PRIVATE, fd, 0);
    int mmap_errno = errno;
    close(fd); /* the mapping keeps the file alive */
    if (base == MAP_FAILED) {
        err_set(err, ERR_IO, "%s: cannot mmap %zu bytes: %s", path, size, strerror(mmap_errno));
        return NULL;
    }
    return gguf_open_impl(base, size, size, true, path, err);
}

/* ---- gguf_open_mem: the file read into memory, tensors placed as the caller's placer says ----
 *
 * The header is read and parsed first (GGUF_MEM_HEAD bytes, four times more while the parse needs more), so the
 * tensors are known before their data is read; the rest of the file is then cut into pieces that two threads
 * (this one and a helper) take in turn: a plain piece is read straight into place, a piece of a tensor the
 * placer transforms is read into the thread's staging buffer (whole units of the placer, about
 * GGUF_MEM_STAGE bytes, so it stays in L2) and written into place by it from there. Transforming while reading
 * instead of after saves a pass over memory: 1B models re-laid for the AVX-512 kernels of a Zen 5 loaded (with
 * the engine's create) in 0.86-0.92x the time of reading then re-laying; the rest of the cost is the
 * transposes themselves (docs/performance.md, stop 15). Staging buffers of 64 KiB to 1 MiB, or reading into
 * place and transposing from a copy of each unit, measured the same. */
#define GGUF_MEM_HEAD ((size_t)4 << 20)
#define GGUF_MEM_PLAIN ((size_t)8 << 20) /* bytes of a plain piece */
#define GGUF_MEM_STAGE ((size_t)256 << 10) /* bytes of a transformed piece, at least one unit */

struct gguf_piece {
    size_t off, len;               /* file offset (= offset at base) and bytes */
    const struct gguf_tensor *t;   /* the tensor the placer transforms, or NULL: plain */
};

struct gguf_loader {
    int fd;
    uint8_t *base;
    const struct gguf_placer *pl;
    const struct gguf_piece *pieces;
    size_t n_pieces, stage_bytes;
    atomic_size_t next;
    atomic_bool stop;
};

/* What one thread of the load found wrong: nothing (failed false), a read error (err) or the file ending early
 * (err 0), at offset failed_at; or no memory for its staging buffer (nomem). */
struct gguf_load_status {
    struct gguf_loader *ld;
    bool failed, nomem;
    size_t failed_at;
    int err;
};

/* Reads file bytes [off, off + len) into dst. 0, or -1 with st filled in. */
static int gguf_pread_all(int fd, uint8_t *dst, size_t off, size_t len, struct gguf_load_status *st)
{
    size_t done = 0;
    while (done < len) {
        size_t want = len - done < ((size_t)1 << 30) ? len - done : (size_t)1 << 30;
        ssize_t got = pread(fd, dst + done, want, (off_t)(off + done));
        if (got < 0 && errno == EINTR)
            continue;
        if (got <= 0) {
            st->err = got < 0 ? errno : 0;
            st->failed = true;
            st->failed_at = off + done;
            return -1;
        }
        done += (size_t)got;
    }
    return 0;
}

static void *gguf_load_run(void *arg)
{
    struct gguf_load_status *st = arg;
    struct gguf_loader *ld = st->ld;
    uint8_t *stage = ld->stage_bytes ? malloc(ld->stage_bytes) : NULL;
    if (ld->stage_bytes && !stage) {
        st->nomem = st->failed = true;
        atomic_store(&ld->stop, true);
        return NULL;
    }
    for (;;) {
        size_t i = atomic_fetch_add(&ld->next, 1);
        if (i >= ld->n_pieces || atomic_load(&ld->stop))
            break;
        const struct gguf_piece *p = &ld->pieces[i];
        if (gguf_pread_all(ld->fd, p->t ? stage : ld->base + p->off, p->off, p->len, st)) {
            atomic_store(&ld->stop, true);
            break;
        }
        if (p->t)
            ld->pl->place(ld->pl->ctx, p->t, stage, ld->base + p->off, p->len);
    }
    free(stage);
    return NULL;
}

static int gguf_cmp_tensor_offset(const void *a, const void *b)
{
    const struct gguf_tensor *x = *(const struct gguf_tensor *const *)a, *y = *(const struct gguf_tensor *const *)b;
    return x->offset < y->offset ? -1 : x->offset > y->offset;
}

/* Appends piece p to v (n used, cap allocated). 0 or -1 (no memory). */
static int gguf_pieces_push(struct gguf_piece **v, size_t *n, size_t *cap, struct gguf_piece p)
{
    if (*n == *cap) {
        size_t c = *cap ? 2 * *cap : 256;
        struct gguf_piece *nv = realloc(*v, c * sizeof *nv);
        if (!nv)
            return -1;
        *v = nv, *cap = c;
    }
    (*v)[(*n)++] = p;
    return 0;
}

/* Appends plain pieces covering [from, to). 0 or -1 (no memory). */
static int gguf_pieces_plain(struct gguf_piece **v, size_t *n, size_t *cap, size_t from, size_t to)
{
    for (size_t off = from; off < to; off += GGUF_MEM_PLAIN)
        if (gguf_pieces_push(v, n, cap, (struct gguf_piece){off, to - off < GGUF_MEM_PLAIN ? to - off : GGUF_MEM_PLAIN, NULL}))
            return -1;
    return 0;
}

/* The pieces of the file past its first `head` bytes (already read), plus every transformed tensor whole
 * (re-read when it starts within those bytes), in file order; *stage: the largest transformed piece.
 * NULL when out of memory, or with *bad set to the tensor whose size is not a whole number of its units. */
static struct gguf_piece *gguf_pieces(const struct gguf *g, const struct gguf_placer *pl, size_t head, size_t *n_out,
                                      size_t *stage, const struct gguf_tensor **bad)
{
    struct gguf_piece *v = NULL;
    size_t n = 0, cap = 0, pos = head;
    const struct gguf_tensor **order = malloc((g->n_tensors ? (size_t)g->n_tensors : 1) * sizeof *order);
    *stage = 0;
    *bad = NULL;
    if (!order)
        return NULL;
    for (int64_t i = 0; i < g->n_tensors; i++)
        order[i] = &g->tensors[i];
    qsort(order, (size_t)g->n_tensors, sizeof *order, gguf_cmp_tensor_offset);
    for (int64_t i = 0; pl && i < g->n_tensors; i++) {
        const struct gguf_tensor *t = order[i];
        size_t unit = t->nbytes ? pl->unit(pl->ctx, t) : 0;
        if (!unit)
            continue;
        if (t->nbytes % unit) {
            *bad = t;
            goto fail;
        }
        size_t start = g->data_offset + (size_t)t->offset, step = GGUF_MEM_STAGE / unit * unit;
        if (!step)
            step = unit;
        if (start > pos && gguf_pieces_plain(&v, &n, &cap, pos, start))
            goto fail;
        for (size_t off = 0; off < t->nbytes; off += step) {
            size_t len = t->nbytes - off < step ? t->nbytes - off : step;
            if (gguf_pieces_push(&v, &n, &cap, (struct gguf_piece){start + off, len, t}))
                goto fail;
            if (len > *stage)
                *stage = len;
        }
        if (start + t->nbytes > pos)
            pos = start + t->nbytes;
    }
    if (gguf_pieces_plain(&v, &n, &cap, pos, g->size))
        goto fail;
    free(order);
    *n_out = n;
    return v ? v : calloc(1, sizeof *v);
fail:
    free(order);
    free(v);
    return NULL;
}

struct gguf *gguf_open_mem(const char *path, char *err) { return gguf_open_mem_placed(path, NULL, err); }

struct gguf *gguf_open_mem_placed(const char *path, const struct gguf_placer *pl, char *err)
{
    size_t size = 0;
    int fd = gguf_file_open(path, &size, err);
    if (fd < 0)
        return NULL;
    /* huge pages: decode streams every weight once per token, and 4 KiB pages cost it a TLB miss per 4 KiB
     * (core/bigmem.h gives the measurement) */
    uint8_t *base = bigmem_alloc(size);
    struct gguf *g = NULL;
    struct gguf_piece *pieces = NULL;
    struct gguf_load_status st[2] = {{0}, {0}};
    if (!base) {
        err_set(err, ERR_NOMEM, "%s: cannot allocate %zu bytes to load the file into memory: %s (try --mmap)", path,
                size, strerror(errno));
        close(fd);
        return NULL;
    }
    /* the header: parsed from what has been read, more read while it needs more */
    size_t head = 0;
    for (size_t want = size < GGUF_MEM_HEAD ? size : GGUF_MEM_HEAD;; want = size / 4 < want ? size : 4 * want) {
        if (gguf_pread_all(fd, base + head, head, want - head, &st[0]))
            goto read_failed;
        head = want;
        if ((g = gguf_open_impl(base, size, head, false, path, err)) || head == size)
            break;
    }
    if (!g)
        goto fail;
    g->mapped = true; /* owns base from here on: gguf_close unmaps it */
    g->in_memory = true;
    size_t n_pieces = 0, stage = 0;
    const struct gguf_tensor *bad = NULL;
    pieces = gguf_pieces(g, pl, head, &n_pieces, &stage, &bad);
    if (!pieces) {
        if (bad)
            err_set(err, ERR_INTERNAL, "%s: tensor '%s' (%zu bytes) is not a whole number of the loader's units", path,
                    bad->name, bad->nbytes);
        else
            err_set(err, ERR_NOMEM, "%s: out of memory planning the load", path);
        goto fail;
    }
    /* Two readers (this thread and one helper): the cost is mostly page faults and copying out of the page
     * cache, which a second core halves (1B Q4_0: 0.35 -> 0.2 s). */
    struct gguf_loader ld = {fd, base, pl, pieces, n_pieces, stage, 0, false};
    st[0].ld = st[1].ld = &ld;
    pthread_t th;
    bool two = size - head >= ((size_t)8 << 20) && pthread_create(&th, NULL, gguf_load_run, &st[1]) == 0;
    gguf_load_run(&st[0]);
    if (two)
        pthread_join(th, NULL);
    for (int i = 0; i < 2; i++) {
        if (st[i].nomem) {
            err_set(err, ERR_NOMEM, "%s: out of memory for a %zu-byte load buffer", path, stage);
            goto fail;
        }
        if (st[i].failed)
            goto read_failed;
    }
    free(pieces);
    close(fd);
    (void)mprotect(base, size, PROT_READ); /* weights are read-only from here on (but see gguf_set_writable) */
    return g;

read_failed:
    for (int i = 0; i < 2; i++)
        if (st[i].failed) {
            if (st[i].err)
                err_set(err, ERR_IO, "%s: read failed at offset %zu: %s", path, st[i].failed_at, strerror(st[i].err));
            else
                err_set(err, ERR_IO, "%s: file shrank while loading: ended at %zu of %zu bytes", path,
                        st[i].failed_at, size);
            break;
        }
fail:
    free(pieces);
    close(fd);
    if (g)
        gguf_close(g); /* unmaps base */
    else
        munmap(base, size);
    return NULL;
}

int gguf_set_writable(struct gguf *g, bool writable)
{
    if (!g->in_memory)
        return ERR_UNSUPPORTED;
    /* the whole allocation at once, so its huge pages stay whole */
    return mprotect((void *)g->base, g->size, writable ? PROT_READ | PROT_WRITE : PROT_READ) ? ERR_IO : 0;
}

struct gguf *gguf_open_buffer(const void *buf, size_t len, char *err)
{
    static const uint8_t empty[1];
    return gguf_open_impl(buf ? buf : empty, buf ? len : 0, buf ? len : 0, false, "<buffer>", err);
}

void gguf_close(struct gguf *g)
{
    if (!g)
        return;
    if (g->kv)
        for (int64_t i = 0; i < g->n_kv; i++)
            free((void *)g->kv[i].strs);
    free(g->kv);
    free(g->tensors);
    free(g->names);
    free(g->kv_index.slots);
    free(g->tensor_index.slots);
    if (g->mapped)
        munmap((void *)g->base, g->size);
    free(g);
}

/* ---- accessors ---- */

uint32_t gguf_version(const struct gguf *g) { return g->version; }
size_t gguf_alignment(const struct gguf *g) { return g->alignment; }
size_t gguf_file_size(const struct gguf *g) { return g->size; }
size_t gguf_data_offset(const struct gguf *g) { return g->data_offset; }
int64_t gguf_kv_count(const struct gguf *g) { return g->n_kv; }
int64_t gguf_tensor_count(const struct gguf *g) { return g->n_tensors; }

const struct gguf_kv *gguf_kv_at(const struct gguf *g, int64_t i)
{
    return i >= 0 && i < g->n_kv ? &g->kv[i] : NULL;
}

const struct gguf_tensor *gguf_tensor_at(const struct gguf *g, int64_t i)
{
    return i >= 0 && i < g->n_tensors ? &g->tensors[i] : NULL;
}

const struct gguf_kv *gguf_kv_find(const struct gguf *g, const char *key)
{
    int64_t i = gguf_index_lookup(&g->kv_index, key, strlen(key), -1, gguf_kv_key_at, g);
    return i >= 0 ? &g->kv[i] : NULL;
}

const struct gguf_tensor *gguf_tensor_find(const struct gguf *g, const char *name)
{
    int64_t i = gguf_index_lookup(&g->tensor_index, name, strlen(name), -1, gguf_tensor_name_at, g);
    return i >= 0 ? &g->tensors[i] : NULL;
}

/* Integer value of an integer-typed scalar: sets exactly one of *u (unsigned types) or *s (signed). */
static bool gguf_scalar_int(const struct gguf_kv *kv, bool *is_signed, uint64_t *u, int64_t *s)
{
    const void *p = kv->data;
    switch (kv->type) {
    case GGUF_TYPE_UINT8: { uint8_t v; memcpy(&v, p, 1); *u = v; *is_signed = false; return true; }
    case GGUF_TYPE_UINT16: { uint16_t v; memcpy(&v, p, 2); *u = v; *is_signed = false; return true; }
    case GGUF_TYPE_UINT32: { uint32_t v; memcpy(&v, p, 4); *u = v; *is_signed = false; return true; }
    case GGUF_TYPE_UINT64: { uint64_t v; memcpy(&v, p, 8); *u = v; *is_signed = false; return true; }
    case GGUF_TYPE_INT8: { int8_t v; memcpy(&v, p, 1); *s = v; *is_signed = true; return true; }
    case GGUF_TYPE_INT16: { int16_t v; memcpy(&v, p, 2); *s = v; *is_signed = true; return true; }
    case GGUF_TYPE_INT32: { int32_t v; memcpy(&v, p, 4); *s = v; *is_signed = true; return true; }
    case GGUF_TYPE_INT64: { int64_t v; memcpy(&v, p, 8); *s = v; *is_signed = true; return true; }
    default: return false;
    }
}

int gguf_get_u32(const struct gguf *g, const char *key, uint32_t *out)
{
    const struct gguf_kv *kv = gguf_kv_find(g, key);
    if (!kv)
        return ERR_NOT_FOUND;
    bool sg;
    uint64_t u = 0;
    int64_t s = 0;
    if (!gguf_scalar_int(kv, &sg, &u, &s))
        return ERR_FORMAT;
    if (sg) {
        if (s < 0 || s > (int64_t)UINT32_MAX)
            return ERR_FORMAT;
        *out = (uint32_t)s;
    } else {
        if (u > UINT32_MAX)
            return ERR_FORMAT;
        *out = (uint32_t)u;
    }
    return 0;
}

int gguf_get_i64(const struct gguf *g, const char *key, int64_t *out)
{
    const struct gguf_kv *kv = gguf_kv_find(g, key);
    if (!kv)
        return ERR_NOT_FOUND;
    bool sg;
    uint64_t u = 0;
    int64_t s = 0;
    if (!gguf_scalar_int(kv, &sg, &u, &s))
        return ERR_FORMAT;
    if (!sg && u > (uint64_t)INT64_MAX)
        return ERR_FORMAT;
    *out = sg ? s : (int64_t)u;
    return 0;
}

int gguf_get_f32(const struct gguf *g, const char *key, float *out)
{
    const struct gguf_kv *kv = gguf_kv_find(g, key);
    if (!kv)
        return ERR_NOT_FOUND;
    if (kv->type == GGUF_TYPE_FLOAT32) {
        memcpy(out, kv->data, 4);
        return 0;
    }
    if (kv->type == GGUF_TYPE_FLOAT64) {
        double d;
        memcpy(&d, kv->data, 8);
        *out = (float)d;
        return 0;
    }
    return ERR_FORMAT;
}

int gguf_get_bool(const struct gguf *g, const char *key, bool *out)
{
    const struct gguf_kv *kv = gguf_kv_find(g, key);
    if (!kv)
        return ERR_NOT_FOUND;
    if (kv->type != GGUF_TYPE_BOOL)
        return ERR_FORMAT;
    *out = *(const uint8_t *)kv->data != 0;
    return 0;
}

int gguf_get_str(const struct gguf *g, const char *key, struct gguf_str *out)
{
    const struct gguf_kv *kv = gguf_kv_find(g, key);
    if (!kv)
        return ERR_NOT_FOUND;
    if (kv->type != GGUF_TYPE_STRING)
        return ERR_FORMAT;
    *out = kv->str;
    return 0;
}

int gguf_get_arr(const struct gguf *g, const char *key, const struct gguf_kv **out)
{
    const struct gguf_kv *kv = gguf_kv_find(g, key);
    if (!kv)
        return ERR_NOT_FOUND;
    if (kv->type != GGUF_TYPE_ARRAY)
        return ERR_FORMAT;
    *out = kv;
    return 0;
}

double gguf_arr_num(const struct gguf_kv *kv, uint64_t i)
{
    ASSERT(kv->type == GGUF_TYPE_ARRAY && i < kv->arr_len);
    size_t es = gguf_vtype_size_(kv->arr_type);
    ASSERT(es > 0);
    const uint8_t *p = (const uint8_t *)kv->data + i * es;
    switch (kv->arr_type) {
    case GGUF_TYPE_UINT8: { uint8_t v; memcpy(&v, p, 1); return v; }
    case GGUF_TYPE_INT8: { int8_t v; memcpy(&v, p, 1); return v; }
    case GGUF_TYPE_BOOL: { uint8_t v; memcpy(&v, p, 1); return v != 0; }
    case GGUF_TYPE_UINT16: { uint16_t v; memcpy(&v, p, 2); return v; }
    case GGUF_TYPE_INT16: { int16_t v; memcpy(&v, p, 2); return v; }
    case GGUF_TYPE_UINT32: { uint32_t v; memcpy(&v, p, 4); return v; }
    case GGUF_TYPE_INT32: { int32_t v; memcpy(&v, p, 4); return v; }
    case GGUF_TYPE_FLOAT32: { float v; memcpy(&v, p, 4); return v; }
    case GGUF_TYPE_UINT64: { uint64_t v; memcpy(&v, p, 8); return (double)v; }
    case GGUF_TYPE_INT64: { int64_t v; memcpy(&v, p, 8); return (double)v; }
    case GGUF_TYPE_FLOAT64: { double v; memcpy(&v, p, 8); return v; }
    default: return NAN;
    }
}

char *gguf_str_dup(struct gguf_str s)
{
    if (s.len >= SIZE_MAX)
        return NULL;
    char *p = malloc((size_t)s.len + 1);
    if (!p)
        return NULL;
    if (s.len)
        memcpy(p, s.ptr, (size_t)s.len);
    p[s.len] = 0;
    return p;
}

bool gguf_str_eq(struct gguf_str s, const char *z)
{
    size_t n = strlen(z);
    return s.len == n && (n == 0 || memcmp(s.ptr, z, n) == 0);
}
