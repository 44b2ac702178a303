/*
 * grammar_compile: AST (gbnf.c) -> struct grammar, a set of byte DFAs whose states may call rules.
 *
 *  1. Rules in a reference cycle (recursive) stay rules; every other rule of at most GRAMMAR_INLINE_MAX NFA
 *     states is inlined where it is used, so a JSON grammar without recursion becomes mostly one DFA and its
 *     masks rarely depend on the stack (see matcher.c). When the copies make the grammar pass a size cap
 *     (thousands of properties each with its own whitespace and number), it is rebuilt inlining only rules
 *     used once.
 *  2. Each remaining rule reachable from root: Thompson NFA (code point classes become UTF-8 byte-range
 *     sequences, RE2's split), then subset construction over bytes and call symbols. Byte edges are
 *     deterministic per state; several calls from one state are the pushdown part's nondeterminism.
 *  3. Bytes that no edge tells apart share a class; transitions live in one dense [state][class] table.
 *  4. Productive rules and live states (those from which the rule can still end) by fixpoint; edges into
 *     dead states and calls to unproductive rules are removed, so any prefix the matcher accepts can be
 *     completed. A grammar whose root cannot end is an error.
 *  5. The expansion graph (a state to each callee's start, and past a callee that can match "") must be
 *     acyclic, else a rule reaches itself without consuming a byte (left recursion) and expansion would
 *     never end: an error naming the rule.
 *  6. A call whose return state has nothing left to do is marked a tail call (pushes nothing), so right
 *     recursion and repetition do not grow the stack.
 */
#include "engine/grammar/grammar_impl.h"

#include "core/err.h"

#include <stdlib.h>
#include <string.h>

enum { NFA_EPS, NFA_BYTE, NFA_CALL };

struct nfa_edge {
    uint32_t from, to, rule; /* rule: compiled rule id for NFA_CALL */
    uint8_t kind, lo, hi;
};

struct dfa_range {
    uint32_t state, target;
    uint8_t lo, hi;
};

struct dfa_call {
    uint32_t state, rule, target;
};

struct gbuild {
    const struct gast *a;
    char *err;
    int rc;
    /* rules */
    uint8_t *recursive; /* [gast rules] */
    uint64_t *size;     /* [gast rules] NFA size estimate of the body with inlining, 0 = not computed */
    uint8_t *inl;       /* [gast rules] inlined at every use */
    uint32_t *crule;    /* [gast rules] compiled rule id or GNONE */
    uint32_t *crule_src; /* [compiled] gast rule */
    uint32_t n_crules;
    uint32_t **adj;     /* [gast rules] rules referenced by each (with repeats) */
    size_t *adj_n;
    bool single_use;    /* inline only rules referenced once (the retry for grammars past the caps) */
    bool too_large;     /* a size cap was hit */
    /* NFA of the rule being compiled */
    struct nfa_edge *ne;
    size_t n_ne, cap_ne;
    uint32_t n_nfa;
    uint32_t *nfa_off;         /* CSR by from */
    struct nfa_edge *nfa_sorted;
    /* global DFA under construction */
    uint32_t n_states, cap_states;
    uint8_t *accept;
    uint32_t *state_rule;
    struct dfa_range *ranges;
    size_t n_ranges, cap_ranges;
    struct dfa_call *calls;
    size_t n_calls, cap_calls;
};

static bool gb_grow(void **p, size_t *cap, size_t need, size_t elem)
{
    if (need <= *cap)
        return true;
    size_t c = *cap ? *cap : 64;
    while (c < need)
        c *= 2;
    void *q = realloc(*p, c * elem);
    if (!q)
        return false;
    *p = q;
    *cap = c;
    return true;
}

static int gb_oom(struct gbuild *b)
{
    if (!b->rc)
        b->rc = err_set(b->err, ERR_NOMEM, "out of memory compiling the grammar");
    return b->rc;
}

static int gb_fail_rule(struct gbuild *b, uint32_t gast_rule, const char *what)
{
    if (b->rc)
        return b->rc;
    const struct gast_rule *r = &b->a->rules[gast_rule];
    b->rc = err_set(b->err, ERR_INVALID_ARG, "grammar: line %u, column %u: rule '%s' %s", r->line, r->col, r->name, what);
    return b->rc;
}

/* ---- 1. recursion and inlining ---- */

/* Rules referenced from node (appended to out, duplicates allowed). */
static int gb_refs(const struct gast *a, uint32_t node, uint32_t **out, size_t *n, size_t *cap)
{
    /* explicit stack: bodies can be deep */
    uint32_t *stack = NULL;
    size_t sn = 0, scap = 0;
    int rc = 0;
    if (!gb_grow((void **)&stack, &scap, 1, sizeof *stack))
        return ERR_NOMEM;
    stack[sn++] = node;
    while (sn) {
        const struct gast_node *x = &a->nodes[stack[--sn]];
        switch (x->kind) {
        case GAST_REF:
            if (!gb_grow((void **)out, cap, *n + 1, sizeof **out)) {
                rc = ERR_NOMEM;
                goto done;
            }
            (*out)[(*n)++] = x->a;
            break;
        case GAST_SEQ:
        case GAST_ALT:
            if (!gb_grow((void **)&stack, &scap, sn + x->b, sizeof *stack)) {
                rc = ERR_NOMEM;
                goto done;
            }
            for (uint32_t i = 0; i < x->b; i++)
                stack[sn++] = a->kids[x->a + i];
            break;
        case GAST_REP:
            stack[sn++] = x->a;
            break;
        default:
            break;
        }
    }
done:
    free(stack);
    return rc;
}

/* Marks rules that lie on a reference cycle (Tarjan's SCC, iterative). */
static int gb_find_recursion(struct gbuild *b)
{
    const struct gast *a = b->a;
    size_t nr = a->n_rules;
    int rc = ERR_NOMEM;
    uint32_t **adj = b->adj = calloc(nr, sizeof *adj);
    size_t *adj_n = b->adj_n = calloc(nr, sizeof *adj_n);
    uint32_t *index = malloc(nr * sizeof *index), *low = malloc(nr * sizeof *low);
    uint8_t *on = calloc(nr, 1);
    uint32_t *st = malloc(nr * sizeof *st), *cs = malloc(nr * sizeof *cs), *ci = malloc(nr * sizeof *ci);
    if (!adj || !adj_n || !index || !low || !on || !st || !cs || !ci)
        goto done;
    for (size_t r = 0; r < nr; r++) {
        size_t cap = 0;
        if (gb_refs(a, a->rules[r].body, &adj[r], &adj_n[r], &cap))
            goto done;
        for (size_t i = 0; i < adj_n[r]; i++)
            if (adj[r][i] == r)
                b->recursive[r] = 1;
        index[r] = GNONE;
    }
    uint32_t counter = 0;
    size_t sp = 0;
    for (uint32_t root = 0; root < nr; root++) {
        if (index[root] != GNONE)
            continue;
        size_t csp = 0;
        cs[csp] = root, ci[csp] = 0, csp++;
        index[root] = low[root] = counter++;
        st[sp++] = root, on[root] = 1;
        while (csp) {
            uint32_t v = cs[csp - 1];
            if (ci[csp - 1] < adj_n[v]) {
                uint32_t w = adj[v][ci[csp - 1]++];
                if (index[w] == GNONE) {
                    index[w] = low[w] = counter++;
                    st[sp++] = w, on[w] = 1;
                    cs[csp] = w, ci[csp] = 0, csp++;
                } else if (on[w] && index[w] < low[v]) {
                    low[v] = index[w];
                }
                continue;
            }
            if (low[v] == index[v]) {
                size_t start = sp;
                while (st[start - 1] != v)
                    start--;
                start--;
                bool cyc = sp - start > 1;
                for (size_t i = start; i < sp; i++) {
                    on[st[i]] = 0;
                    if (cyc)
                        b->recursive[st[i]] = 1;
                }
                sp = start;
            }
            csp--;
            if (csp) {
                uint32_t u = cs[csp - 1];
                if (low[v] < low[u])
                    low[u] = low[v];
            }
        }
    }
    rc = 0;
done:
    free(index);
    free(low);
    free(on);
    free(st);
    free(cs);
    free(ci);
    return rc ? gb_oom(b) : 0;
}

static uint64_t gb_sat(uint64_t x) { return x > (1ull << 40) ? (1ull << 40) : x; }
/* NFA states node will take, counting inlined rules by their (already computed) size: an estimate for the
 * inlining threshold and the caps. */
static uint64_t gb_node_size(const struct gbuild *b, uint32_t node, int depth)
{
    const struct gast_node *x = &b->a->nodes[node];
    if (depth > 10000)
        return 1ull << 40;
    switch (x->kind) {
    case GAST_EMPTY: return 1;
    case GAST_LIT: return (uint64_t)x->b + 1;
    case GAST_CLASS: {
        /* one end state, plus the inner states of multi-byte UTF-8 sequences (a generous bound per range) */
        uint64_t n = 2;
        for (uint32_t i = 0; i < x->b; i++) {
            uint32_t hi = b->a->ranges[x->a + 2 * i + 1];
            n += hi < 0x80 ? 0 : hi < 0x800 ? 2 : hi < 0x10000 ? 8 : 14;
        }
        return n;
    }
    case GAST_REF: return b->inl[x->a] ? b->size[x->a] + 1 : 2;
    case GAST_SEQ:
    case GAST_ALT: {
        uint64_t s = 2;
        for (uint32_t i = 0; i < x->b; i++)
            s = gb_sat(s + gb_node_size(b, b->a->kids[x->a + i], depth + 1) + 1);
        return s;
    }
    case GAST_REP: {
        uint64_t copies = x->c == GAST_INF ? (uint64_t)x->b + 1 : x->c;
        if (!copies)
            copies = 1;
        return gb_sat(copies * (gb_node_size(b, x->a, depth + 1) + 1) + 2);
    }
    }
    return 1;
}

/* Decides inlining: non-recursive rules, callees before callers (Kahn's order over the reference DAG of
 * non-recursive rules), each inlined when its size with its own inlined callees is at most
 * GRAMMAR_INLINE_MAX (and, in single_use mode, when it is referenced once, so nothing is copied). */
static int gb_plan_inlining(struct gbuild *b, uint32_t root)
{
    size_t nr = b->a->n_rules;
    uint32_t *pending = calloc(nr, sizeof *pending); /* distinct non-recursive callees not yet sized */
    uint32_t *queue = malloc(nr * sizeof *queue);
    uint32_t **callers = calloc(nr, sizeof *callers);
    size_t *n_callers = calloc(nr, sizeof *n_callers), *cap_callers = calloc(nr, sizeof *cap_callers);
    uint8_t *mark = calloc(nr, 1);
    uint32_t *uses = calloc(nr, sizeof *uses);
    int rc = ERR_NOMEM;
    if (!pending || !queue || !callers || !n_callers || !cap_callers || !mark || !uses)
        goto done;
    for (uint32_t r = 0; r < nr; r++)
        for (size_t i = 0; i < b->adj_n[r]; i++)
            uses[b->adj[r][i]]++;
    for (uint32_t r = 0; r < nr; r++) {
        if (b->recursive[r])
            continue;
        for (size_t i = 0; i < b->adj_n[r]; i++) {
            uint32_t x = b->adj[r][i];
            if (b->recursive[x] || mark[x])
                continue;
            mark[x] = 1;
            pending[r]++;
            if (!gb_grow((void **)&callers[x], &cap_callers[x], n_callers[x] + 1, sizeof **callers))
                goto done;
            callers[x][n_callers[x]++] = r;
        }
        for (size_t i = 0; i < b->adj_n[r]; i++)
            mark[b->adj[r][i]] = 0;
    }
    size_t qh = 0, qt = 0;
    for (uint32_t r = 0; r < nr; r++)
        if (!b->recursive[r] && !pending[r])
            queue[qt++] = r;
    while (qh < qt) {
        uint32_t r = queue[qh++];
        uint64_t s = gb_node_size(b, b->a->rules[r].body, 0);
        b->size[r] = s;
        b->inl[r] = r != root && s <= GRAMMAR_INLINE_MAX && (!b->single_use || uses[r] == 1);
        for (size_t i = 0; i < n_callers[r]; i++)
            if (--pending[callers[r][i]] == 0)
                queue[qt++] = callers[r][i];
    }
    rc = 0;
done:
    if (callers)
        for (size_t r = 0; r < nr; r++)
            free(callers[r]);
    free(callers);
    free(n_callers);
    free(cap_callers);
    free(pending);
    free(queue);
    free(mark);
    free(uses);
    return rc ? gb_oom(b) : 0;
}

/* ---- 2. NFA ---- */

static uint32_t nfa_new(struct gbuild *b)
{
    if (b->n_nfa >= GRAMMAR_MAX_NFA) {
        b->too_large = true;
        if (!b->rc)
            b->rc = err_set(b->err, ERR_INVALID_ARG, "grammar too large: a rule needs more than %u automaton states "
                            "(reduce repetition counts or split the rule)", GRAMMAR_MAX_NFA);
        return GNONE;
    }
    return b->n_nfa++;
}

static void nfa_edge_add(struct gbuild *b, uint32_t from, uint32_t to, uint8_t kind, uint8_t lo, uint8_t hi,
                         uint32_t rule)
{
    if (b->rc)
        return;
    if (!gb_grow((void **)&b->ne, &b->cap_ne, b->n_ne + 1, sizeof *b->ne)) {
        gb_oom(b);
        return;
    }
    b->ne[b->n_ne++] = (struct nfa_edge){from, to, rule, kind, lo, hi};
}

static void utf8_encode(uint32_t c, uint8_t *o, int *n)
{
    if (c < 0x80) {
        o[0] = (uint8_t)c, *n = 1;
    } else if (c < 0x800) {
        o[0] = (uint8_t)(0xc0 | (c >> 6)), o[1] = (uint8_t)(0x80 | (c & 0x3f)), *n = 2;
    } else if (c < 0x10000) {
        o[0] = (uint8_t)(0xe0 | (c >> 12)), o[1] = (uint8_t)(0x80 | ((c >> 6) & 0x3f));
        o[2] = (uint8_t)(0x80 | (c & 0x3f)), *n = 3;
    } else {
        o[0] = (uint8_t)(0xf0 | (c >> 18)), o[1] = (uint8_t)(0x80 | ((c >> 12) & 0x3f));
        o[2] = (uint8_t)(0x80 | ((c >> 6) & 0x3f)), o[3] = (uint8_t)(0x80 | (c & 0x3f)), *n = 4;
    }
}

/* Adds byte-range paths from -> end for the code points lo..hi (no surrogates inside), split so that each
 * path is a sequence of byte ranges (RE2's UTF-8 range splitting). */
static void nfa_utf8_range(struct gbuild *b, uint32_t lo, uint32_t hi, uint32_t from, uint32_t end)
{
    static const uint32_t max_len[3] = {0x7f, 0x7ff, 0xffff};
    if (b->rc)
        return;
    for (int i = 0; i < 3; i++) {
        if (lo <= max_len[i] && hi > max_len[i]) {
            nfa_utf8_range(b, lo, max_len[i], from, end);
            nfa_utf8_range(b, max_len[i] + 1, hi, from, end);
            return;
        }
    }
    if (hi >= 0x80) {
        int n = hi < 0x800 ? 2 : hi < 0x10000 ? 3 : 4;
        for (int i = 1; i < n; i++) {
            uint32_t m = (1u << (6 * i)) - 1;
            if ((lo & ~m) != (hi & ~m)) {
                if ((lo & m) != 0) {
                    nfa_utf8_range(b, lo, lo | m, from, end);
                    nfa_utf8_range(b, (lo | m) + 1, hi, from, end);
                    return;
                }
                if ((hi & m) != m) {
                    nfa_utf8_range(b, lo, (hi & ~m) - 1, from, end);
                    nfa_utf8_range(b, hi & ~m, hi, from, end);
                    return;
                }
            }
        }
    }
    uint8_t x[4], y[4];
    int nx, ny;
    utf8_encode(lo, x, &nx);
    utf8_encode(hi, y, &ny);
    uint32_t cur = from;
    for (int k = 0; k < nx; k++) {
        uint32_t nxt = k == nx - 1 ? end : nfa_new(b);
        if (nxt == GNONE)
            return;
        nfa_edge_add(b, cur, nxt, NFA_BYTE, x[k], y[k], 0);
        cur = nxt;
    }
}

/* Builds node starting at from; returns the state where it ends (GNONE on error). */
static uint32_t nfa_build(struct gbuild *b, uint32_t node, uint32_t from, int depth)
{
    const struct gast *a = b->a;
    const struct gast_node *x = &a->nodes[node];
    if (b->rc)
        return GNONE;
    if (depth > 2000) {
        b->rc = err_set(b->err, ERR_INVALID_ARG, "grammar too deeply nested (more than 2000 levels of groups and inlined rules)");
        return GNONE;
    }
    switch (x->kind) {
    case GAST_EMPTY:
        return from;
    case GAST_LIT: {
        uint32_t cur = from;
        for (uint32_t i = 0; i < x->b; i++) {
            uint32_t nxt = nfa_new(b);
            if (nxt == GNONE)
                return GNONE;
            uint8_t c = a->bytes[x->a + i];
            nfa_edge_add(b, cur, nxt, NFA_BYTE, c, c, 0);
            cur = nxt;
        }
        return cur;
    }
    case GAST_CLASS: {
        uint32_t end = nfa_new(b);
        if (end == GNONE)
            return GNONE;
        for (uint32_t i = 0; i < x->b; i++)
            nfa_utf8_range(b, a->ranges[x->a + 2 * i], a->ranges[x->a + 2 * i + 1], from, end);
        return b->rc ? GNONE : end;
    }
    case GAST_REF: {
        if (b->inl[x->a])
            return nfa_build(b, a->rules[x->a].body, from, depth + 1);
        uint32_t end = nfa_new(b);
        if (end == GNONE)
            return GNONE;
        nfa_edge_add(b, from, end, NFA_CALL, 0, 0, b->crule[x->a]);
        return end;
    }
    case GAST_SEQ: {
        uint32_t cur = from;
        for (uint32_t i = 0; i < x->b && cur != GNONE; i++)
            cur = nfa_build(b, a->kids[x->a + i], cur, depth + 1);
        return cur;
    }
    case GAST_ALT: {
        uint32_t end = nfa_new(b);
        if (end == GNONE)
            return GNONE;
        for (uint32_t i = 0; i < x->b; i++) {
            uint32_t s = nfa_new(b);
            if (s == GNONE)
                return GNONE;
            nfa_edge_add(b, from, s, NFA_EPS, 0, 0, 0);
            uint32_t e = nfa_build(b, a->kids[x->a + i], s, depth + 1);
            if (e == GNONE)
                return GNONE;
            nfa_edge_add(b, e, end, NFA_EPS, 0, 0, 0);
        }
        return end;
    }
    case GAST_REP: {
        uint32_t cur = from;
        for (uint32_t i = 0; i < x->b && cur != GNONE; i++) {
            uint32_t s = nfa_new(b);
            if (s == GNONE)
                return GNONE;
            nfa_edge_add(b, cur, s, NFA_EPS, 0, 0, 0);
            cur = nfa_build(b, x->a, s, depth + 1);
        }
        if (cur == GNONE)
            return GNONE;
        if (x->c == GAST_INF) {
            /* loop state: fresh, so nothing built before it can re-enter the loop */
            uint32_t s = nfa_new(b);
            if (s == GNONE)
                return GNONE;
            nfa_edge_add(b, cur, s, NFA_EPS, 0, 0, 0);
            uint32_t e = nfa_build(b, x->a, s, depth + 1);
            if (e == GNONE)
                return GNONE;
            nfa_edge_add(b, e, s, NFA_EPS, 0, 0, 0);
            uint32_t out = nfa_new(b);
            if (out == GNONE)
                return GNONE;
            nfa_edge_add(b, s, out, NFA_EPS, 0, 0, 0);
            return out;
        }
        uint32_t end = nfa_new(b);
        if (end == GNONE)
            return GNONE;
        for (uint32_t i = x->b; i < x->c && cur != GNONE; i++) {
            nfa_edge_add(b, cur, end, NFA_EPS, 0, 0, 0);
            uint32_t s = nfa_new(b);
            if (s == GNONE)
                return GNONE;
            nfa_edge_add(b, cur, s, NFA_EPS, 0, 0, 0);
            cur = nfa_build(b, x->a, s, depth + 1);
        }
        if (cur == GNONE)
            return GNONE;
        nfa_edge_add(b, cur, end, NFA_EPS, 0, 0, 0);
        return end;
    }
    }
    return GNONE;
}

/* Sorts edges by source into CSR (counting sort keeps it linear and stable). */
static int nfa_index(struct gbuild *b)
{
    free(b->nfa_off);
    free(b->nfa_sorted);
    b->nfa_off = calloc((size_t)b->n_nfa + 1, sizeof *b->nfa_off);
    b->nfa_sorted = malloc((b->n_ne ? b->n_ne : 1) * sizeof *b->nfa_sorted);
    if (!b->nfa_off || !b->nfa_sorted)
        return gb_oom(b);
    for (size_t i = 0; i < b->n_ne; i++)
        b->nfa_off[b->ne[i].from + 1]++;
    for (uint32_t i = 0; i < b->n_nfa; i++)
        b->nfa_off[i + 1] += b->nfa_off[i];
    uint32_t *fill = malloc(((size_t)b->n_nfa + 1) * sizeof *fill);
    if (!fill)
        return gb_oom(b);
    memcpy(fill, b->nfa_off, ((size_t)b->n_nfa + 1) * sizeof *fill);
    for (size_t i = 0; i < b->n_ne; i++)
        b->nfa_sorted[fill[b->ne[i].from]++] = b->ne[i];
    free(fill);
    return 0;
}

/* ---- 2b. subset construction ---- */

struct dset_table {
    uint32_t *pool;     /* sets, concatenated */
    size_t n_pool, cap_pool;
    uint32_t *set_off;  /* [n_sets + 1] */
    size_t n_sets, cap_sets;
    uint32_t *slots;    /* hash -> set id + 1 */
    size_t n_slots;
};

static uint32_t dset_hash(const uint32_t *s, size_t n)
{
    uint32_t h = 2166136261u;
    for (size_t i = 0; i < n; i++) {
        h ^= s[i];
        h *= 16777619u;
        h ^= h >> 15;
    }
    return h;
}

static int u32_cmp(const void *x, const void *y)
{
    uint32_t a = *(const uint32_t *)x, b = *(const uint32_t *)y;
    return a < b ? -1 : a > b;
}

/* Interns the sorted set s[0..n); *id its index; *fresh whether it is new. 0 or ERR_NOMEM. */
static int dset_intern(struct dset_table *t, const uint32_t *s, size_t n, uint32_t *id, bool *fresh)
{
    if ((t->n_sets + 1) * 2 > t->n_slots) {
        size_t ns = t->n_slots ? t->n_slots * 2 : 1024;
        uint32_t *slots = calloc(ns, sizeof *slots);
        if (!slots)
            return ERR_NOMEM;
        for (size_t i = 0; i < t->n_sets; i++) {
            uint32_t h = dset_hash(t->pool + t->set_off[i], t->set_off[i + 1] - t->set_off[i]);
            size_t k = h & (ns - 1);
            while (slots[k])
                k = (k + 1) & (ns - 1);
            slots[k] = (uint32_t)i + 1;
        }
        free(t->slots);
        t->slots = slots;
        t->n_slots = ns;
    }
    uint32_t h = dset_hash(s, n);
    size_t k = h & (t->n_slots - 1);
    while (t->slots[k]) {
        uint32_t i = t->slots[k] - 1;
        size_t m = t->set_off[i + 1] - t->set_off[i];
        if (m == n && !memcmp(t->pool + t->set_off[i], s, n * sizeof *s)) {
            *id = i;
            *fresh = false;
            return 0;
        }
        k = (k + 1) & (t->n_slots - 1);
    }
    if (!gb_grow((void **)&t->pool, &t->cap_pool, t->n_pool + n, sizeof *t->pool) ||
        !gb_grow((void **)&t->set_off, &t->cap_sets, t->n_sets + 2, sizeof *t->set_off))
        return ERR_NOMEM;
    if (t->n_sets == 0)
        t->set_off[0] = 0;
    memcpy(t->pool + t->n_pool, s, n * sizeof *s);
    t->n_pool += n;
    t->set_off[t->n_sets + 1] = (uint32_t)t->n_pool;
    t->slots[k] = (uint32_t)t->n_sets + 1;
    *id = (uint32_t)t->n_sets++;
    *fresh = true;
    return 0;
}

static void dset_free(struct dset_table *t)
{
    free(t->pool);
    free(t->set_off);
    free(t->slots);
    memset(t, 0, sizeof *t);
}

struct closure_ws {
    uint32_t *mark; /* [n_nfa] generation stamps */
    uint32_t gen;
    uint32_t *stack, *out;
    size_t cap;
};

/* Epsilon closure of seeds[0..n) into ws->out (sorted); returns its size. */
static size_t nfa_closure(const struct gbuild *b, struct closure_ws *ws, const uint32_t *seeds, size_t n)
{
    ws->gen++;
    size_t sp = 0, on = 0;
    for (size_t i = 0; i < n; i++) {
        if (ws->mark[seeds[i]] != ws->gen) {
            ws->mark[seeds[i]] = ws->gen;
            ws->stack[sp++] = seeds[i];
        }
    }
    while (sp) {
        uint32_t s = ws->stack[--sp];
        ws->out[on++] = s;
        for (uint32_t e = b->nfa_off[s]; e < b->nfa_off[s + 1]; e++) {
            const struct nfa_edge *x = &b->nfa_sorted[e];
            if (x->kind == NFA_EPS && ws->mark[x->to] != ws->gen) {
                ws->mark[x->to] = ws->gen;
                ws->stack[sp++] = x->to;
            }
        }
    }
    qsort(ws->out, on, sizeof *ws->out, u32_cmp);
    return on;
}

static int gb_state_add(struct gbuild *b, uint32_t rule, bool accept)
{
    if (b->n_states >= GRAMMAR_MAX_DFA) {
        b->too_large = true;
        if (!b->rc)
            b->rc = err_set(b->err, ERR_INVALID_ARG, "grammar too large: more than %u automaton states (reduce "
                            "repetition counts, maxLength or the number of alternatives)", GRAMMAR_MAX_DFA);
        return b->rc;
    }
    size_t cap = b->cap_states;
    if (!gb_grow((void **)&b->accept, &cap, b->n_states + 1, 1))
        return gb_oom(b);
    cap = b->cap_states;
    if (!gb_grow((void **)&b->state_rule, &cap, b->n_states + 1, sizeof *b->state_rule))
        return gb_oom(b);
    b->cap_states = (uint32_t)cap;
    b->accept[b->n_states] = accept;
    b->state_rule[b->n_states] = rule;
    b->n_states++;
    return 0;
}

struct seg_edge {
    uint32_t to;
    uint8_t lo, hi;
};

/* Compiles rule cr (its NFA is built and indexed, start 0, final fin) into DFA states from b->n_states. */
static int gb_determinize(struct gbuild *b, uint32_t cr, uint32_t fin)
{
    struct dset_table t = {0};
    struct closure_ws ws = {0};
    struct seg_edge *se = NULL;
    uint32_t *seeds = NULL, *pts = NULL;
    size_t cap_pts = 0;
    struct dfa_call *pc = NULL;
    size_t cap_se = 0, cap_seeds = 0, cap_pc = 0;
    int rc = 0;
    uint32_t base = b->n_states;
    ws.mark = calloc(b->n_nfa, sizeof *ws.mark);
    ws.stack = malloc((size_t)b->n_nfa * sizeof *ws.stack);
    ws.out = malloc((size_t)b->n_nfa * sizeof *ws.out);
    if (!ws.mark || !ws.stack || !ws.out)
        goto oom;
    uint32_t zero = 0, id;
    bool fresh;
    size_t n = nfa_closure(b, &ws, &zero, 1);
    if (dset_intern(&t, ws.out, n, &id, &fresh))
        goto oom;
    for (uint32_t d = 0; d < t.n_sets; d++) {
        const uint32_t *set = t.pool + t.set_off[d];
        size_t sn = t.set_off[d + 1] - t.set_off[d];
        bool acc = false;
        size_t nse = 0, npc = 0;
        for (size_t i = 0; i < sn; i++) {
            uint32_t s = set[i];
            if (s == fin)
                acc = true;
            for (uint32_t e = b->nfa_off[s]; e < b->nfa_off[s + 1]; e++) {
                const struct nfa_edge *x = &b->nfa_sorted[e];
                if (x->kind == NFA_BYTE) {
                    if (!gb_grow((void **)&se, &cap_se, nse + 1, sizeof *se))
                        goto oom;
                    se[nse++] = (struct seg_edge){x->to, x->lo, x->hi};
                } else if (x->kind == NFA_CALL) {
                    if (!gb_grow((void **)&pc, &cap_pc, npc + 1, sizeof *pc))
                        goto oom;
                    pc[npc++] = (struct dfa_call){0, x->rule, x->to};
                }
            }
        }
        if ((rc = gb_state_add(b, cr, acc)))
            goto done;
        /* byte segments between the sorted cut points (0, every lo and hi + 1, 256): linear in the edges */
        if (!gb_grow((void **)&pts, &cap_pts, 2 * nse + 2, sizeof *pts))
            goto oom;
        size_t np = 0;
        pts[np++] = 0;
        pts[np++] = 256;
        for (size_t i = 0; i < nse; i++)
            pts[np++] = se[i].lo, pts[np++] = (uint32_t)se[i].hi + 1;
        qsort(pts, np, sizeof *pts, u32_cmp);
        size_t u = 0;
        for (size_t i = 0; i < np; i++)
            if (!u || pts[u - 1] != pts[i])
                pts[u++] = pts[i];
        uint32_t prev_target = GNONE;
        int run_lo = 0;
        for (size_t k = 0; k + 1 < u; k++) {
            int seg_lo = (int)pts[k];
            size_t ns = 0;
            for (size_t i = 0; i < nse; i++) {
                if (se[i].lo <= seg_lo && se[i].hi >= seg_lo) {
                    if (!gb_grow((void **)&seeds, &cap_seeds, ns + 1, sizeof *seeds))
                        goto oom;
                    seeds[ns++] = se[i].to;
                }
            }
            uint32_t target = GNONE;
            if (ns) {
                size_t cn = nfa_closure(b, &ws, seeds, ns);
                if (dset_intern(&t, ws.out, cn, &id, &fresh))
                    goto oom;
                target = base + id;
            }
            /* merge with the previous segment when the target is the same */
            if (target != prev_target) {
                if (prev_target != GNONE) {
                    if (!gb_grow((void **)&b->ranges, &b->cap_ranges, b->n_ranges + 1, sizeof *b->ranges))
                        goto oom;
                    b->ranges[b->n_ranges++] = (struct dfa_range){base + d, prev_target, (uint8_t)run_lo, (uint8_t)(seg_lo - 1)};
                }
                prev_target = target;
                run_lo = seg_lo;
            }
        }
        if (prev_target != GNONE) {
            if (!gb_grow((void **)&b->ranges, &b->cap_ranges, b->n_ranges + 1, sizeof *b->ranges))
                goto oom;
            b->ranges[b->n_ranges++] = (struct dfa_range){base + d, prev_target, (uint8_t)run_lo, 255};
        }
        /* calls: group by callee */
        for (size_t i = 0; i < npc; i++) {
            if (pc[i].rule == GNONE)
                continue;
            uint32_t callee = pc[i].rule;
            size_t ns = 0;
            for (size_t j = i; j < npc; j++) {
                if (pc[j].rule == callee) {
                    if (!gb_grow((void **)&seeds, &cap_seeds, ns + 1, sizeof *seeds))
                        goto oom;
                    seeds[ns++] = pc[j].target;
                    pc[j].rule = GNONE;
                }
            }
            size_t cn = nfa_closure(b, &ws, seeds, ns);
            if (dset_intern(&t, ws.out, cn, &id, &fresh))
                goto oom;
            if (!gb_grow((void **)&b->calls, &b->cap_calls, b->n_calls + 1, sizeof *b->calls))
                goto oom;
            b->calls[b->n_calls++] = (struct dfa_call){base + d, callee, base + id};
        }
        if (base + t.n_sets > GRAMMAR_MAX_DFA || t.n_pool > (64u << 20)) {
            b->too_large = true;
            rc = err_set(b->err, ERR_INVALID_ARG, "grammar too large: more than %u automaton states (reduce "
                         "repetition counts, maxLength or the number of alternatives)", GRAMMAR_MAX_DFA);
            goto done;
        }
    }
    goto done;
oom:
    rc = gb_oom(b);
done:
    dset_free(&t);
    free(ws.mark);
    free(ws.stack);
    free(ws.out);
    free(se);
    free(seeds);
    free(pts);
    free(pc);
    if (rc && !b->rc)
        b->rc = rc;
    return rc;
}

/* ---- 4.-6. analysis on the assembled grammar ---- */

static bool gr_has_bytes(const struct grammar *g, uint32_t s)
{
    const uint32_t *row = g->next + (size_t)s * g->n_classes;
    for (uint32_t c = 0; c < g->n_classes; c++)
        if (row[c] != GNONE)
            return true;
    return false;
}

/* Which states can still reach an accepting state of their rule, by one backward propagation: through
 * byte edges when with_bytes, and through a call edge once its callee is known to end (its start state
 * found) and its return state is. Rules' start states found = rules that can end: with bytes, productive
 * rules; without, nullable ones (rule_ok[r]). Calls waiting on a callee are parked on it and released when
 * it is found, so the whole fixpoint is linear in states and edges. 0 or ERR_NOMEM. */
static int gr_reach(const struct grammar *g, bool with_bytes, uint8_t *reach, uint8_t *rule_ok)
{
    uint32_t n = g->n_states;
    uint32_t *rev_off = calloc((size_t)n + 1, sizeof *rev_off), *queue = malloc(((size_t)n + 1) * sizeof *queue);
    uint32_t *park_off = calloc((size_t)g->n_rules + 1, sizeof *park_off), *park = NULL, *rev = NULL, *fill = NULL;
    int rc = ERR_NOMEM;
    if (!rev_off || !queue || !park_off)
        goto done;
    /* reverse edges into each state: pairs (source, call index or GNONE for a byte edge) */
    size_t n_rev = 0;
    for (uint32_t s = 0; s < n; s++) {
        const uint32_t *row = g->next + (size_t)s * g->n_classes;
        for (uint32_t c = 0; with_bytes && c < g->n_classes; c++)
            if (row[c] != GNONE && (c == 0 || row[c - 1] != row[c]))
                rev_off[row[c] + 1]++, n_rev++;
        for (uint32_t k = 0; k < g->states[s].n_calls; k++) {
            const struct gcall *cl = &g->calls[g->states[s].call_off + k];
            rev_off[cl->target + 1]++, n_rev++;
            park_off[g->states[cl->start].rule + 1]++;
        }
    }
    for (uint32_t s = 0; s < n; s++)
        rev_off[s + 1] += rev_off[s];
    for (uint32_t r = 0; r < g->n_rules; r++)
        park_off[r + 1] += park_off[r];
    rev = malloc((n_rev ? n_rev : 1) * 2 * sizeof *rev);
    park = malloc(((size_t)park_off[g->n_rules] ? park_off[g->n_rules] : 1) * sizeof *park);
    fill = malloc(((size_t)n + 1) * sizeof *fill);
    if (!rev || !park || !fill)
        goto done;
    memcpy(fill, rev_off, ((size_t)n + 1) * sizeof *fill);
    for (uint32_t s = 0; s < n; s++) {
        const uint32_t *row = g->next + (size_t)s * g->n_classes;
        for (uint32_t c = 0; with_bytes && c < g->n_classes; c++)
            if (row[c] != GNONE && (c == 0 || row[c - 1] != row[c])) {
                uint32_t k = fill[row[c]]++;
                rev[2 * k] = s, rev[2 * k + 1] = GNONE;
            }
        for (uint32_t k = 0; k < g->states[s].n_calls; k++) {
            uint32_t ci = g->states[s].call_off + k;
            uint32_t j = fill[g->calls[ci].target]++;
            rev[2 * j] = s, rev[2 * j + 1] = ci;
        }
    }
    uint32_t *park_n = calloc(g->n_rules ? g->n_rules : 1, sizeof *park_n);
    if (!park_n)
        goto done;
    memset(reach, 0, n);
    memset(rule_ok, 0, g->n_rules);
    size_t qh = 0, qt = 0;
    for (uint32_t s = 0; s < n; s++)
        if (g->states[s].accept)
            reach[s] = 1, queue[qt++] = s;
    while (qh < qt) {
        uint32_t t = queue[qh++];
        uint32_t r = g->states[t].rule;
        if (t == g->rule_start[r] && !rule_ok[r]) {
            /* the rule can end: release the calls parked on it (their return states already reach) */
            rule_ok[r] = 1;
            for (uint32_t k = 0; k < park_n[r]; k++) {
                uint32_t src = park[park_off[r] + k];
                if (!reach[src])
                    reach[src] = 1, queue[qt++] = src;
            }
        }
        for (uint32_t k = rev_off[t]; k < rev_off[t + 1]; k++) {
            uint32_t src = rev[2 * k], ci = rev[2 * k + 1];
            if (reach[src])
                continue;
            if (ci != GNONE) {
                uint32_t callee = g->states[g->calls[ci].start].rule;
                if (!rule_ok[callee]) {
                    park[park_off[callee] + park_n[callee]++] = src;
                    continue;
                }
            }
            reach[src] = 1;
            queue[qt++] = src;
        }
    }
    free(park_n);
    rc = 0;
done:
    free(rev_off);
    free(queue);
    free(park_off);
    free(park);
    free(rev);
    free(fill);
    return rc;
}

/* Live states and productive rules, then pruning of edges into dead states and calls into rules that never
 * end. 0, ERR_NOMEM. */
static int gr_prune(struct grammar *g, uint8_t *live)
{
    uint8_t *prod = malloc(g->n_rules ? g->n_rules : 1);
    if (!prod || gr_reach(g, true, live, prod)) {
        free(prod);
        return ERR_NOMEM;
    }
    for (uint32_t s = 0; s < g->n_states; s++) {
        uint32_t *row = g->next + (size_t)s * g->n_classes;
        for (uint32_t c = 0; c < g->n_classes; c++)
            if (row[c] != GNONE && !live[row[c]])
                row[c] = GNONE;
        struct gstate *st = &g->states[s];
        uint32_t o = 0;
        for (uint32_t k = 0; k < st->n_calls; k++) {
            struct gcall cl = g->calls[st->call_off + k];
            if (live[cl.target] && prod[g->states[cl.start].rule])
                g->calls[st->call_off + o++] = cl;
        }
        st->n_calls = (uint16_t)o;
    }
    free(prod);
    return 0;
}

/* Rules that can match "" (after pruning): reachability through calls alone. */
static int gr_nullable(const struct grammar *g, uint8_t *nullable)
{
    uint8_t *reach = malloc(g->n_states ? g->n_states : 1);
    if (!reach)
        return ERR_NOMEM;
    int rc = gr_reach(g, false, reach, nullable);
    free(reach);
    return rc;
}

/* A cycle in the expansion graph (state -> callee start; state -> call target past a nullable callee):
 * returns a state on it, or GNONE. */
static uint32_t gr_expansion_cycle(const struct grammar *g, const uint8_t *nullable, const uint8_t *live, int *rc)
{
    uint8_t *color = calloc(g->n_states, 1); /* 0 new, 1 on the DFS path, 2 done */
    uint32_t *st = malloc((size_t)g->n_states * sizeof *st), *it = malloc((size_t)g->n_states * sizeof *it);
    uint32_t found = GNONE;
    *rc = 0;
    if (!color || !st || !it) {
        *rc = ERR_NOMEM;
        goto done;
    }
    for (uint32_t root = 0; root < g->n_states && found == GNONE; root++) {
        if (color[root] || !live[root])
            continue;
        size_t sp = 0;
        st[sp] = root, it[sp] = 0, sp++;
        color[root] = 1;
        while (sp && found == GNONE) {
            uint32_t s = st[sp - 1];
            uint32_t k = it[sp - 1];
            /* successors: 2 per call (start, and target if the callee is nullable) */
            if (k >= 2u * g->states[s].n_calls) {
                color[s] = 2;
                sp--;
                continue;
            }
            it[sp - 1]++;
            const struct gcall *cl = &g->calls[g->states[s].call_off + k / 2];
            uint32_t t;
            if (k % 2 == 0)
                t = cl->start;
            else if (nullable[g->states[cl->start].rule])
                t = cl->target;
            else
                continue;
            if (color[t] == 1) {
                found = t;
            } else if (!color[t]) {
                color[t] = 1;
                st[sp] = t, it[sp] = 0, sp++;
            }
        }
    }
done:
    free(color);
    free(st);
    free(it);
    return found;
}

static int gb_finish(struct gbuild *b, struct grammar *g)
{
    /* byte classes */
    uint8_t cut[257] = {0};
    for (size_t i = 0; i < b->n_ranges; i++)
        cut[b->ranges[i].lo] = 1, cut[b->ranges[i].hi + 1] = 1;
    uint32_t cls = 0;
    for (int c = 0; c < 256; c++) {
        if (c > 0 && cut[c])
            cls++;
        g->byte_class[c] = (uint8_t)cls;
    }
    g->n_classes = cls + 1;
    g->n_states = b->n_states;
    size_t table = (size_t)g->n_states * g->n_classes * sizeof *g->next;
    if (table > GRAMMAR_MAX_TABLE && (b->too_large = true))
        return err_set(b->err, ERR_INVALID_ARG, "grammar too large: its transition table would take %zu MiB "
                       "(the limit is %u MiB)", table >> 20, GRAMMAR_MAX_TABLE >> 20);
    g->next = malloc(table ? table : 1);
    g->states = calloc(g->n_states ? g->n_states : 1, sizeof *g->states);
    g->calls = malloc((b->n_calls ? b->n_calls : 1) * sizeof *g->calls);
    if (!g->next || !g->states || !g->calls)
        return gb_oom(b);
    memset(g->next, 0xff, table);
    for (size_t i = 0; i < b->n_ranges; i++) {
        const struct dfa_range *r = &b->ranges[i];
        for (uint32_t c = g->byte_class[r->lo]; c <= g->byte_class[r->hi]; c++)
            g->next[(size_t)r->state * g->n_classes + c] = r->target;
    }
    for (uint32_t s = 0; s < g->n_states; s++) {
        g->states[s].accept = b->accept[s];
        g->states[s].rule = b->state_rule[s];
    }
    /* calls were appended state by state, in state order */
    g->n_calls = (uint32_t)b->n_calls;
    for (size_t i = 0; i < b->n_calls; i++) {
        const struct dfa_call *c = &b->calls[i];
        struct gstate *st = &g->states[c->state];
        if (!st->n_calls)
            st->call_off = (uint32_t)i;
        if (st->n_calls == UINT16_MAX)
            return err_set(b->err, ERR_INVALID_ARG, "grammar too large: a state calls more than 65535 rules");
        st->n_calls++;
        g->calls[i] = (struct gcall){g->rule_start[c->rule], c->target};
    }
    int rc = 0;
    uint8_t *live = malloc(g->n_states ? g->n_states : 1);
    uint8_t *nullable = malloc(g->n_rules ? g->n_rules : 1);
    if (!live || !nullable || gr_prune(g, live) || gr_nullable(g, nullable)) {
        rc = gb_oom(b);
        goto done;
    }
    if (!live[g->root]) {
        rc = err_set(b->err, ERR_INVALID_ARG, "grammar matches no string: rule 'root' can never be completed "
                     "(every path goes through a rule that never ends)");
        goto done;
    }
    uint32_t cyc = gr_expansion_cycle(g, nullable, live, &rc);
    if (rc) {
        rc = gb_oom(b);
        goto done;
    }
    if (cyc != GNONE) {
        rc = gb_fail_rule(b, b->crule_src[g->states[cyc].rule],
                          "is left-recursive: it can reach itself again without matching any character");
        goto done;
    }
    for (uint32_t s = 0; s < g->n_states; s++)
        g->states[s].has_bytes = gr_has_bytes(g, s);
    /* tail calls */
    for (uint32_t i = 0; i < g->n_calls; i++) {
        uint32_t t = g->calls[i].target;
        if (t != GNONE && g->states[t].accept && !g->states[t].has_bytes && !g->states[t].n_calls)
            g->calls[i].target = GNONE;
    }
done:
    free(live);
    free(nullable);
    return rc;
}

void grammar_destroy(struct grammar *g)
{
    if (!g)
        return;
    gmask_cache_destroy(atomic_load(&g->cache));
    if (g->rule_names)
        for (uint32_t i = 0; i < g->n_rules; i++)
            free(g->rule_names[i]);
    free(g->rule_names);
    free(g->rule_start);
    free(g->next);
    free(g->states);
    free(g->calls);
    free(g);
}

size_t grammar_n_states(const struct grammar *g) { return g->n_states; }

static int gb_build(const struct gast *a, uint32_t root, bool single_use, bool *too_large, struct grammar **out,
                    char *err)
{
    struct gbuild b = {.a = a, .err = err, .single_use = single_use};
    struct grammar *g = NULL;
    uint32_t *work = NULL;
    size_t nr = a->n_rules;
    *out = NULL;
    b.recursive = calloc(nr, 1);
    b.size = calloc(nr, sizeof *b.size);
    b.inl = calloc(nr, 1);
    b.crule = malloc(nr * sizeof *b.crule);
    b.crule_src = malloc(nr * sizeof *b.crule_src);
    work = malloc(nr * sizeof *work);
    g = calloc(1, sizeof *g);
    if (!b.recursive || !b.size || !b.inl || !b.crule || !b.crule_src || !work || !g) {
        gb_oom(&b);
        goto fail;
    }
    if (gb_find_recursion(&b) || gb_plan_inlining(&b, root))
        goto fail;
    for (size_t r = 0; r < nr; r++)
        b.crule[r] = GNONE;
    /* compiled rules: root and every non-inlined rule referenced from a compiled one */
    size_t wn = 0;
    b.crule[root] = b.n_crules;
    b.crule_src[b.n_crules++] = root;
    work[wn++] = root;
    /* walk references through inlined rules (each expanded once: its references are then known) */
    uint8_t *expanded = calloc(nr, 1);
    uint32_t *refs = NULL;
    size_t n_refs = 0, cap_refs = 0;
    if (!expanded) {
        gb_oom(&b);
        goto fail;
    }
    while (wn) {
        uint32_t r = work[--wn];
        n_refs = 0;
        for (size_t i = 0; i < b.adj_n[r]; i++) {
            if (!gb_grow((void **)&refs, &cap_refs, n_refs + 1, sizeof *refs)) {
                free(refs);
                free(expanded);
                gb_oom(&b);
                goto fail;
            }
            refs[n_refs++] = b.adj[r][i];
        }
        for (size_t i = 0; i < n_refs; i++) {
            uint32_t x = refs[i];
            if (b.inl[x]) {
                if (expanded[x])
                    continue;
                expanded[x] = 1;
                for (size_t j = 0; j < b.adj_n[x]; j++) {
                    if (!gb_grow((void **)&refs, &cap_refs, n_refs + 1, sizeof *refs)) {
                        free(refs);
                        free(expanded);
                        gb_oom(&b);
                        goto fail;
                    }
                    refs[n_refs++] = b.adj[x][j];
                }
                continue;
            }
            if (b.crule[x] == GNONE) {
                b.crule[x] = b.n_crules;
                b.crule_src[b.n_crules++] = x;
                work[wn++] = x;
            }
        }
    }
    free(refs);
    free(expanded);
    g->n_rules = b.n_crules;
    g->rule_start = malloc(b.n_crules * sizeof *g->rule_start);
    g->rule_names = calloc(b.n_crules, sizeof *g->rule_names);
    if (!g->rule_start || !g->rule_names) {
        gb_oom(&b);
        goto fail;
    }
    for (uint32_t cr = 0; cr < b.n_crules; cr++) {
        g->rule_names[cr] = strdup(a->rules[b.crule_src[cr]].name);
        if (!g->rule_names[cr]) {
            gb_oom(&b);
            goto fail;
        }
    }
    for (uint32_t cr = 0; cr < b.n_crules; cr++) {
        uint32_t r = b.crule_src[cr];
        uint64_t est = gb_node_size(&b, a->rules[r].body, 0);
        if (est > GRAMMAR_MAX_NFA) {
            b.too_large = true;
            gb_fail_rule(&b, r, "is too large: it needs more than 2097152 automaton states (reduce repetition "
                                "counts or maxLength)");
            goto fail;
        }
        b.n_nfa = 0;
        b.n_ne = 0;
        uint32_t start = nfa_new(&b);
        (void)start;
        uint32_t fin = nfa_build(&b, a->rules[r].body, 0, 0);
        if (fin == GNONE || nfa_index(&b))
            goto fail;
        g->rule_start[cr] = b.n_states;
        if (gb_determinize(&b, cr, fin))
            goto fail;
    }
    g->root = g->rule_start[0];
    int frc = gb_finish(&b, g);
    if (frc) {
        if (!b.rc)
            b.rc = frc;
        goto fail;
    }
    *out = g;
    g = NULL;
fail:
    grammar_destroy(g);
    free(work);
    free(b.recursive);
    free(b.size);
    free(b.inl);
    free(b.crule);
    free(b.crule_src);
    free(b.ne);
    free(b.nfa_off);
    free(b.nfa_sorted);
    free(b.accept);
    free(b.state_rule);
    free(b.ranges);
    free(b.calls);
    if (b.adj)
        for (size_t r = 0; r < nr; r++)
            free(b.adj[r]);
    free(b.adj);
    free(b.adj_n);
    *too_large = b.too_large;
    if (*out)
        return 0;
    return b.rc ? b.rc : ERR_INTERNAL;
}

int grammar_build(const struct gast *a, uint32_t root, struct grammar **out, char *err)
{
    bool too_large;
    int rc = gb_build(a, root, false, &too_large, out, err);
    if (rc && too_large) /* copies of shared rules made it too big: call them instead (slower masks) */
        rc = gb_build(a, root, true, &too_large, out, err);
    return rc;
}

int grammar_compile_gbnf(const char *text, size_t len, struct grammar **out, char *err)
{
    struct gast a = {0};
    uint32_t root;
    *out = NULL;
    int rc = gbnf_parse(text, len, &a, &root, err);
    if (!rc)
        rc = grammar_build(&a, root, out, err);
    gast_free(&a);
    return rc;
}
