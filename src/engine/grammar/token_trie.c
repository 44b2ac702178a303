/*
 * token_trie: the vocabulary's detokenized byte strings as a trie laid out in preorder (children in byte
 * order), each node knowing the end of its subtree (skip) and its parent, so a mask is one forward scan that
 * jumps over every subtree the grammar rejects, and a cached mask can point at a subtree by one index.
 * Built by sorting the pieces: consecutive pieces share their longest common prefix, so nodes come out in
 * preorder directly. Tokens with the same bytes (an SPM byte token <0x41> and "A") end at the same node.
 * End-of-generation tokens and tokens with no bytes (control, unknown) are not in the trie: the matcher
 * allows EOG tokens where the grammar may end and never the others.
 */
#include "engine/grammar/grammar_impl.h"

#include "core/err.h"
#include "engine/tokenizer/tokenizer.h"

#include <stdlib.h>
#include <string.h>

static int trie_piece_cmp(const void *x, const void *y, void *ctx)
{
    const struct token_trie *t = ctx;
    int32_t a = *(const int32_t *)x, b = *(const int32_t *)y;
    uint32_t la = t->piece_len[a], lb = t->piece_len[b];
    int c = memcmp(t->piece_bytes + t->piece_off[a], t->piece_bytes + t->piece_off[b], la < lb ? la : lb);
    if (c)
        return c;
    if (la != lb)
        return la < lb ? -1 : 1;
    return a < b ? -1 : a > b;
}

void token_trie_destroy(struct token_trie *t)
{
    if (!t)
        return;
    free(t->nodes);
    free(t->toks);
    free(t->piece_bytes);
    free(t->piece_off);
    free(t->piece_len);
    free(t->eog_bits);
    free(t->eog);
    free(t);
}

/* Builds nodes and token lists from t->piece_* (eog already marked). Node i's tokens are toks[nodes[i].tok
 * .. nodes[i + 1].tok): in sorted order the token whose piece is exactly a node's bytes comes before any
 * longer piece, so it is appended right after its node is made and before the next node. */
static int trie_build(struct token_trie *t, char *err)
{
    int32_t n = t->n_vocab;
    int32_t *ids = malloc((size_t)(n ? n : 1) * sizeof *ids);
    uint32_t path[TRIE_MAX_PIECE + 1];
    int rc = ERR_NOMEM;
    size_t n_ids = 0, n_nodes_max = 1;
    if (!ids)
        goto done;
    for (int32_t i = 0; i < n; i++) {
        bool eog = t->eog_bits[i / 32] >> (i % 32) & 1;
        if (!eog && t->piece_len[i] > 0 && t->piece_len[i] <= TRIE_MAX_PIECE) {
            ids[n_ids++] = i;
            n_nodes_max += t->piece_len[i];
        }
    }
    qsort_r(ids, n_ids, sizeof *ids, trie_piece_cmp, t);
    t->nodes = malloc((n_nodes_max + 1) * sizeof *t->nodes);
    t->toks = malloc((n_ids ? n_ids : 1) * sizeof *t->toks);
    if (!t->nodes || !t->toks)
        goto done;
    uint32_t nn = 1, nt = 0, depth = 0;
    t->nodes[0] = (struct trie_node){.parent = GNONE};
    path[0] = 0;
    const char *prev = NULL;
    uint32_t prev_len = 0;
    for (size_t k = 0; k < n_ids; k++) {
        int32_t id = ids[k];
        const char *p = t->piece_bytes + t->piece_off[id];
        uint32_t len = t->piece_len[id];
        uint32_t lcp = 0;
        while (prev && lcp < len && lcp < prev_len && p[lcp] == prev[lcp])
            lcp++;
        /* close the nodes below the common prefix */
        while (depth > lcp) {
            t->nodes[path[depth]].skip = nn;
            depth--;
        }
        for (uint32_t d = lcp; d < len; d++) {
            t->nodes[nn] = (struct trie_node){.byte = (uint8_t)p[d], .depth = (uint16_t)(d + 1), .parent = path[d], .tok = nt};
            path[++depth] = nn++;
        }
        if (len > t->max_depth)
            t->max_depth = len;
        t->toks[nt++] = id;
        prev = p;
        prev_len = len;
    }
    while (depth > 0) {
        t->nodes[path[depth]].skip = nn;
        depth--;
    }
    t->nodes[0].skip = nn;
    t->nodes[0].tok = 0;
    t->nodes[nn] = (struct trie_node){.tok = nt, .skip = nn + 1, .parent = GNONE};
    t->n_nodes = nn;
    rc = 0;
done:
    free(ids);
    if (rc)
        err_set(err, rc, "out of memory building the token trie");
    return rc;
}

static struct token_trie *trie_alloc(int32_t n_vocab, size_t bytes)
{
    struct token_trie *t = calloc(1, sizeof *t);
    if (!t)
        return NULL;
    t->n_vocab = n_vocab;
    size_t nv = (size_t)(n_vocab ? n_vocab : 1);
    t->piece_bytes = malloc(bytes ? bytes : 1);
    t->piece_off = malloc(nv * sizeof *t->piece_off);
    t->piece_len = malloc(nv * sizeof *t->piece_len);
    t->eog_bits = calloc((nv + 31) / 32, sizeof *t->eog_bits);
    if (!t->piece_bytes || !t->piece_off || !t->piece_len || !t->eog_bits) {
        token_trie_destroy(t);
        return NULL;
    }
    return t;
}

static int trie_eog_list(struct token_trie *t)
{
    int n = 0;
    for (int32_t i = 0; i < t->n_vocab; i++)
        n += t->eog_bits[i / 32] >> (i % 32) & 1;
    t->eog = malloc((size_t)(n ? n : 1) * sizeof *t->eog);
    if (!t->eog)
        return ERR_NOMEM;
    for (int32_t i = 0; i < t->n_vocab; i++)
        if (t->eog_bits[i / 32] >> (i % 32) & 1)
            t->eog[t->n_eog++] = i;
    return 0;
}

struct token_trie *token_trie_create(const struct tokenizer *tok, char *err)
{
    int32_t n = tokenizer_n_vocab(tok);
    size_t total = 0;
    char buf[256];
    for (int32_t i = 0; i < n; i++) {
        int k = tokenizer_token_to_piece(tok, i, false, buf, sizeof buf);
        if (k > 0)
            total += (size_t)k;
    }
    struct token_trie *t = trie_alloc(n, total);
    if (!t) {
        err_set(err, ERR_NOMEM, "out of memory building the token trie");
        return NULL;
    }
    size_t off = 0;
    for (int32_t i = 0; i < n; i++) {
        int k = tokenizer_token_to_piece(tok, i, false, t->piece_bytes + off, (int)(total - off));
        if (k < 0 || (size_t)k > total - off || tokenizer_is_control(tok, i))
            k = 0;
        t->piece_off[i] = (uint32_t)off;
        t->piece_len[i] = (uint32_t)k;
        off += (size_t)k;
        if (tokenizer_is_eog(tok, i))
            t->eog_bits[i / 32] |= 1u << (i % 32);
    }
    if (trie_eog_list(t) || trie_build(t, err)) {
        err_set(err, ERR_NOMEM, "out of memory building the token trie");
        token_trie_destroy(t);
        return NULL;
    }
    return t;
}

struct token_trie *token_trie_create_from_pieces(const char *const *pieces, const uint32_t *lens, int32_t n_vocab,
                                                 const int32_t *eog, int n_eog, char *err)
{
    size_t total = 0;
    for (int32_t i = 0; i < n_vocab; i++)
        total += lens[i];
    struct token_trie *t = trie_alloc(n_vocab, total);
    if (!t) {
        err_set(err, ERR_NOMEM, "out of memory building the token trie");
        return NULL;
    }
    size_t off = 0;
    for (int32_t i = 0; i < n_vocab; i++) {
        memcpy(t->piece_bytes + off, pieces[i], lens[i]);
        t->piece_off[i] = (uint32_t)off;
        t->piece_len[i] = lens[i];
        off += lens[i];
    }
    for (int k = 0; k < n_eog; k++) {
        if (eog[k] < 0 || eog[k] >= n_vocab) {
            err_set(err, ERR_INVALID_ARG, "end token %d is outside the vocabulary of %d", eog[k], n_vocab);
            token_trie_destroy(t);
            return NULL;
        }
        t->eog_bits[eog[k] / 32] |= 1u << (eog[k] % 32);
    }
    if (trie_eog_list(t) || trie_build(t, err)) {
        err_set(err, ERR_NOMEM, "out of memory building the token trie");
        token_trie_destroy(t);
        return NULL;
    }
    return t;
}

int32_t token_trie_n_vocab(const struct token_trie *t) { return t->n_vocab; }

const char *token_trie_piece(const struct token_trie *t, int32_t id, uint32_t *len)
{
    if (id < 0 || id >= t->n_vocab)
        return NULL;
    *len = t->piece_len[id];
    return t->piece_bytes + t->piece_off[id];
}

bool token_trie_is_eog(const struct token_trie *t, int32_t id)
{
    return id >= 0 && id < t->n_vocab && (t->eog_bits[id / 32] >> (id % 32) & 1);
}
