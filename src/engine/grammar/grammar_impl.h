/*
 * grammar_impl: the grammar module's internal layout, shared by its files. Not a public API: everything
 * outside src/engine/grammar/ goes through grammar.h.
 *
 * Pipeline:
 *   GBNF text --gbnf.c--> AST (struct gast: rules whose bodies are trees of literals, code point classes,
 *   rule references, sequences, alternations, repetitions)
 *   JSON Schema --json_schema.c (+ regex.c for `pattern`)--> GBNF text --> the same
 *   AST --grammar_compile.c--> struct grammar: non-recursive rules inlined, each remaining rule a DFA over
 *   bytes (Thompson NFA, subset construction; classes expanded to UTF-8 byte sequences) whose states may also
 *   call rules; dead states and unproductive calls pruned, so every accepted prefix can be completed.
 *   struct grammar + struct token_trie --matcher.c--> masks and accepts.
 */
#ifndef WAFER_ENGINE_GRAMMAR_IMPL_H
#define WAFER_ENGINE_GRAMMAR_IMPL_H

#include "engine/grammar/grammar.h"

#include <stdarg.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* ---- size caps (bad input becomes an error, never an unbounded compile) ---- */
#define GRAMMAR_MAX_TEXT (8u << 20)      /* GBNF text bytes */
#define GRAMMAR_MAX_REPEAT 10000u        /* m and n of {m,n} */
#define GRAMMAR_MAX_NFA (1u << 21)       /* NFA states of one rule after inlining and repetition */
#define GRAMMAR_MAX_DFA (1u << 18)       /* DFA states of the whole grammar */
#define GRAMMAR_MAX_TABLE (96u << 20)    /* bytes of the DFA transition table */
#define GRAMMAR_INLINE_MAX 4096u         /* inline a non-recursive rule of at most this many NFA states */

#define GNONE UINT32_MAX
#define GAST_INF UINT32_MAX

/* ---- text builder (GBNF emitted by the schema and regex compilers) ---- */
struct gtext {
    char *p; /* NUL-terminated while not oom */
    size_t n, cap;
    bool oom;
};
void gtext_put(struct gtext *t, const char *s, size_t n);
void gtext_puts(struct gtext *t, const char *s);
void gtext_printf(struct gtext *t, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
void gtext_free(struct gtext *t);
/* Appends s[0..n) as a GBNF string literal ("..." with \" \\ and control bytes escaped). */
void gtext_gbnf_literal(struct gtext *t, const char *s, size_t n);
/* Appends code point c as it must appear inside a GBNF [class] (escaped where needed). */
void gtext_gbnf_class_char(struct gtext *t, uint32_t c);

/* ---- AST ---- */
enum gast_kind {
    GAST_EMPTY, /* matches "" */
    GAST_LIT,   /* bytes a..a+b of gast.bytes */
    GAST_CLASS, /* code point ranges: pairs a..a+2b of gast.ranges, sorted, disjoint, no surrogates */
    GAST_REF,   /* rule a */
    GAST_SEQ,   /* kids a..a+b */
    GAST_ALT,   /* kids a..a+b */
    GAST_REP,   /* kid a repeated b..c times (c == GAST_INF: unbounded) */
};

struct gast_node {
    uint8_t kind;
    uint32_t a, b, c;
};

struct gast_rule {
    char *name;
    uint32_t body;       /* node, GNONE while only referenced */
    uint32_t line, col;  /* of its definition, else of its first reference */
};

struct gast {
    struct gast_node *nodes;
    size_t n_nodes, cap_nodes;
    uint8_t *bytes;
    size_t n_bytes, cap_bytes;
    uint32_t *ranges;
    size_t n_ranges, cap_ranges; /* counts uint32 values (2 per range) */
    uint32_t *kids;
    size_t n_kids, cap_kids;
    struct gast_rule *rules;
    size_t n_rules, cap_rules;
};

void gast_free(struct gast *a);

/* Parses GBNF into a (zeroed by the caller); *root the `root` rule. 0 or ERR_INVALID_ARG/ERR_NOMEM with
 * "line L, column C: ..." in err. */
int gbnf_parse(const char *text, size_t len, struct gast *a, uint32_t *root, char *err);

/* ---- compiled grammar ---- */
struct gstate {
    uint32_t call_off;  /* calls[call_off .. call_off + n_calls) */
    uint16_t n_calls;
    uint8_t accept;     /* the rule may end here (pop) */
    uint8_t has_bytes;  /* some byte edge leaves this state */
    uint32_t rule;      /* the compiled rule this state belongs to */
};

struct gcall {
    uint32_t start;  /* the callee's start state */
    uint32_t target; /* where the caller continues when the callee ends; GNONE: nothing is left to do
                        there (a final state without edges), so the call is a tail call and pushes nothing */
};

struct gmask_cache;

struct grammar {
    uint32_t n_states, n_classes, n_calls, n_rules;
    uint8_t byte_class[256];  /* byte -> equivalence class: bytes no edge tells apart share one */
    uint32_t *next;           /* [n_states][n_classes] target state or GNONE */
    struct gstate *states;    /* [n_states] */
    struct gcall *calls;      /* [n_calls] */
    uint32_t *rule_start;     /* [n_rules] */
    char **rule_names;        /* [n_rules] */
    uint32_t root;            /* start state of the root rule */
    _Atomic(struct gmask_cache *) cache; /* for the first trie a matcher used; see matcher.c */
};

/* Compiles the AST (root rule root) into *out. 0 or ERR_INVALID_ARG (left recursion, empty language, size
 * caps; messages name the rule and where it was defined) or ERR_NOMEM. */
int grammar_build(const struct gast *a, uint32_t root, struct grammar **out, char *err);

/* Frees a mask cache (grammar_destroy; matchers with a private one). */
void gmask_cache_destroy(struct gmask_cache *c);

/* The mask by a walk of the whole trie with the full stack, no cache: the reference the cached mask must
 * equal (tests), and the fallback near the depth limit. Same contract as grammar_matcher_mask. */
int grammar_matcher_mask_exact(struct grammar_matcher *m, uint32_t *bitmask);

static inline uint32_t grammar_next(const struct grammar *g, uint32_t state, uint8_t byte)
{
    return g->next[(size_t)state * g->n_classes + g->byte_class[byte]];
}

/* ---- token trie ---- */
#define TRIE_MAX_PIECE 1024 /* longer pieces never match (no real vocabulary has them) */

struct trie_node {
    uint8_t byte;     /* the edge into this node (root: 0) */
    uint8_t pad_;
    uint16_t depth;   /* root 0 */
    uint32_t skip;    /* first node after this node's subtree (preorder) */
    uint32_t parent;  /* root: GNONE */
    uint32_t tok;     /* tokens ending here: trie.toks[tok .. nodes[i + 1].tok) */
};

struct token_trie {
    int32_t n_vocab;
    uint32_t n_nodes;        /* nodes[n_nodes] is a sentinel holding the end of the token list */
    struct trie_node *nodes; /* preorder, children in byte order; node 0 is the root */
    int32_t *toks;
    uint32_t max_depth;
    char *piece_bytes;
    uint32_t *piece_off, *piece_len; /* [n_vocab] */
    uint32_t *eog_bits;              /* [(n_vocab + 31) / 32] */
    int32_t *eog;
    int n_eog;
};

/* ---- JSON Schema helpers shared by the compiler and the validator ---- */
/* The formats both sides support; NULL-terminated. */
extern const char *const json_schema_formats[];

/* Regex (ECMA-262 subset) to GBNF: appends to out one parenthesized GBNF expression (no rule references)
 * matching the strings the pattern matches (search semantics: without ^ / $ anything may come before / after). json_encoded: the expression
 * matches the JSON-encoded string body (between the quotes) instead of the raw UTF-8. 0, or
 * ERR_UNSUPPORTED / ERR_INVALID_ARG with the reason in err (back-references and lookaround are refused by
 * name), ERR_NOMEM. */
int regex_to_gbnf(const char *pattern, size_t len, bool json_encoded, struct gtext *out, char *err);

#endif
