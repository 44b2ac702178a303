/*
 * matcher: a sequence's position in a compiled grammar, advanced per byte, and the token mask.
 *
 * State. A configuration is a set of heads (state, parent, depth): a DFA state with byte edges on top of a
 * persistent stack of frames (return states pushed by calls, in an arena, parents always older than their
 * children). Stepping a byte moves each head along its byte edge, then expands: a state's calls push their
 * return state and expand the callee's start; an accepting state pops into its parent frame (below the
 * root: the grammar may end here, CFG_END). Heads are deduplicated by (state, parent), frames created in one
 * step by (state, parent). The arena is compacted after accepts once it is mostly garbage.
 *
 * Mask. Walking the whole token trie with the full configuration is exact but visits up to every node
 * (57k for a 32k SPM vocabulary): too slow for wide states like a JSON string's body. So for each head's
 * state q the shared cache holds what one walk from q alone found, with a sentinel (FRAME_BASE) in place of
 * the unknown stack below: tokens accepted without ever leaving q's rule (context-independent: allowed
 * whatever lies below) and the trie subtrees where every path died after some path popped out of the rule
 * (context-dependent). A mask is then: for each head, OR its accepted set, and walk only its
 * context-dependent subtrees with the real stack. The precompute walk is pruned like any other (subtrees
 * that die inside the rule are skipped whole), and runs once per grammar and vocabulary for each class of
 * DFA states that no token can tell apart (cache_classes).
 *
 * Consistency with accept: the depth limit is absolute, the precompute's relative, so an entry is only used
 * when head depth + the deepest frame its walk created fits under GRAMMAR_MAX_DEPTH; an entry whose walk hit
 * the stack or work limits is marked fallback. Either way the mask falls back to the exact walk.
 */
#include "engine/grammar/grammar_impl.h"

#include "core/err.h"

#include <stdlib.h>
#include <string.h>

#define FRAME_BOTTOM 0xffffffffu /* below the root rule */
#define FRAME_BASE 0xfffffffeu   /* below a cached head: the unknown rest of the stack */
#define EXPAND_BUDGET (GRAMMAR_MAX_STACKS * 16u) /* expansion calls per byte step */
#define CACHE_MAX_BYTES ((size_t)256 << 20)     /* per grammar; past it entries are computed per use */

enum { CFG_END = 1, CFG_ESCAPED = 2, CFG_OVERFLOW = 4 };
enum { ENTRY_LIST, ENTRY_BITS, ENTRY_FALLBACK };
enum { WALK_FULL, WALK_PRECOMPUTE };

struct ghead {
    uint32_t state, parent, depth; /* depth: frames below */
};

struct gframe {
    uint32_t state, parent, depth; /* depth: frames including this one */
};

struct gcfg {
    uint32_t off, n;       /* heads[off .. off + n) */
    uint32_t frames_end;   /* arena size when this configuration was complete */
    uint32_t flags;
};

struct gmask_entry {
    uint32_t n_acc, n_unc, max_depth;
    uint8_t kind;
    uint32_t data[]; /* accepted ids (LIST) or bitmap (BITS), then n_unc trie nodes */
};

struct gmask_cache {
    const struct token_trie *trie;
    uint32_t n_slots;
    uint32_t *cls; /* [n_states] slot of each DFA state: states with equal entries share one */
    _Atomic size_t bytes;
    _Atomic(struct gmask_entry *) slot[];
};

struct grammar_matcher {
    const struct grammar *g;
    const struct token_trie *trie;
    struct gmask_cache *cache;
    bool own_cache;
    uint32_t n_words;
    /* arenas */
    struct gframe *frames;
    size_t n_frames, cap_frames;
    struct ghead *heads;
    size_t n_heads, cap_heads;
    /* committed configuration: heads [0, cur.n), frames [0, n_frames) */
    struct gcfg cur;
    size_t frames_live;
    bool done, oom;
    /* walk scratch, indexed by trie depth */
    struct gcfg *cfg;
    uint8_t *esc;
    uint32_t *path, *anc;
    uint32_t budget, step_frames, walk_flags, pc_max_depth;
    /* precompute scratch */
    uint32_t *pc_bits;
    uint32_t pc_n_acc;
    uint32_t *pc_unc;
    size_t pc_n_unc, pc_cap_unc;
    uint32_t *remap;
    size_t cap_remap;
    size_t misses;
};

static bool m_grow(void **p, size_t *cap, size_t need, size_t elem)
{
    if (need <= *cap)
        return true;
    size_t c = *cap ? *cap : 256;
    while (c < need)
        c *= 2;
    void *q = realloc(*p, c * elem);
    if (!q)
        return false;
    *p = q;
    *cap = c;
    return true;
}

/* ---- stepping ---- */

static void walk_add_head(struct grammar_matcher *m, struct gcfg *out, uint32_t state, uint32_t parent, uint32_t depth)
{
    for (uint32_t i = out->off; i < out->off + out->n; i++)
        if (m->heads[i].state == state && m->heads[i].parent == parent)
            return;
    if (out->n >= GRAMMAR_MAX_STACKS) {
        out->flags |= CFG_OVERFLOW;
        return;
    }
    if (!m_grow((void **)&m->heads, &m->cap_heads, m->n_heads + 1, sizeof *m->heads)) {
        m->oom = true;
        return;
    }
    m->heads[m->n_heads++] = (struct ghead){state, parent, depth};
    out->n++;
}

static uint32_t walk_frame(struct grammar_matcher *m, uint32_t state, uint32_t parent, uint32_t pdepth)
{
    for (size_t i = m->step_frames; i < m->n_frames; i++)
        if (m->frames[i].state == state && m->frames[i].parent == parent)
            return (uint32_t)i;
    if (!m_grow((void **)&m->frames, &m->cap_frames, m->n_frames + 1, sizeof *m->frames)) {
        m->oom = true;
        return GNONE;
    }
    m->frames[m->n_frames] = (struct gframe){state, parent, pdepth + 1};
    if (pdepth + 1 > m->pc_max_depth)
        m->pc_max_depth = pdepth + 1;
    return (uint32_t)m->n_frames++;
}

/* Adds to out every head reachable from state (on parent, pdepth frames below) without consuming a byte. */
static void walk_expand(struct grammar_matcher *m, struct gcfg *out, uint32_t state, uint32_t parent, uint32_t pdepth)
{
    if (!m->budget) {
        out->flags |= CFG_OVERFLOW;
        return;
    }
    m->budget--;
    const struct grammar *g = m->g;
    const struct gstate *s = &g->states[state];
    if (s->has_bytes)
        walk_add_head(m, out, state, parent, pdepth);
    for (uint32_t k = 0; k < s->n_calls; k++) {
        const struct gcall *c = &g->calls[s->call_off + k];
        uint32_t np = parent, nd = pdepth;
        if (c->target != GNONE) {
            if (pdepth + 1 > GRAMMAR_MAX_DEPTH)
                continue; /* too deep: this path does not exist (same rule in every walk) */
            np = walk_frame(m, c->target, parent, pdepth);
            if (np == GNONE)
                return;
            nd = pdepth + 1;
        }
        walk_expand(m, out, c->start, np, nd);
    }
    if (s->accept) {
        if (parent == FRAME_BOTTOM) {
            out->flags |= CFG_END;
        } else if (parent == FRAME_BASE) {
            out->flags |= CFG_ESCAPED;
        } else {
            struct gframe f = m->frames[parent];
            walk_expand(m, out, f.state, f.parent, f.depth - 1);
        }
    }
}

/* Steps configuration in (whose heads lie below the arena end) by one byte into out, appended. */
static void walk_step(struct grammar_matcher *m, struct gcfg in, uint8_t byte, struct gcfg *out)
{
    out->off = (uint32_t)m->n_heads;
    out->n = 0;
    out->flags = 0;
    if (in.n == 1) {
        /* fast path, most steps inside a rule: one head moving to a state that neither calls nor ends (so,
         * being live, it has byte edges): the result is that one head, no expansion */
        struct ghead h = m->heads[in.off];
        uint32_t t = grammar_next(m->g, h.state, byte);
        if (t == GNONE) {
            out->frames_end = (uint32_t)m->n_frames;
            return;
        }
        const struct gstate *st = &m->g->states[t];
        if (!st->n_calls && !st->accept && m->n_heads < m->cap_heads) {
            m->heads[m->n_heads++] = (struct ghead){t, h.parent, h.depth};
            out->n = 1;
            out->frames_end = (uint32_t)m->n_frames;
            return;
        }
    }
    m->step_frames = (uint32_t)m->n_frames;
    m->budget = EXPAND_BUDGET;
    for (uint32_t i = 0; i < in.n; i++) {
        struct ghead h = m->heads[in.off + i];
        uint32_t t = grammar_next(m->g, h.state, byte);
        if (t != GNONE)
            walk_expand(m, out, t, h.parent, h.depth);
    }
    out->frames_end = (uint32_t)m->n_frames;
    m->walk_flags |= out->flags;
}

/* ---- trie walks ---- */

static inline void mark_tokens(const struct token_trie *t, uint32_t node, uint32_t *bits)
{
    for (uint32_t k = t->nodes[node].tok; k < t->nodes[node + 1].tok; k++) {
        uint32_t id = (uint32_t)t->toks[k];
        bits[id >> 5] |= 1u << (id & 31);
    }
}

/* Walks trie nodes [first, end) (whole subtrees in preorder); m->cfg[depth(first) - 1] must hold the
 * configuration at first's parent. FULL: marks accepted tokens in bits. PRECOMPUTE: marks tokens accepted
 * inside the rule in pc_bits and records the roots of subtrees that died after an escape. */
static void walk_nodes(struct grammar_matcher *m, uint32_t first, uint32_t end, int mode, uint32_t *bits)
{
    const struct token_trie *t = m->trie;
    uint32_t i = first;
    while (i < end && !m->oom) {
        const struct trie_node *nd = &t->nodes[i];
        uint32_t d = nd->depth;
        struct gcfg *prev = &m->cfg[d - 1], *c = &m->cfg[d];
        m->n_heads = prev->off + prev->n;
        m->n_frames = prev->frames_end;
        walk_step(m, *prev, nd->byte, c);
        if (mode == WALK_FULL) {
            if (c->n || (c->flags & CFG_END))
                mark_tokens(t, i, bits);
            i = c->n ? i + 1 : nd->skip;
        } else {
            uint8_t esc = m->esc[d - 1] || (c->flags & CFG_ESCAPED);
            m->esc[d] = esc;
            if (c->n) {
                for (uint32_t k = t->nodes[i].tok; k < t->nodes[i + 1].tok; k++) {
                    uint32_t id = (uint32_t)t->toks[k];
                    m->pc_bits[id >> 5] |= 1u << (id & 31);
                    m->pc_n_acc++;
                }
                i++;
            } else {
                if (esc) {
                    if (!m_grow((void **)&m->pc_unc, &m->pc_cap_unc, m->pc_n_unc + 1, sizeof *m->pc_unc)) {
                        m->oom = true;
                        return;
                    }
                    m->pc_unc[m->pc_n_unc++] = i;
                }
                i = nd->skip;
            }
        }
    }
}

/* Puts a one-head configuration at the arena end into m->cfg[0]. */
static void walk_root_cfg(struct grammar_matcher *m, struct ghead h)
{
    m->n_heads = m->cur.off + m->cur.n;
    m->n_frames = m->cur.frames_end;
    struct gcfg *c = &m->cfg[0];
    c->off = (uint32_t)m->n_heads;
    c->n = 0;
    c->flags = 0;
    if (!m_grow((void **)&m->heads, &m->cap_heads, m->n_heads + 1, sizeof *m->heads)) {
        m->oom = true;
        return;
    }
    m->heads[m->n_heads++] = h;
    c->n = 1;
    c->frames_end = (uint32_t)m->n_frames;
}

static void walk_restore(struct grammar_matcher *m)
{
    m->n_heads = m->cur.off + m->cur.n;
    m->n_frames = m->cur.frames_end;
}

/* ---- the shared cache ---- */

/* Classes of DFA states whose cache entries are equal for a trie of depth L: partition refinement where a
 * state's signature after round k is (its class, accept, byte-class row of its targets' round-(k-1) classes,
 * its calls by callee start and return state). Round k's classes tell apart exactly what the first k bytes
 * can, so after L rounds (or a fixpoint) two states in one class accept the same tokens inside their rule
 * and escape at the same trie nodes. Calls are compared by identity (a sound simplification: merging them
 * would need the same refinement over the callees). What this buys: the states of a bounded repetition
 * (maxLength, {m,n}, format atoms) more than L bytes from their end share one entry instead of one each. */
struct cls_rows {
    uint32_t *off;        /* [n_states + 1] */
    uint32_t *cls, *tgt;  /* byte class and target of each non-empty transition */
};

/* Whether states a and b have equal round signatures (old classes in cls). */
static bool cls_same(const struct grammar *g, const struct cls_rows *r, const uint32_t *cls, bool targets,
                     uint32_t a, uint32_t b)
{
    const struct gstate *x = &g->states[a], *y = &g->states[b];
    if (cls[a] != cls[b] || x->accept != y->accept || x->n_calls != y->n_calls ||
        r->off[a + 1] - r->off[a] != r->off[b + 1] - r->off[b])
        return false;
    for (uint32_t j = 0; j < x->n_calls; j++)
        if (g->calls[x->call_off + j].start != g->calls[y->call_off + j].start ||
            g->calls[x->call_off + j].target != g->calls[y->call_off + j].target)
            return false;
    for (uint32_t i = r->off[a], k = r->off[b]; i < r->off[a + 1]; i++, k++)
        if (r->cls[i] != r->cls[k] || (targets && cls[r->tgt[i]] != cls[r->tgt[k]]))
            return false;
    return true;
}

/* Classes of DFA states whose cache entries are equal for a trie of depth L: partition refinement where a
 * state's signature in round k is (its class, accept, its calls by callee start and return state, and for
 * each byte class it can take, the round-(k-1) class of the target). Round k tells apart exactly what the
 * first k bytes can, so after L rounds (or a fixpoint) two states in one class accept the same tokens inside
 * their rule and escape at the same trie nodes. Calls are compared by identity (sound; merging them would
 * need the same refinement over the callees). What this buys: the states of a bounded repetition
 * (maxLength, {m,n}, format atoms) more than L bytes from its end share one entry instead of one each. */
static int cache_classes(const struct grammar *g, uint32_t L, uint32_t *cls, uint32_t *n_cls)
{
    uint32_t n = g->n_states, nc = g->n_classes;
    struct cls_rows r = {0};
    size_t total = 0;
    for (size_t i = 0; i < (size_t)n * nc; i++)
        total += g->next[i] != GNONE;
    if (total > (4u << 20)) { /* a huge grammar: not worth the memory, a class per state */
        for (uint32_t st = 0; st < n; st++)
            cls[st] = st;
        *n_cls = n;
        return 0;
    }
    r.off = malloc(((size_t)n + 1) * sizeof *r.off);
    r.cls = malloc((total ? total : 1) * sizeof *r.cls);
    r.tgt = malloc((total ? total : 1) * sizeof *r.tgt);
    uint32_t *next_cls = malloc((size_t)n * sizeof *next_cls), *hashes = malloc((size_t)n * sizeof *hashes);
    size_t n_slots = 1;
    while (n_slots < 2 * (size_t)n)
        n_slots *= 2;
    uint32_t *slots = malloc(n_slots * sizeof *slots);
    int rc = ERR_NOMEM;
    if (!r.off || !r.cls || !r.tgt || !next_cls || !hashes || !slots)
        goto done;
    size_t k = 0;
    for (uint32_t st = 0; st < n; st++) {
        r.off[st] = (uint32_t)k;
        const uint32_t *row = g->next + (size_t)st * nc;
        for (uint32_t c = 0; c < nc; c++)
            if (row[c] != GNONE)
                r.cls[k] = c, r.tgt[k] = row[c], k++;
    }
    r.off[n] = (uint32_t)k;
    memset(cls, 0, (size_t)n * sizeof *cls);
    uint32_t count = 1;
    for (uint32_t round = 0; round <= L; round++) {
        memset(slots, 0xff, n_slots * sizeof *slots);
        uint32_t fresh = 0;
        for (uint32_t st = 0; st < n; st++) {
            const struct gstate *x = &g->states[st];
            uint32_t h = (2166136261u ^ cls[st]) * 16777619u;
            h = (h ^ x->accept ^ ((uint32_t)x->n_calls << 1)) * 16777619u;
            for (uint32_t j = 0; j < x->n_calls; j++)
                h = (h ^ g->calls[x->call_off + j].start ^ (g->calls[x->call_off + j].target << 7)) * 16777619u;
            for (uint32_t i = r.off[st]; i < r.off[st + 1]; i++)
                h = (h ^ r.cls[i] ^ (round ? cls[r.tgt[i]] << 8 : 0)) * 16777619u;
            hashes[st] = h;
            size_t slot = h & (n_slots - 1);
            for (;;) {
                uint32_t o = slots[slot];
                if (o == GNONE) {
                    slots[slot] = st;
                    next_cls[st] = fresh++;
                    break;
                }
                if (hashes[o] == h && cls_same(g, &r, cls, round > 0, o, st)) {
                    next_cls[st] = next_cls[o];
                    break;
                }
                slot = (slot + 1) & (n_slots - 1);
            }
        }
        memcpy(cls, next_cls, (size_t)n * sizeof *cls);
        bool stable = fresh == count && round > 0;
        count = fresh;
        if (stable)
            break;
    }
    *n_cls = count;
    rc = 0;
done:
    free(r.off);
    free(r.cls);
    free(r.tgt);
    free(next_cls);
    free(hashes);
    free(slots);
    return rc;
}

static struct gmask_cache *cache_create(const struct grammar *g, const struct token_trie *trie)
{
    uint32_t *cls = malloc((g->n_states ? g->n_states : 1) * sizeof *cls), n_cls;
    if (!cls || cache_classes(g, trie->max_depth, cls, &n_cls)) {
        free(cls);
        return NULL;
    }
    struct gmask_cache *c = calloc(1, sizeof *c + (size_t)n_cls * sizeof c->slot[0]);
    if (!c) {
        free(cls);
        return NULL;
    }
    c->trie = trie;
    c->n_slots = n_cls;
    c->cls = cls;
    return c;
}

void gmask_cache_destroy(struct gmask_cache *c)
{
    if (!c)
        return;
    for (uint32_t i = 0; i < c->n_slots; i++)
        free(atomic_load(&c->slot[i]));
    free(c->cls);
    free(c);
}

/* One precompute walk from state q alone; returns a new entry (caller publishes or frees) or NULL (OOM). */
static struct gmask_entry *entry_compute(struct grammar_matcher *m, uint32_t q)
{
    const struct token_trie *t = m->trie;
    memset(m->pc_bits, 0, m->n_words * sizeof *m->pc_bits);
    m->pc_n_acc = 0;
    m->pc_n_unc = 0;
    m->pc_max_depth = 0;
    m->walk_flags = 0;
    walk_root_cfg(m, (struct ghead){q, FRAME_BASE, 0});
    m->esc[0] = 0;
    walk_nodes(m, 1, t->n_nodes, WALK_PRECOMPUTE, NULL);
    walk_restore(m);
    if (m->oom)
        return NULL;
    uint8_t kind = (m->walk_flags & CFG_OVERFLOW) ? ENTRY_FALLBACK : m->pc_n_acc <= m->n_words ? ENTRY_LIST : ENTRY_BITS;
    size_t n_acc_words = kind == ENTRY_LIST ? m->pc_n_acc : kind == ENTRY_BITS ? m->n_words : 0;
    size_t n_unc = kind == ENTRY_FALLBACK ? 0 : m->pc_n_unc;
    struct gmask_entry *e = malloc(sizeof *e + (n_acc_words + n_unc) * sizeof e->data[0]);
    if (!e)
        return NULL;
    e->kind = kind;
    e->n_acc = m->pc_n_acc;
    e->n_unc = (uint32_t)n_unc;
    e->max_depth = m->pc_max_depth;
    if (kind == ENTRY_LIST) {
        uint32_t k = 0;
        for (uint32_t w = 0; w < m->n_words; w++)
            for (uint32_t bits = m->pc_bits[w]; bits; bits &= bits - 1)
                e->data[k++] = w * 32 + (uint32_t)__builtin_ctz(bits);
    } else if (kind == ENTRY_BITS) {
        memcpy(e->data, m->pc_bits, m->n_words * sizeof *m->pc_bits);
    }
    if (n_unc)
        memcpy(e->data + n_acc_words, m->pc_unc, n_unc * sizeof *m->pc_unc);
    return e;
}

static size_t entry_bytes(const struct gmask_entry *e, uint32_t n_words)
{
    size_t acc = e->kind == ENTRY_LIST ? e->n_acc : e->kind == ENTRY_BITS ? n_words : 0;
    return sizeof *e + (acc + e->n_unc) * sizeof e->data[0];
}

/* The entry for state q (shared by its class): cached, or computed now and published (lock-free: the first to publish wins, the
 * others free theirs; all copies are equal). *temp set when the entry must be freed after use (cache full). */
static struct gmask_entry *entry_get(struct grammar_matcher *m, uint32_t q, bool *temp)
{
    *temp = false;
    _Atomic(struct gmask_entry *) *slot = &m->cache->slot[m->cache->cls[q]];
    struct gmask_entry *e = atomic_load_explicit(slot, memory_order_acquire);
    if (e)
        return e;
    e = entry_compute(m, q);
    if (!e)
        return NULL;
    m->misses++;
    size_t sz = entry_bytes(e, m->n_words);
    if (atomic_fetch_add(&m->cache->bytes, sz) + sz > CACHE_MAX_BYTES) {
        atomic_fetch_sub(&m->cache->bytes, sz);
        *temp = true;
        return e;
    }
    struct gmask_entry *expected = NULL;
    if (!atomic_compare_exchange_strong_explicit(slot, &expected, e, memory_order_acq_rel,
                                                 memory_order_acquire)) {
        atomic_fetch_sub(&m->cache->bytes, sz);
        free(e);
        return expected;
    }
    return e;
}

/* ---- lifecycle ---- */

static void matcher_start(struct grammar_matcher *m)
{
    m->n_frames = 0;
    m->n_heads = 0;
    m->done = false;
    m->walk_flags = 0;
    struct gcfg c = {0};
    m->step_frames = 0;
    m->budget = EXPAND_BUDGET;
    walk_expand(m, &c, m->g->root, FRAME_BOTTOM, 0);
    c.frames_end = (uint32_t)m->n_frames;
    m->cur = c;
    m->frames_live = m->n_frames;
}

struct grammar_matcher *grammar_matcher_create(const struct grammar *g, const struct token_trie *trie, char *err)
{
    struct grammar_matcher *m = calloc(1, sizeof *m);
    if (!m)
        goto oom;
    m->g = g;
    m->trie = trie;
    if (trie) {
        uint32_t L = trie->max_depth + 2;
        m->n_words = (uint32_t)(((size_t)trie->n_vocab + 31) / 32);
        m->cfg = calloc(L, sizeof *m->cfg);
        m->esc = calloc(L, 1);
        m->path = calloc(L, sizeof *m->path);
        m->anc = calloc(L, sizeof *m->anc);
        m->pc_bits = calloc(m->n_words ? m->n_words : 1, sizeof *m->pc_bits);
        if (!m->cfg || !m->esc || !m->path || !m->anc || !m->pc_bits)
            goto oom;
        struct grammar *gm = (struct grammar *)g; /* the cache is the one mutable part, behind atomics */
        struct gmask_cache *c = atomic_load(&gm->cache);
        if (!c) {
            struct gmask_cache *fresh = cache_create(g, trie);
            if (!fresh)
                goto oom;
            struct gmask_cache *expected = NULL;
            if (atomic_compare_exchange_strong(&gm->cache, &expected, fresh)) {
                c = fresh;
            } else {
                gmask_cache_destroy(fresh);
                c = expected;
            }
        }
        if (c->trie != trie) { /* another vocabulary: a cache of our own */
            c = cache_create(g, trie);
            if (!c)
                goto oom;
            m->own_cache = true;
        }
        m->cache = c;
    }
    if (!m_grow((void **)&m->heads, &m->cap_heads, 64, sizeof *m->heads) ||
        !m_grow((void **)&m->frames, &m->cap_frames, 256, sizeof *m->frames))
        goto oom;
    matcher_start(m);
    if (m->oom)
        goto oom;
    return m;
oom:
    err_set(err, ERR_NOMEM, "out of memory creating a grammar matcher");
    grammar_matcher_destroy(m);
    return NULL;
}

void grammar_matcher_destroy(struct grammar_matcher *m)
{
    if (!m)
        return;
    if (m->own_cache)
        gmask_cache_destroy(m->cache);
    free(m->frames);
    free(m->heads);
    free(m->cfg);
    free(m->esc);
    free(m->path);
    free(m->anc);
    free(m->pc_bits);
    free(m->pc_unc);
    free(m->remap);
    free(m);
}

void grammar_matcher_reset(struct grammar_matcher *m)
{
    m->oom = false;
    matcher_start(m);
}

size_t grammar_matcher_cache_misses(const struct grammar_matcher *m) { return m->misses; }

bool grammar_matcher_can_end(const struct grammar_matcher *m) { return !m->done && (m->cur.flags & CFG_END); }

bool grammar_matcher_is_done(const struct grammar_matcher *m)
{
    return m->done || (m->cur.n == 0 && (m->cur.flags & CFG_END));
}

/* ---- accepting ---- */

/* Drops frames no head can reach (parents are older than children, so one pass in index order remaps). */
static int matcher_compact(struct grammar_matcher *m)
{
    if (!m_grow((void **)&m->remap, &m->cap_remap, m->n_frames, sizeof *m->remap))
        return ERR_NOMEM;
    memset(m->remap, 0xff, m->n_frames * sizeof *m->remap);
    for (uint32_t i = 0; i < m->cur.n; i++)
        for (uint32_t f = m->heads[i].parent; f < FRAME_BASE && m->remap[f] == GNONE; f = m->frames[f].parent)
            m->remap[f] = 0; /* reachable */
    uint32_t n = 0;
    for (size_t i = 0; i < m->n_frames; i++) {
        if (m->remap[i] == GNONE)
            continue;
        struct gframe f = m->frames[i];
        if (f.parent < FRAME_BASE)
            f.parent = m->remap[f.parent];
        m->remap[i] = n;
        m->frames[n++] = f;
    }
    for (uint32_t i = 0; i < m->cur.n; i++)
        if (m->heads[i].parent < FRAME_BASE)
            m->heads[i].parent = m->remap[m->heads[i].parent];
    m->n_frames = n;
    m->cur.frames_end = n;
    m->frames_live = n;
    return 0;
}

static int matcher_advance(struct grammar_matcher *m, const uint8_t *b, size_t n)
{
    if (m->done)
        return ERR_INVALID_ARG;
    struct gcfg c = m->cur, next;
    m->walk_flags = 0;
    for (size_t i = 0; i < n; i++) {
        walk_step(m, c, b[i], &next);
        if (m->oom) {
            walk_restore(m);
            m->oom = false;
            return ERR_NOMEM;
        }
        if (!next.n && !(i + 1 == n && (next.flags & CFG_END))) {
            walk_restore(m);
            return ERR_INVALID_ARG;
        }
        c = next;
    }
    memmove(m->heads, m->heads + c.off, c.n * sizeof *m->heads);
    m->n_heads = c.n;
    c.off = 0;
    c.frames_end = (uint32_t)m->n_frames;
    m->cur = c;
    if (m->n_frames > 2 * m->frames_live + 4096 && matcher_compact(m))
        return ERR_NOMEM;
    return 0;
}

int grammar_matcher_accept_bytes(struct grammar_matcher *m, const void *bytes, size_t n)
{
    return matcher_advance(m, bytes, n);
}

int grammar_matcher_accept(struct grammar_matcher *m, int32_t token)
{
    if (!m->trie || token < 0 || token >= m->trie->n_vocab || m->done)
        return ERR_INVALID_ARG;
    if (token_trie_is_eog(m->trie, token)) {
        if (!(m->cur.flags & CFG_END))
            return ERR_INVALID_ARG;
        m->done = true;
        return 0;
    }
    uint32_t len;
    const char *p = token_trie_piece(m->trie, token, &len);
    if (!len)
        return ERR_INVALID_ARG; /* control and unknown tokens */
    return matcher_advance(m, (const uint8_t *)p, len);
}

/* ---- masks ---- */

static void mask_begin(const struct grammar_matcher *m, uint32_t *bits)
{
    memset(bits, 0, m->n_words * sizeof *bits);
    if (!m->done && (m->cur.flags & CFG_END))
        for (int k = 0; k < m->trie->n_eog; k++)
            bits[m->trie->eog[k] >> 5] |= 1u << (m->trie->eog[k] & 31);
}

int grammar_matcher_mask_exact(struct grammar_matcher *m, uint32_t *bits)
{
    if (!m->trie)
        return ERR_INVALID_ARG;
    mask_begin(m, bits);
    if (m->done || !m->cur.n)
        return 0;
    m->cfg[0] = m->cur;
    walk_nodes(m, 1, m->trie->n_nodes, WALK_FULL, bits);
    walk_restore(m);
    if (m->oom) {
        m->oom = false;
        return ERR_NOMEM;
    }
    return 0;
}

/* Walks the context-dependent subtrees of an entry with the real head h. */
static void mask_uncertain(struct grammar_matcher *m, struct ghead h, const uint32_t *unc, uint32_t n_unc, uint32_t *bits)
{
    const struct token_trie *t = m->trie;
    walk_root_cfg(m, h);
    uint32_t valid = 0; /* cfg[0..valid] hold the configurations along path[1..valid] */
    for (uint32_t u = 0; u < n_unc && !m->oom; u++) {
        uint32_t v = unc[u];
        uint32_t dv = t->nodes[v].depth;
        for (uint32_t x = t->nodes[v].parent, d = dv - 1; d >= 1; x = t->nodes[x].parent, d--)
            m->anc[d] = x;
        uint32_t k = valid < dv - 1 ? valid : dv - 1;
        while (k > 0 && m->path[k] != m->anc[k])
            k--;
        bool dead = false;
        for (uint32_t d = 1; d <= k; d++)
            if (!m->cfg[d].n) {
                dead = true;
                break;
            }
        for (uint32_t d = k + 1; d < dv && !dead; d++) {
            struct gcfg *prev = &m->cfg[d - 1];
            m->n_heads = prev->off + prev->n;
            m->n_frames = prev->frames_end;
            walk_step(m, *prev, t->nodes[m->anc[d]].byte, &m->cfg[d]);
            m->path[d] = m->anc[d];
            k = d;
            if (!m->cfg[d].n)
                dead = true;
        }
        valid = k;
        if (dead)
            continue;
        walk_nodes(m, v, t->nodes[v].skip, WALK_FULL, bits);
    }
    walk_restore(m);
}

int grammar_matcher_mask(struct grammar_matcher *m, uint32_t *bits)
{
    if (!m->trie)
        return ERR_INVALID_ARG;
    mask_begin(m, bits);
    if (m->done || !m->cur.n)
        return 0;
    /* every head's entry first: any unusable one sends the whole mask down the exact walk */
    for (uint32_t i = 0; i < m->cur.n; i++) {
        struct ghead h = m->heads[i];
        bool temp;
        struct gmask_entry *e = entry_get(m, h.state, &temp);
        if (!e) {
            m->oom = false;
            return ERR_NOMEM;
        }
        bool usable = e->kind != ENTRY_FALLBACK && h.depth + e->max_depth <= GRAMMAR_MAX_DEPTH;
        if (temp)
            free(e);
        if (!usable)
            return grammar_matcher_mask_exact(m, bits);
    }
    for (uint32_t i = 0; i < m->cur.n; i++) {
        struct ghead h = m->heads[i];
        bool temp;
        struct gmask_entry *e = entry_get(m, h.state, &temp);
        if (!e) {
            m->oom = false;
            return ERR_NOMEM;
        }
        uint32_t acc_words;
        if (e->kind == ENTRY_LIST) {
            for (uint32_t k = 0; k < e->n_acc; k++)
                bits[e->data[k] >> 5] |= 1u << (e->data[k] & 31);
            acc_words = e->n_acc;
        } else {
            for (uint32_t w = 0; w < m->n_words; w++)
                bits[w] |= e->data[w];
            acc_words = m->n_words;
        }
        if (e->n_unc)
            mask_uncertain(m, h, e->data + acc_words, e->n_unc, bits);
        if (temp)
            free(e);
        if (m->oom) {
            m->oom = false;
            return ERR_NOMEM;
        }
    }
    return 0;
}
