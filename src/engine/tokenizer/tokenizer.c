/*
 * tokenizer: SentencePiece-style and byte-level BPE tokenization from GGUF metadata, following llama.cpp's
 * llama-vocab.cpp behaviour (defaults, special-token handling, piece rendering) so ids match exactly.
 *
 * Layout: every token's text lives NUL-terminated in one arena (tokenizer_token_text hands these out); an
 * open-addressing hash maps text -> id (the last id wins for duplicate texts, as in llama.cpp); BPE merges
 * are a second hash keyed by the (left, right) pair. Pieces (what a token renders to with specials shown)
 * are computed once at create, as llama.cpp caches them, so token_to_piece is a copy.
 *
 * This file builds the tokenizer from GGUF metadata (defaults, special ids, end-of-generation set, token
 * attributes), renders pieces and runs the streaming detokenizer; encoding is in tokenizer_encode.c.
 */
#include "engine/tokenizer/tokenizer_impl.h"

#include "core/log.h"
#include "engine/tokenizer/unicode.h"

#include <ctype.h>
#include <limits.h>
#include <stdio.h>

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

bool tokenizer_is_eog(const struct tokenizer *t, int32_t id) { return tok_is_eog(t, id); }

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
        if (tok_spm_build_pairs(t)) {
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
