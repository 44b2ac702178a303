/*
 * pretok: the pre-tokenizers of byte-level BPE vocabularies: the rules that cut text into words before BPE
 * merges run inside each word. tokenizer.ggml.pre names a rule set; each set is the list of regexes
 * llama.cpp applies (each regex further splits the pieces the previous one produced: a match becomes a
 * piece, and so does the unmatched text between matches).
 *
 * No regex engine: every regex is a hand-written matcher with the same leftmost-first, greedy-with-
 * backtracking semantics as the std::regex / custom code llama.cpp runs, over the same character view:
 * llama.cpp runs its regexes on a "collapsed" text where every non-ASCII codepoint is replaced by one byte
 * standing for its category (so \p{P}/\p{S} see only ASCII punctuation the way its tables list it, e.g. '~'
 * is in neither), on codepoints for regexes without \p{..}, and on Unicode flags for its two custom
 * splitters (GPT-2 and Llama 3). Matching that view, not textbook Unicode regex semantics, is what makes the
 * token ids identical.
 */
#ifndef WAFER_ENGINE_PRETOK_H
#define WAFER_ENGINE_PRETOK_H

#include <stddef.h>
#include <stdint.h>

enum pretok_type {
    PRETOK_DEFAULT,        /* no/unknown pre: punctuation runs, GPT-2, digit runs, 3-digit groups */
    PRETOK_GPT2,           /* GPT-2's regex */
    PRETOK_LLAMA3,         /* Llama 3: case-insensitive contractions, \p{N}{1,3}, newline handling */
    PRETOK_QWEN2,          /* Llama 3's regex with single digits */
    PRETOK_DEEPSEEK_LLM,
    PRETOK_DEEPSEEK_CODER,
    PRETOK_DEEPSEEK3,
    PRETOK_FALCON,
    PRETOK_STARCODER,      /* single digits, then GPT-2 */
    PRETOK_PORO,           /* bloom, gpt3-finnish, poro */
    PRETOK_VIKING,
    PRETOK_TEKKEN,
    PRETOK_CHAMELEON,
};

/* Per-name tokenizer defaults llama.cpp ties to the pre-tokenizer name. */
#define PRETOK_F_IGNORE_MERGES 0x1 /* a word that is itself a token skips BPE */
#define PRETOK_F_ADD_BOS 0x2       /* add BOS by default */
#define PRETOK_F_NO_BOS 0x4        /* the vocab has no BOS token (chatglm) */

struct pretok_name {
    const char *name;
    enum pretok_type type;
    unsigned flags;
};

/* The entry for a tokenizer.ggml.pre value (len bytes, not NUL-terminated), or NULL when unsupported. */
const struct pretok_name *pretok_lookup(const char *name, size_t len);

/* Writes the supported names, comma separated, into buf (always NUL-terminated). */
void pretok_names(char *buf, size_t cap);

/* Splits cps[0..n) into words. On success returns 0 and *lens (caller frees) holds *n_words word lengths in
 * codepoints, summing to n. ERR_NOMEM on allocation failure. */
int pretok_split(enum pretok_type type, const uint32_t *cps, size_t n, size_t **lens, size_t *n_words);

#endif
