/*
 * grammar: constrained decoding. A grammar (llama.cpp's GBNF, or a JSON Schema compiled to one) becomes a
 * byte-level pushdown automaton; a matcher follows one sequence's output through it and says, before each
 * sampling step, which tokens of the vocabulary may come next (a bitmask), so the constrained output can
 * never leave the language.
 *
 * Pieces and who owns them:
 *   struct grammar        compiled once per grammar or schema; immutable (its per-state token-mask cache fills
 *                         lazily with atomics), so any number of matchers on any threads share it.
 *   struct token_trie     the vocabulary's detokenized byte strings in a trie, built once per model,
 *                         immutable, shared read-only.
 *   struct grammar_matcher one per sequence (not thread-safe itself): the automaton's state after the tokens
 *                         accepted so far.
 *
 * Design (grammar_impl.h has the details): every rule becomes a DFA over bytes whose edges also call other
 * rules (non-recursive rules are inlined first, so most of a JSON grammar is one DFA); the matcher's state is
 * a small set of persistent stacks of DFA states. A mask ORs, for each stack top, a cached set of tokens that
 * the top's rule accepts whatever the context (computed once per DFA state with one pruned walk of the token
 * trie), then walks only the few trie subtrees whose outcome depends on the rest of the stack (tokens that
 * run past the end of the rule). EOS (and the other end-of-generation tokens) is allowed exactly where the
 * grammar may end; other special tokens never.
 *
 * Limits that keep every step bounded: rule nesting GRAMMAR_MAX_DEPTH frames, GRAMMAR_MAX_STACKS parallel
 * stacks, and caps on the compiled size (DFA states, repetition counts) that turn a huge grammar into an
 * error instead of a slow server.
 */
#ifndef WAFER_ENGINE_GRAMMAR_H
#define WAFER_ENGINE_GRAMMAR_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

struct tokenizer;
struct grammar;
struct token_trie;
struct grammar_matcher;

#define GRAMMAR_MAX_DEPTH 1024 /* nested rule frames on one stack; deeper paths are refused */
#define GRAMMAR_MAX_STACKS 256 /* parallel stacks of an ambiguous grammar; more are dropped (stricter) */

/* ---- compiling ---- */

/* Compilers return 0 and the grammar in *out (caller frees with grammar_destroy), or a negative code with
 * *out NULL and a sentence in err (ERR_MSG_MAX bytes): ERR_INVALID_ARG for a malformed or unsatisfiable
 * grammar or schema, or one past the size caps; ERR_UNSUPPORTED for a schema keyword or value outside the
 * supported subset; ERR_FORMAT for a schema that is not JSON; ERR_NOMEM. (An int and an out pointer rather
 * than a NULL constructor, because the server answers these 400 and out-of-memory 503.) */

/* GBNF text (llama.cpp's grammar format: `name ::= ...` rules, `|`, sequences, groups, `*` `+` `?` `{m}`
 * `{m,}` `{m,n}` `{,n}`, "literals", [classes] with ranges and ^ negation, `.`, escapes \n \r \t \\ \" \[ \]
 * \xHH \uHHHH \UHHHHHHHH, # comments); the start rule is `root`. Classes and `.` match Unicode code points
 * as UTF-8. Errors say "line L, column C: what is wrong" (1-based, columns in bytes). */
int grammar_compile_gbnf(const char *text, size_t len, struct grammar **out, char *err);

/* JSON Schema compile flags. */
enum {
    GRAMMAR_SCHEMA_STRICT = 1u << 0,  /* OpenAI strict: every property required, additionalProperties false */
    GRAMMAR_SCHEMA_COMPACT = 1u << 1, /* no whitespace between JSON tokens (default: none or one bounded run:
                                         a space, or a newline and at most 32 spaces/tabs) */
};

/* Compiles a JSON Schema (a JSON text) to a grammar of the JSON documents it accepts. Supported: type
 * (object, array, string, number, integer, boolean, null, and arrays of them), properties, required,
 * additionalProperties (false, true or a schema), items, prefixItems, minItems, maxItems, enum, const,
 * anyOf, oneOf, $ref to "#" or a JSON pointer inside the document ($defs, definitions; recursion allowed),
 * string format (date, time, date-time, uuid, email), pattern, minLength, maxLength, integer minimum,
 * maximum, exclusiveMinimum, exclusiveMaximum (exact), and the annotations (title, description, $schema,
 * $id, $comment, default, examples, deprecated, readOnly, writeOnly). Anything else is an error naming the
 * keyword and its JSON pointer (fail closed: never unconstrained output). See json_schema.c for the exact
 * generation choices (property order as declared; when properties are given and additionalProperties is
 * absent no other keys are generated; numbers have bounded digit counts). */
int grammar_compile_schema(const char *json, size_t len, unsigned flags, struct grammar **out, char *err);

/* The GBNF text grammar_compile_schema compiles, in *gbnf (NUL-terminated; caller frees with free()), for
 * debugging and tests. Codes as grammar_compile_schema. */
int grammar_schema_to_gbnf(const char *json, size_t len, unsigned flags, char **gbnf, char *err);

/* OpenAI's json_object mode: any JSON object. Flags as for schemas (STRICT has no effect). */
int grammar_compile_json_object(unsigned flags, struct grammar **out, char *err);

void grammar_destroy(struct grammar *g);

/* Number of DFA states (all rules) of a compiled grammar: a size for logs and benchmarks. */
size_t grammar_n_states(const struct grammar *g);

/* ---- the vocabulary ---- */

/* Builds the trie of every token's bytes (tokenizer_token_to_piece without special rendering). Control and
 * unknown tokens never match the grammar; end-of-generation tokens (tokenizer_is_eog) are allowed where the
 * grammar may end. NULL with err on failure (ERR_NOMEM). Caller frees with token_trie_destroy. */
struct token_trie *token_trie_create(const struct tokenizer *t, char *err);

/* The same from explicit pieces (tests, fuzzing): token i is pieces[i] (lens[i] bytes); an empty piece
 * never matches; eog[0..n_eog) are the end tokens. */
struct token_trie *token_trie_create_from_pieces(const char *const *pieces, const uint32_t *lens, int32_t n_vocab,
                                                 const int32_t *eog, int n_eog, char *err);
void token_trie_destroy(struct token_trie *t);
int32_t token_trie_n_vocab(const struct token_trie *t);
/* Bytes of token id (NULL for an id out of range); *len set. Owned by the trie. */
const char *token_trie_piece(const struct token_trie *t, int32_t id, uint32_t *len);
/* Whether id ends generation (an EOS/EOG token). */
bool token_trie_is_eog(const struct token_trie *t, int32_t id);

/* ---- matching ---- */

/* A matcher at the start of g. trie may be NULL for byte-only use (grammar_matcher_accept_bytes; masks and
 * token accepts then fail with ERR_INVALID_ARG). g and trie must outlive the matcher. NULL on OOM (err).
 * Caller frees with grammar_matcher_destroy. Allocation: buffers sized at creation grow geometrically and
 * are kept, so steady-state steps allocate nothing (the shared mask cache allocates once per DFA state). */
struct grammar_matcher *grammar_matcher_create(const struct grammar *g, const struct token_trie *trie, char *err);
void grammar_matcher_destroy(struct grammar_matcher *m);

/* Back to the start of the grammar (the shared mask cache is kept). */
void grammar_matcher_reset(struct grammar_matcher *m);

/* Writes the allowed next tokens: bit (id % 32) of bitmask[id / 32] is set iff token id may come next;
 * bitmask has (n_vocab + 31) / 32 words, bits past n_vocab are cleared. After the grammar has ended (EOS
 * accepted) nothing is allowed. 0, or ERR_INVALID_ARG without a trie, ERR_NOMEM. Deterministic. */
int grammar_matcher_mask(struct grammar_matcher *m, uint32_t *bitmask);

/* Advances by one token. 0 when the grammar allows it (an end token ends the grammar: is_done becomes
 * true); ERR_INVALID_ARG when it does not (the state is unchanged), ERR_NOMEM. */
int grammar_matcher_accept(struct grammar_matcher *m, int32_t token);

/* Advances by raw bytes (no tokens). 0, or ERR_INVALID_ARG when some byte is not allowed (the state is
 * unchanged), ERR_NOMEM. */
int grammar_matcher_accept_bytes(struct grammar_matcher *m, const void *bytes, size_t n);

/* Whether the bytes so far form a complete sentence of the grammar (an end token would be accepted). */
bool grammar_matcher_can_end(const struct grammar_matcher *m);

/* Whether generation must stop here: an end token was accepted, or the grammar is complete and allows no
 * further byte. */
bool grammar_matcher_is_done(const struct grammar_matcher *m);

/* Cache entries this matcher has computed so far (each is one pruned trie walk, the cold cost of a mask):
 * for benchmarks and logs. */
size_t grammar_matcher_cache_misses(const struct grammar_matcher *m);

/* ---- validation ---- */

/* Validates the JSON text instance against the JSON Schema schema, for the subset grammar_compile_schema
 * supports (with JSON Schema's own semantics: e.g. additional properties are allowed unless forbidden, oneOf
 * means exactly one). 0 when valid; ERR_INVALID_ARG with the first violation and its JSON pointer in err
 * (ERR_MSG_MAX bytes); ERR_UNSUPPORTED for a schema keyword outside the subset; ERR_FORMAT when the schema
 * or the instance is not JSON. Duplicate object keys in the instance are a violation. */
int json_schema_validate(const char *schema, size_t schema_len, const char *instance, size_t instance_len,
                         char *err);

#endif
