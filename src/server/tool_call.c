/*
 * tool_call: the grammar of a tool-calling answer and reading the calls back out of it.
 *
 * Grammar: one JSON Schema describes one call, {"name": {"const": N}, "arguments": <the function's
 * parameters>} (Llama 3: "parameters"; Mistral adds the 9-character "id"), an anyOf over the tools that may
 * be called; every function's parameters go under $defs/t<i> with their own $refs re-rooted there, so
 * recursive parameter schemas stay recursive. The JSON Schema compiler turns it into GBNF (its start rule
 * `root` is never referenced by its other rules, so it is renamed and wrapped), and the format's frame is
 * written around it: the markers, repetition for parallel calls (parallel_tool_calls false: exactly one),
 * and for tool_choice auto the alternative of text that does not begin with the marker. The generic form
 * is a schema whole ({"tool_calls": [...]} or, for auto, anyOf that and {"response": string}).
 *
 * Reading back is strict: an answer the grammar allowed always reads; anything else (which would be a bug)
 * is an error, never a guess. Each call's arguments are then validated against the original parameter
 * schema with the JSON Schema validator, as every constrained answer is.
 */
#include "server/tool_call.h"

#include "core/err.h"
#include "engine/grammar/grammar.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Rewrites every "$ref": "#..." inside v to point under prefix (a JSON pointer such as "#/$defs/t0"). */
static int reroot_refs(json_t *v, const char *prefix)
{
    if (json_is_array(v)) {
        for (size_t i = 0; i < json_array_size(v); i++)
            if (reroot_refs(json_array_get(v, i), prefix))
                return ERR_NOMEM;
        return 0;
    }
    if (!json_is_object(v))
        return 0;
    const char *key;
    json_t *x;
    json_object_foreach(v, key, x) {
        if (!strcmp(key, "$ref") && json_is_string(x) && json_string_value(x)[0] == '#') {
            size_t n = strlen(prefix) + json_string_length(x) + 1;
            char *r = malloc(n);
            if (!r)
                return ERR_NOMEM;
            snprintf(r, n, "%s%s", prefix, json_string_value(x) + 1);
            int rc = json_string_set(x, r);
            free(r);
            if (rc)
                return ERR_NOMEM;
        } else if (reroot_refs(x, prefix)) {
            return ERR_NOMEM;
        }
    }
    return 0;
}

/* The schema of one call of tool i. */
static json_t *call_schema(enum chat_tool_format fmt, const struct gen_request *g, int i)
{
    char ref[32];
    snprintf(ref, sizeof ref, "#/$defs/t%d", i);
    const char *args = fmt == CHAT_TOOLS_LLAMA3 ? "parameters" : "arguments";
    json_t *props = json_pack("{s:{s:s},s:{s:s}}", "name", "const", g->tools[i].name, args, "$ref", ref);
    json_t *req = json_pack("[s,s]", "name", args);
    if (fmt == CHAT_TOOLS_MISTRAL && props && req) {
        json_object_set_new(props, "id", json_pack("{s:s,s:s}", "type", "string", "pattern", "^[a-zA-Z0-9]{9}$"));
        json_array_append_new(req, json_string("id"));
    }
    if (!props || !req) {
        json_decref(props);
        json_decref(req);
        return NULL;
    }
    return json_pack("{s:s,s:o,s:o,s:b}", "type", "object", "properties", props, "required", req,
                     "additionalProperties", 0);
}

/* The schema document of one call (or, for Mistral and the generic form, of the whole answer). */
static json_t *answer_schema(enum chat_tool_format fmt, const struct gen_request *g, struct api_error *e)
{
    json_t *doc = json_object(), *defs = json_object(), *alts = json_array();
    if (!doc || !defs || !alts)
        goto oom;
    json_object_set(doc, "$defs", defs);
    for (int i = 0; i < g->n_tools; i++) {
        json_t *p;
        if (g->tool_params[i]) {
            p = json_loads(g->tool_params[i], 0, NULL);
            char prefix[32];
            snprintf(prefix, sizeof prefix, "#/$defs/t%d", i);
            if (p && reroot_refs(p, prefix)) {
                json_decref(p);
                p = NULL;
            }
        } else {
            p = json_pack("{s:s}", "type", "object");
        }
        char name[32];
        snprintf(name, sizeof name, "t%d", i);
        if (!p || json_object_set_new(defs, name, p))
            goto oom;
        if (g->tool_choice == GEN_TOOLS_NAMED && i != g->tool_named)
            continue;
        json_t *c = call_schema(fmt, g, i);
        if (!c || json_array_append_new(alts, c))
            goto oom;
    }
    json_t *one = json_array_size(alts) == 1 ? json_incref(json_array_get(alts, 0)) : json_pack("{s:O}", "anyOf", alts);
    if (!one)
        goto oom;
    json_t *body = one;
    if (fmt == CHAT_TOOLS_MISTRAL || fmt == CHAT_TOOLS_GENERIC) {
        body = json_pack("{s:s,s:o,s:i}", "type", "array", "items", one, "minItems", 1);
        if (body && !g->parallel_tool_calls)
            json_object_set_new(body, "maxItems", json_integer(1));
        if (body && fmt == CHAT_TOOLS_GENERIC) {
            json_t *calls = json_pack("{s:s,s:{s:o},s:[s],s:b}", "type", "object", "properties", "tool_calls", body,
                                      "required", "tool_calls", "additionalProperties", 0);
            body = calls;
            if (calls && g->tool_choice == GEN_TOOLS_AUTO)
                body = json_pack("{s:[o,{s:s,s:{s:{s:s}},s:[s],s:b}]}", "anyOf", calls, "type", "object",
                                 "properties", "response", "type", "string", "required", "response",
                                 "additionalProperties", 0);
        }
        if (!body)
            goto oom;
    }
    if (json_object_update(doc, body)) {
        json_decref(body);
        goto oom;
    }
    json_decref(body);
    json_decref(defs);
    json_decref(alts);
    return doc;
oom:
    json_decref(doc);
    json_decref(defs);
    json_decref(alts);
    api_error_set(e, ERR_NOMEM, "tools", NULL, "out of memory");
    return NULL;
}

struct text {
    char *p;
    size_t n, cap;
    bool oom;
};

static void tput(struct text *t, const char *s, size_t n)
{
    if (t->oom)
        return;
    if (t->n + n + 1 > t->cap) {
        size_t cap = t->cap ? t->cap * 2 : 1024;
        while (cap < t->n + n + 1)
            cap *= 2;
        char *p = realloc(t->p, cap);
        if (!p) {
            t->oom = true;
            return;
        }
        t->p = p;
        t->cap = cap;
    }
    memcpy(t->p + t->n, s, n);
    t->n += n;
    t->p[t->n] = 0;
}

static void tputs(struct text *t, const char *s) { tput(t, s, strlen(s)); }

/* One byte as GBNF escape, usable in literals and classes alike. */
static void tput_byte(struct text *t, unsigned char c)
{
    char b[8];
    if ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == ' ' || c == '_')
        snprintf(b, sizeof b, "%c", c);
    else
        snprintf(b, sizeof b, "\\x%02X", c);
    tputs(t, b);
}

static void tput_lit(struct text *t, const char *s)
{
    tputs(t, "\"");
    for (; *s; s++)
        tput_byte(t, (unsigned char)*s);
    tputs(t, "\"");
}

/* tc-free: any text that does not begin with marker (empty included). */
static void tput_free_rule(struct text *t, const char *marker, bool exclude_ws)
{
    size_t n = strlen(marker);
    tputs(t, "tc-free ::= \"\"");
    for (size_t k = 0; k < n; k++) { /* marker[0..k) then a byte other than marker[k] */
        tputs(t, " | ");
        if (k) {
            char pre[256];
            snprintf(pre, sizeof pre, "%.*s", (int)k, marker);
            tput_lit(t, pre);
            tputs(t, " ( ");
        }
        tputs(t, "[^");
        tput_byte(t, (unsigned char)marker[k]);
        if (!k && exclude_ws)
            tputs(t, " \\t\\n\\r");
        tputs(t, "] .*");
        if (k)
            tputs(t, " )?");
    }
    tputs(t, "\n");
}

int tool_grammar_build(enum chat_tool_format fmt, const struct gen_request *g, char **gbnf, struct api_error *e)
{
    *gbnf = NULL;
    json_t *doc = answer_schema(fmt, g, e);
    if (!doc)
        return e->code;
    char *schema = json_dumps(doc, JSON_COMPACT);
    json_decref(doc);
    if (!schema)
        return api_error_set(e, ERR_NOMEM, "tools", NULL, "out of memory");
    char err[ERR_MSG_MAX], *body = NULL;
    int rc = grammar_schema_to_gbnf(schema, strlen(schema), 0, &body, err);
    free(schema);
    if (rc) {
        /* name the tool: its parameters sit under /$defs/t<i> */
        int i = -1;
        const char *at = strstr(err, "/$defs/t");
        if (at)
            sscanf(at, "/$defs/t%d", &i);
        char param[64];
        snprintf(param, sizeof param, i >= 0 && i < g->n_tools ? "tools[%d].function.parameters" : "tools", i);
        return api_error_set(e, rc, param, NULL, "invalid '%s': %s", param, err);
    }
    if (fmt == CHAT_TOOLS_GENERIC) { /* the schema is the whole answer */
        *gbnf = body;
        return 0;
    }
    if (strncmp(body, "root ::= ", 9)) {
        free(body);
        return api_error_set(e, ERR_INTERNAL, "tools", NULL, "unexpected grammar from the schema compiler");
    }
    struct text t = {0};
    bool parallel = g->parallel_tool_calls && fmt != CHAT_TOOLS_LLAMA3; /* Meta's format: one call a turn */
    const char *marker = NULL;
    switch (fmt) {
    case CHAT_TOOLS_HERMES:
        marker = "<tool_call>";
        tputs(&t, "tc-calls ::= \"<tool_call>\\n\" tc-call \"\\n</tool_call>\"");
        if (parallel)
            tputs(&t, " ( \"\\n<tool_call>\\n\" tc-call \"\\n</tool_call>\" )*");
        tputs(&t, "\n");
        break;
    case CHAT_TOOLS_MISTRAL:
        marker = "[TOOL_CALLS]";
        tputs(&t, "tc-calls ::= \"[TOOL_CALLS]\" tc-call\n"); /* the call rule is the JSON array */
        break;
    default:
        marker = "{";
        tputs(&t, "tc-calls ::= tc-call\n");
        break;
    }
    if (g->tool_choice == GEN_TOOLS_AUTO) {
        tputs(&t, "root ::= tc-calls | tc-free\n");
        tput_free_rule(&t, marker, fmt == CHAT_TOOLS_LLAMA3);
    } else {
        tputs(&t, "root ::= tc-calls\n");
    }
    tputs(&t, "tc-call ::= ");
    tputs(&t, body + 9);
    free(body);
    if (t.oom) {
        free(t.p);
        return api_error_set(e, ERR_NOMEM, "tools", NULL, "out of memory");
    }
    *gbnf = t.p;
    return 0;
}

/* ---- reading calls back ---- */

bool tool_answer_is_text(enum chat_tool_format fmt, const char *text, size_t len)
{
    const char *marker = fmt == CHAT_TOOLS_HERMES ? "<tool_call>" : fmt == CHAT_TOOLS_MISTRAL ? "[TOOL_CALLS]" : "{";
    if (fmt == CHAT_TOOLS_GENERIC || !len)
        return false;
    if (fmt == CHAT_TOOLS_LLAMA3) /* a call may begin with whitespace, text may not (the grammar's tc-free) */
        return !strchr("{ \t\n\r", text[0]);
    size_t n = strlen(marker);
    return memcmp(text, marker, len < n ? len : n) != 0;
}

static const char *skip_ws(const char *p, const char *end)
{
    while (p < end && (*p == ' ' || *p == '\t' || *p == '\n' || *p == '\r'))
        p++;
    return p;
}

static bool starts(const char *p, const char *end, const char *lit)
{
    size_t n = strlen(lit);
    return (size_t)(end - p) >= n && !memcmp(p, lit, n);
}

/* Parses one JSON value at p; *next gets the byte after it. NULL when there is none. */
static json_t *json_at(const char *p, const char *end, const char **next)
{
    json_error_t je;
    json_t *v = json_loadb(p, (size_t)(end - p), JSON_DISABLE_EOF_CHECK | JSON_REJECT_DUPLICATES | JSON_DECODE_ANY,
                           &je);
    if (v)
        *next = p + je.position;
    return v;
}

/* Appends the call obj ({name, arguments|parameters[, id]}) to calls as OpenAI's shape, validated. */
static int add_call(json_t *calls, json_t *obj, const char *args_key, const struct chat_tool *tools,
                    char *const *params, int n_tools, const char *id_prefix, char *err)
{
    json_t *name = json_object_get(obj, "name"), *args = json_object_get(obj, args_key);
    json_t *id = json_object_get(obj, "id");
    if (!json_is_string(name) || !json_is_object(args))
        return err_set(err, ERR_INVALID_ARG, "a tool call without a name or an arguments object");
    int t = -1;
    for (int i = 0; i < n_tools; i++)
        if (!strcmp(tools[i].name, json_string_value(name)))
            t = i;
    if (t < 0)
        return err_set(err, ERR_INVALID_ARG, "a call of '%.64s', which is not one of the tools", json_string_value(name));
    char *text = json_dumps(args, JSON_COMPACT);
    if (!text)
        return err_set(err, ERR_NOMEM, "out of memory");
    if (params[t]) {
        char verr[ERR_MSG_MAX];
        int rc = json_schema_validate(params[t], strlen(params[t]), text, strlen(text), verr);
        if (rc) {
            free(text);
            return err_set(err, ERR_INVALID_ARG, "the arguments of '%s' fail its parameter schema: %.160s",
                           tools[t].name, verr);
        }
    }
    char idbuf[96];
    snprintf(idbuf, sizeof idbuf, "%s_%zu", id_prefix, json_array_size(calls));
    json_t *c = json_pack("{s:s,s:s,s:{s:s,s:s}}", "id", json_is_string(id) ? json_string_value(id) : idbuf, "type",
                          "function", "function", "name", tools[t].name, "arguments", text);
    free(text);
    if (!c || json_array_append_new(calls, c))
        return err_set(err, ERR_NOMEM, "out of memory");
    return 0;
}

int tool_calls_parse(enum chat_tool_format fmt, const char *text, size_t len, const struct chat_tool *tools,
                     char *const *params, int n_tools, const char *id_prefix, json_t **calls_out,
                     json_t **content_out, char *err)
{
    const char *p = text ? text : "", *end = p + len;
    json_t *calls = json_array(), *v = NULL;
    json_t *content = NULL;
    int rc = 0;
    *calls_out = NULL;
    *content_out = NULL;
    if (!calls)
        return err_set(err, ERR_NOMEM, "out of memory");
    const char *q = skip_ws(p, end);
    switch (fmt) {
    case CHAT_TOOLS_HERMES:
        if (!starts(p, end, "<tool_call>"))
            break;
        while (!rc && starts(p, end, "<tool_call>")) {
            const char *next;
            if (!(v = json_at(p + 11, end, &next)) || !json_is_object(v)) {
                rc = err_set(err, ERR_INVALID_ARG, "a <tool_call> block without a JSON object");
                break;
            }
            rc = add_call(calls, v, "arguments", tools, params, n_tools, id_prefix, err);
            json_decref(v);
            v = NULL;
            p = skip_ws(next, end);
            if (!rc && !starts(p, end, "</tool_call>"))
                rc = err_set(err, ERR_INVALID_ARG, "a <tool_call> block without its </tool_call>");
            if (!rc)
                p = skip_ws(p + 12, end);
        }
        if (!rc && p < end)
            rc = err_set(err, ERR_INVALID_ARG, "text after the tool calls");
        goto done;
    case CHAT_TOOLS_MISTRAL:
        if (!starts(p, end, "[TOOL_CALLS]"))
            break;
        q = p + 12;
        __attribute__((fallthrough)); /* a JSON array of calls */
    case CHAT_TOOLS_GENERIC:
    case CHAT_TOOLS_LLAMA3: {
        if (fmt == CHAT_TOOLS_LLAMA3 && (q == end || *q != '{'))
            break;
        const char *next;
        if (!(v = json_at(q, end, &next)) || skip_ws(next, end) != end) {
            rc = err_set(err, ERR_INVALID_ARG, "the answer is not one JSON value");
            goto done;
        }
        json_t *arr = fmt == CHAT_TOOLS_MISTRAL ? v : fmt == CHAT_TOOLS_GENERIC ? json_object_get(v, "tool_calls") : NULL;
        if (fmt == CHAT_TOOLS_GENERIC && !arr) {
            json_t *resp = json_object_get(v, "response");
            if (!json_is_string(resp)) {
                rc = err_set(err, ERR_INVALID_ARG, "the answer has neither tool_calls nor response");
                goto done;
            }
            content = json_incref(resp);
            goto done;
        }
        if (fmt == CHAT_TOOLS_LLAMA3) {
            rc = json_is_object(v) ? add_call(calls, v, "parameters", tools, params, n_tools, id_prefix, err)
                                   : err_set(err, ERR_INVALID_ARG, "the call is not a JSON object");
            goto done;
        }
        if (!json_is_array(arr) || json_array_size(arr) == 0) {
            rc = err_set(err, ERR_INVALID_ARG, "the tool calls are not a non-empty array");
            goto done;
        }
        for (size_t i = 0; !rc && i < json_array_size(arr); i++)
            rc = json_is_object(json_array_get(arr, i))
                     ? add_call(calls, json_array_get(arr, i), "arguments", tools, params, n_tools, id_prefix, err)
                     : err_set(err, ERR_INVALID_ARG, "a tool call is not a JSON object");
        goto done;
    }
    }
    /* text: no calls, the caller shows the text itself */
done:
    json_decref(v);
    if (rc) {
        json_decref(calls);
        json_decref(content);
        return rc;
    }
    *calls_out = calls;
    *content_out = content;
    return 0;
}
