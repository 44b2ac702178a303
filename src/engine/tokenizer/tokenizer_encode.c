/*
 * tokenizer_encode: text -> token ids, following llama.cpp's llama_vocab::tokenize step for step.
 *
 * (1) Special tokens are cut out of the text: longest text first, each one splitting every remaining text
 *     fragment at all its occurrences (llama.cpp's tokenizer_st_partition). A prefilter first finds which
 *     special tokens occur in the text at all, so vocabularies with thousands of specials stay cheap.
 *     With plain spans (tokenizer_encode_spans: a chat prompt's message contents), an occurrence of a
 *     markup token (control, unknown, end of generation, or a user-defined tag such as <start_of_turn>) that
 *     overlaps a plain span is not cut: it stays in its fragment and is tokenized as the text it is. The spans do not cut
 *     fragments themselves, so text that holds no special token tokenizes as it would without them.
 * (2) Each text fragment goes through SPM (score-ordered pair merges over characters, byte fallback) or
 *     byte-level BPE (pre-tokenizer words, rank-ordered pair merges).
 * (3) BOS/EOS are added as the metadata says.
 * Both merge loops use a binary heap of candidate pairs with lazy invalidation: O(n log n) per fragment or
 * word. All scratch memory belongs to the call, so one tokenizer serves many threads.
 */
#include "engine/tokenizer/tokenizer_impl.h"

#include "engine/tokenizer/unicode.h"

#include <limits.h>

/* ---- output ids ---- */

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
int tok_spm_build_pairs(struct tokenizer *t)
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

/* Whether id's text is a tag, "<...>" or "[...]" with something between. */
static bool tok_looks_like_tag(const struct tokenizer *t, int32_t id)
{
    const struct tok_token *k = &t->tok[id];
    const char *s = t->text + k->text_off;
    size_t n = k->text_len;
    return n >= 3 && ((s[0] == '<' && s[n - 1] == '>') || (s[0] == '[' && s[n - 1] == ']'));
}

/* Whether [pos, pos + n) overlaps one of the plain spans (sorted by offset, disjoint). */
static bool spans_overlap(const struct tok_span *sp, size_t n_sp, size_t pos, size_t n)
{
    size_t lo = 0, hi = n_sp;
    while (lo < hi) { /* first span ending after pos */
        size_t mid = (lo + hi) / 2;
        if (sp[mid].off + sp[mid].len <= pos)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo < n_sp && sp[lo].off < pos + n;
}

/* Splits every text fragment at each occurrence of special token id (llama.cpp's st_partition step); with
 * plain spans, occurrences overlapping one are left in the text. */
static int partition_one(const struct tokenizer *t, int32_t id, const char *text, const struct tok_span *plain,
                         size_t n_plain, struct tok_frags *in, struct tok_frags *out)
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
        size_t cur = f.off, scan = f.off, end = f.off + f.len; /* text pending from cur, searched from scan */
        for (;;) {
            const char *m = end - scan >= nl ? memmem(text + scan, end - scan, needle, nl) : NULL;
            if (!m)
                break;
            size_t pos = (size_t)(m - text);
            if (n_plain && spans_overlap(plain, n_plain, pos, nl)) {
                scan = pos + 1; /* written by a user: stays text */
                continue;
            }
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
            scan = cur;
        }
        if (cur < end && frags_push(out, -1, cur, end - cur))
            return ERR_NOMEM;
    }
    return 0;
}

/* The whole encoding: on success returns the number of ids and hands *ids (malloc'd, the caller frees; NULL
 * when there are none) over; on failure returns a negative ERR_* code and *ids is NULL. */
static int encode_ids(const struct tokenizer *t, const char *text, size_t len, bool add_special, bool parse_special,
                      const struct tok_span *plain, size_t n_plain, int32_t **ids)
{
    int rc = 0;
    *ids = NULL;
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
                    bool control = t->tok[id].attr & (ATTR_CONTROL | ATTR_UNKNOWN);
                    if (!parse_special && control)
                        continue;
                    if (!present[i])
                        continue;
                    /* plain spans protect against the tokens that are markup: control ones, and
                     * user-defined ones that end a turn or read like a tag (Gemma's <start_of_turn>), while
                     * other user-defined tokens (runs of spaces, code pieces) still match as text would */
                    bool guarded = control || tok_is_eog(t, id) || tok_looks_like_tag(t, id);
                    if ((rc = partition_one(t, id, text, plain, guarded ? n_plain : 0, &fa, &fb)))
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
    rc = (int)s.out.n;
    *ids = s.out.v;
    s.out.v = NULL;
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

int tokenizer_encode(const struct tokenizer *t, const char *text, size_t len, bool add_special, bool parse_special,
                     int32_t *out, int cap)
{
    int32_t *ids;
    int n = encode_ids(t, text, len, add_special, parse_special, NULL, 0, &ids);
    if (n > 0 && out && cap > 0)
        memcpy(out, ids, (size_t)(n < cap ? n : cap) * sizeof *out);
    free(ids);
    return n;
}

int tokenizer_encode_alloc(const struct tokenizer *t, const char *text, size_t len, bool add_special,
                           bool parse_special, int32_t **out)
{
    if (!out)
        return ERR_INVALID_ARG;
    *out = NULL;
    if (!t || (!text && len > 0))
        return ERR_INVALID_ARG;
    int32_t *ids;
    int n = encode_ids(t, text, len, add_special, parse_special, NULL, 0, &ids);
    if (n < 0)
        return n;
    if (!ids && !(ids = malloc(sizeof *ids))) /* no ids: still a buffer the caller can free and index */
        return ERR_NOMEM;
    *out = ids;
    return n;
}

int tokenizer_encode_spans(const struct tokenizer *t, const char *text, size_t len, bool add_special,
                           const struct tok_span *plain, size_t n_plain, int32_t **out)
{
    if (!out)
        return ERR_INVALID_ARG;
    *out = NULL;
    if (!t || (!text && len > 0) || (!plain && n_plain > 0))
        return ERR_INVALID_ARG;
    for (size_t i = 0; i < n_plain; i++)
        if (plain[i].off > len || plain[i].len > len - plain[i].off ||
            (i > 0 && plain[i].off < plain[i - 1].off + plain[i - 1].len))
            return ERR_INVALID_ARG;
    int32_t *ids;
    int n = encode_ids(t, text, len, add_special, true, plain, n_plain, &ids);
    if (n < 0)
        return n;
    if (!ids && !(ids = malloc(sizeof *ids)))
        return ERR_NOMEM;
    *out = ids;
    return n;
}
