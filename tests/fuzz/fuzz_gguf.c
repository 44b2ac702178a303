/* libFuzzer target for the GGUF reader: any byte string either fails to open with a message or opens, and
 * then every pointer the reader hands out (keys, strings, array elements, string-array entries, tensor data)
 * must be readable in full: ASan flags any that point outside the input. */
#include "core/err.h"
#include "engine/gguf/gguf.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

static volatile uint64_t fuzz_sink;

static uint64_t fuzz_touch(const void *p, uint64_t n)
{
    uint64_t h = 0;
    const uint8_t *b = p;
    for (uint64_t i = 0; i < n; i++)
        h = h * 31 + b[i];
    return h;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    /* an exact-size heap copy, so reading one byte past the end is caught */
    uint8_t *buf = malloc(size ? size : 1);
    if (!buf)
        return 0;
    memcpy(buf, data, size);
    char err[ERR_MSG_MAX];
    err[0] = 0;
    struct gguf *g = gguf_open_buffer(buf, size, err);
    if (!g) {
        if (!err[0] || strlen(err) >= ERR_MSG_MAX)
            abort(); /* every failure must say why */
        free(buf);
        return 0;
    }
    uint64_t h = gguf_version(g) + gguf_alignment(g) + gguf_data_offset(g) + gguf_file_size(g);
    for (int64_t i = 0; i < gguf_kv_count(g); i++) {
        const struct gguf_kv *kv = gguf_kv_at(g, i);
        h += fuzz_touch(kv->key.ptr, kv->key.len);
        char *key = gguf_str_dup(kv->key);
        if (key) {
            const struct gguf_kv *found = gguf_kv_find(g, key);
            if (!memchr(kv->key.ptr, 0, kv->key.len) && found != kv)
                abort(); /* keys are unique, so lookup must find this very pair */
            uint32_t u32;
            int64_t i64;
            float f;
            bool b;
            struct gguf_str s;
            const struct gguf_kv *arr;
            h += (uint64_t)gguf_get_u32(g, key, &u32) + (uint64_t)gguf_get_i64(g, key, &i64);
            h += (uint64_t)gguf_get_f32(g, key, &f) + (uint64_t)gguf_get_bool(g, key, &b);
            if (gguf_get_str(g, key, &s) == 0)
                h += fuzz_touch(s.ptr, s.len);
            h += (uint64_t)gguf_get_arr(g, key, &arr);
            free(key);
        }
        switch (kv->type) {
        case GGUF_TYPE_STRING:
            h += fuzz_touch(kv->str.ptr, kv->str.len);
            break;
        case GGUF_TYPE_ARRAY:
            if (kv->arr_type == GGUF_TYPE_STRING) {
                for (uint64_t j = 0; j < kv->arr_len; j++)
                    h += fuzz_touch(kv->strs[j].ptr, kv->strs[j].len);
            } else {
                for (uint64_t j = 0; j < kv->arr_len; j++) {
                    double v = gguf_arr_num(kv, j);
                    h += v == v ? 1 : 0;
                }
                h += fuzz_touch(kv->data, kv->arr_len * gguf_vtype_size(kv->arr_type));
            }
            break;
        default:
            h += fuzz_touch(kv->data, gguf_vtype_size(kv->type));
            break;
        }
    }
    for (int64_t i = 0; i < gguf_tensor_count(g); i++) {
        const struct gguf_tensor *t = gguf_tensor_at(g, i);
        const uint8_t *d = t->data;
        h += strlen(t->name) + d[0] + d[t->nbytes - 1];
        if (gguf_tensor_find(g, t->name) != t)
            abort();
        if (t->n_dims < 1 || t->n_dims > GGUF_MAX_DIMS || !dtype_is_known(t->type))
            abort();
    }
    fuzz_sink = h;
    gguf_close(g);
    free(buf);
    return 0;
}
