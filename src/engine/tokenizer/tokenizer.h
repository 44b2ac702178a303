/*
 * tokenizer: text <-> token ids for llama-family GGUF vocabularies, matching llama.cpp token for token.
 *
 * Two vocabulary kinds (tokenizer.ggml.model):
 *   "llama" (SentencePiece BPE): a space prefix, spaces as U+2581, codepoints merged pairwise by score,
 *           byte tokens <0xNN> for what the vocabulary lacks;
 *   "gpt2"  (byte-level BPE): a pre-tokenizer chosen by tokenizer.ggml.pre cuts the text into words
 *           (pretok.h), each word's bytes are mapped to printable codepoints and merged by rank.
 * Special tokens (control, user-defined) are cut out of the text first, the way llama.cpp does it.
 *
 * Everything is built once by tokenizer_create (token hash map, merge ranks, the rendered piece of every
 * token) and then read-only, so one tokenizer serves any number of threads without locks.
 */
#ifndef WAFER_ENGINE_TOKENIZER_H
#define WAFER_ENGINE_TOKENIZER_H

#include "engine/gguf/gguf.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

struct tokenizer; /* opaque, immutable after create: safe to share between threads */

/* Builds from tokenizer.ggml.* metadata (model, tokens, scores, token_type, merges, pre, bos/eos/unknown/
 * padding/eot/eom ids, add_bos_token, add_eos_token, add_space_prefix). Works on vocab-only files and copies
 * what it needs, so g may be closed afterwards. Unsupported tokenizer.ggml.model or pre -> NULL with a
 * message (ERR_MSG_MAX bytes into err) listing the supported ones. Caller frees with tokenizer_destroy. */
struct tokenizer *tokenizer_create(const struct gguf *g, char *err);
void tokenizer_destroy(struct tokenizer *t);

int32_t tokenizer_n_vocab(const struct tokenizer *t);
int32_t tokenizer_bos(const struct tokenizer *t); /* -1 if none */
int32_t tokenizer_eos(const struct tokenizer *t); /* -1 if none */
/* Whether encoding with add_special prepends BOS. */
bool tokenizer_add_bos(const struct tokenizer *t);
/* Whether encoding with add_special appends EOS. */
bool tokenizer_add_eos(const struct tokenizer *t);
/* End of generation: eos, eot, eom and the end-of-turn tokens llama.cpp recognises by their text. False for
 * ids out of range. */
bool tokenizer_is_eog(const struct tokenizer *t, int32_t id);
/* True for control and unknown tokens (those token_to_piece hides unless render_special). */
bool tokenizer_is_control(const struct tokenizer *t, int32_t id);

/* Encodes len bytes of text. add_special: add BOS/EOS as the metadata says (llama.cpp's add_special).
 * parse_special: text of control/unknown special tokens (e.g. "<|im_start|>", "<s>") becomes that token;
 * otherwise it is plain text (user-defined tokens are always matched, as in llama.cpp). Writes at most cap
 * ids to out (out may be NULL when cap is 0) and returns the total number of ids (> cap means: call again
 * with a bigger buffer), or a negative ERR_* code (ERR_NOMEM, ERR_TOO_LARGE past INT_MAX ids). */
int tokenizer_encode(const struct tokenizer *t, const char *text, size_t len, bool add_special, bool parse_special,
                     int32_t *out, int cap);
/* tokenizer_encode into a buffer sized to fit, in one pass: *out gets the ids (malloc'd, never NULL on
 * success, even for 0 ids; the caller frees) and the return value their number; or a negative ERR_* code
 * (ERR_NOMEM, ERR_TOO_LARGE, ERR_INVALID_ARG for a NULL t or out, or NULL text with len > 0) with *out NULL.
 * The way to tokenize text of unknown length: no guessed buffer, no retry. */
int tokenizer_encode_alloc(const struct tokenizer *t, const char *text, size_t len, bool add_special,
                           bool parse_special, int32_t **out);

/* A byte range [off, off + len) of a text. */
struct tok_span {
    size_t off, len;
};

/* tokenizer_encode_alloc with special tokens parsed everywhere except where they overlap one of the plain
 * spans (sorted by offset, disjoint, inside the text): there markup tokens are text: control, unknown and
 * end-of-generation tokens (as with parse_special off), and also user-defined tokens that read like a tag
 * ("<start_of_turn>", "[TOOL]"), which llama.cpp would match even without parse_special. Other user-defined
 * tokens match as usual. For a chat prompt whose plain spans are the message contents, so that only the
 * template's own markup becomes special tokens. The spans do not cut the text into separately
 * tokenized pieces: without special-token text inside them, the ids equal tokenizer_encode_alloc's with
 * parse_special. Same returns; ERR_INVALID_ARG also for spans out of order or out of range. */
int tokenizer_encode_spans(const struct tokenizer *t, const char *text, size_t len, bool add_special,
                           const struct tok_span *plain, size_t n_plain, int32_t **out);

/* The bytes token id stands for (SPM: U+2581 -> space, <0xNN> byte tokens -> that byte; BPE: byte-level
 * mapping undone). Control and unknown tokens give their text only when render_special, else nothing.
 * Returns the piece length; when it exceeds cap nothing is written. ERR_INVALID_ARG for an id out of range.
 * Like llama.cpp's llama_token_to_piece with lstrip=0. */
int tokenizer_token_to_piece(const struct tokenizer *t, int32_t id, bool render_special, char *buf, int cap);

/* Raw vocabulary string of id (NUL-terminated, owned by t), or NULL when id is out of range. */
const char *tokenizer_token_text(const struct tokenizer *t, int32_t id);

/* Streaming detokenizer state: embed it and zero-initialise it. */
struct detok_stream {
    unsigned char pending[8];
    int n_pending;
};

/* Appends token id's piece to the stream and writes out everything that is complete UTF-8, holding back an
 * incomplete trailing sequence, so the output is always valid UTF-8 (ill-formed bytes become U+FFFD).
 * Returns the bytes written, or, when that would exceed cap, the size needed with nothing written and the
 * state unchanged (cap >= 3 * (piece length + 3) always suffices). ERR_INVALID_ARG for a bad id. */
int tokenizer_stream_push(const struct tokenizer *t, struct detok_stream *s, int32_t id, bool render_special,
                          char *buf, int cap);
/* Emits what is held back (one U+FFFD when an incomplete sequence is pending) and resets the state. Returns
 * bytes written (0 or 3), or 3 with nothing written when cap < 3. */
int tokenizer_stream_flush(struct detok_stream *s, char *buf, int cap);

const char *tokenizer_model_name(const struct tokenizer *t); /* "llama" or "gpt2" */
const char *tokenizer_pre_name(const struct tokenizer *t);   /* "default", "llama-bpe", ... */

#endif
