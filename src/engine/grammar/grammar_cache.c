/*
 * grammar_cache: a small LRU list of reference-counted compiled grammars. The list is searched linearly
 * (tens of entries; a compare is a length check then memcmp), most recently used first.
 */
#include "engine/grammar/grammar_cache.h"

#include "core/err.h"
#include "engine/grammar/grammar.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

struct grammar_entry {
    atomic_int refs;
    enum grammar_kind kind;
    unsigned flags;
    char *text; /* [len + 1], the key */
    size_t len;
    struct grammar *g;
    const char *schema; /* validation schema: text, a static string, or NULL */
    size_t schema_len;
    struct grammar_entry *next; /* LRU order, most recent first */
};

struct grammar_cache {
    pthread_mutex_t mu;
    struct grammar_entry *head;
    int n, max;
    long hits, misses;
};

static const char json_object_schema[] = "{\"type\":\"object\"}";

struct grammar_cache *grammar_cache_create(int max_entries)
{
    if (max_entries < 1)
        return NULL;
    struct grammar_cache *c = calloc(1, sizeof *c);
    if (!c)
        return NULL;
    pthread_mutex_init(&c->mu, NULL);
    c->max = max_entries;
    return c;
}

void grammar_cache_destroy(struct grammar_cache *c)
{
    if (!c)
        return;
    for (struct grammar_entry *e = c->head, *nx; e; e = nx) {
        nx = e->next;
        grammar_entry_unref(e);
    }
    pthread_mutex_destroy(&c->mu);
    free(c);
}

void grammar_entry_ref(struct grammar_entry *e) { atomic_fetch_add(&e->refs, 1); }

void grammar_entry_unref(struct grammar_entry *e)
{
    if (!e || atomic_fetch_sub(&e->refs, 1) != 1)
        return;
    grammar_destroy(e->g);
    free(e->text);
    free(e);
}

const struct grammar *grammar_entry_grammar(const struct grammar_entry *e) { return e->g; }

const char *grammar_entry_schema(const struct grammar_entry *e, size_t *len)
{
    *len = e->schema_len;
    return e->schema;
}

void grammar_cache_counts(struct grammar_cache *c, long *hits, long *misses)
{
    pthread_mutex_lock(&c->mu);
    *hits = c->hits;
    *misses = c->misses;
    pthread_mutex_unlock(&c->mu);
}

static bool entry_is(const struct grammar_entry *e, enum grammar_kind kind, unsigned flags, const char *text,
                     size_t len)
{
    return e->kind == kind && e->flags == flags && e->len == len && !memcmp(e->text, text, len);
}

/* Finds the key and moves it to the front with a new reference; NULL on a miss. Under c->mu. */
static struct grammar_entry *cache_find(struct grammar_cache *c, enum grammar_kind kind, unsigned flags,
                                        const char *text, size_t len)
{
    for (struct grammar_entry **p = &c->head; *p; p = &(*p)->next) {
        struct grammar_entry *e = *p;
        if (!entry_is(e, kind, flags, text, len))
            continue;
        *p = e->next;
        e->next = c->head;
        c->head = e;
        grammar_entry_ref(e);
        return e;
    }
    return NULL;
}

static struct grammar_entry *entry_compile(enum grammar_kind kind, unsigned flags, const char *text, size_t len,
                                           int *rc, char *err)
{
    struct grammar_entry *e = calloc(1, sizeof *e);
    if (!e || !(e->text = malloc(len + 1))) {
        free(e);
        *rc = err_set(err, ERR_NOMEM, "out of memory compiling the grammar");
        return NULL;
    }
    memcpy(e->text, text, len);
    e->text[len] = 0;
    e->len = len;
    e->kind = kind;
    e->flags = flags;
    atomic_init(&e->refs, 1);
    if (kind == GRAMMAR_KIND_GBNF) {
        *rc = grammar_compile_gbnf(text, len, &e->g, err);
    } else if (kind == GRAMMAR_KIND_SCHEMA) {
        *rc = grammar_compile_schema(text, len, flags, &e->g, err);
        e->schema = e->text;
        e->schema_len = len;
    } else {
        *rc = grammar_compile_json_object(flags, &e->g, err);
        e->schema = json_object_schema;
        e->schema_len = sizeof json_object_schema - 1;
    }
    if (*rc) {
        free(e->text);
        free(e);
        return NULL;
    }
    return e;
}

int grammar_cache_get(struct grammar_cache *c, enum grammar_kind kind, unsigned flags, const char *text, size_t len,
                      struct grammar_entry **out, char *err)
{
    *out = NULL;
    if (kind == GRAMMAR_KIND_JSON_OBJECT)
        text = "", len = 0;
    if (c) {
        pthread_mutex_lock(&c->mu);
        *out = cache_find(c, kind, flags, text, len);
        if (*out)
            c->hits++;
        pthread_mutex_unlock(&c->mu);
        if (*out)
            return 0;
    }
    int rc = 0;
    struct grammar_entry *e = entry_compile(kind, flags, text, len, &rc, err);
    if (!e)
        return rc;
    if (!c) {
        *out = e;
        return 0;
    }
    pthread_mutex_lock(&c->mu);
    c->misses++;
    struct grammar_entry *again = cache_find(c, kind, flags, text, len);
    if (again) { /* another thread compiled it meanwhile: use the cached one */
        pthread_mutex_unlock(&c->mu);
        grammar_entry_unref(e);
        *out = again;
        return 0;
    }
    grammar_entry_ref(e); /* the cache's reference */
    e->next = c->head;
    c->head = e;
    if (++c->n > c->max) { /* drop the least recently used */
        struct grammar_entry **p = &c->head;
        while ((*p)->next)
            p = &(*p)->next;
        struct grammar_entry *last = *p;
        *p = NULL;
        c->n--;
        grammar_entry_unref(last);
    }
    pthread_mutex_unlock(&c->mu);
    *out = e;
    return 0;
}
