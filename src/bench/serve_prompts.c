/*
 * serve_prompts: synthetic prompts, JSONL datasets and quality sets. The word list holds short common words
 * that llama-family tokenizers keep whole (with their leading space), which is what makes "one word is about
 * one token" hold without a tokenizer; serve_run.c can refine the ratio through a server's /tokenize.
 * Every prompt starts with different random words, so a server's prefix cache cannot turn the benchmark
 * into a cache benchmark.
 */
#include "bench/serve_prompts.h"

#include "core/err.h"

#include <ctype.h>
#include <errno.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char *const prompt_words[] = {
    "the", "of", "and", "to", "in", "is", "that", "for", "it", "as", "was", "with", "be", "by", "on", "not",
    "he", "this", "are", "or", "his", "from", "at", "which", "but", "have", "an", "had", "they", "you",
    "were", "their", "one", "all", "we", "can", "her", "has", "there", "been", "if", "more", "when", "will",
    "would", "who", "so", "no", "she", "other", "its", "may", "these", "about", "over", "some", "into",
    "than", "out", "time", "only", "new", "could", "what", "up", "any", "two", "first", "then", "them",
    "after", "made", "most", "many", "also", "where", "well", "our", "like", "through", "should", "people",
    "each", "must", "such", "those", "both", "under", "among", "world", "life", "day", "year", "work",
    "water", "house", "place", "part", "home", "hand", "city", "light", "night", "school", "family", "music",
    "story", "power", "money", "group", "game", "river", "table", "garden", "morning", "window", "paper",
    "child", "friend", "road", "book", "letter", "field", "tree", "stone", "cloud", "rain", "snow", "wind",
    "fire", "sun", "moon", "star", "sea", "ship", "train", "car", "horse", "bird", "fish", "dog", "cat",
    "apple", "bread", "milk", "tea", "coffee", "sugar", "salt", "green", "blue", "red", "white", "black",
    "small", "large", "long", "short", "high", "low", "old", "young", "early", "late", "good", "great",
    "little", "own", "right", "big", "open", "free", "full", "strong", "simple", "clear", "quick", "slow",
    "warm", "cold", "bright", "quiet", "happy", "careful", "ready", "able", "near", "far", "often", "never",
    "always", "again", "still", "almost", "together", "between", "before", "around", "along", "across",
    "behind", "above", "below", "without", "because", "while", "until", "during", "make", "take", "come",
    "give", "find", "think", "tell", "ask", "feel", "try", "leave", "call", "keep", "help", "show", "play",
    "move", "live", "hold", "bring", "write", "stand", "learn", "change", "watch", "follow", "stop", "read",
    "walk", "grow", "close", "speak", "build", "send", "reach", "turn", "start", "carry", "draw", "sing",
    "answer", "question", "number", "system", "market", "sound", "voice", "color", "picture", "idea",
    "reason", "plan", "rule", "line", "side", "end", "point", "form", "word", "name", "kind", "head", "eye",
    "face", "door", "wall", "floor", "room", "bed", "chair", "glass", "box", "bag", "key", "path", "bridge",
    "hill", "valley", "island", "forest", "lake", "beach", "farm", "village", "country", "state", "king",
    "queen", "doctor", "teacher", "student", "worker", "farmer", "captain", "soldier", "artist", "writer",
};
#define PROMPT_N_WORDS (sizeof prompt_words / sizeof prompt_words[0])

static uint64_t prompt_rand(uint64_t *s)
{
    /* splitmix64: tiny, seedable with any value, good enough to pick words */
    uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

void serve_prompts_free(struct serve_prompt_set *s)
{
    if (!s)
        return;
    for (int i = 0; i < s->n; i++) {
        free(s->items[i].text);
        for (int k = 0; k < s->items[i].n_keywords; k++)
            free(s->items[i].keywords[k]);
        free(s->items[i].keywords);
    }
    free(s->items);
    s->items = NULL;
    s->n = 0;
}

int serve_prompts_synthetic(struct serve_prompt_set *out, int n, int n_words, int target_tokens, int max_tokens,
                            uint64_t seed, char *err)
{
    out->items = NULL;
    out->n = 0;
    if (n < 0 || n_words < 1 || n_words > (1 << 22))
        return err_set(err, ERR_INVALID_ARG, "synthetic prompts need 1..%d words, not %d", 1 << 22, n_words);
    if (n == 0)
        return 0;
    out->items = calloc((size_t)n, sizeof *out->items);
    if (!out->items)
        return err_set(err, ERR_NOMEM, "out of memory for %d prompts", n);
    uint64_t rng = seed ^ ((uint64_t)n_words * 0x2545f4914f6cdd1dull);
    for (int i = 0; i < n; i++) {
        size_t cap = (size_t)n_words * 12 + 1, len = 0;
        char *t = malloc(cap);
        if (!t) {
            serve_prompts_free(out);
            return err_set(err, ERR_NOMEM, "out of memory for a %d-word prompt", n_words);
        }
        for (int w = 0; w < n_words; w++) {
            const char *word = prompt_words[prompt_rand(&rng) % PROMPT_N_WORDS];
            size_t wl = strlen(word);
            if (w)
                t[len++] = ' ';
            memcpy(t + len, word, wl);
            len += wl;
        }
        t[len] = '\0';
        out->items[i].text = t;
        out->items[i].max_tokens = max_tokens;
        out->items[i].approx_tokens = target_tokens;
        out->n = i + 1;
    }
    return 0;
}

/* Reads the JSONL file line by line; row() turns each object into items[n]. */
static int prompts_load_jsonl(struct serve_prompt_set *out, const char *path, int default_max_tokens, bool quality,
                              char *err)
{
    out->items = NULL;
    out->n = 0;
    FILE *f = fopen(path, "r");
    if (!f)
        return err_set(err, ERR_IO, "cannot open %s: %s", path, strerror(errno));
    int rc = 0, cap = 0, lineno = 0;
    char *line = NULL;
    size_t line_cap = 0;
    ssize_t got;
    while ((got = getline(&line, &line_cap, f)) >= 0) {
        lineno++;
        size_t len = (size_t)got;
        while (len && isspace((unsigned char)line[len - 1]))
            len--;
        size_t a = 0;
        while (a < len && isspace((unsigned char)line[a]))
            a++;
        if (a == len)
            continue;
        json_error_t jerr;
        json_t *o = json_loadb(line + a, len - a, 0, &jerr);
        if (!o) {
            rc = err_set(err, ERR_FORMAT, "%s:%d: not valid JSON (%s)", path, lineno, jerr.text);
            goto fail;
        }
        json_t *p = json_object_get(o, "prompt");
        json_t *mt = json_object_get(o, "max_tokens");
        json_t *kw = json_object_get(o, "expected_keywords");
        const char *why = NULL;
        if (!json_is_object(o))
            why = "each line must be a JSON object";
        else if (!json_is_string(p) || json_string_length(p) == 0)
            why = "\"prompt\" must be a non-empty string";
        else if (mt && !json_is_null(mt) &&
                 (!json_is_integer(mt) || json_integer_value(mt) < 1 || json_integer_value(mt) > 1000000))
            why = "\"max_tokens\" must be an integer in 1..1000000";
        else if (quality && (!json_is_array(kw) || json_array_size(kw) == 0))
            why = "\"expected_keywords\" must be a non-empty array of strings";
        if (!why && quality) {
            for (size_t k = 0; k < json_array_size(kw); k++)
                if (!json_is_string(json_array_get(kw, k)) || json_string_length(json_array_get(kw, k)) == 0)
                    why = "\"expected_keywords\" must hold non-empty strings";
        }
        if (why) {
            json_decref(o);
            rc = err_set(err, ERR_FORMAT, "%s:%d: %s", path, lineno, why);
            goto fail;
        }
        if (out->n == cap) {
            int nc = cap ? cap * 2 : 64;
            struct serve_prompt *ni = realloc(out->items, (size_t)nc * sizeof *ni);
            if (!ni) {
                json_decref(o);
                rc = err_set(err, ERR_NOMEM, "out of memory reading %s", path);
                goto fail;
            }
            out->items = ni;
            cap = nc;
        }
        struct serve_prompt *it = &out->items[out->n];
        memset(it, 0, sizeof *it);
        it->text = strdup(json_string_value(p));
        it->max_tokens = json_is_integer(mt) ? (int)json_integer_value(mt) : default_max_tokens;
        it->approx_tokens = -1;
        out->n++;
        bool oom = !it->text;
        if (quality && !oom) {
            it->keywords = calloc(json_array_size(kw), sizeof *it->keywords);
            oom = !it->keywords;
            for (size_t k = 0; !oom && k < json_array_size(kw); k++) {
                it->keywords[k] = strdup(json_string_value(json_array_get(kw, k)));
                oom = !it->keywords[k];
                it->n_keywords = (int)k + 1;
            }
        }
        json_decref(o);
        if (oom) {
            rc = err_set(err, ERR_NOMEM, "out of memory reading %s", path);
            goto fail;
        }
    }
    if (ferror(f)) {
        rc = err_set(err, ERR_IO, "error reading %s: %s", path, strerror(errno));
        goto fail;
    }
    if (out->n == 0) {
        rc = err_set(err, ERR_FORMAT, "%s: no prompts in the file (expected one JSON object per line)", path);
        goto fail;
    }
    free(line);
    fclose(f);
    return 0;
fail:
    free(line);
    fclose(f);
    serve_prompts_free(out);
    return rc;
}

int serve_prompts_load_dataset(struct serve_prompt_set *out, const char *path, int default_max_tokens, char *err)
{
    return prompts_load_jsonl(out, path, default_max_tokens, false, err);
}

int serve_prompts_load_quality(struct serve_prompt_set *out, const char *path, int default_max_tokens, char *err)
{
    return prompts_load_jsonl(out, path, default_max_tokens, true, err);
}

int serve_prompts_take(struct serve_prompt_set *out, const struct serve_prompt_set *src, int first, int n, char *err)
{
    out->items = NULL;
    out->n = 0;
    if (n <= 0 || src->n == 0)
        return 0;
    out->items = calloc((size_t)n, sizeof *out->items);
    if (!out->items)
        return err_set(err, ERR_NOMEM, "out of memory for %d prompts", n);
    for (int i = 0; i < n; i++) {
        const struct serve_prompt *s = &src->items[((long long)first + i) % src->n];
        out->items[i].text = strdup(s->text);
        out->items[i].max_tokens = s->max_tokens;
        out->items[i].approx_tokens = s->approx_tokens;
        out->n = i + 1;
        if (!out->items[i].text) {
            serve_prompts_free(out);
            return err_set(err, ERR_NOMEM, "out of memory for %d prompts", n);
        }
    }
    return 0;
}

static bool prompts_contains_nocase(const char *hay, const char *needle)
{
    size_t nl = strlen(needle);
    for (const char *h = hay; *h; h++) {
        size_t i = 0;
        while (i < nl && h[i] && tolower((unsigned char)h[i]) == tolower((unsigned char)needle[i]))
            i++;
        if (i == nl)
            return true;
    }
    return nl == 0;
}

double serve_quality_score(const char *answer, const struct serve_prompt *p, bool *found)
{
    if (p->n_keywords == 0)
        return 1.0;
    int hits = 0;
    for (int k = 0; k < p->n_keywords; k++) {
        bool f = answer && prompts_contains_nocase(answer, p->keywords[k]);
        if (found)
            found[k] = f;
        hits += f;
    }
    return (double)hits / (double)p->n_keywords;
}
