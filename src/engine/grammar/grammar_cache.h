/*
 * grammar_cache: compiled grammars shared across requests. Compiling a schema costs milliseconds and its
 * per-state mask cache (inside the grammar) fills over the first requests, so a repeated schema or grammar
 * must find the same compiled grammar again. The cache is keyed by (kind, flags, source text), bounded by a
 * count of entries, least recently used evicted first. An entry is reference-counted: a request holds one
 * reference for its whole life, so eviction never frees a grammar a sequence still matches against.
 *
 * A grammar_entry also keeps the schema the answer must satisfy (the original JSON Schema; {"type":"object"}
 * for json_object mode; none for GBNF), so whoever ends a constrained sequence can validate it.
 *
 * Thread-safe: one mutex around the map (compiling happens outside it; two threads compiling the same text
 * at once both compile, the first one inserted wins).
 */
#ifndef WAFER_ENGINE_GRAMMAR_CACHE_H
#define WAFER_ENGINE_GRAMMAR_CACHE_H

#include <stddef.h>

struct grammar;
struct grammar_cache;
struct grammar_entry;

enum grammar_kind {
    GRAMMAR_KIND_GBNF = 1,   /* text: GBNF */
    GRAMMAR_KIND_SCHEMA,     /* text: a JSON Schema; flags: GRAMMAR_SCHEMA_* */
    GRAMMAR_KIND_JSON_OBJECT /* text ignored: any JSON object */
};

/* A cache of at most max_entries grammars (>= 1). NULL on OOM. */
struct grammar_cache *grammar_cache_create(int max_entries);
/* Frees the cache's references; entries still held by requests live on until released. */
void grammar_cache_destroy(struct grammar_cache *c);

/* The compiled grammar for (kind, flags, text[0..len)), compiled on a miss. 0 and a new reference in *out
 * (release with grammar_entry_unref), or the compiler's code and message (see grammar.h: ERR_INVALID_ARG
 * with line:column or a JSON pointer, ERR_UNSUPPORTED naming the keyword, ERR_FORMAT, ERR_NOMEM). c may be
 * NULL: then nothing is cached. */
int grammar_cache_get(struct grammar_cache *c, enum grammar_kind kind, unsigned flags, const char *text, size_t len,
                      struct grammar_entry **out, char *err);

void grammar_entry_ref(struct grammar_entry *e);
void grammar_entry_unref(struct grammar_entry *e);
const struct grammar *grammar_entry_grammar(const struct grammar_entry *e);
/* The schema an answer must validate against (NUL-terminated), or NULL (GBNF: the grammar is the check). */
const char *grammar_entry_schema(const struct grammar_entry *e, size_t *len);

/* Hits and misses so far (for logs and tests). */
void grammar_cache_counts(struct grammar_cache *c, long *hits, long *misses);

#endif
