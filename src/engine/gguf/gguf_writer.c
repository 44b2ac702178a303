/*
 * gguf writer: metadata and tensor declarations are kept in memory (each value already serialized in its
 * on-disk little-endian form, so writing the header is a plain copy), then the header goes out at begin and
 * tensor data is streamed in declaration order. Tensor offsets are fixed at begin from the declared shapes,
 * so the writer never seeks back and never holds tensor data: quantizing a multi-GB model needs one row
 * buffer, not a second copy of the model.
 *
 * Output is always GGUF v3. Every tensor (the last one too) is padded with zeros to the alignment, which is
 * general.alignment when it was set as a u32, else 32.
 */
#include "engine/gguf/gguf.h"

#include "core/err.h"

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct gguf_writer_kv {
    char *key;
    enum gguf_vtype type;
    uint8_t *val; /* serialized value (for arrays: element type, length, elements) */
    size_t val_len;
};

struct gguf_writer_tensor {
    char *name;
    enum dtype type;
    uint32_t n_dims;
    int64_t ne[GGUF_MAX_DIMS];
    uint64_t offset;
    size_t nbytes;
};

struct gguf_writer {
    struct gguf_writer_kv *kv;
    size_t n_kv, cap_kv;
    struct gguf_writer_tensor *tensors;
    size_t n_tensors, cap_tensors;
    FILE *f;
    char *path;
    size_t alignment;
    uint64_t pos; /* bytes written so far, for padding */
    size_t next;  /* index of the next tensor whose data is expected */
    size_t done;  /* bytes of tensor `next` already written by gguf_writer_write_data */
    bool failed;
};

struct gguf_writer *gguf_writer_create(void) { return calloc(1, sizeof(struct gguf_writer)); }

void gguf_writer_destroy(struct gguf_writer *w)
{
    if (!w)
        return;
    for (size_t i = 0; i < w->n_kv; i++) {
        free(w->kv[i].key);
        free(w->kv[i].val);
    }
    free(w->kv);
    for (size_t i = 0; i < w->n_tensors; i++)
        free(w->tensors[i].name);
    free(w->tensors);
    if (w->f)
        fclose(w->f); /* abandoned mid-write: the partial file stays, as with any failed write */
    free(w->path);
    free(w);
}

static int gguf_writer_grow(void **arr, size_t *cap, size_t n, size_t elem)
{
    if (n < *cap)
        return 0;
    size_t nc = *cap ? *cap * 2 : 16;
    void *p = realloc(*arr, nc * elem);
    if (!p)
        return ERR_NOMEM;
    *arr = p;
    *cap = nc;
    return 0;
}

/* Takes ownership of val (freed on failure too). Replaces the value of an existing key in place, so the key
 * keeps its first position. */
static int gguf_writer_put(struct gguf_writer *w, const char *key, enum gguf_vtype type, uint8_t *val, size_t len)
{
    if (!key || !*key) {
        free(val);
        return ERR_INVALID_ARG;
    }
    for (size_t i = 0; i < w->n_kv; i++) {
        if (!strcmp(w->kv[i].key, key)) {
            free(w->kv[i].val);
            w->kv[i].type = type;
            w->kv[i].val = val;
            w->kv[i].val_len = len;
            return 0;
        }
    }
    char *k = strdup(key);
    if (!k || gguf_writer_grow((void **)&w->kv, &w->cap_kv, w->n_kv, sizeof *w->kv)) {
        free(k);
        free(val);
        return ERR_NOMEM;
    }
    w->kv[w->n_kv++] = (struct gguf_writer_kv){k, type, val, len};
    return 0;
}

int gguf_writer_set_scalar(struct gguf_writer *w, const char *key, enum gguf_vtype t, const void *v)
{
    size_t n = gguf_vtype_size(t);
    if (n == 0)
        return ERR_INVALID_ARG;
    uint8_t *val = malloc(n);
    if (!val)
        return ERR_NOMEM;
    memcpy(val, v, n);
    if (t == GGUF_TYPE_BOOL)
        val[0] = val[0] != 0;
    return gguf_writer_put(w, key, t, val, n);
}

int gguf_writer_set_u32(struct gguf_writer *w, const char *key, uint32_t v)
{
    return gguf_writer_set_scalar(w, key, GGUF_TYPE_UINT32, &v);
}

int gguf_writer_set_i32(struct gguf_writer *w, const char *key, int32_t v)
{
    return gguf_writer_set_scalar(w, key, GGUF_TYPE_INT32, &v);
}

int gguf_writer_set_u64(struct gguf_writer *w, const char *key, uint64_t v)
{
    return gguf_writer_set_scalar(w, key, GGUF_TYPE_UINT64, &v);
}

int gguf_writer_set_f32(struct gguf_writer *w, const char *key, float v)
{
    return gguf_writer_set_scalar(w, key, GGUF_TYPE_FLOAT32, &v);
}

int gguf_writer_set_bool(struct gguf_writer *w, const char *key, bool v)
{
    uint8_t b = v;
    return gguf_writer_set_scalar(w, key, GGUF_TYPE_BOOL, &b);
}

static void gguf_put_u64(uint8_t *p, uint64_t v) { memcpy(p, &v, 8); }

int gguf_writer_set_strn(struct gguf_writer *w, const char *key, struct gguf_str s)
{
    uint8_t *val = malloc(8 + (size_t)s.len);
    if (!val)
        return ERR_NOMEM;
    gguf_put_u64(val, s.len);
    if (s.len)
        memcpy(val + 8, s.ptr, (size_t)s.len);
    return gguf_writer_put(w, key, GGUF_TYPE_STRING, val, 8 + (size_t)s.len);
}

int gguf_writer_set_str(struct gguf_writer *w, const char *key, const char *v)
{
    struct gguf_str s = {strlen(v), v};
    return gguf_writer_set_strn(w, key, s);
}

int gguf_writer_set_arr(struct gguf_writer *w, const char *key, enum gguf_vtype t, const void *data, uint64_t n)
{
    size_t es = gguf_vtype_size(t);
    if (es == 0 || n > (SIZE_MAX - 12) / es)
        return ERR_INVALID_ARG;
    size_t len = 12 + (size_t)n * es;
    uint8_t *val = malloc(len);
    if (!val)
        return ERR_NOMEM;
    uint32_t et = t;
    memcpy(val, &et, 4);
    gguf_put_u64(val + 4, n);
    if (n)
        memcpy(val + 12, data, (size_t)n * es);
    if (t == GGUF_TYPE_BOOL)
        for (uint64_t i = 0; i < n; i++)
            val[12 + i] = val[12 + i] != 0;
    return gguf_writer_put(w, key, GGUF_TYPE_ARRAY, val, len);
}

int gguf_writer_set_str_arr(struct gguf_writer *w, const char *key, const struct gguf_str *strs, uint64_t n)
{
    size_t len = 12;
    for (uint64_t i = 0; i < n; i++)
        len += 8 + (size_t)strs[i].len;
    uint8_t *val = malloc(len);
    if (!val)
        return ERR_NOMEM;
    uint32_t et = GGUF_TYPE_STRING;
    memcpy(val, &et, 4);
    gguf_put_u64(val + 4, n);
    uint8_t *p = val + 12;
    for (uint64_t i = 0; i < n; i++) {
        gguf_put_u64(p, strs[i].len);
        if (strs[i].len)
            memcpy(p + 8, strs[i].ptr, (size_t)strs[i].len);
        p += 8 + strs[i].len;
    }
    return gguf_writer_put(w, key, GGUF_TYPE_ARRAY, val, len);
}

int gguf_writer_copy_kv(struct gguf_writer *w, const struct gguf_kv *kv)
{
    char *key = gguf_str_dup(kv->key);
    if (!key)
        return ERR_NOMEM;
    int rc;
    if (kv->type == GGUF_TYPE_STRING)
        rc = gguf_writer_set_strn(w, key, kv->str);
    else if (kv->type == GGUF_TYPE_ARRAY && kv->arr_type == GGUF_TYPE_STRING)
        rc = gguf_writer_set_str_arr(w, key, kv->strs, kv->arr_len);
    else if (kv->type == GGUF_TYPE_ARRAY)
        rc = gguf_writer_set_arr(w, key, kv->arr_type, kv->data, kv->arr_len);
    else
        rc = gguf_writer_set_scalar(w, key, kv->type, kv->data);
    free(key);
    return rc;
}

int gguf_writer_add_tensor(struct gguf_writer *w, const char *name, enum dtype type, uint32_t n_dims,
                           const int64_t *ne)
{
    if (w->f || !name || !*name || n_dims < 1 || n_dims > GGUF_MAX_DIMS || !dtype_is_known((uint32_t)type))
        return ERR_INVALID_ARG;
    int64_t nelem = 1;
    for (uint32_t d = 0; d < n_dims; d++) {
        if (ne[d] <= 0 || ne[d] > INT64_MAX / nelem)
            return ERR_INVALID_ARG;
        nelem *= ne[d];
    }
    if (ne[0] % (int64_t)dtype_block_elems(type) != 0 || w->n_tensors >= INT32_MAX)
        return ERR_INVALID_ARG;
    for (size_t i = 0; i < w->n_tensors; i++)
        if (!strcmp(w->tensors[i].name, name))
            return ERR_INVALID_ARG;
    char *nm = strdup(name);
    if (!nm || gguf_writer_grow((void **)&w->tensors, &w->cap_tensors, w->n_tensors, sizeof *w->tensors)) {
        free(nm);
        return ERR_NOMEM;
    }
    struct gguf_writer_tensor *t = &w->tensors[w->n_tensors];
    memset(t, 0, sizeof *t);
    t->name = nm;
    t->type = type;
    t->n_dims = n_dims;
    for (int d = 0; d < GGUF_MAX_DIMS; d++)
        t->ne[d] = (uint32_t)d < n_dims ? ne[d] : 1;
    t->nbytes = dtype_row_bytes(type, ne[0]) * (size_t)(nelem / ne[0]);
    return (int)w->n_tensors++;
}

static int gguf_writer_out(struct gguf_writer *w, const void *p, size_t n, char *err)
{
    if (n && fwrite(p, 1, n, w->f) != n) {
        w->failed = true;
        return err_set(err, ERR_IO, "%s: write failed at offset %" PRIu64 ": %s", w->path, w->pos, strerror(errno));
    }
    w->pos += n;
    return 0;
}

static int gguf_writer_pad(struct gguf_writer *w, char *err)
{
    static const uint8_t zeros[64];
    size_t pad = (size_t)((w->alignment - w->pos % w->alignment) % w->alignment);
    while (pad) {
        size_t k = pad < sizeof zeros ? pad : sizeof zeros;
        int rc = gguf_writer_out(w, zeros, k, err);
        if (rc)
            return rc;
        pad -= k;
    }
    return 0;
}

int gguf_writer_begin(struct gguf_writer *w, const char *path, char *err)
{
    if (w->f || w->path)
        return err_set(err, ERR_INVALID_ARG, "%s: gguf_writer_begin called twice", path);
    w->alignment = GGUF_DEFAULT_ALIGNMENT;
    for (size_t i = 0; i < w->n_kv; i++) {
        if (strcmp(w->kv[i].key, "general.alignment") != 0)
            continue;
        if (w->kv[i].type == GGUF_TYPE_UINT32) {
            uint32_t a;
            memcpy(&a, w->kv[i].val, 4);
            if (a == 0 || (a & (a - 1)) != 0)
                return err_set(err, ERR_INVALID_ARG, "%s: general.alignment %" PRIu32 " is not a nonzero power of two",
                               path, a);
            w->alignment = a;
        } else {
            return err_set(err, ERR_INVALID_ARG, "%s: general.alignment must be a u32, not %s", path,
                           gguf_vtype_name(w->kv[i].type));
        }
    }
    uint64_t off = 0;
    for (size_t i = 0; i < w->n_tensors; i++) {
        w->tensors[i].offset = off;
        off += (w->tensors[i].nbytes + w->alignment - 1) / w->alignment * w->alignment;
    }
    w->path = strdup(path);
    if (!w->path)
        return err_set(err, ERR_NOMEM, "%s: out of memory", path);
    w->f = fopen(path, "wb");
    if (!w->f)
        return err_set(err, ERR_IO, "%s: cannot create: %s", path, strerror(errno));
    setvbuf(w->f, NULL, _IOFBF, 1 << 20);

    uint32_t version = 3;
    uint64_t nt = w->n_tensors, nkv = w->n_kv;
    int rc;
    if ((rc = gguf_writer_out(w, "GGUF", 4, err)) || (rc = gguf_writer_out(w, &version, 4, err)) ||
        (rc = gguf_writer_out(w, &nt, 8, err)) || (rc = gguf_writer_out(w, &nkv, 8, err)))
        return rc;
    for (size_t i = 0; i < w->n_kv; i++) {
        const struct gguf_writer_kv *kv = &w->kv[i];
        uint64_t klen = strlen(kv->key);
        uint32_t type = kv->type;
        if ((rc = gguf_writer_out(w, &klen, 8, err)) || (rc = gguf_writer_out(w, kv->key, klen, err)) ||
            (rc = gguf_writer_out(w, &type, 4, err)) || (rc = gguf_writer_out(w, kv->val, kv->val_len, err)))
            return rc;
    }
    for (size_t i = 0; i < w->n_tensors; i++) {
        const struct gguf_writer_tensor *t = &w->tensors[i];
        uint64_t nlen = strlen(t->name);
        uint32_t type = t->type;
        if ((rc = gguf_writer_out(w, &nlen, 8, err)) || (rc = gguf_writer_out(w, t->name, nlen, err)) ||
            (rc = gguf_writer_out(w, &t->n_dims, 4, err)))
            return rc;
        for (uint32_t d = 0; d < t->n_dims; d++)
            if ((rc = gguf_writer_out(w, &t->ne[d], 8, err)))
                return rc;
        if ((rc = gguf_writer_out(w, &type, 4, err)) || (rc = gguf_writer_out(w, &t->offset, 8, err)))
            return rc;
    }
    return gguf_writer_pad(w, err);
}

int gguf_writer_write_data(struct gguf_writer *w, int i, const void *data, size_t n, char *err)
{
    if (!w->f || w->failed)
        return err_set(err, ERR_INVALID_ARG, "gguf writer: tensor %d data written without a successful begin", i);
    if (i < 0 || (size_t)i != w->next || (size_t)i >= w->n_tensors)
        return err_set(err, ERR_INVALID_ARG, "%s: tensor %d written out of order (expected tensor %zu of %zu)",
                       w->path, i, w->next, w->n_tensors);
    const struct gguf_writer_tensor *t = &w->tensors[i];
    if (n > t->nbytes - w->done)
        return err_set(err, ERR_INVALID_ARG,
                       "%s: tensor %d ('%s'): %zu more bytes of data would exceed the %zu its shape needs (%zu written)",
                       w->path, i, t->name, n, t->nbytes, w->done);
    int rc = gguf_writer_out(w, data, n, err);
    if (rc)
        return rc;
    w->done += n;
    if (w->done == t->nbytes) {
        if ((rc = gguf_writer_pad(w, err)))
            return rc;
        w->next++;
        w->done = 0;
    }
    return 0;
}

int gguf_writer_write_tensor(struct gguf_writer *w, int i, const void *data, size_t nbytes, char *err)
{
    if (w->f && i >= 0 && (size_t)i < w->n_tensors && (size_t)i == w->next &&
        (w->done != 0 || nbytes != w->tensors[i].nbytes))
        return err_set(err, ERR_INVALID_ARG, "%s: tensor %d ('%s'): got %zu bytes of data, its shape needs %zu",
                       w->path, i, w->tensors[i].name, nbytes, w->tensors[i].nbytes);
    return gguf_writer_write_data(w, i, data, nbytes, err);
}

int gguf_writer_finish(struct gguf_writer *w, char *err)
{
    if (!w->f)
        return err_set(err, ERR_INVALID_ARG, "gguf writer: finish without a successful begin");
    FILE *f = w->f;
    w->f = NULL;
    if (w->next != w->n_tensors) {
        fclose(f);
        return err_set(err, ERR_INVALID_ARG, "%s: only %zu of %zu tensors were written (next: '%s', %zu of %zu bytes)",
                       w->path, w->next, w->n_tensors, w->tensors[w->next].name, w->done, w->tensors[w->next].nbytes);
    }
    bool bad = w->failed || fflush(f) != 0 || ferror(f);
    int e = errno;
    if (fclose(f) != 0 && !bad) {
        bad = true;
        e = errno;
    }
    if (bad)
        return err_set(err, ERR_IO, "%s: write failed: %s", w->path, strerror(e));
    return 0;
}
