/*
 * tokenizer: SentencePiece-style and byte-level BPE tokenization from GGUF metadata, following llama.cpp's
 * llama-vocab.cpp behaviour (defaults, special-token handling, piece rendering) so ids match exactly.
 *
 * Layout: every token's text lives NUL-terminated in one arena (tokenizer_token_text hands these out); an
 * open-addressing hash maps text -> id (the last id wins for duplicate texts, as in llama.cpp); BPE merges
 * are a second hash keyed by the (left, right) pair. Pieces (what a token renders to with specials shown)
 * are computed once at create, as llama.cpp caches them, so token_to_piece is a copy.
 *
 * Encoding: (1) special tokens are cut out of the text: longest text first, each one splitting every
 * remaining text fragment at all its occurrences (llama.cpp's tokenizer_st_partition; a prefilter finds
 * which special tokens occur at all so long vocabularies of specials stay cheap); (2) each text fragment
 * goes through SPM or BPE; (3) BOS/EOS are added per the metadata.
 * Both merge loops use a binary heap of candidate pairs with lazy invalidation: O(n log n) per fragment/word.
 */
#include "engine/tokenizer.h"

#include "core/err.h"
#include "core/log.h"
#include "engine/pretok.h"
#include "engine/unicode.h"

#include <ctype.h>
#include <limits.h>
#include <stdio.h>
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

static uint64_t tok_hash_bytes(uint64_t h, const void *p, size_t n)
{
    const unsigned char *s = p;
    for (size_t i = 0; i < n; i++) {
        h ^= s[i];
        h *= 0x100000001b3ull;
    }
    return h;
}

#define TOK_HASH_SEED 0xcbf29ce484222325ull

static uint64_t tok_hash_mix(uint64_t h)
{
    h ^= h >> 33;
    h *= 0xff51afd7ed558ccdull;
    h ^= h >> 33;
    return h;
}

static size_t tok_table_size(size_t n)
{
    size_t s = 16;
    while (s < n * 2)
        s *= 2;
    return s;
}

/* id of the token whose text is s[0..n), or -1 */
static int32_t tok_lookup(const struct tokenizer *t, const char *s, size_t n)
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

static uint64_t tok_pair_hash(const char *l, size_t ln, const char *r, size_t rn)
{
    uint64_t h = tok_hash_bytes(TOK_HASH_SEED, l, ln);
    h = tok_hash_bytes(h, " ", 1);
    return tok_hash_mix(tok_hash_bytes(h, r, rn));
}

/* rank of merging (l, r), or -1 */
static int32_t tok_merge_rank(const struct tokenizer *t, const char *l, size_t ln, const char *r, size_t rn)
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

/* ---- growable buffers ---- */

struct tok_ivec {
    int32_t *v;
    size_t n, cap;
};

static int ivec_push(struct tok_ivec *a, int32_t x)
{
    if (a->n == a->cap) {
        size_t cap = a->cap ? a->cap * 2 : 64;
        int32_t *v = realloc(a->v, cap * sizeof *v);
        if (!v)
            return ERR_NOMEM;
        a->v = v;
        a->cap = cap;
    }
    a->v[a->n++] = x;
    return 0;
}

struct tok_buf {
    char *p;
    size_t n, cap;
};

static int buf_reserve(struct tok_buf *b, size_t extra)
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

static int buf_add(struct tok_buf *b, const void *s, size_t n)
{
    if (buf_reserve(b, n))
        return ERR_NOMEM;
    memcpy(b->p + b->n, s, n);
    b->n += n;
    return 0;
}

/* ---- the pair-merge machinery shared by SPM and BPE ---- */

struct tok_sym {
    int prev, next;
    size_t off, n; /* bytes in the session's text */
};

/* A candidate merge of symbol `left` with its current right neighbour, packed for a compact heap: key =
 * (priority << 32) | ~left, larger first, so ties go to the leftmost pair as in llama.cpp's comparators.
 * SPM's priority is the merged token's score (higher first), BPE's the merge rank (lower first). The right
 * neighbour is not stored: a pair is stale exactly when the two symbols' sizes no longer add up to `size`
 * (symbols only grow, or vanish with n = 0). */
struct tok_bigram {
    uint64_t key;
    uint32_t left, size;
};

static uint32_t prio_from_score(float f)
{
    uint32_t u;
    memcpy(&u, &f, 4);
    return (u & 0x80000000u) ? ~u : u | 0x80000000u; /* order-preserving float -> unsigned */
}

struct tok_heap {
    struct tok_bigram *v;
    size_t n, cap;
};

static int heap_push(struct tok_heap *h, struct tok_bigram x)
{
    if (h->n == h->cap) {
        size_t cap = h->cap ? h->cap * 2 : 64;
        struct tok_bigram *v = realloc(h->v, cap * sizeof *v);
        if (!v)
            return ERR_NOMEM;
        h->v = v;
        h->cap = cap;
    }
    size_t i = h->n++;
    while (i > 0) {
        size_t p = (i - 1) / 2;
        if (x.key <= h->v[p].key)
            break;
        h->v[i] = h->v[p];
        i = p;
    }
    h->v[i] = x;
    return 0;
}

static struct tok_bigram heap_pop(struct tok_heap *h)
{
    struct tok_bigram top = h->v[0], x = h->v[--h->n];
    size_t i = 0;
    for (;;) {
        size_t c = 2 * i + 1;
        if (c >= h->n)
            break;
        if (c + 1 < h->n && h->v[c + 1].key > h->v[c].key)
            c++;
        if (h->v[c].key <= x.key)
            break;
        h->v[i] = h->v[c];
        i = c;
    }
    if (h->n)
        h->v[i] = x;
    return top;
}

/* Scratch state of one encode call (the tokenizer itself stays read-only). */
struct tok_session {
    const struct tokenizer *t;
    struct tok_ivec out;
    struct tok_buf text; /* the SPM fragment / BPE word being merged */
    struct tok_sym *sym;
    size_t n_sym, cap_sym;
    struct tok_heap heap;
    uint32_t *cps;
    size_t cap_cps;
};

static int session_symbols(struct tok_session *s, size_t n)
{
    if (n > s->cap_sym) {
        struct tok_sym *v = realloc(s->sym, n * sizeof *v);
        if (!v)
            return ERR_NOMEM;
        s->sym = v;
        s->cap_sym = n;
    }
    return 0;
}

/* Splits s->text into one symbol per UTF-8 character (by lead byte, llama.cpp style). */
static int session_split_chars(struct tok_session *s)
{
    if (session_symbols(s, s->text.n ? s->text.n : 1))
        return ERR_NOMEM;
    size_t off = 0;
    int i = 0;
    while (off < s->text.n) {
        size_t n = unicode_len_utf8((unsigned char)s->text.p[off]);
        if (n > s->text.n - off)
            n = s->text.n - off;
        s->sym[i] = (struct tok_sym){.prev = i - 1, .next = off + n == s->text.n ? -1 : i + 1, .off = off, .n = n};
        off += n;
        i++;
    }
    s->n_sym = (size_t)i;
    return 0;
}

/* Candidate merge of symbols left and right, if the vocabulary (SPM) or merge list (BPE) has it. */
static int session_try_pair(struct tok_session *s, int left, int right)
{
    if (left < 0 || right < 0)
        return 0;
    const struct tokenizer *t = s->t;
    const struct tok_sym *l = &s->sym[left], *r = &s->sym[right];
    uint32_t prio;
    if (t->kind == TOK_SPM) {
        int32_t id = tok_lookup(t, s->text.p + l->off, l->n + r->n);
        if (id < 0)
            return 0;
        prio = prio_from_score(t->tok[id].score);
    } else {
        int32_t rank = tok_merge_rank(t, s->text.p + l->off, l->n, s->text.p + r->off, r->n);
        if (rank < 0)
            return 0;
        prio = ~(uint32_t)rank;
    }
    struct tok_bigram b = {.key = ((uint64_t)prio << 32) | (uint32_t)~(uint32_t)left,
                           .left = (uint32_t)left,
                           .size = (uint32_t)(l->n + r->n)};
    return heap_push(&s->heap, b);
}

/* Runs the merge loop over symbols [a, b), which must be linked only among themselves. */
static int session_merge(struct tok_session *s, size_t a, size_t b)
{
    s->heap.n = 0;
    for (size_t i = a + 1; i < b; i++)
        if (session_try_pair(s, (int)i - 1, (int)i))
            return ERR_NOMEM;
    while (s->heap.n) {
        struct tok_bigram b = heap_pop(&s->heap);
        struct tok_sym *l = &s->sym[b.left];
        if (l->n == 0 || l->next < 0)
            continue;
        int right = l->next;
        struct tok_sym *r = &s->sym[right];
        if (r->n == 0 || l->n + r->n != b.size)
            continue; /* stale: one side grew since this pair was queued */
        l->n += r->n;
        r->n = 0;
        l->next = r->next;
        if (r->next >= 0)
            s->sym[r->next].prev = (int)b.left;
        if (session_try_pair(s, l->prev, (int)b.left) || session_try_pair(s, (int)b.left, l->next))
            return ERR_NOMEM;
    }
    return 0;
}

/* ---- SPM ---- */

/* Bit of the pair filter for two adjacent characters (each 1-4 bytes). */
static size_t spm_pair_bit(const char *a, size_t na, const char *b, size_t nb)
{
    uint64_t h = tok_hash_bytes(TOK_HASH_SEED, a, na);
    h = tok_hash_bytes(h ^ 0xff, b, nb);
    return (size_t)(tok_hash_mix(h) & (SPM_PAIR_BITS - 1));
}

/* False only when no vocabulary entry contains these two characters next to each other (a filter: false
 * positives are possible, false negatives are not). */
static bool spm_pair_possible(const struct tokenizer *t, const char *text, const struct tok_sym *x,
                              const struct tok_sym *y)
{
    size_t bit = spm_pair_bit(text + x->off, x->n, text + y->off, y->n);
    return (t->spm_pairs[bit / 64] >> (bit % 64)) & 1;
}

/* Fills the pair filter from every token's text, split into characters the way encoding splits text. */
static int spm_build_pairs(struct tokenizer *t)
{
    t->spm_pairs = calloc(SPM_PAIR_BITS / 64, sizeof *t->spm_pairs);
    if (!t->spm_pairs)
        return ERR_NOMEM;
    for (int32_t id = 0; id < t->n_vocab; id++) {
        const char *s = t->text + t->tok[id].text_off;
        size_t n = t->tok[id].text_len, prev_off = 0, prev_n = 0;
        for (size_t off = 0; off < n;) {
            size_t k = unicode_len_utf8((unsigned char)s[off]);
            if (k > n - off)
                k = n - off;
            if (off > 0) {
                size_t bit = spm_pair_bit(s + prev_off, prev_n, s + off, k);
                t->spm_pairs[bit / 64] |= 1ull << (bit % 64);
            }
            prev_off = off;
            prev_n = k;
            off += k;
        }
    }
    return 0;
}

/* One text fragment: spaces become U+2581 (with a leading one when space_prefix), then merge by score;
 * pieces missing from the vocabulary fall back to byte tokens. */
static int spm_encode(struct tok_session *s, const char *text, size_t len, bool space_prefix)
{
    const struct tokenizer *t = s->t;
    static const char ws[] = "\xe2\x96\x81";
    s->text.n = 0;
    if (space_prefix && buf_add(&s->text, ws, 3))
        return ERR_NOMEM;
    for (size_t i = 0; i < len; i++) {
        int rc = text[i] == ' ' ? buf_add(&s->text, ws, 3) : buf_add(&s->text, text + i, 1);
        if (rc)
            return rc;
    }
    if (s->text.n == 0)
        return 0;
    if (session_split_chars(s))
        return ERR_NOMEM;
    /* Merge chunk by chunk: between two characters that occur next to each other in no vocabulary entry no
     * merge can ever happen, so the chunks are independent and the result is the same as merging the whole
     * fragment at once, with a small, cache-friendly heap instead of one the size of the text. */
    size_t a = 0;
    for (size_t c = 1; c <= s->n_sym; c++) {
        if (c < s->n_sym && spm_pair_possible(t, s->text.p, &s->sym[c - 1], &s->sym[c]))
            continue;
        s->sym[c - 1].next = -1;
        if (c < s->n_sym)
            s->sym[c].prev = -1;
        if (session_merge(s, a, c))
            return ERR_NOMEM;
        for (int i = (int)a; i != -1; i = s->sym[i].next) {
            const struct tok_sym *y = &s->sym[i];
            int32_t id = tok_lookup(t, s->text.p + y->off, y->n);
            if (id >= 0) {
                if (ivec_push(&s->out, id))
                    return ERR_NOMEM;
                continue;
            }
            for (size_t j = 0; j < y->n; j++) {
                int32_t b = t->byte_tok[(unsigned char)s->text.p[y->off + j]];
                if (b < 0)
                    b = t->unk; /* llama.cpp aborts here; a vocabulary without byte tokens gets <unk> */
                if (b >= 0 && ivec_push(&s->out, b))
                    return ERR_NOMEM;
            }
        }
        a = c;
    }
    return 0;
}

/* ---- byte-level BPE ---- */

static int bpe_encode_word(struct tok_session *s, const uint32_t *cps, size_t n)
{
    const struct tokenizer *t = s->t;
    /* UTF-8 bytes of the word, each shown as its GPT-2 printable codepoint */
    s->text.n = 0;
    for (size_t i = 0; i < n; i++) {
        char u[4], m[4];
        int un = unicode_encode(cps[i], u);
        for (int j = 0; j < un; j++) {
            int mn = unicode_encode(unicode_byte_to_cp((uint8_t)u[j]), m);
            if (buf_add(&s->text, m, (size_t)mn))
                return ERR_NOMEM;
        }
    }
    if (s->text.n == 0)
        return 0;
    int32_t whole;
    if (t->ignore_merges && (whole = tok_lookup(t, s->text.p, s->text.n)) >= 0)
        return ivec_push(&s->out, whole);
    if (session_split_chars(s) || session_merge(s, 0, s->n_sym))
        return ERR_NOMEM;
    for (int i = 0; i != -1; i = s->sym[i].next) {
        const struct tok_sym *y = &s->sym[i];
        int32_t id = tok_lookup(t, s->text.p + y->off, y->n);
        if (id >= 0) {
            if (ivec_push(&s->out, id))
                return ERR_NOMEM;
            continue;
        }
        /* llama.cpp's fallback: each byte of the symbol as a one-byte token, when there is one */
        for (size_t j = 0; j < y->n; j++) {
            int32_t b = tok_lookup(t, s->text.p + y->off + j, 1);
            if (b >= 0 && ivec_push(&s->out, b))
                return ERR_NOMEM;
        }
    }
    return 0;
}

static int bpe_encode(struct tok_session *s, const char *text, size_t len)
{
    if (len > s->cap_cps) {
        uint32_t *c = realloc(s->cps, len * sizeof *c);
        if (!c)
            return ERR_NOMEM;
        s->cps = c;
        s->cap_cps = len;
    }
    size_t n = 0;
    for (size_t off = 0; off < len;) {
        size_t adv;
        s->cps[n++] = unicode_decode_llama((const unsigned char *)text + off, len - off, &adv);
        off += adv;
    }
    size_t *lens, n_words;
    int rc = pretok_split(s->t->pre, s->cps, n, &lens, &n_words);
    if (rc)
        return rc;
    size_t start = 0;
    for (size_t w = 0; w < n_words && !rc; w++) {
        rc = bpe_encode_word(s, s->cps + start, lens[w]);
        start += lens[w];
    }
    free(lens);
    return rc;
}

/* ---- special tokens ---- */

struct tok_frag {
    int32_t id; /* -1: text */
    size_t off, len;
};

struct tok_frags {
    struct tok_frag *v;
    size_t n, cap;
};

static int frags_push(struct tok_frags *f, int32_t id, size_t off, size_t len)
{
    if (f->n == f->cap) {
        size_t cap = f->cap ? f->cap * 2 : 16;
        struct tok_frag *v = realloc(f->v, cap * sizeof *v);
        if (!v)
            return ERR_NOMEM;
        f->v = v;
        f->cap = cap;
    }
    f->v[f->n++] = (struct tok_frag){id, off, len};
    return 0;
}

static int spec_cmp_text(const struct tokenizer *t, int32_t id, const char *s, size_t n)
{
    const struct tok_token *k = &t->tok[id];
    if (k->text_len != n)
        return k->text_len < n ? -1 : 1;
    return memcmp(t->text + k->text_off, s, n);
}

/* Marks present[i] for each special token specials[i] whose text occurs somewhere in text; returns how many
 * do. Only positions starting with a byte some special token starts with are probed, one binary search per
 * distinct special-token length. */
static size_t spec_find_present(const struct tokenizer *t, const char *text, size_t len, bool *present)
{
    size_t found = 0;
    for (size_t p = 0; p < len; p++) {
        if (!t->spec_first[(unsigned char)text[p]])
            continue;
        for (size_t li = 0; li < t->n_spec_lens && t->spec_lens[li] <= len - p; li++) {
            size_t n = t->spec_lens[li];
            size_t lo = 0, hi = t->n_specials;
            while (lo < hi) { /* first entry >= text[p..p+n) */
                size_t mid = (lo + hi) / 2;
                if (spec_cmp_text(t, t->specials[t->spec_sorted[mid]], text + p, n) < 0)
                    lo = mid + 1;
                else
                    hi = mid;
            }
            for (; lo < t->n_specials && spec_cmp_text(t, t->specials[t->spec_sorted[lo]], text + p, n) == 0; lo++)
                if (!present[t->spec_sorted[lo]]) {
                    present[t->spec_sorted[lo]] = true;
                    found++;
                }
        }
    }
    return found;
}

static bool tok_isspace(char c) { return c == ' ' || (c >= '\t' && c <= '\r'); }

/* Splits every text fragment at each occurrence of special token id (llama.cpp's st_partition step). */
static int partition_one(const struct tokenizer *t, int32_t id, const char *text, struct tok_frags *in,
                         struct tok_frags *out)
{
    const struct tok_token *k = &t->tok[id];
    const char *needle = t->text + k->text_off;
    size_t nl = k->text_len;
    out->n = 0;
    for (size_t i = 0; i < in->n; i++) {
        struct tok_frag f = in->v[i];
        if (f.id >= 0) {
            if (frags_push(out, f.id, 0, 0))
                return ERR_NOMEM;
            continue;
        }
        size_t cur = f.off, end = f.off + f.len;
        for (;;) {
            const char *m = end - cur >= nl ? memmem(text + cur, end - cur, needle, nl) : NULL;
            if (!m)
                break;
            size_t pos = (size_t)(m - text);
            size_t left_len = pos - cur;
            if (k->attr & ATTR_LSTRIP)
                while (left_len > 0 && tok_isspace(text[cur + left_len - 1]))
                    left_len--;
            if (left_len > 0 && frags_push(out, -1, cur, left_len))
                return ERR_NOMEM;
            if (frags_push(out, id, 0, 0))
                return ERR_NOMEM;
            cur = pos + nl;
            if (k->attr & ATTR_RSTRIP)
                while (cur < end && tok_isspace(text[cur]))
                    cur++;
        }
        if (cur < end && frags_push(out, -1, cur, end - cur))
            return ERR_NOMEM;
    }
    return 0;
}

int tokenizer_encode(const struct tokenizer *t, const char *text, size_t len, bool add_special, bool parse_special,
                     int32_t *out, int cap)
{
    int rc = 0;
    struct tok_session s = {.t = t};
    struct tok_frags fa = {0}, fb = {0};
    bool *present = NULL;

    if (len > 0) {
        if (frags_push(&fa, -1, 0, len))
            goto nomem;
        if (t->n_specials) {
            present = calloc(t->n_specials, sizeof *present);
            if (!present)
                goto nomem;
            if (spec_find_present(t, text, len, present)) {
                for (size_t i = 0; i < t->n_specials; i++) {
                    int32_t id = t->specials[i];
                    if (!parse_special && (t->tok[id].attr & (ATTR_CONTROL | ATTR_UNKNOWN)))
                        continue;
                    if (!present[i])
                        continue;
                    if ((rc = partition_one(t, id, text, &fa, &fb)))
                        goto done;
                    struct tok_frags tmp = fa;
                    fa = fb;
                    fb = tmp;
                }
            }
        }
    }

    bool bos = add_special && t->add_bos && t->bos >= 0;
    if (bos && ivec_push(&s.out, t->bos))
        goto nomem;
    bool prev_special = true; /* SPM: the first fragment gets the space prefix */
    for (size_t i = 0; i < fa.n; i++) {
        const struct tok_frag *f = &fa.v[i];
        if (f->id >= 0) {
            if (ivec_push(&s.out, f->id))
                goto nomem;
            prev_special = true;
            continue;
        }
        if (t->kind == TOK_SPM) {
            rc = spm_encode(&s, text + f->off, f->len, t->add_space_prefix && prev_special);
            prev_special = false;
        } else {
            rc = bpe_encode(&s, text + f->off, f->len);
        }
        if (rc)
            goto done;
    }
    if (add_special && t->add_eos && t->eos >= 0 && ivec_push(&s.out, t->eos))
        goto nomem;

    if (s.out.n > INT_MAX) {
        rc = ERR_TOO_LARGE;
        goto done;
    }
    if (out && cap > 0 && s.out.n > 0)
        memcpy(out, s.out.v, (s.out.n < (size_t)cap ? s.out.n : (size_t)cap) * sizeof *out);
    rc = (int)s.out.n;
    goto done;
nomem:
    rc = ERR_NOMEM;
done:
    free(s.out.v);
    free(s.text.p);
    free(s.sym);
    free(s.heap.v);
    free(s.cps);
    free(fa.v);
    free(fb.v);
    free(present);
    return rc;
}

/* ---- pieces ---- */

/* What token id renders to with specials shown (llama.cpp's token_to_piece with special=true). */
static int render_piece(const struct tokenizer *t, int32_t id, struct tok_buf *b)
{
    const struct tok_token *k = &t->tok[id];
    const char *s = t->text + k->text_off;
    size_t n = k->text_len;
    if (k->attr & (ATTR_UNKNOWN | ATTR_CONTROL | ATTR_USER_DEFINED))
        return buf_add(b, s, n);
    if (t->kind == TOK_SPM) {
        if (k->attr & ATTR_NORMAL) {
            for (size_t i = 0; i < n;) {
                if (n - i >= 3 && !memcmp(s + i, "\xe2\x96\x81", 3)) {
                    if (buf_add(b, " ", 1))
                        return ERR_NOMEM;
                    i += 3;
                } else {
                    if (buf_add(b, s + i, 1))
                        return ERR_NOMEM;
                    i++;
                }
            }
            return 0;
        }
        if (k->attr & ATTR_BYTE) {
            /* "<0xNN>": the hex digits at [3, 5) */
            char hex[3] = {0};
            if (n > 3)
                memcpy(hex, s + 3, n - 3 >= 2 ? 2 : 1);
            char byte = (char)strtol(hex, NULL, 16);
            return buf_add(b, &byte, 1);
        }
        return 0;
    }
    if (k->attr & ATTR_NORMAL) {
        for (size_t i = 0; i < n;) {
            size_t adv;
            uint32_t cp = unicode_decode_llama((const unsigned char *)s + i, n - i, &adv);
            i += adv;
            int byte = unicode_cp_to_byte(cp);
            if (byte >= 0) {
                char c = (char)byte;
                if (buf_add(b, &c, 1))
                    return ERR_NOMEM;
                continue;
            }
            /* llama.cpp's marker for a codepoint outside the byte map */
            char u[4], hex[8];
            int un = unicode_encode(cp, u);
            if (buf_add(b, "[UNK_BYTE_0x", 12))
                return ERR_NOMEM;
            for (int j = 0; j < un; j++) {
                snprintf(hex, sizeof hex, "%02x", (unsigned char)u[j]);
                if (buf_add(b, hex, 2))
                    return ERR_NOMEM;
            }
            if (buf_add(b, s, n) || buf_add(b, "]", 1))
                return ERR_NOMEM;
        }
    }
    return 0;
}

int tokenizer_token_to_piece(const struct tokenizer *t, int32_t id, bool render_special, char *buf, int cap)
{
    if (id < 0 || id >= t->n_vocab)
        return ERR_INVALID_ARG;
    const struct tok_token *k = &t->tok[id];
    if (!render_special && (k->attr & (ATTR_UNKNOWN | ATTR_CONTROL)))
        return 0;
    if (k->piece_len > (uint32_t)(cap > 0 ? cap : 0))
        return (int)k->piece_len;
    if (k->piece_len)
        memcpy(buf, t->pieces + k->piece_off, k->piece_len);
    return (int)k->piece_len;
}

const char *tokenizer_token_text(const struct tokenizer *t, int32_t id)
{
    if (id < 0 || id >= t->n_vocab)
        return NULL;
    return t->text + t->tok[id].text_off;
}

/* ---- streaming detokenizer ---- */

/* Converts in[0..n) to valid UTF-8 in out (NULL: just count); returns bytes produced and sets *held to the
 * length of the incomplete tail left unconsumed. */
static size_t stream_convert(const unsigned char *in, size_t n, char *out, size_t *held)
{
    size_t i = 0, o = 0;
    *held = 0;
    while (i < n) {
        uint32_t cp;
        int r = unicode_utf8_step(in + i, n - i, &cp);
        if (r > 0) {
            if (out)
                memcpy(out + o, in + i, (size_t)r);
            o += (size_t)r;
            i += (size_t)r;
        } else if (r == 0) {
            *held = n - i;
            break;
        } else {
            if (out)
                memcpy(out + o, "\xef\xbf\xbd", 3);
            o += 3;
            i += (size_t)-r;
        }
    }
    return o;
}

int tokenizer_stream_push(const struct tokenizer *t, struct detok_stream *s, int32_t id, bool render_special,
                          char *buf, int cap)
{
    if (id < 0 || id >= t->n_vocab || s->n_pending < 0 || s->n_pending > 3)
        return ERR_INVALID_ARG;
    const struct tok_token *k = &t->tok[id];
    size_t plen = (!render_special && (k->attr & (ATTR_UNKNOWN | ATTR_CONTROL))) ? 0 : k->piece_len;
    size_t n = (size_t)s->n_pending + plen;
    unsigned char small[256];
    unsigned char *in = n <= sizeof small ? small : malloc(n);
    if (!in)
        return ERR_NOMEM;
    memcpy(in, s->pending, (size_t)s->n_pending);
    memcpy(in + s->n_pending, t->pieces + k->piece_off, plen);
    size_t held;
    size_t need = stream_convert(in, n, NULL, &held);
    int rc;
    if (need > INT_MAX) {
        rc = ERR_TOO_LARGE;
    } else if (need > (size_t)(cap > 0 ? cap : 0)) {
        rc = (int)need;
    } else {
        stream_convert(in, n, buf, &held);
        memcpy(s->pending, in + n - held, held);
        s->n_pending = (int)held;
        rc = (int)need;
    }
    if (in != small)
        free(in);
    return rc;
}

int tokenizer_stream_flush(struct detok_stream *s, char *buf, int cap)
{
    if (s->n_pending <= 0) {
        s->n_pending = 0;
        return 0;
    }
    if (cap < 3)
        return 3;
    memcpy(buf, "\xef\xbf\xbd", 3);
    s->n_pending = 0;
    return 3;
}

/* ---- accessors ---- */

int32_t tokenizer_n_vocab(const struct tokenizer *t) { return t->n_vocab; }
int32_t tokenizer_bos(const struct tokenizer *t) { return t->bos; }
int32_t tokenizer_eos(const struct tokenizer *t) { return t->eos; }
bool tokenizer_add_bos(const struct tokenizer *t) { return t->add_bos && t->bos >= 0; }
bool tokenizer_add_eos(const struct tokenizer *t) { return t->add_eos && t->eos >= 0; }
const char *tokenizer_model_name(const struct tokenizer *t) { return t->kind == TOK_SPM ? "llama" : "gpt2"; }
const char *tokenizer_pre_name(const struct tokenizer *t) { return t->pre_name; }

bool tokenizer_is_eog(const struct tokenizer *t, int32_t id)
{
    for (size_t i = 0; i < t->n_eog; i++)
        if (t->eog[i] == id)
            return true;
    return false;
}

bool tokenizer_is_control(const struct tokenizer *t, int32_t id)
{
    return id >= 0 && id < t->n_vocab && (t->tok[id].attr & (ATTR_UNKNOWN | ATTR_CONTROL));
}

void tokenizer_destroy(struct tokenizer *t)
{
    if (!t)
        return;
    free(t->pre_name);
    free(t->tok);
    free(t->text);
    free(t->pieces);
    free(t->tok_slots);
    free(t->merges);
    free(t->merge_text);
    free(t->merge_slots);
    free(t->eog);
    free(t->specials);
    free(t->spec_sorted);
    free(t->spec_lens);
    free(t->spm_pairs);
    free(t);
}

/* ---- construction ---- */

static uint32_t attr_from_type(int type)
{
    switch (type) {
    case 1: return ATTR_NORMAL;
    case 2: return ATTR_UNKNOWN;
    case 3: return ATTR_CONTROL;
    case 4: return ATTR_USER_DEFINED;
    case 5: return ATTR_UNUSED;
    case 6: return ATTR_BYTE;
    default: return ATTR_UNDEFINED;
    }
}

static bool tok_text_is(const struct tokenizer *t, int32_t id, const char *z)
{
    size_t n = strlen(z);
    return t->tok[id].text_len == n && !memcmp(t->text + t->tok[id].text_off, z, n);
}

static int load_tokens(struct tokenizer *t, const struct gguf *g, char *err)
{
    const struct gguf_kv *kv, *sc = NULL, *ty = NULL;
    if (gguf_get_arr(g, "tokenizer.ggml.tokens", &kv) || kv->arr_type != GGUF_TYPE_STRING)
        return err_set(err, ERR_FORMAT, "tokenizer.ggml.tokens is missing or not an array of strings");
    if (kv->arr_len == 0 || kv->arr_len > INT32_MAX - 1)
        return err_set(err, ERR_FORMAT, "tokenizer.ggml.tokens has %llu entries", (unsigned long long)kv->arr_len);
    size_t n = (size_t)kv->arr_len;
    int rc = gguf_get_arr(g, "tokenizer.ggml.scores", &sc);
    if (rc == ERR_FORMAT || (sc && (sc->arr_len != n || sc->arr_type == GGUF_TYPE_STRING)))
        return err_set(err, ERR_FORMAT, "tokenizer.ggml.scores must be a numeric array of %zu entries", n);
    rc = gguf_get_arr(g, "tokenizer.ggml.token_type", &ty);
    if (rc == ERR_FORMAT || (ty && (ty->arr_len != n || ty->arr_type == GGUF_TYPE_STRING)))
        return err_set(err, ERR_FORMAT, "tokenizer.ggml.token_type must be a numeric array of %zu entries", n);

    t->n_vocab = (int32_t)n;
    t->tok = calloc(n, sizeof *t->tok);
    size_t total = 0;
    for (size_t i = 0; i < n; i++)
        total += kv->strs[i].len ? kv->strs[i].len + 1 : 32;
    t->text = malloc(total);
    t->tok_mask = tok_table_size(n) - 1;
    t->tok_slots = calloc(t->tok_mask + 1, sizeof *t->tok_slots);
    if (!t->tok || !t->text || !t->tok_slots)
        return err_set(err, ERR_NOMEM, "out of memory loading %zu tokens", n);
    size_t off = 0;
    for (size_t i = 0; i < n; i++) {
        struct tok_token *k = &t->tok[i];
        struct gguf_str s = kv->strs[i];
        if (s.len > UINT32_MAX - 1)
            return err_set(err, ERR_FORMAT, "tokenizer.ggml.tokens[%zu] is too long", i);
        k->text_off = off;
        if (s.len == 0) { /* llama.cpp names empty tokens so they stay unique */
            int w = snprintf(t->text + off, 32, "[EMPTY_%zu]", i);
            k->text_len = (uint32_t)w;
        } else {
            memcpy(t->text + off, s.ptr, s.len);
            k->text_len = (uint32_t)s.len;
        }
        t->text[off + k->text_len] = 0;
        off += k->text_len + 1;
        k->score = sc ? (float)gguf_arr_num(sc, i) : 0.0f;
        k->attr = ty ? attr_from_type((int)gguf_arr_num(ty, i)) : ATTR_NORMAL;
        /* insert; a repeated text maps to the later id */
        size_t h = tok_hash_mix(tok_hash_bytes(TOK_HASH_SEED, t->text + k->text_off, k->text_len)) & t->tok_mask;
        for (;;) {
            uint32_t e = t->tok_slots[h];
            if (!e) {
                t->tok_slots[h] = (uint32_t)i + 1;
                break;
            }
            const struct tok_token *o = &t->tok[e - 1];
            if (o->text_len == k->text_len && !memcmp(t->text + o->text_off, t->text + k->text_off, k->text_len)) {
                t->tok_slots[h] = (uint32_t)i + 1;
                break;
            }
            h = (h + 1) & t->tok_mask;
        }
    }
    return 0;
}

static int load_merges(struct tokenizer *t, const struct gguf *g, char *err)
{
    const struct gguf_kv *kv;
    if (gguf_get_arr(g, "tokenizer.ggml.merges", &kv) || kv->arr_type != GGUF_TYPE_STRING)
        return err_set(err, ERR_FORMAT, "tokenizer.ggml.merges is missing or not an array of strings (needed by "
                                        "gpt2 tokenizers)");
    size_t n = (size_t)kv->arr_len, total = 0;
    if (kv->arr_len > INT32_MAX - 1)
        return err_set(err, ERR_FORMAT, "tokenizer.ggml.merges has too many entries");
    for (size_t i = 0; i < n; i++)
        total += kv->strs[i].len;
    t->merges = malloc((n ? n : 1) * sizeof *t->merges);
    t->merge_text = malloc(total ? total : 1);
    t->merge_mask = tok_table_size(n) - 1;
    t->merge_slots = calloc(t->merge_mask + 1, sizeof *t->merge_slots);
    if (!t->merges || !t->merge_text || !t->merge_slots)
        return err_set(err, ERR_NOMEM, "out of memory loading %zu merges", n);
    size_t off = 0;
    for (size_t i = 0; i < n; i++) {
        struct gguf_str s = kv->strs[i];
        /* "left right", split at the first space after the first byte (as llama.cpp does) */
        const char *sp = s.len > 1 ? memchr(s.ptr + 1, ' ', s.len - 1) : NULL;
        if (!sp || s.len > UINT32_MAX)
            continue; /* never matches a pair of non-empty symbols */
        size_t ln = (size_t)(sp - s.ptr), rn = s.len - ln - 1;
        struct tok_merge *m = &t->merges[t->n_merges];
        m->key_off = off;
        m->left_len = (uint32_t)ln;
        m->right_len = (uint32_t)rn;
        m->rank = (int32_t)i;
        memcpy(t->merge_text + off, s.ptr, ln);
        memcpy(t->merge_text + off + ln, sp + 1, rn);
        size_t h = tok_pair_hash(s.ptr, ln, sp + 1, rn) & t->merge_mask;
        bool dup = false;
        for (;;) {
            uint32_t e = t->merge_slots[h];
            if (!e)
                break;
            const struct tok_merge *o = &t->merges[e - 1];
            const char *ok = t->merge_text + o->key_off;
            if (o->left_len == ln && o->right_len == rn && !memcmp(ok, s.ptr, ln) && !memcmp(ok + ln, sp + 1, rn)) {
                dup = true; /* the first (lowest) rank stays */
                break;
            }
            h = (h + 1) & t->merge_mask;
        }
        if (dup)
            continue;
        t->merge_slots[h] = (uint32_t)t->n_merges + 1;
        t->n_merges++;
        off += ln + rn;
    }
    return 0;
}

/* Special ids from metadata over the defaults; ids out of range are ignored (llama.cpp warns and keeps the
 * default), and a default that does not fit the vocabulary becomes "none". */
static void load_special_id(struct tokenizer *t, const struct gguf *g, const char *key, int32_t *id)
{
    uint32_t v;
    if (gguf_get_u32(g, key, &v) == 0) {
        if (v < (uint32_t)t->n_vocab)
            *id = (int32_t)v;
        else if (v != UINT32_MAX) /* UINT32_MAX is how converters write "none" */
            log_warn("tokenizer: %s = %u is outside the vocabulary (%d tokens); ignored", key, v, t->n_vocab);
    }
    if (*id >= t->n_vocab)
        *id = -1;
}

static int eog_add(struct tokenizer *t, int32_t id)
{
    if (id < 0 || tokenizer_is_eog(t, id))
        return 0;
    int32_t *v = realloc(t->eog, (t->n_eog + 1) * sizeof *v);
    if (!v)
        return ERR_NOMEM;
    t->eog = v;
    t->eog[t->n_eog++] = id;
    return 0;
}

static void force_control(struct tokenizer *t, int32_t id)
{
    if (!(t->tok[id].attr & ATTR_CONTROL)) {
        log_debug("tokenizer: token %d '%s' looks like a control token; treating it as one", id,
                  t->text + t->tok[id].text_off);
        t->tok[id].attr = ATTR_CONTROL;
    }
}

static int setup_specials(struct tokenizer *t, const struct gguf *g)
{
    static const char *const eot_texts[] = {"<|eot_id|>", "<|im_end|>", "<|end|>", "<end_of_turn>",
                                            "<|endoftext|>", "<EOT>", "<\xef\xbd\x9c" "end\xe2\x96\x81of\xe2\x96\x81sentence\xef\xbd\x9c>"};
    static const char *const eog_texts[] = {"<|eot_id|>", "<|im_end|>", "<|end|>", "<end_of_turn>",
                                            "<|endoftext|>", "<|eom_id|>", "<EOT>"};
    static const char *const fim_pad[] = {"<|fim_pad|>", "<fim-pad>", "<PAD>"};
    static const char *const fim_rep[] = {"<|fim_repo|>", "<|repo_name|>", "<fim-repo>", "<REPO>"};
    static const char *const fim_sep[] = {"<|file_sep|>"};
    int32_t fpad = -1, frep = -1, fsep = -1;

    load_special_id(t, g, "tokenizer.ggml.eot_token_id", &t->eot);
    load_special_id(t, g, "tokenizer.ggml.eom_token_id", &t->eom);
    load_special_id(t, g, "tokenizer.ggml.fim_pad_token_id", &fpad);
    load_special_id(t, g, "tokenizer.ggml.fim_rep_token_id", &frep);
    load_special_id(t, g, "tokenizer.ggml.fim_sep_token_id", &fsep);

    /* text-based detection, for files whose converter did not record these ids (lowest id wins) */
    for (int32_t id = 0; id < t->n_vocab; id++) {
        if (t->eot < 0)
            for (size_t j = 0; j < sizeof eot_texts / sizeof *eot_texts; j++)
                if (tok_text_is(t, id, eot_texts[j])) {
                    t->eot = id;
                    force_control(t, id);
                }
        if (t->eom < 0 && tok_text_is(t, id, "<|eom_id|>")) {
            t->eom = id;
            force_control(t, id);
        }
        if (fpad < 0)
            for (size_t j = 0; j < sizeof fim_pad / sizeof *fim_pad; j++)
                if (tok_text_is(t, id, fim_pad[j])) {
                    fpad = id;
                    force_control(t, id);
                }
        if (frep < 0)
            for (size_t j = 0; j < sizeof fim_rep / sizeof *fim_rep; j++)
                if (tok_text_is(t, id, fim_rep[j])) {
                    frep = id;
                    force_control(t, id);
                }
        if (fsep < 0 && tok_text_is(t, id, fim_sep[0])) {
            fsep = id;
            force_control(t, id);
        }
    }
    /* the FIM begin/hole/end tokens are forced to control too, although they do not end generation */
    static const char *const fim_other[] = {"<|fim_prefix|>", "<fim-prefix>", "<\xef\xbd\x9c" "fim\xe2\x96\x81" "begin\xef\xbd\x9c>", "<PRE>",
                                            "<|fim_suffix|>", "<fim-suffix>", "<\xef\xbd\x9c" "fim\xe2\x96\x81" "hole\xef\xbd\x9c>", "<SUF>",
                                            "<|fim_middle|>", "<fim-middle>", "<\xef\xbd\x9c" "fim\xe2\x96\x81" "end\xef\xbd\x9c>", "<MID>"};
    static const char *const fim_keys[] = {"tokenizer.ggml.fim_pre_token_id", "tokenizer.ggml.fim_suf_token_id",
                                           "tokenizer.ggml.fim_mid_token_id"};
    static const char *const fim_old_keys[] = {"tokenizer.ggml.prefix_token_id", "tokenizer.ggml.suffix_token_id",
                                               "tokenizer.ggml.middle_token_id"};
    for (int f = 0; f < 3; f++) {
        int32_t id = -1;
        load_special_id(t, g, fim_keys[f], &id);
        load_special_id(t, g, fim_old_keys[f], &id);
        for (int32_t i = 0; id < 0 && i < t->n_vocab; i++)
            for (int j = 0; j < 4; j++)
                if (tok_text_is(t, i, fim_other[f * 4 + j])) {
                    id = i;
                    force_control(t, i);
                    break;
                }
    }

    if (eog_add(t, fpad) || eog_add(t, frep) || eog_add(t, fsep))
        return ERR_NOMEM;
    for (int32_t id = 0; id < t->n_vocab; id++)
        for (size_t j = 0; j < sizeof eog_texts / sizeof *eog_texts; j++)
            if (tok_text_is(t, id, eog_texts[j])) {
                if (eog_add(t, id))
                    return ERR_NOMEM;
                force_control(t, id);
            }
    if (eog_add(t, t->eos) || eog_add(t, t->eot) || eog_add(t, t->eom))
        return ERR_NOMEM;
    return 0;
}

static int cmp_partition_order(const void *a, const void *b, void *ctx)
{
    const struct tokenizer *t = ctx;
    int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
    uint32_t lx = t->tok[x].text_len, ly = t->tok[y].text_len;
    if (lx != ly)
        return lx > ly ? -1 : 1;
    return x < y ? -1 : x > y;
}

static int cmp_text_order(const void *a, const void *b, void *ctx)
{
    const struct tokenizer *t = ctx;
    uint32_t i = *(const uint32_t *)a, j = *(const uint32_t *)b;
    const struct tok_token *ki = &t->tok[t->specials[i]];
    int c = spec_cmp_text(t, t->specials[j], t->text + ki->text_off, ki->text_len);
    if (c)
        return -c;
    return i < j ? -1 : i > j;
}

static int cmp_u32(const void *a, const void *b)
{
    uint32_t x = *(const uint32_t *)a, y = *(const uint32_t *)b;
    return x < y ? -1 : x > y;
}

static int build_special_cache(struct tokenizer *t)
{
    size_t n = 0;
    for (int32_t id = 0; id < t->n_vocab; id++)
        if (t->tok[id].attr & (ATTR_CONTROL | ATTR_USER_DEFINED | ATTR_UNKNOWN))
            n++;
    if (!n)
        return 0;
    t->specials = malloc(n * sizeof *t->specials);
    t->spec_sorted = malloc(n * sizeof *t->spec_sorted);
    t->spec_lens = malloc(n * sizeof *t->spec_lens);
    if (!t->specials || !t->spec_sorted || !t->spec_lens)
        return ERR_NOMEM;
    for (int32_t id = 0; id < t->n_vocab; id++)
        if (t->tok[id].attr & (ATTR_CONTROL | ATTR_USER_DEFINED | ATTR_UNKNOWN)) {
            t->specials[t->n_specials] = id;
            t->spec_lens[t->n_specials] = t->tok[id].text_len;
            t->spec_first[(unsigned char)t->text[t->tok[id].text_off]] = true;
            t->n_specials++;
        }
    qsort_r(t->specials, n, sizeof *t->specials, cmp_partition_order, t);
    for (size_t i = 0; i < n; i++)
        t->spec_sorted[i] = (uint32_t)i;
    qsort_r(t->spec_sorted, n, sizeof *t->spec_sorted, cmp_text_order, t);
    qsort(t->spec_lens, n, sizeof *t->spec_lens, cmp_u32);
    size_t d = 0;
    for (size_t i = 0; i < n; i++)
        if (d == 0 || t->spec_lens[d - 1] != t->spec_lens[i])
            t->spec_lens[d++] = t->spec_lens[i];
    t->n_spec_lens = d;
    return 0;
}

static int build_pieces(struct tokenizer *t)
{
    struct tok_buf b = {0};
    for (int32_t id = 0; id < t->n_vocab; id++) {
        size_t start = b.n;
        if (render_piece(t, id, &b)) {
            free(b.p);
            return ERR_NOMEM;
        }
        if (b.n - start > UINT32_MAX) {
            free(b.p);
            return ERR_TOO_LARGE;
        }
        t->tok[id].piece_off = start;
        t->tok[id].piece_len = (uint32_t)(b.n - start);
    }
    t->pieces = b.p ? b.p : malloc(1);
    return t->pieces ? 0 : ERR_NOMEM;
}

static void build_byte_tokens(struct tokenizer *t)
{
    static const char hex[] = "0123456789ABCDEF";
    for (int c = 0; c < 256; c++) {
        char name[7] = {'<', '0', 'x', hex[c >> 4], hex[c & 15], '>', 0};
        int32_t id = tok_lookup(t, name, 6);
        if (id < 0) {
            char raw = (char)c;
            id = tok_lookup(t, &raw, 1);
        }
        t->byte_tok[c] = id;
    }
}

/* Per-model token attributes llama.cpp sets by name (white space stripping around some specials). */
static void apply_name_attrs(struct tokenizer *t, const struct gguf *g)
{
    struct gguf_str s;
    if (t->pre_name && strstr(t->pre_name, "jina-v2-")) {
        int32_t id = tok_lookup(t, "<mask>", 6);
        if (id >= 0)
            t->tok[id].attr |= ATTR_LSTRIP;
        return;
    }
    if (gguf_get_str(g, "general.name", &s) != 0)
        return;
    char name[256];
    size_t n = s.len < sizeof name - 1 ? (size_t)s.len : sizeof name - 1;
    for (size_t i = 0; i < n; i++)
        name[i] = (char)tolower((unsigned char)s.ptr[i]);
    name[n] = 0;
    if (!strstr(name, "phi-3") && !strstr(name, "phi3"))
        return;
    for (size_t i = 0; i < t->n_specials; i++)
        t->tok[t->specials[i]].attr |= ATTR_RSTRIP;
    static const char *const keep[] = {"<unk>", "<s>", "<|endoftext|>"};
    int32_t id = tok_lookup(t, "</s>", 4);
    if (id >= 0)
        t->tok[id].attr |= ATTR_RSTRIP;
    for (size_t i = 0; i < 3; i++)
        if ((id = tok_lookup(t, keep[i], strlen(keep[i]))) >= 0)
            t->tok[id].attr &= ~(uint32_t)ATTR_RSTRIP;
}

struct tokenizer *tokenizer_create(const struct gguf *g, char *err)
{
    struct tokenizer *t = calloc(1, sizeof *t);
    struct gguf_str model, pre;
    char names[1024];
    bool bflag;
    int rc;
    if (!t) {
        err_set(err, ERR_NOMEM, "out of memory");
        return NULL;
    }
    if (gguf_get_str(g, "tokenizer.ggml.model", &model) != 0) {
        err_set(err, ERR_FORMAT, "tokenizer.ggml.model is missing: the file has no vocabulary");
        goto fail;
    }
    const struct pretok_name *pn = NULL;
    if (gguf_str_eq(model, "llama")) {
        t->kind = TOK_SPM;
        t->bos = 1;
        t->eos = 2;
        t->unk = 0;
        t->add_bos = true;
        t->add_space_prefix = true;
        t->pre = PRETOK_DEFAULT;
        t->pre_name = strdup("default");
    } else if (gguf_str_eq(model, "gpt2")) {
        t->kind = TOK_BPE;
        t->bos = 11; /* llama.cpp's defaults for byte-level BPE */
        t->eos = 11;
        t->unk = -1;
        if (gguf_get_str(g, "tokenizer.ggml.pre", &pre) != 0) {
            log_warn("tokenizer: tokenizer.ggml.pre is missing; using the 'default' pre-tokenizer (generation "
                     "quality may suffer: consider regenerating the model file)");
            pn = pretok_lookup("default", 7);
        } else if (!(pn = pretok_lookup(pre.ptr, (size_t)pre.len))) {
            pretok_names(names, sizeof names);
            err_set(err, ERR_UNSUPPORTED, "unsupported tokenizer.ggml.pre '%.*s' (supported: %s)",
                    (int)(pre.len > 64 ? 64 : pre.len), pre.ptr, names);
            goto fail;
        }
        t->pre = pn->type;
        t->pre_name = strdup(pn->name);
        t->ignore_merges = pn->flags & PRETOK_F_IGNORE_MERGES;
        t->add_bos = pn->flags & PRETOK_F_ADD_BOS;
        if (pn->flags & PRETOK_F_NO_BOS)
            t->bos = -1;
    } else {
        err_set(err, ERR_UNSUPPORTED, "unsupported tokenizer.ggml.model '%.*s' (supported: llama, gpt2)",
                (int)(model.len > 64 ? 64 : model.len), model.ptr);
        goto fail;
    }
    t->eot = t->eom = t->pad = -1;
    if (!t->pre_name) {
        err_set(err, ERR_NOMEM, "out of memory");
        goto fail;
    }
    if (gguf_get_bool(g, "tokenizer.ggml.add_space_prefix", &bflag) == 0)
        t->add_space_prefix = bflag;

    if ((rc = load_tokens(t, g, err)))
        goto fail;
    if (t->kind == TOK_BPE && (rc = load_merges(t, g, err)))
        goto fail;

    load_special_id(t, g, "tokenizer.ggml.bos_token_id", &t->bos);
    load_special_id(t, g, "tokenizer.ggml.eos_token_id", &t->eos);
    load_special_id(t, g, "tokenizer.ggml.unknown_token_id", &t->unk);
    load_special_id(t, g, "tokenizer.ggml.padding_token_id", &t->pad);
    if (gguf_get_bool(g, "tokenizer.ggml.add_bos_token", &bflag) == 0)
        t->add_bos = bflag;
    if (gguf_get_bool(g, "tokenizer.ggml.add_eos_token", &bflag) == 0)
        t->add_eos = bflag;

    if (setup_specials(t, g) || build_special_cache(t) || build_pieces(t)) {
        err_set(err, ERR_NOMEM, "out of memory building the tokenizer");
        goto fail;
    }
    apply_name_attrs(t, g);
    if (t->kind == TOK_SPM) {
        build_byte_tokens(t);
        if (spm_build_pairs(t)) {
            err_set(err, ERR_NOMEM, "out of memory building the tokenizer");
            goto fail;
        }
    } else
        memset(t->byte_tok, 0xff, sizeof t->byte_tok);
    return t;
fail:
    tokenizer_destroy(t);
    return NULL;
}
