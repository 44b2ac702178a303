/* Structured output through the scheduler on the random-weight llama-19M model (its free output is noise, so
 * every valid answer is the constraint's work): answers under a JSON Schema parse and validate at
 * temperature 1 with n > 1 and penalties; greedy constrained output is deterministic (alone, across choices);
 * a GBNF grammar's answers are complete sentences; a stop string that cuts the JSON short fails the request
 * (never invalid output returned as finished); the grammar cache returns the same compiled grammar for the
 * same text and evicts the least recently used. */
#include "testutil.h"

#include "core/clock.h"
#include "core/err.h"
#include "engine/engine.h"
#include "engine/grammar/grammar.h"
#include "engine/grammar/grammar_cache.h"
#include "engine/model.h"
#include "engine/scheduler.h"
#include "engine/tokenizer/tokenizer.h"

#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define MODEL "models/llama-19M/llama-19M-Q8_0.gguf"

struct fixture {
    struct model *m;
    struct engine *e;
    struct scheduler *s;
    struct grammar_cache *gc;
};

static void fixture_up(struct fixture *f)
{
    const char *path = TEST_SHARED_OR_SKIP(MODEL);
    char err[ERR_MSG_MAX];
    f->m = model_load(path, err);
    assert_non_null(f->m);
    struct engine_params ep;
    engine_params_default(&ep);
    ep.n_threads = 2;
    ep.max_seqs = 8;
    ep.max_batch_tokens = 64 + 8;
    f->e = engine_create(f->m, &ep, err);
    assert_non_null(f->e);
    struct sched_params sp;
    sched_params_default(&sp);
    sp.max_batch_size = 8;
    sp.prefill_chunk = 64;
    f->s = scheduler_create(f->e, f->m->tok, &sp, NULL, NULL, NULL, err);
    assert_non_null(f->s);
    assert_int_equal(scheduler_start(f->s), 0);
    f->gc = grammar_cache_create(4);
    assert_non_null(f->gc);
}

static void fixture_down(struct fixture *f)
{
    scheduler_destroy(f->s);
    grammar_cache_destroy(f->gc);
    engine_destroy(f->e);
    model_destroy(f->m);
}

static struct sched_req *make_req(struct fixture *f, const char *prompt, int n, enum grammar_kind kind,
                                  const char *text, unsigned flags)
{
    int32_t toks[128];
    int nt = tokenizer_encode(f->m->tok, prompt, strlen(prompt), true, false, toks, 128);
    assert_true(nt > 0);
    struct sched_req *r = sched_req_create(toks, nt, n);
    assert_non_null(r);
    r->max_tokens = 300;
    r->sp.temperature = 1.0f;
    r->t_arrival = clock_now_ns();
    char err[ERR_MSG_MAX];
    int rc = grammar_cache_get(f->gc, kind, flags, text, text ? strlen(text) : 0, &r->constraint, err);
    if (rc)
        print_error("%s\n", err);
    assert_int_equal(rc, 0);
    return r;
}

static void wait_finished(struct sched_req *r)
{
    struct sched_req_status st = {0};
    for (int i = 0; i < 120000 && !st.finished; i++) {
        sched_req_status_get(r, &st);
        if (!st.finished)
            usleep(1000);
    }
    assert_true(st.finished);
}

struct copy {
    int want;
    char text[8192];
    size_t len;
    int32_t ids[512];
    int n_toks;
    enum sched_finish finish;
};

static bool copy_fn(void *ctx, int c, const struct sched_choice *ch)
{
    struct copy *cp = ctx;
    if (c != cp->want)
        return true;
    cp->len = ch->text_len < sizeof cp->text - 1 ? ch->text_len : sizeof cp->text - 1;
    memcpy(cp->text, ch->text ? ch->text : "", cp->len);
    cp->text[cp->len] = 0;
    cp->n_toks = ch->n_toks < 512 ? ch->n_toks : 512;
    for (int i = 0; i < cp->n_toks; i++)
        cp->ids[i] = ch->toks[i].id;
    cp->finish = ch->finish;
    return false;
}

static void get_choice(struct sched_req *r, int c, struct copy *cp)
{
    memset(cp, 0, sizeof *cp);
    cp->want = c;
    sched_req_read(r, copy_fn, cp);
}

static const char *schemas[] = {
    "{\"type\":\"object\",\"properties\":{\"name\":{\"type\":\"string\",\"maxLength\":8},"
    "\"age\":{\"type\":\"integer\",\"minimum\":0,\"maximum\":120},"
    "\"tags\":{\"type\":\"array\",\"items\":{\"enum\":[\"a\",\"b\",\"c\"]},\"maxItems\":3}},"
    "\"required\":[\"name\",\"age\",\"tags\"],\"additionalProperties\":false}",
    "{\"type\":\"array\",\"items\":{\"type\":\"boolean\"},\"minItems\":1,\"maxItems\":4}",
    "{\"type\":\"object\",\"properties\":{\"id\":{\"type\":\"string\",\"format\":\"uuid\"},"
    "\"when\":{\"type\":\"string\",\"format\":\"date\"},\"code\":{\"type\":\"string\",\"pattern\":\"^[A-Z]{3}-[0-9]{2}$\"}},"
    "\"required\":[\"id\",\"when\",\"code\"]}",
    "{\"$defs\":{\"node\":{\"type\":\"object\",\"properties\":{\"v\":{\"type\":\"integer\",\"minimum\":0,\"maximum\":9},"
    "\"kids\":{\"type\":\"array\",\"items\":{\"$ref\":\"#/$defs/node\"},\"maxItems\":2}},\"required\":[\"v\"]}},"
    "\"$ref\":\"#/$defs/node\"}",
};

/* Every choice of every request ends by its grammar and validates; penalties and n > 1 on. */
static void test_schema_answers_validate(void **state)
{
    (void)state;
    struct fixture f;
    fixture_up(&f);
    int n_schemas = (int)(sizeof schemas / sizeof schemas[0]);
    struct sched_req *rs[4];
    for (int i = 0; i < n_schemas; i++) {
        rs[i] = make_req(&f, "Return JSON:", 2, GRAMMAR_KIND_SCHEMA, schemas[i], GRAMMAR_SCHEMA_COMPACT);
        rs[i]->sp.seed = 100 + (uint64_t)i;
        rs[i]->sp.repeat_penalty = 1.2f;
        rs[i]->sp.frequency_penalty = 0.5f;
        rs[i]->ignore_eos = i == 1; /* has no say under a grammar */
        assert_int_equal(scheduler_submit(f.s, rs[i]), 0);
    }
    int n_stop = 0;
    for (int i = 0; i < n_schemas; i++) {
        wait_finished(rs[i]);
        struct sched_req_status st;
        sched_req_status_get(rs[i], &st);
        if (st.error)
            print_error("schema %d: %s\n", i, st.errmsg);
        assert_int_equal(st.error, 0);
        for (int c = 0; c < 2; c++) {
            struct copy cp;
            get_choice(rs[i], c, &cp);
            char err[ERR_MSG_MAX];
            if (cp.finish == SCHED_STOP) {
                n_stop++;
                int rc = json_schema_validate(schemas[i], strlen(schemas[i]), cp.text, cp.len, err);
                if (rc)
                    print_error("schema %d choice %d: %s: %s\n", i, c, err, cp.text);
                assert_int_equal(rc, 0);
            } else {
                assert_int_equal(cp.finish, SCHED_LENGTH);
            }
        }
        sched_req_unref(rs[i]);
    }
    assert_true(n_stop >= 6); /* bounded schemas: nearly every answer completes within 300 tokens */
    fixture_down(&f);
}

/* Greedy constrained output is the same alone, twice, and across the n choices of one request. */
static void test_greedy_deterministic(void **state)
{
    (void)state;
    struct fixture f;
    fixture_up(&f);
    struct copy a, b, c1;
    struct sched_req *r1 = make_req(&f, "Once", 1, GRAMMAR_KIND_SCHEMA, schemas[0], 0);
    r1->sp.temperature = 0;
    assert_int_equal(scheduler_submit(f.s, r1), 0);
    wait_finished(r1);
    get_choice(r1, 0, &a);
    struct sched_req *r2 = make_req(&f, "Once", 2, GRAMMAR_KIND_SCHEMA, schemas[0], 0);
    r2->sp.temperature = 0;
    assert_int_equal(scheduler_submit(f.s, r2), 0);
    wait_finished(r2);
    get_choice(r2, 0, &b);
    get_choice(r2, 1, &c1);
    assert_true(a.len > 0);
    assert_int_equal(a.n_toks, b.n_toks);
    assert_memory_equal(a.ids, b.ids, (size_t)a.n_toks * sizeof a.ids[0]);
    assert_int_equal(a.n_toks, c1.n_toks);
    assert_memory_equal(a.ids, c1.ids, (size_t)a.n_toks * sizeof a.ids[0]);
    assert_int_equal(a.finish, SCHED_STOP);
    char err[ERR_MSG_MAX];
    assert_int_equal(json_schema_validate(schemas[0], strlen(schemas[0]), a.text, a.len, err), 0);
    long hits, misses;
    grammar_cache_counts(f.gc, &hits, &misses);
    assert_int_equal(misses, 1);
    assert_int_equal(hits, 1);
    sched_req_unref(r1);
    sched_req_unref(r2);
    fixture_down(&f);
}

/* GBNF: answers are complete sentences of the grammar; json_object mode gives an object. */
static void test_gbnf_and_json_object(void **state)
{
    (void)state;
    struct fixture f;
    fixture_up(&f);
    static const char arith[] = "root ::= expr\n"
                                "expr ::= term ((\"+\" | \"-\") term){0,3}\n"
                                "term ::= num | \"(\" expr \")\"\n"
                                "num ::= [1-9] [0-9]{0,2}\n";
    struct sched_req *r = make_req(&f, "2+2=", 3, GRAMMAR_KIND_GBNF, arith, 0);
    struct sched_req *o = make_req(&f, "{", 1, GRAMMAR_KIND_JSON_OBJECT, NULL, 0);
    o->max_tokens = 400;
    assert_int_equal(scheduler_submit(f.s, r), 0);
    assert_int_equal(scheduler_submit(f.s, o), 0);
    wait_finished(r);
    wait_finished(o);
    struct grammar *g;
    char err[ERR_MSG_MAX];
    assert_int_equal(grammar_compile_gbnf(arith, strlen(arith), &g, err), 0);
    for (int c = 0; c < 3; c++) {
        struct copy cp;
        get_choice(r, c, &cp);
        if (cp.finish != SCHED_STOP)
            continue; /* nested parentheses may run past the budget */
        struct grammar_matcher *m = grammar_matcher_create(g, NULL, err);
        assert_int_equal(grammar_matcher_accept_bytes(m, cp.text, cp.len), 0);
        assert_true(grammar_matcher_can_end(m));
        grammar_matcher_destroy(m);
    }
    grammar_destroy(g);
    struct copy cp;
    get_choice(o, 0, &cp);
    struct sched_req_status st;
    sched_req_status_get(o, &st);
    assert_int_equal(st.error, 0);
    if (cp.finish == SCHED_STOP)
        assert_int_equal(json_schema_validate("{\"type\":\"object\"}", 17, cp.text, cp.len, err), 0);
    size_t k = strspn(cp.text, " \t\n");
    if (k >= cp.len || cp.text[k] != '{')
        print_error("json_object: %s (finish %d)\n", cp.text, (int)cp.finish);
    assert_true(k < cp.len && cp.text[k] == '{');
    sched_req_unref(r);
    sched_req_unref(o);
    fixture_down(&f);
}

/* A stop string that cuts the JSON short: the request fails with ERR_INTERNAL (validation), it never ends
 * "stop" with invalid JSON. */
static void test_stop_string_cut_fails_closed(void **state)
{
    (void)state;
    struct fixture f;
    fixture_up(&f);
    struct sched_req *r = make_req(&f, "x", 1, GRAMMAR_KIND_SCHEMA, schemas[0], GRAMMAR_SCHEMA_COMPACT);
    char *stop[] = {"\"age\""};
    assert_int_equal(sched_req_set_stop(r, stop, 1), 0);
    assert_int_equal(scheduler_submit(f.s, r), 0);
    wait_finished(r);
    struct sched_req_status st;
    sched_req_status_get(r, &st);
    assert_int_equal(st.error, ERR_INTERNAL);
    assert_non_null(strstr(st.errmsg, "validation"));
    struct copy cp;
    get_choice(r, 0, &cp);
    assert_int_equal(cp.finish, SCHED_ERROR);
    sched_req_unref(r);
    fixture_down(&f);
}

/* The cache: same text, same grammar; LRU eviction; a held entry outlives its eviction. */
static void test_grammar_cache(void **state)
{
    (void)state;
    struct grammar_cache *gc = grammar_cache_create(2);
    char err[ERR_MSG_MAX];
    struct grammar_entry *a, *a2, *b, *c, *a3;
    const char *sa = "{\"type\":\"integer\"}", *sb = "{\"type\":\"boolean\"}", *sc = "root ::= \"x\"";
    assert_int_equal(grammar_cache_get(gc, GRAMMAR_KIND_SCHEMA, 0, sa, strlen(sa), &a, err), 0);
    assert_int_equal(grammar_cache_get(gc, GRAMMAR_KIND_SCHEMA, 0, sa, strlen(sa), &a2, err), 0);
    assert_ptr_equal(a, a2);
    assert_int_equal(grammar_cache_get(gc, GRAMMAR_KIND_SCHEMA, 0, sb, strlen(sb), &b, err), 0);
    assert_int_equal(grammar_cache_get(gc, GRAMMAR_KIND_GBNF, 0, sc, strlen(sc), &c, err), 0); /* evicts a */
    size_t len;
    assert_null(grammar_entry_schema(c, &len));
    assert_string_equal(grammar_entry_schema(a, &len), sa); /* still held: still alive */
    assert_int_equal(grammar_cache_get(gc, GRAMMAR_KIND_SCHEMA, 0, sa, strlen(sa), &a3, err), 0);
    assert_ptr_not_equal(a3, a); /* recompiled */
    long hits, misses;
    grammar_cache_counts(gc, &hits, &misses);
    assert_int_equal(hits, 1);
    assert_int_equal(misses, 4);
    grammar_entry_unref(c);
    assert_int_equal(grammar_cache_get(gc, GRAMMAR_KIND_SCHEMA, 0, "{\"not\":{}}", 10, &c, err), ERR_UNSUPPORTED);
    assert_null(c);
    assert_non_null(strstr(err, "not"));
    grammar_entry_unref(a);
    grammar_entry_unref(a2);
    grammar_entry_unref(a3);
    grammar_entry_unref(b);
    grammar_cache_destroy(gc);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_grammar_cache),          cmocka_unit_test(test_schema_answers_validate),
        cmocka_unit_test(test_greedy_deterministic),   cmocka_unit_test(test_gbnf_and_json_object),
        cmocka_unit_test(test_stop_string_cut_fails_closed),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
