/* Tests for the tokenizer: llama.cpp's own test vectors for every vocab in ../shared/tokenizer (ids must
 * match exactly, and decoding must give the text back), the stories260K golden prompts and pieces, the
 * pre-tokenizer splits on hand-written strings, special-token handling and metadata defaults on small
 * synthetic vocabularies, the streaming detokenizer's UTF-8 guarantees, and `wafer tokenize`. */
#include "testutil.h"

#include "cli/cli.h"
#include "core/err.h"
#include "engine/gguf/gguf.h"
#include "engine/tokenizer/pretok.h"
#include "engine/tokenizer/tokenizer.h"
#include "engine/tokenizer/unicode.h"

#include <dirent.h>
#include <fcntl.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* ---- helpers ---- */

/* Independent strict UTF-8 validator (not the one under test). */
static bool utf8_ok(const unsigned char *s, size_t n)
{
    size_t i = 0;
    while (i < n) {
        unsigned c = s[i];
        size_t k;
        uint32_t v, min;
        if (c < 0x80) {
            i++;
            continue;
        } else if ((c & 0xe0) == 0xc0) {
            k = 1, v = c & 0x1f, min = 0x80;
        } else if ((c & 0xf0) == 0xe0) {
            k = 2, v = c & 0x0f, min = 0x800;
        } else if ((c & 0xf8) == 0xf0) {
            k = 3, v = c & 0x07, min = 0x10000;
        } else {
            return false;
        }
        for (size_t j = 1; j <= k; j++) {
            if (i + j >= n || (s[i + j] & 0xc0) != 0x80)
                return false;
            v = (v << 6) | (s[i + j] & 0x3f);
        }
        if (v < min || v > 0x10ffff || (v >= 0xd800 && v <= 0xdfff))
            return false;
        i += k + 1;
    }
    return true;
}

/* Encodes with a right-sized buffer; caller frees. */
static int32_t *encode_all(const struct tokenizer *t, const char *s, size_t n, bool add_special, bool parse_special,
                           int *n_out)
{
    int need = tokenizer_encode(t, s, n, add_special, parse_special, NULL, 0);
    assert_true(need >= 0);
    int32_t *ids = malloc((size_t)(need + 1) * sizeof *ids);
    assert_non_null(ids);
    assert_int_equal(tokenizer_encode(t, s, n, add_special, parse_special, ids, need), need);
    *n_out = need;
    return ids;
}

/* Concatenation of the pieces of ids (specials hidden); caller frees; *len set. */
static char *decode_all(const struct tokenizer *t, const int32_t *ids, int n, size_t *len)
{
    size_t cap = 64, o = 0;
    char *s = malloc(cap);
    for (int i = 0; i < n; i++) {
        int k = tokenizer_token_to_piece(t, ids[i], false, s + o, (int)(cap - o));
        assert_true(k >= 0);
        if ((size_t)k > cap - o) {
            while ((size_t)k > cap - o)
                cap *= 2;
            s = realloc(s, cap);
            assert_int_equal(tokenizer_token_to_piece(t, ids[i], false, s + o, (int)(cap - o)), k);
        }
        o += (size_t)k;
    }
    *len = o;
    return s;
}

static void print_ids(const char *label, const int32_t *ids, int n)
{
    print_message("      %s:", label);
    for (int i = 0; i < n; i++)
        print_message(" %d", ids[i]);
    print_message("\n");
}

static struct tokenizer *open_tokenizer(const char *path, struct gguf **g)
{
    char err[ERR_MSG_MAX];
    *g = gguf_open(path, err);
    if (!*g)
        fail_msg("%s", err);
    struct tokenizer *t = tokenizer_create(*g, err);
    if (!t)
        fail_msg("%s: %s", path, err);
    return t;
}

static int32_t find_token(const struct tokenizer *t, const char *text)
{
    for (int32_t i = 0; i < tokenizer_n_vocab(t); i++)
        if (!strcmp(tokenizer_token_text(t, i), text))
            return i;
    return -1;
}

/* ---- llama.cpp's vocab test vectors ---- */

static const char k_sep[] = "\n__ggml_vocab_test__\n";

/* Runs one vocab's .inp/.out pair; returns the number of mismatching texts (ids or round trip). */
static int run_vocab_vectors(const char *gguf_path)
{
    char inp_path[4500], out_path[4500];
    snprintf(inp_path, sizeof inp_path, "%s.inp", gguf_path);
    snprintf(out_path, sizeof out_path, "%s.out", gguf_path);
    size_t inp_len, out_len;
    char *inp = test_read_file(inp_path, &inp_len);
    char *outs = test_read_file(out_path, &out_len);
    if (!inp || !outs) {
        free(inp);
        free(outs);
        return -1;
    }
    struct gguf *g;
    struct tokenizer *t = open_tokenizer(gguf_path, &g);
    bool spm = !strcmp(tokenizer_model_name(t), "llama");
    int n_texts = 0, n_bad_ids = 0, n_bad_trip = 0;
    char *p = inp, *line = outs;
    for (;;) {
        char *sep = memmem(p, inp_len - (size_t)(p - inp), k_sep, sizeof k_sep - 1);
        if (!sep)
            break;
        size_t tlen = (size_t)(sep - p);
        char *eol = strchr(line, '\n');
        assert_non_null(eol);
        *eol = 0;
        int32_t expect[4096];
        int n_expect = 0;
        for (char *q = line; *q;) {
            char *end;
            long v = strtol(q, &end, 10);
            if (end == q)
                break;
            assert_true(n_expect < 4096);
            expect[n_expect++] = (int32_t)v;
            q = end;
        }
        int n;
        int32_t *ids = encode_all(t, p, tlen, false, false, &n);
        if (n != n_expect || memcmp(ids, expect, (size_t)n * sizeof *ids)) {
            n_bad_ids++;
            print_message("    MISMATCH in %s, text '%.*s'\n", gguf_path, (int)tlen, p);
            print_ids("expected", expect, n_expect);
            print_ids("got     ", ids, n);
        }
        /* decode: SPM gives the text back behind the space prefix; byte-level BPE gives it back exactly */
        size_t dlen;
        char *dec = decode_all(t, ids, n, &dlen);
        bool trip = spm ? (tlen == 0 ? dlen == 0 : dlen == tlen + 1 && dec[0] == ' ' && !memcmp(dec + 1, p, tlen))
                        : (dlen == tlen && !memcmp(dec, p, tlen));
        if (!trip) {
            n_bad_trip++;
            print_message("    ROUND TRIP failed in %s: '%.*s' -> '%.*s'\n", gguf_path, (int)tlen, p, (int)dlen, dec);
        }
        free(dec);
        free(ids);
        n_texts++;
        p = sep + sizeof k_sep - 1;
        line = eol + 1;
    }
    print_message("    %s: %d/%d texts match llama.cpp, %d/%d round trip\n", gguf_path, n_texts - n_bad_ids, n_texts,
                  n_texts - n_bad_trip, n_texts);
    assert_true(n_texts > 0);
    tokenizer_destroy(t);
    gguf_close(g);
    free(inp);
    free(outs);
    return n_bad_ids + n_bad_trip;
}

static void test_vocab_vectors(void **state)
{
    (void)state;
    const char *dir = TEST_SHARED_OR_SKIP("tokenizer");
    char dirpath[4096];
    snprintf(dirpath, sizeof dirpath, "%s", dir);
    DIR *d = opendir(dirpath);
    assert_non_null(d);
    int n_vocabs = 0, n_bad = 0;
    struct dirent *e;
    while ((e = readdir(d))) {
        size_t n = strlen(e->d_name);
        if (n < 5 || strcmp(e->d_name + n - 5, ".gguf"))
            continue;
        char path[4400];
        snprintf(path, sizeof path, "%s/%s", dirpath, e->d_name);
        int bad = run_vocab_vectors(path);
        if (bad < 0)
            continue; /* a vocab without vectors */
        n_vocabs++;
        n_bad += bad;
    }
    closedir(d);
    assert_true(n_vocabs >= 2);
    assert_int_equal(n_bad, 0);
}

/* ---- stories260K golden ---- */

static void test_stories260k_golden(void **state)
{
    (void)state;
    const char *model = TEST_SHARED_OR_SKIP("models/stories260K/stories260K.gguf");
    char model_path[4096];
    snprintf(model_path, sizeof model_path, "%s", model);
    const char *golden = TEST_SHARED_OR_SKIP("golden/stories260K_greedy.json");
    json_error_t jerr;
    json_t *root = json_load_file(golden, 0, &jerr);
    assert_non_null(root);
    struct gguf *g;
    struct tokenizer *t = open_tokenizer(model_path, &g);
    assert_int_equal(tokenizer_n_vocab(t), json_integer_value(json_object_get(root, "vocab_size")));
    assert_int_equal(tokenizer_bos(t), json_integer_value(json_object_get(root, "bos_token_id")));
    assert_int_equal(tokenizer_eos(t), json_integer_value(json_object_get(root, "eos_token_id")));
    assert_true(tokenizer_add_bos(t));
    assert_true(tokenizer_is_eog(t, tokenizer_eos(t)));
    assert_false(tokenizer_is_eog(t, 403));

    int n;
    int32_t *ids = encode_all(t, "Once upon a time", 16, true, false, &n);
    int32_t want[] = {1, 403, 407, 261, 378};
    assert_int_equal(n, 5);
    assert_memory_equal(ids, want, sizeof want);
    free(ids);

    json_t *entries = json_object_get(root, "entries");
    assert_true(json_array_size(entries) > 0);
    size_t i;
    json_t *en;
    json_array_foreach(entries, i, en) {
        const char *prompt = json_string_value(json_object_get(en, "prompt"));
        json_t *pids = json_object_get(en, "prompt_token_ids");
        ids = encode_all(t, prompt, strlen(prompt), true, false, &n);
        assert_int_equal((size_t)n, json_array_size(pids));
        for (int k = 0; k < n; k++)
            assert_int_equal(ids[k], json_integer_value(json_array_get(pids, (size_t)k)));
        free(ids);
        json_t *gids = json_object_get(en, "generated_token_ids"), *pieces = json_object_get(en, "generated_token_pieces");
        assert_int_equal(json_array_size(gids), json_array_size(pieces));
        for (size_t k = 0; k < json_array_size(gids); k++) {
            int32_t id = (int32_t)json_integer_value(json_array_get(gids, k));
            const char *want_piece = json_string_value(json_array_get(pieces, k));
            char buf[64];
            int len = tokenizer_token_to_piece(t, id, false, buf, sizeof buf);
            assert_true(len >= 0 && len < (int)sizeof buf);
            buf[len] = 0;
            if (strcmp(buf, want_piece))
                fail_msg("piece of %d: got '%s', want '%s'", id, buf, want_piece);
        }
    }
    json_decref(root);
    tokenizer_destroy(t);
    gguf_close(g);
}

/* ---- pre-tokenizer splits ---- */

struct split_case {
    enum pretok_type type;
    const char *text;
    const char *words; /* expected words joined by '|' */
};

/* Expected splits follow the regexes' semantics (leftmost-first alternation, greedy quantifiers). */
static const struct split_case k_splits[] = {
    {PRETOK_LLAMA3, "Hello world", "Hello| world"},
    {PRETOK_LLAMA3, "I'm HE'S we'LL they'Re", "I|'m| HE|'S| we|'LL| they|'Re"}, /* contractions in any case */
    {PRETOK_LLAMA3, "12345 67", "123|45| |67"},                              /* digits in threes */
    {PRETOK_LLAMA3, "a\n\nb", "a|\n\n|b"},
    {PRETOK_LLAMA3, "a  \n b", "a|  \n| b"},   /* \s*[\r\n]+ takes spaces up to the last newline */
    {PRETOK_LLAMA3, "x   y", "x|  | y"},       /* \s+(?!\S) leaves the last space to the word */
    {PRETOK_LLAMA3, "中文字符 and 日本語", "中文字符| and| 日本語"},
    {PRETOK_LLAMA3, "😀😀 hi", "😀😀| hi"},
    {PRETOK_LLAMA3, "!!!\n\nfoo", "!!!\n\n|foo"}, /* punctuation keeps its trailing newlines */
    {PRETOK_LLAMA3, "$1,000", "$|1|,|000"},
    {PRETOK_LLAMA3, "  Hello\n    World  ", " | Hello|\n|   | World|  "},
    {PRETOK_LLAMA3, "ümlaut's café", "ümlaut|'s| café"},
    {PRETOK_LLAMA3, "tab\tsep\r\nline", "tab|\tsep|\r\n|line"}, /* one non-letter may lead a word */
    {PRETOK_QWEN2, "12345 67", "1|2|3|4|5| |6|7"},                /* single digits */
    {PRETOK_QWEN2, "I'm HE'S", "I|'m| HE|'S"},
    {PRETOK_QWEN2, "x   y\n", "x|  | y|\n"},
    {PRETOK_QWEN2, "😀😀 hi", "😀😀| hi"},
    {PRETOK_QWEN2, "!!!\n\nfoo", "!!!\n\n|foo"},
    {PRETOK_QWEN2, "$1,000", "$|1|,|0|0|0"},
    {PRETOK_QWEN2, "中文，日本語。", "中文|，日本語|。"}, /* one non-letter leads a word */
    {PRETOK_GPT2, "  Hello", " | Hello"},
    {PRETOK_GPT2, "I'M it's", "I|'|M| it|'s"}, /* GPT-2 contractions are lowercase only */
    {PRETOK_GPT2, "12345 67", "12345| 67"},
    {PRETOK_GPT2, "x   y\n", "x|  | y|\n"},
    {PRETOK_STARCODER, "ab 123", "ab| |1|2|3"},
    {PRETOK_DEEPSEEK_CODER, "foo(1)\n", "foo|(|1|)|\n"},
    {PRETOK_DEFAULT, "Hello, world!! 12345", "Hello|,| world|!!| |123|45"},
    {PRETOK_DEFAULT, "a+b=c ~~x", "a|+|b|=|c| |~~|x"},
    {PRETOK_DEEPSEEK_LLM, "Hello world\n\n你好世界 123  ", "Hello| world|\n|\n|你好世界| |123|  "},
    /* each regex splits what the previous ones produced: [:-~] (the 3rd) takes ASCII letters off "über" */
    {PRETOK_DEEPSEEK_LLM, "über-cool 😀!", "ü|ber|-|cool| 😀|!"},
    {PRETOK_DEEPSEEK3, "Hello .NET 12345 日本語カタカナ", "Hello| .|NET| |123|45| |日本語カタカナ"},
    {PRETOK_DEEPSEEK3, "x~y +=z\n", "x|~y| +=|z|\n"}, /* '~' is neither P nor S to llama.cpp */
    {PRETOK_FALCON, "a+b 12345 `x`", "a|+|b| |123|45| |`|x|`"},
    {PRETOK_PORO, "Hello, world. How?", "Hello|,| world|.| How|?"},
    {PRETOK_VIKING, "abc123 def", "abc|1|2|3| def"},
    {PRETOK_TEKKEN, "HelloWorld iPhone ABCdef", "Hello|World| i|Phone| ABCdef"},
    {PRETOK_TEKKEN, "x/y\n/", "x|/y|\n|/"},
    {PRETOK_CHAMELEON, "IMGIMGABZ a    b", "IMGIMGABZ| a|    |b"},
};

static void test_pretok_splits(void **state)
{
    (void)state;
    for (size_t c = 0; c < sizeof k_splits / sizeof k_splits[0]; c++) {
        const struct split_case *sc = &k_splits[c];
        size_t len = strlen(sc->text), n = 0;
        uint32_t cps[256];
        for (size_t off = 0; off < len;) {
            size_t adv;
            cps[n++] = unicode_decode_llama((const unsigned char *)sc->text + off, len - off, &adv);
            off += adv;
        }
        size_t *lens, n_words;
        assert_int_equal(pretok_split(sc->type, cps, n, &lens, &n_words), 0);
        char got[512];
        size_t o = 0, at = 0;
        for (size_t w = 0; w < n_words; w++) {
            if (w)
                got[o++] = '|';
            for (size_t k = 0; k < lens[w]; k++)
                o += (size_t)unicode_encode(cps[at + k], got + o);
            at += lens[w];
        }
        got[o] = 0;
        free(lens);
        if (strcmp(got, sc->words))
            fail_msg("split %d of '%s': got '%s', want '%s'", (int)sc->type, sc->text, got, sc->words);
    }
}

static void test_pretok_names(void **state)
{
    (void)state;
    const struct pretok_name *p = pretok_lookup("llama-bpe", 9);
    assert_non_null(p);
    assert_int_equal(p->type, PRETOK_LLAMA3);
    assert_true(p->flags & PRETOK_F_IGNORE_MERGES);
    assert_int_equal(pretok_lookup("qwen2", 5)->type, PRETOK_QWEN2);
    assert_int_equal(pretok_lookup("smollm", 6)->type, PRETOK_STARCODER);
    assert_int_equal(pretok_lookup("mpt", 3)->type, PRETOK_GPT2);
    assert_null(pretok_lookup("qwen", 4));
    assert_null(pretok_lookup("qwen2x", 6));
    char names[1024];
    pretok_names(names, sizeof names);
    assert_non_null(strstr(names, "deepseek-coder"));
    /* empty text: no words */
    size_t *lens, n;
    assert_int_equal(pretok_split(PRETOK_LLAMA3, NULL, 0, &lens, &n), 0);
    assert_int_equal(n, 0);
    free(lens);
}

/* ---- unicode ---- */

static void test_unicode_basics(void **state)
{
    (void)state;
    assert_int_equal(unicode_flags('a') & UCAT_MASK, UCAT_LETTER);
    assert_int_equal(unicode_flags(0x4e2d) & UCAT_MASK, UCAT_LETTER);   /* 中 */
    assert_int_equal(unicode_flags(0x0663) & UCAT_MASK, UCAT_NUMBER);   /* Arabic-Indic 3 */
    assert_int_equal(unicode_flags(0x2014) & UCAT_MASK, UCAT_PUNCT);    /* em dash */
    assert_int_equal(unicode_flags(0x1f600) & UCAT_MASK, UCAT_SYMBOL);  /* 😀 */
    assert_int_equal(unicode_flags(0x0301) & UCAT_MASK, UCAT_MARK);
    assert_int_equal(unicode_flags(0x0378) & UCAT_MASK, UCAT_UNDEFINED);
    assert_true(unicode_flags(0x3000) & UFLAG_WHITESPACE);
    assert_true(unicode_flags(0x85) & UFLAG_WHITESPACE);
    assert_false(unicode_flags(0x1c) & UFLAG_WHITESPACE); /* Python's isspace says yes; White_Space no */
    assert_false(unicode_flags(0x200b) & UFLAG_WHITESPACE);
    assert_int_equal(unicode_tolower('Q'), 'q');
    assert_int_equal(unicode_tolower(0x0416), 0x0436); /* Ж */
    assert_int_equal(unicode_tolower(0x0130), 'i');
    for (int b = 0; b < 256; b++)
        assert_int_equal(unicode_cp_to_byte(unicode_byte_to_cp((uint8_t)b)), b);
    assert_int_equal(unicode_byte_to_cp(' '), 0x120); /* Ġ */
    assert_int_equal(unicode_byte_to_cp('\n'), 0x10a); /* Ċ */
    assert_int_equal(unicode_cp_to_byte(0x41), 0x41);
    assert_int_equal(unicode_cp_to_byte(0x20), -1);
    assert_int_equal(unicode_cp_to_byte(0x144), -1);
    size_t adv;
    assert_int_equal(unicode_decode_llama((const unsigned char *)"\xe2\x96\x81", 3, &adv), 0x2581);
    assert_int_equal(adv, 3);
    assert_int_equal(unicode_decode_llama((const unsigned char *)"\xe2\x96", 2, &adv), UNICODE_REPLACEMENT);
    assert_int_equal(adv, 1);
    assert_int_equal(unicode_decode_llama((const unsigned char *)"\x80", 1, &adv), UNICODE_REPLACEMENT);
    assert_true(unicode_utf8_valid("h\xc3\xa9", 3));
    assert_false(unicode_utf8_valid("\xc0\x80", 2));    /* overlong */
    assert_false(unicode_utf8_valid("\xed\xa0\x80", 3)); /* surrogate */
}

/* ---- special tokens and pieces on the shared vocabs ---- */

static void test_special_tokens_spm(void **state)
{
    (void)state;
    const char *path = TEST_SHARED_OR_SKIP("tokenizer/ggml-vocab-llama-spm.gguf");
    struct gguf *g;
    struct tokenizer *t = open_tokenizer(path, &g);
    assert_string_equal(tokenizer_model_name(t), "llama");
    assert_int_equal(tokenizer_bos(t), 1);
    int n;
    int32_t *ids = encode_all(t, "<s>Hello", 8, false, true, &n);
    assert_true(n == 2);
    assert_int_equal(ids[0], 1);
    assert_int_equal(ids[1], 15043); /* "▁Hello": the text after a special token gets the space prefix */
    free(ids);
    ids = encode_all(t, "<s>Hello", 8, false, false, &n);
    assert_true(n > 2);
    for (int i = 0; i < n; i++)
        assert_int_not_equal(ids[i], 1);
    free(ids);
    /* add_special: BOS only (no EOS by default) */
    ids = encode_all(t, "Hello", 5, true, false, &n);
    assert_int_equal(n, 2);
    assert_int_equal(ids[0], 1);
    free(ids);
    ids = encode_all(t, "", 0, true, false, &n);
    assert_int_equal(n, 1);
    free(ids);
    int32_t none[4];
    assert_int_equal(tokenizer_encode(t, "", 0, false, false, none, 4), 0);
    assert_int_equal(tokenizer_encode(t, "", 0, false, false, NULL, 0), 0);
    /* pieces: control tokens only when asked */
    char buf[16];
    assert_int_equal(tokenizer_token_to_piece(t, 1, false, buf, sizeof buf), 0);
    assert_int_equal(tokenizer_token_to_piece(t, 1, true, buf, sizeof buf), 3);
    assert_memory_equal(buf, "<s>", 3);
    assert_int_equal(tokenizer_token_to_piece(t, 15043, false, buf, sizeof buf), 6);
    assert_memory_equal(buf, " Hello", 6);
    assert_int_equal(tokenizer_token_to_piece(t, 15043, false, buf, 3), 6); /* too small: size only */
    int32_t nl = find_token(t, "<0x0A>");
    assert_true(nl >= 0);
    assert_int_equal(tokenizer_token_to_piece(t, nl, false, buf, sizeof buf), 1);
    assert_int_equal(buf[0], '\n');
    assert_int_equal(tokenizer_token_to_piece(t, -1, false, buf, sizeof buf), ERR_INVALID_ARG);
    assert_int_equal(tokenizer_token_to_piece(t, tokenizer_n_vocab(t), false, buf, sizeof buf), ERR_INVALID_ARG);
    assert_null(tokenizer_token_text(t, -1));
    assert_string_equal(tokenizer_token_text(t, 1), "<s>");
    /* a short output buffer gets the first ids and the full count */
    int32_t two[2];
    int total = tokenizer_encode(t, "Hello world, how are you?", 25, true, false, two, 2);
    assert_true(total > 2);
    assert_int_equal(two[0], 1);
    assert_int_equal(two[1], 15043);
    tokenizer_destroy(t);
    gguf_close(g);
}

/* tokenizer_encode_alloc: the same ids as tokenizer_encode into a right-sized buffer, for a long text (byte
 * fallback and special-token text included), an empty one, and a buffer the caller can always free. */
static void test_encode_alloc(void **state)
{
    (void)state;
    const char *path = TEST_SHARED_OR_SKIP("tokenizer/ggml-vocab-llama-spm.gguf");
    struct gguf *g;
    struct tokenizer *t = open_tokenizer(path, &g);
    static const char *const parts[] = {"Once upon a time, ", "a caf\xc3\xa9 \xf0\x9f\x98\x80 served ", "<s>tea</s> ",
                                        "\n\t  12345 ", "\xe6\x97\xa5\xe6\x9c\xac\xe8\xaa\x9e. "};
    size_t cap = 300000, len = 0;
    char *text = malloc(cap);
    assert_non_null(text);
    for (int i = 0; len + 64 < cap; i++) {
        size_t n = strlen(parts[i % 5]);
        memcpy(text + len, parts[i % 5], n);
        len += n;
    }
    for (int special = 0; special < 2; special++) {
        int n_want;
        int32_t *want = encode_all(t, text, len, true, special, &n_want);
        assert_true(n_want > 50000);
        int32_t *got = NULL;
        int n = tokenizer_encode_alloc(t, text, len, true, special, &got);
        assert_int_equal(n, n_want);
        assert_non_null(got);
        assert_memory_equal(got, want, (size_t)n * sizeof *got);
        free(got);
        free(want);
    }
    free(text);
    /* empty text: no ids but a buffer to free; with add_special, BOS alone */
    int32_t *ids = NULL;
    assert_int_equal(tokenizer_encode_alloc(t, "", 0, false, true, &ids), 0);
    assert_non_null(ids);
    free(ids);
    ids = NULL;
    assert_int_equal(tokenizer_encode_alloc(t, NULL, 0, true, true, &ids), 1);
    assert_int_equal(ids[0], 1);
    free(ids);
    /* errors leave *out NULL */
    ids = (int32_t *)&ids;
    assert_int_equal(tokenizer_encode_alloc(t, NULL, 5, true, true, &ids), ERR_INVALID_ARG);
    assert_null(ids);
    ids = (int32_t *)&ids;
    assert_int_equal(tokenizer_encode_alloc(NULL, "x", 1, true, true, &ids), ERR_INVALID_ARG);
    assert_null(ids);
    assert_int_equal(tokenizer_encode_alloc(t, "x", 1, true, true, NULL), ERR_INVALID_ARG);
    tokenizer_destroy(t);
    gguf_close(g);
}

static void test_special_tokens_gpt2(void **state)
{
    (void)state;
    const char *path = TEST_SHARED_OR_SKIP("tokenizer/ggml-vocab-gpt-2.gguf");
    struct gguf *g;
    struct tokenizer *t = open_tokenizer(path, &g);
    assert_string_equal(tokenizer_model_name(t), "gpt2");
    assert_string_equal(tokenizer_pre_name(t), "gpt-2");
    int32_t eot = find_token(t, "<|endoftext|>");
    assert_int_equal(eot, 50256);
    assert_true(tokenizer_is_eog(t, eot));
    assert_true(tokenizer_is_control(t, eot));
    int n;
    int32_t *ids = encode_all(t, "Hi<|endoftext|>", 15, false, true, &n);
    assert_int_equal(n, 2);
    assert_int_equal(ids[1], eot);
    free(ids);
    ids = encode_all(t, "Hi<|endoftext|>", 15, false, false, &n);
    assert_true(n > 2);
    for (int i = 0; i < n; i++)
        assert_int_not_equal(ids[i], eot);
    size_t dlen;
    char *dec = decode_all(t, ids, n, &dlen);
    assert_int_equal(dlen, 15);
    assert_memory_equal(dec, "Hi<|endoftext|>", 15);
    free(dec);
    free(ids);
    /* invalid UTF-8 is tokenized as U+FFFD, like llama.cpp */
    int32_t *a = encode_all(t, "a\xff", 2, false, false, &n);
    int na = n;
    int32_t *b = encode_all(t, "a\xef\xbf\xbd", 4, false, false, &n);
    assert_int_equal(na, n);
    assert_memory_equal(a, b, (size_t)n * sizeof *a);
    free(a);
    free(b);
    tokenizer_destroy(t);
    gguf_close(g);
}

/* ---- streaming detokenizer ---- */

static void test_stream_utf8(void **state)
{
    (void)state;
    const char *path = TEST_SHARED_OR_SKIP("tokenizer/ggml-vocab-llama-spm.gguf");
    struct gguf *g;
    struct tokenizer *t = open_tokenizer(path, &g);
    const unsigned char emoji[] = {0xf0, 0x9f, 0xa6, 0x99}; /* 🦙 */
    int32_t bt[4];
    for (int i = 0; i < 4; i++) {
        char name[8];
        snprintf(name, sizeof name, "<0x%02X>", emoji[i]);
        bt[i] = find_token(t, name);
        assert_true(bt[i] >= 0);
    }
    int32_t hi = find_token(t, "▁Hello");
    assert_true(hi >= 0);

    /* " Hello" + the emoji's four byte tokens: every push is valid UTF-8, the emoji comes out whole */
    struct detok_stream s = {0};
    unsigned char all[256];
    size_t n_all = 0;
    char buf[64];
    int k = tokenizer_stream_push(t, &s, hi, false, buf, sizeof buf);
    assert_int_equal(k, 6);
    memcpy(all + n_all, buf, (size_t)k), n_all += (size_t)k;
    for (int i = 0; i < 4; i++) {
        k = tokenizer_stream_push(t, &s, bt[i], false, buf, sizeof buf);
        assert_true(k >= 0);
        assert_true(utf8_ok((unsigned char *)buf, (size_t)k));
        assert_int_equal(k, i < 3 ? 0 : 4);
        memcpy(all + n_all, buf, (size_t)k), n_all += (size_t)k;
    }
    assert_int_equal(tokenizer_stream_flush(&s, buf, sizeof buf), 0);
    assert_int_equal(n_all, 10);
    assert_memory_equal(all, " Hello\xf0\x9f\xa6\x99", 10);

    /* an incomplete sequence flushes as U+FFFD */
    assert_int_equal(tokenizer_stream_push(t, &s, bt[0], false, buf, sizeof buf), 0);
    assert_int_equal(tokenizer_stream_push(t, &s, bt[1], false, buf, sizeof buf), 0);
    assert_int_equal(tokenizer_stream_flush(&s, buf, sizeof buf), 3);
    assert_memory_equal(buf, "\xef\xbf\xbd", 3);
    assert_int_equal(s.n_pending, 0);

    /* a broken sequence followed by text: U+FFFD, then the text */
    assert_int_equal(tokenizer_stream_push(t, &s, bt[0], false, buf, sizeof buf), 0);
    k = tokenizer_stream_push(t, &s, hi, false, buf, sizeof buf);
    assert_int_equal(k, 9);
    assert_memory_equal(buf, "\xef\xbf\xbd Hello", 9);

    /* a lone continuation byte or 0xFF is replaced at once */
    int32_t ff = find_token(t, "<0xFF>");
    assert_true(ff >= 0);
    k = tokenizer_stream_push(t, &s, ff, false, buf, sizeof buf);
    assert_int_equal(k, 3);
    assert_true(utf8_ok((unsigned char *)buf, 3));
    k = tokenizer_stream_push(t, &s, bt[2], false, buf, sizeof buf);
    assert_int_equal(k, 3);

    /* too small a buffer: the size needed, state unchanged */
    assert_int_equal(tokenizer_stream_push(t, &s, bt[0], false, buf, sizeof buf), 0);
    assert_int_equal(tokenizer_stream_push(t, &s, hi, false, buf, 4), 9);
    assert_int_equal(s.n_pending, 1);
    assert_int_equal(tokenizer_stream_flush(&s, buf, 2), 3); /* too small too */
    assert_int_equal(s.n_pending, 1);
    assert_int_equal(tokenizer_stream_flush(&s, buf, sizeof buf), 3);

    /* control tokens stream only when rendered */
    assert_int_equal(tokenizer_stream_push(t, &s, 2, false, buf, sizeof buf), 0);
    assert_int_equal(tokenizer_stream_push(t, &s, 2, true, buf, sizeof buf), 4);
    assert_int_equal(tokenizer_stream_push(t, &s, -3, true, buf, sizeof buf), ERR_INVALID_ARG);

    /* every prefix of a byte-token stream of mixed text stays valid */
    const char *text = "naïve 🦙 façade 中文 \xf0\x9f\x98\x80!";
    int n;
    int32_t *ids = encode_all(t, text, strlen(text), false, false, &n);
    struct detok_stream s2 = {0};
    n_all = 0;
    for (int i = 0; i < n; i++) {
        k = tokenizer_stream_push(t, &s2, ids[i], false, buf, sizeof buf);
        assert_true(k >= 0 && n_all + (size_t)k < sizeof all);
        memcpy(all + n_all, buf, (size_t)k), n_all += (size_t)k;
        assert_true(utf8_ok(all, n_all));
    }
    n_all += (size_t)tokenizer_stream_flush(&s2, (char *)all + n_all, 8);
    assert_int_equal(n_all, strlen(text) + 1);
    assert_memory_equal(all + 1, text, strlen(text));
    free(ids);
    tokenizer_destroy(t);
    gguf_close(g);
}

/* ---- synthetic vocabularies ---- */

/* Byte-level vocabulary: the 256 byte symbols, then extra tokens. */
#define BPE_EXTRA 6
static const char *const k_bpe_extra[BPE_EXTRA] = {"he", "hello", "Ġw", "<|im_start|>", "<tool>", "<|im_end|>"};
static const int32_t k_bpe_extra_type[BPE_EXTRA] = {1, 1, 1, 3, 4, 3};

static struct gguf *make_bpe(struct test_gguf *b, const char *pre, int add_bos, int add_eos)
{
    static char syms[256][4];
    const char *tokens[256 + BPE_EXTRA];
    int32_t types[256 + BPE_EXTRA];
    for (int i = 0; i < 256; i++) {
        int n = unicode_encode(unicode_byte_to_cp((uint8_t)i), syms[i]);
        syms[i][n] = 0;
        tokens[i] = syms[i];
        types[i] = 1;
    }
    for (int i = 0; i < BPE_EXTRA; i++) {
        tokens[256 + i] = k_bpe_extra[i];
        types[256 + i] = k_bpe_extra_type[i];
    }
    static const char *const merges[] = {"h e", "Ġ w"};
    test_gguf_begin(b);
    test_gguf_str(b, "general.architecture", "llama");
    test_gguf_str(b, "tokenizer.ggml.model", "gpt2");
    if (pre)
        test_gguf_str(b, "tokenizer.ggml.pre", pre);
    test_gguf_strs(b, "tokenizer.ggml.tokens", tokens, 256 + BPE_EXTRA);
    test_gguf_i32s(b, "tokenizer.ggml.token_type", types, 256 + BPE_EXTRA);
    test_gguf_strs(b, "tokenizer.ggml.merges", merges, 2);
    test_gguf_u32(b, "tokenizer.ggml.bos_token_id", 256 + 3);
    test_gguf_u32(b, "tokenizer.ggml.eos_token_id", 256 + 5);
    if (add_bos >= 0)
        test_gguf_bool(b, "tokenizer.ggml.add_bos_token", add_bos);
    if (add_eos >= 0)
        test_gguf_bool(b, "tokenizer.ggml.add_eos_token", add_eos);
    return test_gguf_open(b);
}

static void expect_ids(const struct tokenizer *t, const char *text, bool add_special, bool parse_special,
                       const int32_t *want, int n_want)
{
    int n;
    int32_t *ids = encode_all(t, text, strlen(text), add_special, parse_special, &n);
    if (n != n_want || memcmp(ids, want, (size_t)n * sizeof *ids)) {
        print_ids("want", want, n_want);
        print_ids("got ", ids, n);
        fail_msg("encoding '%s'", text);
    }
    free(ids);
}

static void test_synthetic_bpe(void **state)
{
    (void)state;
    char err[ERR_MSG_MAX];
    struct test_gguf b;
    /* llama-bpe: whole words that are tokens skip the merges; BOS is on by default */
    struct gguf *g = make_bpe(&b, "llama-bpe", -1, -1);
    struct tokenizer *t = tokenizer_create(g, err);
    assert_non_null(t);
    assert_string_equal(tokenizer_pre_name(t), "llama-bpe");
    assert_true(tokenizer_add_bos(t));
    assert_int_equal(tokenizer_bos(t), 259);
    assert_true(tokenizer_is_eog(t, 261));  /* eos, and "<|im_end|>" by its text */
    assert_false(tokenizer_is_eog(t, 259));
    expect_ids(t, "hello", false, false, (int32_t[]){257}, 1);
    expect_ids(t, "hello", true, false, (int32_t[]){259, 257}, 2);
    /* " world": "Ġw" merges, the rest are byte symbols */
    expect_ids(t, "he world", false, false, (int32_t[]){256, 258, 'o', 'r', 'l', 'd'}, 6);
    /* control tokens only with parse_special; user-defined ones always */
    expect_ids(t, "<|im_start|>he", false, true, (int32_t[]){259, 256}, 2);
    expect_ids(t, "a<tool>b", false, false, (int32_t[]){'a', 260, 'b'}, 3);
    int n;
    int32_t *ids = encode_all(t, "<|im_start|>he", 14, false, false, &n);
    assert_int_equal(n, 13); /* "<", "|", "im", ... as bytes: no merges for them */
    free(ids);
    tokenizer_destroy(t);
    gguf_close(g);
    free(b.p);

    /* qwen2: no ignore_merges, no BOS by default, EOS when the metadata asks */
    g = make_bpe(&b, "qwen2", -1, 1);
    t = tokenizer_create(g, err);
    assert_non_null(t);
    assert_false(tokenizer_add_bos(t));
    expect_ids(t, "hello", false, false, (int32_t[]){256, 'l', 'l', 'o'}, 4);
    expect_ids(t, "hello", true, false, (int32_t[]){256, 'l', 'l', 'o', 261}, 5);
    tokenizer_destroy(t);
    gguf_close(g);
    free(b.p);

    /* explicit add_bos_token=false overrides llama-bpe's default */
    g = make_bpe(&b, "llama-bpe", 0, -1);
    t = tokenizer_create(g, err);
    assert_false(tokenizer_add_bos(t));
    tokenizer_destroy(t);
    gguf_close(g);
    free(b.p);

    /* no pre: the default pre-tokenizer */
    g = make_bpe(&b, NULL, -1, -1);
    t = tokenizer_create(g, err);
    assert_non_null(t);
    assert_string_equal(tokenizer_pre_name(t), "default");
    tokenizer_destroy(t);
    gguf_close(g);
    free(b.p);

    /* unknown pre: refused with the supported list */
    g = make_bpe(&b, "klingon", -1, -1);
    assert_null(tokenizer_create(g, err));
    assert_non_null(strstr(err, "klingon"));
    assert_non_null(strstr(err, "llama-bpe"));
    assert_non_null(strstr(err, "qwen2"));
    gguf_close(g);
    free(b.p);
}

/* tokenizer_encode_spans: special-token text inside a plain span is text (control tokens, end-of-turn ones,
 * user-defined tags), outside it is special; the spans never cut the text, so without special text in them
 * the ids are tokenizer_encode_alloc's with parse_special; bad spans are refused. */
static void test_encode_spans(void **state)
{
    (void)state;
    char err[ERR_MSG_MAX];
    struct test_gguf b;
    struct gguf *g = make_bpe(&b, "llama-bpe", 0, -1);
    struct tokenizer *t = tokenizer_create(g, err);
    assert_non_null(t);
    const char *pre = "<|im_start|>", *content = "he<|im_end|>hi <tool>", *post = "<|im_end|>";
    char text[128];
    snprintf(text, sizeof text, "%s%s%s", pre, content, post);
    struct tok_span sp = {strlen(pre), strlen(content)};
    int32_t *ids, *mid;
    int n = tokenizer_encode_spans(t, text, strlen(text), false, &sp, 1, &ids);
    int n_mid = tokenizer_encode_alloc(t, content, strlen(content), false, false, &mid);
    assert_true(n_mid > 3);
    for (int i = 0; i < n_mid; i++)
        assert_true(mid[i] != 261); /* parse_special off: <|im_end|> is text */
    bool tool = false;
    for (int i = 0; i < n_mid; i++)
        tool |= mid[i] == 260;
    assert_true(tool); /* ... while a user-defined tag still matches without spans (llama.cpp) */
    /* inside the span the tag is text too: expected = [<|im_start|>] + content as bytes/merges + [<|im_end|>] */
    assert_int_equal(ids[0], 259);
    assert_int_equal(ids[n - 1], 261);
    for (int i = 1; i < n - 1; i++)
        assert_true(ids[i] < 256 || ids[i] == 256 /* "he" */);
    free(mid);
    free(ids);
    /* no spans: exactly parse_special */
    int32_t *all;
    int n_all = tokenizer_encode_alloc(t, text, strlen(text), false, true, &all);
    n = tokenizer_encode_spans(t, text, strlen(text), false, NULL, 0, &ids);
    assert_int_equal(n, n_all);
    assert_memory_equal(ids, all, (size_t)n * sizeof *ids);
    free(ids);
    free(all);
    /* bad spans */
    struct tok_span bad[2] = {{5, 3}, {4, 2}};
    assert_int_equal(tokenizer_encode_spans(t, text, strlen(text), false, bad, 2, &ids), ERR_INVALID_ARG);
    assert_null(ids);
    bad[0] = (struct tok_span){strlen(text) - 1, 2};
    assert_int_equal(tokenizer_encode_spans(t, text, strlen(text), false, bad, 1, &ids), ERR_INVALID_ARG);
    assert_int_equal(tokenizer_encode_spans(t, text, strlen(text), false, NULL, 1, &ids), ERR_INVALID_ARG);
    tokenizer_destroy(t);
    gguf_close(g);
    free(b.p);

    /* SPM (Llama 2's vocabulary): a llama2 turn whose content writes </s> and <s> */
    const char *path = TEST_SHARED_OR_SKIP("tokenizer/ggml-vocab-llama-spm.gguf");
    struct tokenizer *spm = open_tokenizer(path, &g);
    const char *turn = "[INST] hi </s><s> there [/INST] ok </s>";
    struct tok_span user = {7, strlen("hi </s><s> there")};
    n = tokenizer_encode_spans(spm, turn, strlen(turn), true, &user, 1, &ids);
    assert_int_equal(ids[0], 1);     /* BOS */
    assert_int_equal(ids[n - 1], 2); /* the template's </s> */
    for (int i = 1; i < n - 1; i++)
        assert_true(ids[i] != 1 && ids[i] != 2); /* the user's are text */
    free(ids);
    /* spans over text without special tokens do not change the ids (they do not cut the text) */
    const char *plain = "Hello world, how are you?";
    struct tok_span w = {6, 5};
    n = tokenizer_encode_spans(spm, plain, strlen(plain), true, &w, 1, &ids);
    n_all = tokenizer_encode_alloc(spm, plain, strlen(plain), true, true, &all);
    assert_int_equal(n, n_all);
    assert_memory_equal(ids, all, (size_t)n * sizeof *ids);
    free(ids);
    free(all);
    tokenizer_destroy(spm);
    gguf_close(g);
}

static void test_synthetic_errors(void **state)
{
    (void)state;
    char err[ERR_MSG_MAX];
    struct test_gguf b;
    static const char *const toks[] = {"<unk>", "<s>", "</s>", "a"};

    test_gguf_begin(&b);
    test_gguf_str(&b, "tokenizer.ggml.model", "bert");
    test_gguf_strs(&b, "tokenizer.ggml.tokens", toks, 4);
    struct gguf *g = test_gguf_open(&b);
    assert_null(tokenizer_create(g, err));
    assert_non_null(strstr(err, "bert"));
    assert_non_null(strstr(err, "llama, gpt2"));
    gguf_close(g);
    free(b.p);

    test_gguf_begin(&b);
    test_gguf_str(&b, "general.architecture", "llama");
    g = test_gguf_open(&b);
    assert_null(tokenizer_create(g, err));
    assert_non_null(strstr(err, "tokenizer.ggml.model"));
    gguf_close(g);
    free(b.p);

    test_gguf_begin(&b);
    test_gguf_str(&b, "tokenizer.ggml.model", "llama");
    g = test_gguf_open(&b);
    assert_null(tokenizer_create(g, err));
    assert_non_null(strstr(err, "tokenizer.ggml.tokens"));
    gguf_close(g);
    free(b.p);

    /* gpt2 without merges */
    test_gguf_begin(&b);
    test_gguf_str(&b, "tokenizer.ggml.model", "gpt2");
    test_gguf_str(&b, "tokenizer.ggml.pre", "gpt-2");
    test_gguf_strs(&b, "tokenizer.ggml.tokens", toks, 4);
    g = test_gguf_open(&b);
    assert_null(tokenizer_create(g, err));
    assert_non_null(strstr(err, "merges"));
    gguf_close(g);
    free(b.p);

    /* scores of the wrong length */
    test_gguf_begin(&b);
    test_gguf_str(&b, "tokenizer.ggml.model", "llama");
    test_gguf_strs(&b, "tokenizer.ggml.tokens", toks, 4);
    test_gguf_i32s(&b, "tokenizer.ggml.scores", (int32_t[]){0, 0}, 2);
    g = test_gguf_open(&b);
    assert_null(tokenizer_create(g, err));
    assert_non_null(strstr(err, "scores"));
    gguf_close(g);
    free(b.p);

    /* a tiny SPM vocab without byte tokens: unknown characters become <unk>; add_space_prefix=false */
    test_gguf_begin(&b);
    test_gguf_str(&b, "tokenizer.ggml.model", "llama");
    test_gguf_strs(&b, "tokenizer.ggml.tokens", toks, 4);
    test_gguf_i32s(&b, "tokenizer.ggml.token_type", (int32_t[]){2, 3, 3, 1}, 4);
    test_gguf_bool(&b, "tokenizer.ggml.add_space_prefix", false);
    test_gguf_bool(&b, "tokenizer.ggml.add_eos_token", true);
    g = test_gguf_open(&b);
    struct tokenizer *t = tokenizer_create(g, err);
    assert_non_null(t);
    expect_ids(t, "ab", true, false, (int32_t[]){1, 3, 0, 2}, 4);
    expect_ids(t, "a<unk>", false, true, (int32_t[]){3, 0}, 2);
    tokenizer_destroy(t);
    gguf_close(g);
    free(b.p);
}

/* ---- wafer tokenize ---- */

/* Runs cmd_tokenize_main with stdout/stderr captured into out/errout (NUL-terminated). */
static int run_cli(int argc, char **argv, char *out, size_t out_cap, char *errout, size_t err_cap)
{
    const char *po = test_tmp_path("cli.out"), *pe = test_tmp_path("cli.err");
    fflush(stdout);
    fflush(stderr);
    int so = dup(1), se = dup(2);
    int fo = open(po, O_WRONLY | O_CREAT | O_TRUNC, 0600), fe = open(pe, O_WRONLY | O_CREAT | O_TRUNC, 0600);
    dup2(fo, 1);
    dup2(fe, 2);
    int rc = cmd_tokenize_main(argc, argv);
    fflush(stdout);
    fflush(stderr);
    dup2(so, 1);
    dup2(se, 2);
    close(so), close(se), close(fo), close(fe);
    char *o = test_read_file(po, NULL), *e = test_read_file(pe, NULL);
    snprintf(out, out_cap, "%s", o ? o : "");
    snprintf(errout, err_cap, "%s", e ? e : "");
    free(o);
    free(e);
    return rc;
}

static void test_cli_tokenize(void **state)
{
    (void)state;
    const char *m = TEST_SHARED_OR_SKIP("models/stories260K/stories260K.gguf");
    char model[4096], out[4096], err[4096];
    snprintf(model, sizeof model, "%s", m);

    char *a1[] = {"tokenize", "--model", model, "--text", "Once upon a time"};
    assert_int_equal(run_cli(5, a1, out, sizeof out, err, sizeof err), 0);
    assert_string_equal(out, "1 403 407 261 378\n");

    char *a2[] = {"tokenize", "--model", model, "--text", "Once upon a time", "--no-bos"};
    assert_int_equal(run_cli(6, a2, out, sizeof out, err, sizeof err), 0);
    assert_string_equal(out, "403 407 261 378\n");

    const char *tf = test_tmp_path("prompt.txt");
    FILE *f = fopen(tf, "wb");
    fputs("Once upon a time", f);
    fclose(f);
    char file[4096];
    snprintf(file, sizeof file, "%s", tf);
    char *a3[] = {"tokenize", "--model", model, "--file", file};
    assert_int_equal(run_cli(5, a3, out, sizeof out, err, sizeof err), 0);
    assert_string_equal(out, "1 403 407 261 378\n");

    char *a4[] = {"tokenize", "--model", model, "--text", "<s>Once", "--no-bos", "--parse-special"};
    assert_int_equal(run_cli(7, a4, out, sizeof out, err, sizeof err), 0);
    assert_true(!strncmp(out, "1 ", 2));

    char *a5[] = {"tokenize", "--model", "/nonexistent/model.gguf", "--text", "x"};
    assert_int_equal(run_cli(5, a5, out, sizeof out, err, sizeof err), 1);
    assert_non_null(strstr(err, "/nonexistent/model.gguf"));
    assert_string_equal(out, "");

    char *a6[] = {"tokenize", "--model", model, "--file", "/nonexistent/prompt.txt"};
    assert_int_equal(run_cli(5, a6, out, sizeof out, err, sizeof err), 1);
    assert_non_null(strstr(err, "/nonexistent/prompt.txt"));

    char *a7[] = {"tokenize", "--model", model};
    assert_int_equal(run_cli(3, a7, out, sizeof out, err, sizeof err), 2);
    assert_non_null(strstr(err, "--text"));

    char *a8[] = {"tokenize", "--help"};
    assert_int_equal(run_cli(2, a8, out, sizeof out, err, sizeof err), 0);
    assert_non_null(strstr(out, "--parse-special"));

    char *a9[] = {"tokenize", "--model", model, "--text", "x", "--bogus"};
    assert_int_equal(run_cli(6, a9, out, sizeof out, err, sizeof err), 2);
    assert_non_null(strstr(err, "--bogus"));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_unicode_basics),
        cmocka_unit_test(test_pretok_splits),
        cmocka_unit_test(test_pretok_names),
        cmocka_unit_test(test_vocab_vectors),
        cmocka_unit_test(test_stories260k_golden),
        cmocka_unit_test(test_special_tokens_spm),
        cmocka_unit_test(test_special_tokens_gpt2),
        cmocka_unit_test(test_encode_alloc),
        cmocka_unit_test(test_stream_utf8),
        cmocka_unit_test(test_synthetic_bpe),
        cmocka_unit_test(test_encode_spans),
        cmocka_unit_test(test_synthetic_errors),
        cmocka_unit_test(test_cli_tokenize),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
