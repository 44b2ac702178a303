/*
 * llama2c: llama2.c checkpoint -> GGUF (see llama2c.h for the layouts). The checkpoint's size is checked
 * against what its header implies before any weight is read, so a truncated or mismatched file is refused
 * with the expected and actual sizes.
 */
#include "engine/gguf/llama2c.h"

#include "core/err.h"
#include "engine/gguf/gguf.h"

#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

struct l2c_map {
    const uint8_t *p;
    size_t len;
};

static int l2c_map_open(const char *path, struct l2c_map *m, char *err)
{
    int fd = open(path, O_RDONLY);
    if (fd < 0)
        return err_set(err, ERR_IO, "%s: cannot open: %m", path);
    struct stat st;
    if (fstat(fd, &st) || !S_ISREG(st.st_mode) || st.st_size == 0) {
        close(fd);
        return err_set(err, ERR_IO, "%s: not a regular non-empty file", path);
    }
    void *p = mmap(NULL, (size_t)st.st_size, PROT_READ, MAP_PRIVATE, fd, 0);
    close(fd);
    if (p == MAP_FAILED)
        return err_set(err, ERR_IO, "%s: cannot map: %m", path);
    m->p = p;
    m->len = (size_t)st.st_size;
    return 0;
}

static void l2c_map_close(struct l2c_map *m)
{
    if (m->p)
        munmap((void *)m->p, m->len);
}

/* Token type as llama.cpp's converter assigns it. */
static int32_t l2c_token_type(int id, const char *s, size_t len)
{
    if (id == 0)
        return 2; /* unknown */
    if (id == 1 || id == 2)
        return 3; /* control */
    if (len == 6 && !memcmp(s, "<0x", 3) && s[5] == '>')
        return 6; /* byte */
    return 1;
}

int llama2c_convert(const char *model_path, const char *tokenizer_path, const char *out_path, char *err)
{
    struct l2c_map mm = {0}, tm = {0};
    struct l2c_tensor {
        char name[64];
        size_t off;
        int64_t ne0, ne1;
    } *t = NULL;
    struct gguf_writer *w = NULL;
    struct gguf_str *strs = NULL;
    float *scores = NULL;
    int32_t *types = NULL;
    int rc;
    if ((rc = l2c_map_open(model_path, &mm, err)) || (rc = l2c_map_open(tokenizer_path, &tm, err)))
        goto out;
    if (mm.len < 28) {
        rc = err_set(err, ERR_FORMAT, "%s: %zu bytes is too short for the 28-byte llama2.c header", model_path, mm.len);
        goto out;
    }
    int32_t h[7];
    memcpy(h, mm.p, sizeof h);
    int dim = h[0], hidden = h[1], layers = h[2], heads = h[3], kv_heads = h[4], vocab = abs(h[5]), seq_len = h[6];
    bool shared = h[5] > 0;
    if (dim <= 0 || hidden <= 0 || layers <= 0 || heads <= 0 || kv_heads <= 0 || vocab <= 0 || seq_len <= 0 ||
        dim % heads || heads % kv_heads || dim > 65536 || hidden > 1 << 20 || layers > 1024 || vocab > 1 << 22 ||
        seq_len > 1 << 24) {
        rc = err_set(err, ERR_FORMAT, "%s: implausible llama2.c header {dim %d, hidden %d, layers %d, heads %d, kv_heads %d, "
                     "vocab %d, seq_len %d}", model_path, dim, hidden, layers, heads, kv_heads, h[5], seq_len);
        goto out;
    }
    int hs = dim / heads, kv_dim = kv_heads * hs;
    /* element offsets of each array */
    size_t off = 7 * 4;
    size_t o_emb = off; off += (size_t)vocab * dim * 4;
    size_t o_rms_att = off; off += (size_t)layers * dim * 4;
    size_t o_wq = off; off += (size_t)layers * dim * dim * 4;
    size_t o_wk = off; off += (size_t)layers * kv_dim * dim * 4;
    size_t o_wv = off; off += (size_t)layers * kv_dim * dim * 4;
    size_t o_wo = off; off += (size_t)layers * dim * dim * 4;
    size_t o_rms_ffn = off; off += (size_t)layers * dim * 4;
    size_t o_w1 = off; off += (size_t)layers * hidden * dim * 4;
    size_t o_w2 = off; off += (size_t)layers * dim * hidden * 4;
    size_t o_w3 = off; off += (size_t)layers * hidden * dim * 4;
    size_t o_rms_final = off; off += (size_t)dim * 4;
    off += (size_t)seq_len * hs * 4; /* freq_cis_real, freq_cis_imag */
    size_t o_wcls = off;
    if (!shared)
        off += (size_t)vocab * dim * 4;
    if (mm.len != off) {
        rc = err_set(err, ERR_FORMAT, "%s: the header implies %zu bytes but the file has %zu", model_path, off, mm.len);
        goto out;
    }

    /* tokenizer */
    strs = calloc((size_t)vocab, sizeof *strs);
    scores = calloc((size_t)vocab, sizeof *scores);
    types = calloc((size_t)vocab, sizeof *types);
    if (!strs || !scores || !types) {
        rc = err_set(err, ERR_NOMEM, "out of memory");
        goto out;
    }
    size_t p = 4;
    for (int i = 0; i < vocab; i++) {
        int32_t len;
        if (p + 8 > tm.len) {
            rc = err_set(err, ERR_FORMAT, "%s: truncated at token %d of %d (offset %zu)", tokenizer_path, i, vocab, p);
            goto out;
        }
        memcpy(&scores[i], tm.p + p, 4);
        memcpy(&len, tm.p + p + 4, 4);
        p += 8;
        if (len < 0 || (size_t)len > tm.len - p) {
            rc = err_set(err, ERR_FORMAT, "%s: token %d has length %d past the end of the file", tokenizer_path, i, len);
            goto out;
        }
        /* llama2.c's export wrote SentencePiece's U+2581 word marker as a plain space: put it back */
        const char *src = (const char *)tm.p + p;
        size_t n_sp = 0;
        for (int32_t j = 0; j < len; j++)
            n_sp += src[j] == ' ';
        char *dst = malloc((size_t)len + 2 * n_sp + 1);
        if (!dst) {
            rc = err_set(err, ERR_NOMEM, "out of memory");
            goto out;
        }
        size_t o = 0;
        for (int32_t j = 0; j < len; j++) {
            if (src[j] == ' ') {
                memcpy(dst + o, "\xe2\x96\x81", 3);
                o += 3;
            } else {
                dst[o++] = src[j];
            }
        }
        strs[i].ptr = dst;
        strs[i].len = o;
        types[i] = l2c_token_type(i, dst, o);
        p += (size_t)len;
    }
    if (p != tm.len) {
        rc = err_set(err, ERR_FORMAT, "%s: %zu bytes left after %d tokens: the tokenizer does not match the model's vocab size",
                     tokenizer_path, tm.len - p, vocab);
        goto out;
    }

    w = gguf_writer_create();
    if (!w) {
        rc = err_set(err, ERR_NOMEM, "out of memory");
        goto out;
    }
    int e = 0;
    e |= gguf_writer_set_str(w, "general.architecture", "llama");
    e |= gguf_writer_set_str(w, "general.name", "llama2.c");
    e |= gguf_writer_set_u32(w, "general.file_type", 0);
    e |= gguf_writer_set_u32(w, "llama.context_length", (uint32_t)seq_len);
    e |= gguf_writer_set_u32(w, "llama.embedding_length", (uint32_t)dim);
    e |= gguf_writer_set_u32(w, "llama.feed_forward_length", (uint32_t)hidden);
    e |= gguf_writer_set_u32(w, "llama.block_count", (uint32_t)layers);
    e |= gguf_writer_set_u32(w, "llama.attention.head_count", (uint32_t)heads);
    e |= gguf_writer_set_u32(w, "llama.attention.head_count_kv", (uint32_t)kv_heads);
    e |= gguf_writer_set_u32(w, "llama.rope.dimension_count", (uint32_t)hs);
    e |= gguf_writer_set_f32(w, "llama.attention.layer_norm_rms_epsilon", 1e-5f);
    e |= gguf_writer_set_str(w, "tokenizer.ggml.model", "llama");
    e |= gguf_writer_set_str_arr(w, "tokenizer.ggml.tokens", strs, (uint64_t)vocab);
    e |= gguf_writer_set_arr(w, "tokenizer.ggml.scores", GGUF_TYPE_FLOAT32, scores, (uint64_t)vocab);
    e |= gguf_writer_set_arr(w, "tokenizer.ggml.token_type", GGUF_TYPE_INT32, types, (uint64_t)vocab);
    e |= gguf_writer_set_u32(w, "tokenizer.ggml.unknown_token_id", 0);
    e |= gguf_writer_set_u32(w, "tokenizer.ggml.bos_token_id", 1);
    e |= gguf_writer_set_u32(w, "tokenizer.ggml.eos_token_id", 2);
    if (e) {
        rc = err_set(err, ERR_NOMEM, "out of memory");
        goto out;
    }
    t = calloc(3 + 9 * (size_t)layers, sizeof *t);
    if (!t) {
        rc = err_set(err, ERR_NOMEM, "out of memory");
        goto out;
    }
    int n = 0;
#define T(nm, o, a, b) (snprintf(t[n].name, 64, "%s", nm), t[n].off = (o), t[n].ne0 = (a), t[n].ne1 = (b), n++)
    T("token_embd.weight", o_emb, dim, vocab);
    T("output_norm.weight", o_rms_final, dim, 1);
    if (!shared)
        T("output.weight", o_wcls, dim, vocab);
    for (int l = 0; l < layers; l++) {
        char nm[64];
#define TL(suffix, o, a, b) (snprintf(nm, sizeof nm, "blk.%d.%s", l, suffix), T(nm, o, a, b))
        TL("attn_norm.weight", o_rms_att + (size_t)l * dim * 4, dim, 1);
        TL("attn_q.weight", o_wq + (size_t)l * dim * dim * 4, dim, dim);
        TL("attn_k.weight", o_wk + (size_t)l * kv_dim * dim * 4, dim, kv_dim);
        TL("attn_v.weight", o_wv + (size_t)l * kv_dim * dim * 4, dim, kv_dim);
        TL("attn_output.weight", o_wo + (size_t)l * dim * dim * 4, dim, dim);
        TL("ffn_norm.weight", o_rms_ffn + (size_t)l * dim * 4, dim, 1);
        TL("ffn_gate.weight", o_w1 + (size_t)l * hidden * dim * 4, dim, hidden);
        TL("ffn_down.weight", o_w2 + (size_t)l * dim * hidden * 4, hidden, dim);
        TL("ffn_up.weight", o_w3 + (size_t)l * hidden * dim * 4, dim, hidden);
#undef TL
    }
#undef T
    for (int i = 0; i < n; i++) {
        int64_t ne[2] = {t[i].ne0, t[i].ne1};
        int idx = gguf_writer_add_tensor(w, t[i].name, DTYPE_F32, t[i].ne1 == 1 ? 1 : 2, ne);
        if (idx < 0) {
            rc = err_set(err, idx, "cannot declare tensor %s", t[i].name);
            goto out;
        }
    }
    if ((rc = gguf_writer_begin(w, out_path, err)))
        goto out;
    for (int i = 0; i < n; i++)
        if ((rc = gguf_writer_write_tensor(w, i, mm.p + t[i].off, (size_t)(t[i].ne0 * t[i].ne1 * 4), err)))
            goto out;
    rc = gguf_writer_finish(w, err);
out:
    gguf_writer_destroy(w);
    free(t);
    for (int i = 0; strs && i < vocab; i++)
        free((char *)strs[i].ptr);
    free(strs);
    free(scores);
    free(types);
    l2c_map_close(&mm);
    l2c_map_close(&tm);
    return rc;
}
