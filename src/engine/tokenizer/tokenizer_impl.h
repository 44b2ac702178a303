/*
 * tokenizer_impl: the tokenizer's internal layout, shared by tokenizer.c (construction from GGUF metadata,
 * pieces, streaming detokenizer) and tokenizer_encode.c (special-token partition, SPM and BPE merging).
 * Not a public API: everything outside the tokenizer goes through tokenizer.h.
 */
#ifndef WAFER_ENGINE_TOKENIZER_IMPL_H
#define WAFER_ENGINE_TOKENIZER_IMPL_H

#include "core/err.h"
#include "engine/tokenizer/pretok.h"
#include "engine/tokenizer/tokenizer.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

/* llama.cpp's token attributes (from tokenizer.ggml.token_type) */
enum {
    ATTR_UNDEFINED = 0,
    ATTR_UNKNOWN = 1 << 0,
    ATTR_UNUSED = 1 << 1,
    ATTR_NORMAL = 1 << 2,
    ATTR_CONTROL = 1 << 3,
    ATTR_USER_DEFINED = 1 << 4,
    ATTR_BYTE = 1 << 5,
    ATTR_LSTRIP = 1 << 7,
    ATTR_RSTRIP = 1 << 8,
};

enum tok_kind { TOK_SPM, TOK_BPE };

#define SPM_PAIR_BITS (1u << 24) /* 2 MiB: a few percent false positives for a 256k vocabulary */

struct tok_token {
    size_t text_off, piece_off;
    uint32_t text_len, piece_len;
    float score;
    uint32_t attr;
};

struct tok_merge {
    size_t key_off; /* left bytes then right bytes, in merge_text */
    uint32_t left_len, right_len;
    int32_t rank;
};

struct tokenizer {
    enum tok_kind kind;
    enum pretok_type pre;
    char *pre_name;
    bool ignore_merges, add_bos, add_eos, add_space_prefix;
    int32_t n_vocab;
    struct tok_token *tok;
    char *text;   /* token texts, NUL-terminated */
    char *pieces; /* rendered pieces */
    uint32_t *tok_slots; /* id + 1, 0 = empty */
    size_t tok_mask;

    struct tok_merge *merges;
    size_t n_merges;
    char *merge_text;
    uint32_t *merge_slots; /* merge index + 1 */
    size_t merge_mask;

    int32_t bos, eos, eot, eom, unk, pad;
    int32_t *eog;
    size_t n_eog;
    int32_t byte_tok[256]; /* SPM byte fallback: <0xNN> (or the raw byte) token, -1 if none */
    uint64_t *spm_pairs;   /* SPM: filter of character pairs occurring inside some token (SPM_PAIR_BITS bits) */

    /* special tokens (control, user-defined, unknown) in partition order: longest text first, then id */
    int32_t *specials;
    size_t n_specials;
    uint32_t *spec_sorted; /* indices into specials, sorted by (length, bytes): lookups at a text position */
    uint32_t *spec_lens;  /* distinct lengths, ascending */
    size_t n_spec_lens;
    bool spec_first[256]; /* bytes a special token can start with */
};
/* ---- hashing ---- */

static inline uint64_t tok_hash_bytes(uint64_t h, const void *p, size_t n)
{
    const unsigned char *s = p;
    for (size_t i = 0; i < n; i++) {
        h ^= s[i];
        h *= 0x100000001b3ull;
    }
    return h;
}

#define TOK_HASH_SEED 0xcbf29ce484222325ull

static inline uint64_t tok_hash_mix(uint64_t h)
{
    h ^= h >> 33;
    h *= 0xff51afd7ed558ccdull;
    h ^= h >> 33;
    return h;
}

static inline size_t tok_table_size(size_t n)
{
    size_t s = 16;
    while (s < n * 2)
        s *= 2;
    return s;
}

static inline uint64_t tok_pair_hash(const char *l, size_t ln, const char *r, size_t rn)
{
    uint64_t h = tok_hash_bytes(TOK_HASH_SEED, l, ln);
    h = tok_hash_bytes(h, " ", 1);
    return tok_hash_mix(tok_hash_bytes(h, r, rn));
}

/* id of the token whose text is s[0..n), or -1 (the last id for a repeated text) */
/* Whether id ends generation (tokenizer_is_eog; shared by both files). */
static inline bool tok_is_eog(const struct tokenizer *t, int32_t id)
{
    for (size_t i = 0; i < t->n_eog; i++)
        if (t->eog[i] == id)
            return true;
    return false;
}

static inline int32_t tok_lookup(const struct tokenizer *t, const char *s, size_t n)
{
    size_t i = tok_hash_mix(tok_hash_bytes(TOK_HASH_SEED, s, n)) & t->tok_mask;
    for (;;) {
        uint32_t e = t->tok_slots[i];
        if (!e)
            return -1;
        const struct tok_token *k = &t->tok[e - 1];
        if (k->text_len == n && !memcmp(t->text + k->text_off, s, n))
            return (int32_t)(e - 1);
        i = (i + 1) & t->tok_mask;
    }
}

/* BPE rank of merging (l, r), or -1 */
static inline int32_t tok_merge_rank(const struct tokenizer *t, const char *l, size_t ln, const char *r, size_t rn)
{
    if (!t->merge_slots)
        return -1;
    size_t i = tok_pair_hash(l, ln, r, rn) & t->merge_mask;
    for (;;) {
        uint32_t e = t->merge_slots[i];
        if (!e)
            return -1;
        const struct tok_merge *m = &t->merges[e - 1];
        const char *k = t->merge_text + m->key_off;
        if (m->left_len == ln && m->right_len == rn && !memcmp(k, l, ln) && !memcmp(k + ln, r, rn))
            return m->rank;
        i = (i + 1) & t->merge_mask;
    }
}

/* Builds the SPM character-pair filter (tokenizer_encode.c); ERR_NOMEM on failure. */
int tok_spm_build_pairs(struct tokenizer *t);

/* Orders token id's text against s[0..n) by (length, bytes): the order of the special-token lookup table. */
static inline int spec_cmp_text(const struct tokenizer *t, int32_t id, const char *s, size_t n)
{
    const struct tok_token *k = &t->tok[id];
    if (k->text_len != n)
        return k->text_len < n ? -1 : 1;
    return memcmp(t->text + k->text_off, s, n);
}

/* Growable byte buffer (pieces at create, the text being merged at encode). */
struct tok_buf {
    char *p;
    size_t n, cap;
};

static inline int buf_reserve(struct tok_buf *b, size_t extra)
{
    if (b->n + extra <= b->cap)
        return 0;
    size_t cap = b->cap ? b->cap : 256;
    while (cap < b->n + extra)
        cap *= 2;
    char *p = realloc(b->p, cap);
    if (!p)
        return ERR_NOMEM;
    b->p = p;
    b->cap = cap;
    return 0;
}

static inline int buf_add(struct tok_buf *b, const void *s, size_t n)
{
    if (buf_reserve(b, n))
        return ERR_NOMEM;
    memcpy(b->p + b->n, s, n);
    b->n += n;
    return 0;
}

#endif
