/* Tests for the grammar engine's GBNF side: parse errors with their line and column, what the arithmetic
 * grammar and small grammars accept and reject byte by byte, compile-time refusals (left recursion, empty
 * language, size caps), end tokens only where the grammar may end on a synthetic vocabulary, and on the real
 * 32k llama vocabulary: cached masks equal the exact whole-trie walk at every step of seeded random walks,
 * every allowed token is accepted and a refused one is not, walks never reach a dead end, two threads sharing
 * one grammar get the same masks as one, and nesting past the depth limit stays consistent. */
#include "testutil.h"

#include "core/err.h"
#include "engine/gguf/gguf.h"
#include "engine/grammar/grammar.h"
#include "engine/grammar/grammar_impl.h"
#include "engine/tokenizer/tokenizer.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char arith_gbnf[] = "root  ::= (expr \"=\" ws term \"\\n\")+\n"
                                 "expr  ::= term ([-+*/] term)*\n"
                                 "term  ::= ident | num | \"(\" ws expr \")\" ws\n"
                                 "ident ::= [a-z] [a-z0-9_]* ws\n"
                                 "num   ::= [0-9]+ ws\n"
                                 "ws    ::= [ \\t\\n]*\n";

static const char json_gbnf[] =
    "# llama.cpp's json.gbnf\n"
    "root   ::= object\n"
    "value  ::= object | array | string | number | (\"true\" | \"false\" | \"null\") ws\n"
    "object ::= \"{\" ws ( string \":\" ws value (\",\" ws string \":\" ws value)* )? \"}\" ws\n"
    "array  ::= \"[\" ws ( value (\",\" ws value)* )? \"]\" ws\n"
    "string ::= \"\\\"\" ( [^\"\\\\\\x7F\\x00-\\x1F] | \"\\\\\" ([\"\\\\bfnrt] | \"u\" [0-9a-fA-F]{4}) )* \"\\\"\" ws\n"
    "number ::= (\"-\"? ([0-9] | [1-9] [0-9]{0,15})) (\".\" [0-9]+)? ([eE] [-+]? [0-9] [1-9]{0,15})? ws\n"
    "ws ::= | \" \" | \"\\n\" [ \\t]{0,20}\n";

static struct grammar *compile_ok(const char *text)
{
    char err[ERR_MSG_MAX] = "";
    struct grammar *g = NULL;
    int rc = grammar_compile_gbnf(text, strlen(text), &g, err);
    if (rc)
        print_message("unexpected error: %s\n", err);
    assert_int_equal(rc, 0);
    assert_non_null(g);
    return g;
}

/* Whether the whole string is a sentence of g (byte matcher, no vocabulary). */
static bool matches(const struct grammar *g, const char *s, size_t n)
{
    char err[ERR_MSG_MAX];
    struct grammar_matcher *m = grammar_matcher_create(g, NULL, err);
    assert_non_null(m);
    int rc = grammar_matcher_accept_bytes(m, s, n);
    bool ok = rc == 0 && grammar_matcher_can_end(m);
    grammar_matcher_destroy(m);
    return ok;
}

static bool matches_str(const struct grammar *g, const char *s) { return matches(g, s, strlen(s)); }

/* ---- parse errors ---- */

static void test_gbnf_errors(void **state)
{
    static const struct {
        const char *text;
        int code;
        const char *msg; /* substring of the message */
    } cases[] = {
        {"root ::= foo\n", ERR_INVALID_ARG, "line 1, column 10: undefined rule 'foo'"},
        {"root ::= \"abc\n", ERR_INVALID_ARG, "line 1, column 10: unterminated string literal"},
        {"root = \"a\"", ERR_INVALID_ARG, "line 1, column 6: expected '::='"},
        {"x ::= \"a\"", ERR_INVALID_ARG, "no 'root' rule"},
        {"root ::= (\"a\" | \"b\"\n", ERR_INVALID_ARG, "line 1, column 10: unclosed parenthesis"},
        {"root ::= ( \"a\" $ )", ERR_INVALID_ARG, "line 1, column 16: expected ')' to close the group, found '$'"},
        {"root ::= \"a\" )", ERR_INVALID_ARG, "line 1, column 14: unmatched ')'"},
        {"root ::= [z-a]", ERR_INVALID_ARG, "line 1, column 11: character range is backwards"},
        {"root ::= [abc", ERR_INVALID_ARG, "line 1, column 10: unterminated character class"},
        {"root ::= \"\\q\"", ERR_INVALID_ARG, "line 1, column 11: unknown escape '\\q'"},
        {"root ::= \"\\x4\"", ERR_INVALID_ARG, "line 1, column 14: expected 2 hex digits after \\x"},
        {"root ::= \"\\uD800\"", ERR_INVALID_ARG, "line 1, column 11: escape is not a Unicode scalar value"},
        {"root ::= \"a\"{3,1}", ERR_INVALID_ARG, "line 1, column 13: repetition {m,n} has n < m"},
        {"root ::= \"a\"{2", ERR_INVALID_ARG, "line 1, column 15: expected '}'"},
        {"root ::= \"a\"{99999}", ERR_INVALID_ARG, "line 1, column 14: repetition count too large"},
        {"root ::= *", ERR_INVALID_ARG, "line 1, column 10: a repetition operator needs an item before it"},
        {"root ::= \"a\"\nroot ::= \"b\"", ERR_INVALID_ARG, "line 2, column 1: rule defined twice: 'root'"},
        {"\n\n  root ::= \"a\" $", ERR_INVALID_ARG, "line 3, column 16: expected the end of the line"},
        {"# comment only\n", ERR_INVALID_ARG, "grammar: empty"},
        {"root ::= [\xff]", ERR_INVALID_ARG, "line 1, column 11: invalid UTF-8 in a character class"},
        {"root ::= \"a\"\n  # c\nfoo_bar ::= \"x\" @", ERR_INVALID_ARG, "line 3, column 17: expected the end of the line"},
        {"root ::= \"a\"\nx ::= 12", ERR_INVALID_ARG, "line 2, column 7: undefined rule '12'"},
        /* compile-time refusals name the rule and where it is defined */
        {"root ::= root \"a\" | \"b\"", ERR_INVALID_ARG, "line 1, column 1: rule 'root' is left-recursive"},
        {"root ::= a\na ::= b? a \"x\" | \"y\"\nb ::= \"z\"", ERR_INVALID_ARG, "line 2, column 1: rule 'a' is left-recursive"},
        {"root ::= a\na ::= \"x\" a", ERR_INVALID_ARG, "grammar matches no string"},
        {"root ::= []", ERR_INVALID_ARG, "grammar matches no string"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char err[ERR_MSG_MAX] = "";
        struct grammar *g = (struct grammar *)1;
        int rc = grammar_compile_gbnf(cases[i].text, strlen(cases[i].text), &g, err);
        if (rc != cases[i].code || !strstr(err, cases[i].msg))
            print_message("case %zu: got %d '%s', want %d '%s'\n", i, rc, err, cases[i].code, cases[i].msg);
        assert_int_equal(rc, cases[i].code);
        assert_non_null(strstr(err, cases[i].msg));
        assert_null(g);
    }
    /* a NUL byte inside the text is an error too, not the end of the text */
    char err[ERR_MSG_MAX];
    struct grammar *g;
    assert_int_equal(grammar_compile_gbnf("root ::= \"a\"\0x", 14, &g, err), ERR_INVALID_ARG);
    assert_non_null(strstr(err, "line 1, column 13"));
}

/* ---- languages ---- */

static void test_arithmetic(void **state)
{
    struct grammar *g = compile_ok(arith_gbnf);
    const char *good[] = {"a=b\n", "x = 1\n", "(a+b)*c=d\n", "a=1\nb=2\n", "ab_1 +2 = (3)\n", "( x )=y\n",
                          "12/3*4-5=z9\n"};
    const char *bad[] = {"", "a=\n", "=b\n", "a=b", "a==b\n", "A=b\n", "ab_1 + 2 = 3\n", "(a=b\n", "1a=b\n" /* num then ident */};
    for (size_t i = 0; i < sizeof good / sizeof good[0]; i++) {
        if (!matches_str(g, good[i]))
            print_message("should match: %s", good[i]);
        assert_true(matches_str(g, good[i]));
    }
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        if (matches_str(g, bad[i]))
            print_message("should not match: %s", bad[i]);
        assert_false(matches_str(g, bad[i]));
    }
    grammar_destroy(g);
}

static void test_constructs(void **state)
{
    static const struct {
        const char *gbnf;
        const char *yes[6];
        const char *no[6];
    } cases[] = {
        {"root ::= \"ab\" | \"c\"", {"ab", "c"}, {"", "a", "abc", "cc"}},
        {"root ::= [a-c]{2,3}", {"ab", "abc", "ccc"}, {"a", "abca", "ad"}},
        {"root ::= \"x\"{2}", {"xx"}, {"x", "xxx"}},
        {"root ::= \"x\"{2,}", {"xx", "xxxxx"}, {"x"}},
        {"root ::= \"x\"{,2}", {"", "x", "xx"}, {"xxx"}},
        {"root ::= [^a-y\\n]+", {"z", "zz!", "\xc3\xa9"}, {"a", "za", "\n", "\xff"}},
        {"root ::= [α-ω]+", {"αβω"}, {"a", "Ω", "\xce"}},
        {"root ::= \"\\u00e9\\x41\\U0001F600\\\"\\\\\\t\"", {"\xc3\xa9" "A\xf0\x9f\x98\x80\"\\\t"}, {"\xe9" "A"}},
        {"root ::= .", {"a", "\xe2\x82\xac", "\n"}, {"", "ab", "\xe2\x82"}},
        {"root ::= (\"a\"* )* \"b\"", {"b", "aab"}, {"", "a", "ba"}},
        {"root ::= ws \"a\"\nws ::= | \" \" # optional space\n", {"a", " a"}, {"  a"}},
        {"root ::= \"a\" |\n  \"b\" # alternatives go on after |\n", {"a", "b"}, {"ab"}},
        {"root ::= list\nlist ::= item (\",\" list)?\nitem ::= [0-9]", {"1", "1,2,3"}, {"1,", ",1"}},
        {"root ::= \"(\" root \")\" | \"\"", {"", "()", "((()))"}, {"(", "())", ")("}},
        {"root ::= a\r\n\r\na ::= \"x\" |\r\n \"y\"\r\n", {"x", "y"}, {"xy", ""}}, /* CRLF lines */
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        struct grammar *g = compile_ok(cases[i].gbnf);
        for (int k = 0; k < 6 && cases[i].yes[k]; k++) {
            if (!matches_str(g, cases[i].yes[k]))
                print_message("case %zu should match '%s'\n", i, cases[i].yes[k]);
            assert_true(matches_str(g, cases[i].yes[k]));
        }
        for (int k = 0; k < 6 && cases[i].no[k]; k++) {
            if (matches_str(g, cases[i].no[k]))
                print_message("case %zu should not match '%s'\n", i, cases[i].no[k]);
            assert_false(matches_str(g, cases[i].no[k]));
        }
        grammar_destroy(g);
    }
}

static void test_accept_bytes_incremental(void **state)
{
    struct grammar *g = compile_ok("root ::= [α-ω]+ \"!\"");
    char err[ERR_MSG_MAX];
    struct grammar_matcher *m = grammar_matcher_create(g, NULL, err);
    /* a code point split across calls, a refused byte leaves the state as it was */
    assert_int_equal(grammar_matcher_accept_bytes(m, "\xce", 1), 0);
    assert_false(grammar_matcher_can_end(m));
    assert_int_equal(grammar_matcher_accept_bytes(m, "\xb1!x", 3), ERR_INVALID_ARG);
    assert_int_equal(grammar_matcher_accept_bytes(m, "\xb1", 1), 0);
    assert_int_equal(grammar_matcher_accept_bytes(m, "!", 1), 0);
    assert_true(grammar_matcher_can_end(m));
    assert_true(grammar_matcher_is_done(m)); /* nothing may follow the '!' */
    grammar_matcher_reset(m);
    assert_false(grammar_matcher_can_end(m));
    assert_int_equal(grammar_matcher_accept_bytes(m, "!", 1), ERR_INVALID_ARG);
    /* no vocabulary: masks and tokens are refused */
    uint32_t bits[1];
    assert_int_equal(grammar_matcher_mask(m, bits), ERR_INVALID_ARG);
    assert_int_equal(grammar_matcher_accept(m, 0), ERR_INVALID_ARG);
    grammar_matcher_destroy(m);
    grammar_destroy(g);
}

/* ---- end tokens on a synthetic vocabulary ---- */

static bool bit(const uint32_t *b, int id) { return b[id / 32] >> (id % 32) & 1; }

static void test_eos_only_at_end(void **state)
{
    /* 0 "a", 1 "b", 2 "ab", 3 eos, 4 control (no bytes), 5 "ba", 6 "b" again (same bytes as 1) */
    const char *pieces[] = {"a", "b", "ab", "", "", "ba", "b"};
    const uint32_t lens[] = {1, 1, 2, 0, 0, 2, 1};
    const int32_t eog[] = {3};
    char err[ERR_MSG_MAX];
    struct token_trie *t = token_trie_create_from_pieces(pieces, lens, 7, eog, 1, err);
    assert_non_null(t);
    assert_int_equal(token_trie_n_vocab(t), 7);
    assert_true(token_trie_is_eog(t, 3));
    assert_false(token_trie_is_eog(t, 0));
    struct grammar *g = compile_ok("root ::= \"a\" \"b\"?");
    struct grammar_matcher *m = grammar_matcher_create(g, t, err);
    assert_non_null(m);
    uint32_t b[1];
    assert_int_equal(grammar_matcher_mask(m, b), 0);
    assert_true(bit(b, 0) && bit(b, 2));
    assert_false(bit(b, 1) || bit(b, 3) || bit(b, 4) || bit(b, 5) || bit(b, 6));
    assert_int_equal(grammar_matcher_accept(m, 3), ERR_INVALID_ARG); /* EOS before the end */
    assert_int_equal(grammar_matcher_accept(m, 4), ERR_INVALID_ARG); /* control, never */
    assert_int_equal(grammar_matcher_accept(m, 1), ERR_INVALID_ARG);
    assert_int_equal(grammar_matcher_accept(m, 0), 0);
    assert_int_equal(grammar_matcher_mask(m, b), 0);
    assert_true(bit(b, 1) && bit(b, 6) && bit(b, 3)); /* "b", its twin, and EOS: the grammar may end */
    assert_false(bit(b, 0) || bit(b, 2) || bit(b, 4) || bit(b, 5));
    assert_true(grammar_matcher_can_end(m));
    assert_false(grammar_matcher_is_done(m));
    assert_int_equal(grammar_matcher_accept(m, 6), 0);
    assert_int_equal(grammar_matcher_mask(m, b), 0);
    assert_int_equal(b[0], 1u << 3); /* only EOS */
    assert_true(grammar_matcher_is_done(m));
    assert_int_equal(grammar_matcher_accept(m, 3), 0);
    assert_int_equal(grammar_matcher_mask(m, b), 0);
    assert_int_equal(b[0], 0); /* after EOS nothing */
    assert_int_equal(grammar_matcher_accept(m, 3), ERR_INVALID_ARG);
    assert_int_equal(grammar_matcher_accept(m, 7), ERR_INVALID_ARG);
    grammar_matcher_destroy(m);
    grammar_destroy(g);
    token_trie_destroy(t);
}

/* ---- the real vocabulary ---- */

static struct token_trie *llama_trie(void)
{
    const char *path = test_shared_path("tokenizer/ggml-vocab-llama-spm.gguf");
    if (!path)
        return NULL;
    char err[ERR_MSG_MAX];
    struct gguf *gg = gguf_open(path, err);
    assert_non_null(gg);
    struct tokenizer *tok = tokenizer_create(gg, err);
    assert_non_null(tok);
    struct token_trie *t = token_trie_create(tok, err);
    assert_non_null(t);
    assert_int_equal(token_trie_n_vocab(t), 32000);
    assert_true(token_trie_is_eog(t, tokenizer_eos(tok)));
    /* pieces are the tokenizer's bytes: SPM's U+2581 is a space */
    int32_t ids[4];
    int n = tokenizer_encode(tok, "Hello", 5, false, false, ids, 4);
    assert_true(n >= 1);
    uint32_t len;
    const char *p = token_trie_piece(t, ids[0], &len);
    assert_true(len >= 1 && p[0] == ' ');
    tokenizer_destroy(tok);
    gguf_close(gg);
    return t;
}

/* Seeded random walk over allowed tokens, checking at each step: cached mask == exact mask, not empty,
 * a sample of allowed tokens accepted by a copy of the state (via a replay matcher), a sample of refused
 * ones rejected. Returns the number of tokens generated. */
static int walk_check(const struct grammar *g, const struct token_trie *t, uint64_t seed, int steps)
{
    char err[ERR_MSG_MAX];
    struct grammar_matcher *m = grammar_matcher_create(g, t, err), *probe = grammar_matcher_create(g, t, err);
    assert_non_null(m);
    assert_non_null(probe);
    int nv = token_trie_n_vocab(t);
    size_t nw = ((size_t)nv + 31) / 32;
    uint32_t *b1 = malloc(nw * 4), *b2 = malloc(nw * 4);
    int32_t *allowed = malloc((size_t)nv * sizeof *allowed), *hist = malloc((size_t)steps * sizeof *hist);
    int n_hist = 0;
    for (int s = 0; s < steps; s++) {
        assert_int_equal(grammar_matcher_mask(m, b1), 0);
        assert_int_equal(grammar_matcher_mask_exact(m, b2), 0);
        if (memcmp(b1, b2, nw * 4)) {
            for (int i = 0; i < nv; i++)
                if (bit(b1, i) != bit(b2, i)) {
                    uint32_t l;
                    const char *p = token_trie_piece(t, i, &l);
                    print_message("step %d token %d '%.*s': cached %d exact %d\n", s, i, (int)l, p, bit(b1, i), bit(b2, i));
                }
            fail();
        }
        int n = 0;
        for (int i = 0; i < nv; i++)
            if (bit(b1, i))
                allowed[n++] = i;
        assert_true(n > 0); /* never a dead end */
        /* probes: replay the history, then try a few allowed and a few refused tokens */
        for (int k = 0; k < 4; k++) {
            bool want = k < 2;
            int32_t tok;
            if (want) {
                tok = allowed[test_rand_u64(&seed) % (uint64_t)n];
            } else {
                tok = (int32_t)(test_rand_u64(&seed) % (uint64_t)nv);
                if (bit(b1, tok))
                    continue;
            }
            grammar_matcher_reset(probe);
            for (int h = 0; h < n_hist; h++)
                assert_int_equal(grammar_matcher_accept(probe, hist[h]), 0);
            assert_int_equal(grammar_matcher_accept(probe, tok), want ? 0 : ERR_INVALID_ARG);
        }
        int32_t tok = allowed[test_rand_u64(&seed) % (uint64_t)n];
        assert_int_equal(grammar_matcher_accept(m, tok), 0);
        hist[n_hist++] = tok;
        if (grammar_matcher_is_done(m))
            break;
    }
    free(b1);
    free(b2);
    free(allowed);
    free(hist);
    grammar_matcher_destroy(m);
    grammar_matcher_destroy(probe);
    return n_hist;
}

static void test_masks_real_vocab(void **state)
{
    struct token_trie *t = llama_trie();
    if (!t) {
        print_message("[  SKIPPED ] shared file tokenizer/ggml-vocab-llama-spm.gguf not found (set WAFER_SHARED)\n");
        skip();
    }
    const char *grammars[] = {arith_gbnf, json_gbnf, "root ::= [^\"]{0,40} \"\\\"\" [0-9]+"};
    for (size_t i = 0; i < sizeof grammars / sizeof grammars[0]; i++) {
        struct grammar *g = compile_ok(grammars[i]);
        for (uint64_t seed = 1; seed <= 3; seed++)
            walk_check(g, t, seed * 7919 + i, 60);
        grammar_destroy(g);
    }
    token_trie_destroy(t);
}

struct thread_arg {
    const struct grammar *g;
    const struct token_trie *t;
    uint64_t seed;
    uint32_t hash;
};

/* A seeded walk hashing every mask: the same seed must give the same hash on any thread. */
static void *walk_hash(void *p)
{
    struct thread_arg *a = p;
    char err[ERR_MSG_MAX];
    struct grammar_matcher *m = grammar_matcher_create(a->g, a->t, err);
    int nv = token_trie_n_vocab(a->t);
    size_t nw = ((size_t)nv + 31) / 32;
    uint32_t *b = malloc(nw * 4);
    int32_t *allowed = malloc((size_t)nv * sizeof *allowed);
    uint32_t h = 2166136261u;
    uint64_t seed = a->seed;
    for (int s = 0; s < 80 && !grammar_matcher_is_done(m); s++) {
        if (grammar_matcher_mask(m, b))
            break;
        int n = 0;
        for (int i = 0; i < nv; i++)
            if (bit(b, i))
                allowed[n++] = i, h = (h ^ (uint32_t)i) * 16777619u;
        if (!n)
            break;
        if (grammar_matcher_accept(m, allowed[test_rand_u64(&seed) % (uint64_t)n]))
            break;
    }
    a->hash = h;
    free(b);
    free(allowed);
    grammar_matcher_destroy(m);
    return NULL;
}

static void test_threads_share_grammar(void **state)
{
    struct token_trie *t = llama_trie();
    if (!t) {
        print_message("[  SKIPPED ] shared file tokenizer/ggml-vocab-llama-spm.gguf not found (set WAFER_SHARED)\n");
        skip();
    }
    /* reference hashes from a grammar of their own, then 4 threads on one fresh shared grammar */
    struct grammar *ref = compile_ok(json_gbnf), *g = compile_ok(json_gbnf);
    struct thread_arg want[4], got[4];
    pthread_t th[4];
    for (int i = 0; i < 4; i++) {
        want[i] = (struct thread_arg){ref, t, 100 + (uint64_t)(i % 2), 0};
        walk_hash(&want[i]);
        got[i] = (struct thread_arg){g, t, 100 + (uint64_t)(i % 2), 0};
    }
    for (int i = 0; i < 4; i++)
        assert_int_equal(pthread_create(&th[i], NULL, walk_hash, &got[i]), 0);
    for (int i = 0; i < 4; i++)
        pthread_join(th[i], NULL);
    for (int i = 0; i < 4; i++)
        assert_int_equal(got[i].hash, want[i].hash);
    assert_int_equal(want[0].hash, want[2].hash);
    assert_true(want[0].hash != want[1].hash);
    grammar_destroy(ref);
    grammar_destroy(g);
    token_trie_destroy(t);
}

static void test_depth_limit(void **state)
{
    /* each "[" pushes a frame; past GRAMMAR_MAX_DEPTH the path does not exist, masks agree with accepts */
    struct grammar *g = compile_ok("root ::= \"[\" root \"]\" \"x\"? | \"x\"");
    const char *pieces[] = {"[", "]", "x", "[[", "]]x", ""};
    const uint32_t lens[] = {1, 1, 1, 2, 3, 0};
    const int32_t eog[] = {5};
    char err[ERR_MSG_MAX];
    struct token_trie *t = token_trie_create_from_pieces(pieces, lens, 6, eog, 1, err);
    struct grammar_matcher *m = grammar_matcher_create(g, t, err);
    uint32_t b1[1], b2[1];
    int depth = 0;
    for (; depth < GRAMMAR_MAX_DEPTH + 5; depth++) {
        assert_int_equal(grammar_matcher_mask(m, b1), 0);
        assert_int_equal(grammar_matcher_mask_exact(m, b2), 0);
        assert_int_equal(b1[0], b2[0]);
        if (!bit(b1, 0))
            break;
        assert_int_equal(grammar_matcher_accept(m, 0), 0);
    }
    assert_int_equal(depth, GRAMMAR_MAX_DEPTH);
    assert_int_equal(grammar_matcher_accept(m, 0), ERR_INVALID_ARG);
    assert_int_equal(grammar_matcher_accept(m, 2), 0);
    for (int left = depth; left > 0; left--) {
        assert_int_equal(grammar_matcher_mask(m, b1), 0);
        assert_int_equal(grammar_matcher_mask_exact(m, b2), 0);
        assert_int_equal(b1[0], b2[0]);
        assert_true(bit(b1, 1));
        assert_int_equal(bit(b1, 4), left >= 2); /* "]]x" closes two levels */
        assert_false(bit(b1, 5));
        assert_int_equal(grammar_matcher_accept(m, 1), 0);
    }
    assert_true(grammar_matcher_can_end(m));
    grammar_matcher_destroy(m);
    grammar_destroy(g);
    token_trie_destroy(t);
}

static void test_size_caps(void **state)
{
    char err[ERR_MSG_MAX];
    struct grammar *g;
    /* determinization blow-up ([ab]* a [ab]{n} needs 2^n states) is an error, not a hang */
    const char *blow = "root ::= [ab]* \"a\" [ab]{40}";
    assert_int_equal(grammar_compile_gbnf(blow, strlen(blow), &g, err), ERR_INVALID_ARG);
    assert_non_null(strstr(err, "too large"));
    const char *big = "root ::= ([a-z]{1000}){1000}";
    assert_int_equal(grammar_compile_gbnf(big, strlen(big), &g, err), ERR_INVALID_ARG);
    assert_non_null(strstr(err, "too large"));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_gbnf_errors),
        cmocka_unit_test(test_arithmetic),
        cmocka_unit_test(test_constructs),
        cmocka_unit_test(test_accept_bytes_incremental),
        cmocka_unit_test(test_eos_only_at_end),
        cmocka_unit_test(test_masks_real_vocab),
        cmocka_unit_test(test_threads_share_grammar),
        cmocka_unit_test(test_depth_limit),
        cmocka_unit_test(test_size_caps),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
