/* libFuzzer target for the grammar engine. Input: a mode byte, a text up to the first 0xFF byte, then drive
 * bytes. Modes (byte % 4): 0 GBNF, 1 JSON schema, 2 JSON schema with STRICT|COMPACT, 3 the validator
 * (schema, a newline, the instance). Every failure must carry a message; a compiled grammar is driven over
 * a small vocabulary (all single bytes, some multi-byte pieces, an end token) choosing tokens with the drive
 * bytes, and at every step the cached mask must equal the exact walk, every masked token must be accepted,
 * the mask must be empty only when the grammar is done; the drive bytes are also fed raw. Never a crash,
 * leak, hang or sanitizer report. */
#include "core/err.h"
#include "engine/grammar/grammar.h"
#include "engine/grammar/grammar_impl.h"

#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define FZ_VOCAB (256 + 12)

static struct token_trie *fz_trie(void)
{
    static struct token_trie *t;
    if (t)
        return t;
    static char bytes[256];
    static const char *multi[] = {"{\"", "\":", "\",\"", "true", "null", "ab", "  ", "\xc3\xa9", "12", "\"}", "]}"};
    const char *pieces[FZ_VOCAB];
    uint32_t lens[FZ_VOCAB];
    for (int i = 0; i < 256; i++) {
        bytes[i] = (char)i;
        pieces[i] = &bytes[i];
        lens[i] = 1;
    }
    for (int i = 0; i < 11; i++) {
        pieces[256 + i] = multi[i];
        lens[256 + i] = (uint32_t)strlen(multi[i]);
    }
    pieces[FZ_VOCAB - 1] = "";
    lens[FZ_VOCAB - 1] = 0;
    int32_t eog = FZ_VOCAB - 1;
    char err[ERR_MSG_MAX];
    t = token_trie_create_from_pieces(pieces, lens, FZ_VOCAB, &eog, 1, err);
    if (!t)
        __builtin_trap();
    return t;
}

static void fz_drive(const struct grammar *g, const uint8_t *drive, size_t n)
{
    struct token_trie *t = fz_trie();
    char err[ERR_MSG_MAX];
    struct grammar_matcher *m = grammar_matcher_create(g, t, err);
    if (!m)
        return; /* out of memory only */
    uint32_t a[(FZ_VOCAB + 31) / 32], b[(FZ_VOCAB + 31) / 32];
    for (size_t i = 0; i < n && i < 48; i++) {
        if (grammar_matcher_mask(m, a) || grammar_matcher_mask_exact(m, b))
            break;
        if (memcmp(a, b, sizeof a))
            __builtin_trap(); /* the cache disagrees with the exact walk */
        int32_t allowed[FZ_VOCAB];
        int k = 0;
        for (int id = 0; id < FZ_VOCAB; id++)
            if (a[id / 32] >> (id % 32) & 1)
                allowed[k++] = id;
        if (!k) {
            if (!grammar_matcher_is_done(m))
                __builtin_trap(); /* a dead end: compiled grammars never have one */
            break;
        }
        if (grammar_matcher_accept(m, allowed[drive[i] % k]))
            __builtin_trap(); /* a masked token was refused */
        if (grammar_matcher_is_done(m))
            break;
    }
    grammar_matcher_reset(m);
    int rc = grammar_matcher_accept_bytes(m, drive, n);
    if (rc && rc != ERR_INVALID_ARG && rc != ERR_NOMEM)
        __builtin_trap();
    grammar_matcher_destroy(m);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1)
        return 0;
    int mode = data[0] % 4;
    const uint8_t *text = data + 1;
    const uint8_t *sep = memchr(text, 0xff, size - 1);
    size_t tlen = sep ? (size_t)(sep - text) : size - 1;
    const uint8_t *drive = sep ? sep + 1 : text + tlen;
    size_t dlen = size - 1 - tlen - (sep ? 1 : 0);
    char err[ERR_MSG_MAX] = "";
    struct grammar *g = NULL;
    int rc;
    if (mode == 3) {
        const uint8_t *nl = memchr(text, '\n', tlen);
        size_t slen = nl ? (size_t)(nl - text) : tlen;
        const char *inst = nl ? (const char *)nl + 1 : "null";
        size_t ilen = nl ? tlen - slen - 1 : 4;
        rc = json_schema_validate((const char *)text, slen, inst, ilen, err);
        if (rc && !err[0])
            __builtin_trap();
        return 0;
    }
    if (mode == 0)
        rc = grammar_compile_gbnf((const char *)text, tlen, &g, err);
    else
        rc = grammar_compile_schema((const char *)text, tlen, mode == 2 ? GRAMMAR_SCHEMA_STRICT | GRAMMAR_SCHEMA_COMPACT : 0,
                                    &g, err);
    if (rc) {
        if (rc > 0 || !err[0] || g)
            __builtin_trap(); /* every refusal carries a message */
        return 0;
    }
    if (!g)
        __builtin_trap();
    fz_drive(g, drive, dlen);
    grammar_destroy(g);
    return 0;
}
