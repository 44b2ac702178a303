/*
 * request_validate: jansson parses the body (duplicate keys refused, NUL in strings refused); small typed
 * getters then check each field's type and range and name the parameter on failure. A JSON null counts as
 * absent, as OpenAI's own clients send nulls for unset fields. Unknown fields are ignored (clients send
 * extras such as "user"), but fields that would change the output and that wafer does not implement
 * (the legacy functions / function_call, suffix) are refused rather than silently dropped. Tools are taken
 * apart here (names, the parameter schemas as compact JSON, tool_choice); the server renders them with the
 * chat template and builds the grammar their calls must follow (tool_call.c). Structured output (response_format,
 * grammar, json_schema) is taken apart here and compiled by the server (api_prepare.c), which answers a
 * malformed schema or grammar 400 with the compiler's position.
 */
#include "server/request_validate.h"

#include "core/err.h"
#include "engine/grammar/grammar.h"
#include "engine/grammar/grammar_cache.h"
#include "engine/scheduler.h"

#include <errno.h>
#include <jansson.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int api_error_set(struct api_error *e, int code, const char *param, const char *oa_code, const char *fmt, ...)
{
    if (!e)
        return code;
    e->code = code;
    snprintf(e->param, sizeof e->param, "%s", param ? param : "");
    e->oa_code = oa_code;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(e->message, sizeof e->message, fmt, ap);
    va_end(ap);
    return code;
}

void gen_defaults_init(struct gen_defaults *d)
{
    d->max_new_tokens = 256;
    d->temperature = 0.8f;
    d->top_p = 0.95f;
    d->min_p = 0.05f;
    d->top_k = 40;
    d->repeat_penalty = 1.0f;
    d->parse_special = false;
}

static const char *json_type_name(const json_t *v)
{
    switch (json_typeof(v)) {
    case JSON_OBJECT: return "an object";
    case JSON_ARRAY: return "an array";
    case JSON_STRING: return "a string";
    case JSON_INTEGER: return "an integer";
    case JSON_REAL: return "a number";
    case JSON_TRUE:
    case JSON_FALSE: return "a boolean";
    case JSON_NULL: return "null";
    }
    return "something else";
}

/* Field lookup with null treated as absent. */
static json_t *jget(json_t *o, const char *key)
{
    json_t *v = json_object_get(o, key);
    return v && !json_is_null(v) ? v : NULL;
}

/* Integer field: *present tells whether it was there. */
static int jint(json_t *o, const char *key, long long lo, long long hi, long long *out, bool *present,
                struct api_error *e)
{
    json_t *v = jget(o, key);
    if (present)
        *present = v != NULL;
    if (!v)
        return 0;
    long long x;
    if (json_is_integer(v)) {
        x = json_integer_value(v);
    } else if (json_is_real(v) && json_real_value(v) == floor(json_real_value(v)) &&
               fabs(json_real_value(v)) < 9e15) {
        x = (long long)json_real_value(v);
    } else {
        return api_error_set(e, ERR_INVALID_ARG, key, NULL, "'%s' must be an integer, got %s", key,
                             json_type_name(v));
    }
    if (x < lo || x > hi)
        return api_error_set(e, ERR_INVALID_ARG, key, NULL, "'%s' must be between %lld and %lld, got %lld", key, lo,
                             hi, x);
    *out = x;
    return 0;
}

/* Number field in [lo, hi] (lo excluded when lo_open). */
static int jnum(json_t *o, const char *key, double lo, double hi, bool lo_open, float *out, struct api_error *e)
{
    json_t *v = jget(o, key);
    if (!v)
        return 0;
    if (!json_is_number(v))
        return api_error_set(e, ERR_INVALID_ARG, key, NULL, "'%s' must be a number, got %s", key, json_type_name(v));
    double x = json_number_value(v);
    if (!isfinite(x) || x > hi || (lo_open ? x <= lo : x < lo))
        return api_error_set(e, ERR_INVALID_ARG, key, NULL, "'%s' must be %s %g and <= %g, got %g", key,
                             lo_open ? ">" : ">=", lo, hi, x);
    *out = (float)x;
    return 0;
}

static int jbool(json_t *o, const char *key, bool *out, struct api_error *e)
{
    json_t *v = jget(o, key);
    if (!v)
        return 0;
    if (!json_is_boolean(v))
        return api_error_set(e, ERR_INVALID_ARG, key, NULL, "'%s' must be a boolean, got %s", key,
                             json_type_name(v));
    *out = json_is_true(v);
    return 0;
}

static int jstr(json_t *o, const char *key, char **out, struct api_error *e)
{
    json_t *v = jget(o, key);
    if (!v)
        return 0;
    if (!json_is_string(v))
        return api_error_set(e, ERR_INVALID_ARG, key, NULL, "'%s' must be a string, got %s", key, json_type_name(v));
    free(*out);
    *out = strdup(json_string_value(v));
    return *out ? 0 : api_error_set(e, ERR_NOMEM, key, NULL, "out of memory");
}

/* stop: a string or an array of strings (OpenAI); stop_sequences for the simple API. */
static int jstop(json_t *o, const char *key, struct gen_request *r, struct api_error *e)
{
    json_t *v = jget(o, key);
    if (!v)
        return 0;
    json_t *one = NULL;
    size_t n;
    if (json_is_string(v)) {
        one = v;
        n = 1;
    } else if (json_is_array(v)) {
        n = json_array_size(v);
    } else {
        return api_error_set(e, ERR_INVALID_ARG, key, NULL, "'%s' must be a string or an array of strings, got %s",
                             key, json_type_name(v));
    }
    if (n > REQ_MAX_STOP)
        return api_error_set(e, ERR_INVALID_ARG, key, NULL, "'%s' may hold at most %d strings, got %zu", key,
                             REQ_MAX_STOP, n);
    r->stop = calloc(n ? n : 1, sizeof *r->stop);
    if (!r->stop)
        return api_error_set(e, ERR_NOMEM, key, NULL, "out of memory");
    for (size_t i = 0; i < n; i++) {
        json_t *s = one ? one : json_array_get(v, i);
        if (!json_is_string(s))
            return api_error_set(e, ERR_INVALID_ARG, key, NULL, "'%s[%zu]' must be a string, got %s", key, i,
                                 json_type_name(s));
        size_t len = json_string_length(s);
        if (len > REQ_MAX_STOP_LEN)
            return api_error_set(e, ERR_INVALID_ARG, key, NULL, "'%s[%zu]' is longer than %d bytes", key, i,
                                 REQ_MAX_STOP_LEN);
        if (!len)
            continue; /* an empty stop string would stop at once; ignore it as OpenAI does */
        if (!(r->stop[r->n_stop] = strdup(json_string_value(s))))
            return api_error_set(e, ERR_NOMEM, key, NULL, "out of memory");
        r->n_stop++;
    }
    return 0;
}

static int jtokens(json_t *v, const char *param, int32_t **out, int *n_out, struct api_error *e)
{
    size_t n = json_array_size(v);
    int32_t *t = malloc((n ? n : 1) * sizeof *t);
    if (!t)
        return api_error_set(e, ERR_NOMEM, param, NULL, "out of memory");
    for (size_t i = 0; i < n; i++) {
        json_t *x = json_array_get(v, i);
        if (!json_is_integer(x) || json_integer_value(x) < 0 || json_integer_value(x) > INT32_MAX) {
            free(t);
            return api_error_set(e, ERR_INVALID_ARG, param, NULL,
                                 "'%s[%zu]' must be a non-negative token id, got %s", param, i, json_type_name(x));
        }
        t[i] = (int32_t)json_integer_value(x);
    }
    *out = t;
    *n_out = (int)n;
    return 0;
}

/* prompt: "text" | ["text", ...] | [1, 2, 3] | [[1, 2], [3]] */
static int jprompt(json_t *o, const char *key, bool allow_multi, struct gen_request *r, struct api_error *e)
{
    json_t *v = jget(o, key);
    if (!v)
        return api_error_set(e, ERR_INVALID_ARG, key, NULL, "'%s' is required", key);
    if (json_is_string(v)) {
        r->prompts = calloc(1, sizeof *r->prompts);
        if (!r->prompts || !(r->prompts[0].text = strdup(json_string_value(v))))
            return api_error_set(e, ERR_NOMEM, key, NULL, "out of memory");
        r->n_prompts = 1;
        return 0;
    }
    if (!json_is_array(v) || !allow_multi)
        return api_error_set(e, ERR_INVALID_ARG, key, NULL, "'%s' must be a string%s, got %s", key,
                             allow_multi ? ", an array of strings or an array of token ids" : "", json_type_name(v));
    size_t n = json_array_size(v);
    if (!n)
        return api_error_set(e, ERR_INVALID_ARG, key, NULL, "'%s' must not be an empty array", key);
    if (json_is_integer(json_array_get(v, 0))) { /* one prompt of token ids */
        r->prompts = calloc(1, sizeof *r->prompts);
        if (!r->prompts)
            return api_error_set(e, ERR_NOMEM, key, NULL, "out of memory");
        r->n_prompts = 1;
        return jtokens(v, key, &r->prompts[0].tokens, &r->prompts[0].n_tokens, e);
    }
    if (n > REQ_MAX_PROMPTS)
        return api_error_set(e, ERR_INVALID_ARG, key, NULL, "'%s' may hold at most %d prompts, got %zu", key,
                             REQ_MAX_PROMPTS, n);
    r->prompts = calloc(n, sizeof *r->prompts);
    if (!r->prompts)
        return api_error_set(e, ERR_NOMEM, key, NULL, "out of memory");
    r->n_prompts = (int)n;
    for (size_t i = 0; i < n; i++) {
        json_t *p = json_array_get(v, i);
        char param[64];
        snprintf(param, sizeof param, "%s[%zu]", key, i);
        if (json_is_string(p)) {
            if (!(r->prompts[i].text = strdup(json_string_value(p))))
                return api_error_set(e, ERR_NOMEM, param, NULL, "out of memory");
        } else if (json_is_array(p) && json_array_size(p) > 0) {
            int rc = jtokens(p, param, &r->prompts[i].tokens, &r->prompts[i].n_tokens, e);
            if (rc)
                return rc;
        } else {
            return api_error_set(e, ERR_INVALID_ARG, param, NULL,
                                 "'%s' must be a string or a non-empty array of token ids, got %s", param,
                                 json_type_name(p));
        }
    }
    return 0;
}

/* An array of text parts [{"type": "text", "text": ...}] (param names it in errors): their texts
 * concatenated into *out (malloc'd; NULL on OOM); other part types are refused. */
static int jtext_parts(json_t *c, const char *param, char **out, struct api_error *e)
{
    size_t total = 1;
    for (size_t k = 0; k < json_array_size(c); k++) {
        json_t *part = json_array_get(c, k);
        json_t *type = json_is_object(part) ? json_object_get(part, "type") : NULL;
        json_t *t = json_is_object(part) ? json_object_get(part, "text") : NULL;
        if (!type || !json_is_string(type) || strcmp(json_string_value(type), "text") || !json_is_string(t))
            return api_error_set(e, ERR_INVALID_ARG, param, NULL,
                                 "'%s[%zu]' must be a text part {\"type\": \"text\", \"text\": ...}; "
                                 "images and audio are not supported", param, k);
        total += json_string_length(t);
    }
    char *text = malloc(total);
    if (text) {
        size_t off = 0;
        for (size_t k = 0; k < json_array_size(c); k++) {
            json_t *t = json_object_get(json_array_get(c, k), "text");
            memcpy(text + off, json_string_value(t), json_string_length(t));
            off += json_string_length(t);
        }
        text[off] = 0;
    }
    *out = text;
    return 0;
}

/* prediction (OpenAI's predicted outputs): {"type": "content", "content": text or text parts}, the output
 * the client expects; and wafer's "speculation": "off", "ngram" or "draft", the request's other drafts. */
static int jprediction(json_t *o, struct gen_request *r, struct api_error *e)
{
    json_t *p = jget(o, "prediction");
    if (p) {
        if (!json_is_object(p))
            return api_error_set(e, ERR_INVALID_ARG, "prediction", NULL,
                                 "'prediction' must be an object {\"type\": \"content\", \"content\": ...}, got %s",
                                 json_type_name(p));
        json_t *t = json_object_get(p, "type");
        if (!json_is_string(t) || strcmp(json_string_value(t), "content"))
            return api_error_set(e, ERR_INVALID_ARG, "prediction.type", NULL,
                                 "'prediction.type' must be \"content\" (the only type of predicted output)");
        json_t *c = json_object_get(p, "content");
        char *text = NULL;
        if (json_is_string(c))
            text = strdup(json_string_value(c));
        else if (json_is_array(c)) {
            int rc = jtext_parts(c, "prediction.content", &text, e);
            if (rc)
                return rc;
        } else
            return api_error_set(e, ERR_INVALID_ARG, "prediction.content", NULL,
                                 "'prediction.content' must be a string or an array of text parts");
        if (!text)
            return api_error_set(e, ERR_NOMEM, "prediction", NULL, "out of memory");
        free(r->prediction);
        r->prediction = text;
    }
    json_t *sv = jget(o, "speculation");
    if (sv) {
        const char *v = json_is_string(sv) ? json_string_value(sv) : "";
        r->spec = !strcmp(v, "off") ? SCHED_SPEC_OFF : !strcmp(v, "ngram") ? SCHED_SPEC_NGRAM
                : !strcmp(v, "draft") ? SCHED_SPEC_DRAFT : -1;
        if (r->spec < 0)
            return api_error_set(e, ERR_INVALID_ARG, "speculation", NULL,
                                 "'speculation' must be \"off\", \"ngram\" (n-gram drafts) or \"draft\" (the "
                                 "server's draft model); the output is the same");
    }
    return 0;
}

/* A function name as OpenAI allows it: 1 to 64 of a-z, A-Z, 0-9, '_' and '-' (so it needs no escaping in
 * any tool format). */
static bool tool_name_ok(const char *s)
{
    size_t n = strlen(s);
    if (n < 1 || n > 64)
        return false;
    for (size_t i = 0; i < n; i++)
        if (!((s[i] >= 'a' && s[i] <= 'z') || (s[i] >= 'A' && s[i] <= 'Z') || (s[i] >= '0' && s[i] <= '9') ||
              s[i] == '_' || s[i] == '-'))
            return false;
    return true;
}

/* Copies a string field of o (absent or null: NULL) into *out; 0 or an error naming param. */
static int jstr_opt(json_t *o, const char *key, const char *param, char **out, struct api_error *e)
{
    json_t *v = jget(o, key);
    *out = NULL;
    if (!v)
        return 0;
    if (!json_is_string(v))
        return api_error_set(e, ERR_INVALID_ARG, param, NULL, "'%s' must be a string, got %s", param,
                             json_type_name(v));
    *out = strdup(json_string_value(v));
    return *out ? 0 : api_error_set(e, ERR_NOMEM, param, NULL, "out of memory");
}

/* messages[i]'s tool fields: an assistant's tool_calls [{id, type: function, function: {name, arguments}}],
 * a tool message's tool_call_id (required) and name. */
static int jmessage_tools(json_t *m, size_t i, const char *role, struct chat_message *out, struct api_error *e)
{
    char param[96];
    int rc;
    json_t *tc = jget(m, "tool_calls");
    if (!strcmp(role, "tool")) {
        snprintf(param, sizeof param, "messages[%zu].tool_call_id", i);
        if (!jget(m, "tool_call_id"))
            return api_error_set(e, ERR_INVALID_ARG, param, NULL, "'%s' is required in a tool message", param);
        if ((rc = jstr_opt(m, "tool_call_id", param, (char **)&out->tool_call_id, e)))
            return rc;
        snprintf(param, sizeof param, "messages[%zu].name", i);
        return jstr_opt(m, "name", param, (char **)&out->name, e);
    }
    if (!tc)
        return 0;
    snprintf(param, sizeof param, "messages[%zu].tool_calls", i);
    if (strcmp(role, "assistant"))
        return api_error_set(e, ERR_INVALID_ARG, param, NULL, "'%s': only assistant messages have tool_calls", param);
    if (!json_is_array(tc))
        return api_error_set(e, ERR_INVALID_ARG, param, NULL, "'%s' must be an array, got %s", param,
                             json_type_name(tc));
    size_t n = json_array_size(tc);
    if (n > REQ_MAX_TOOLS)
        return api_error_set(e, ERR_INVALID_ARG, param, NULL, "'%s' holds more than %d calls", param, REQ_MAX_TOOLS);
    struct chat_tool_call *calls = calloc(n ? n : 1, sizeof *calls);
    if (!calls)
        return api_error_set(e, ERR_NOMEM, param, NULL, "out of memory");
    out->tool_calls = calls;
    for (size_t k = 0; k < n; k++) {
        json_t *c = json_array_get(tc, k);
        json_t *f = json_is_object(c) ? jget(c, "function") : NULL;
        json_t *t = json_is_object(c) ? jget(c, "type") : NULL;
        snprintf(param, sizeof param, "messages[%zu].tool_calls[%zu]", i, k);
        if (!json_is_object(c) || !json_is_object(f) || (t && (!json_is_string(t) ||
                                                              strcmp(json_string_value(t), "function"))))
            return api_error_set(e, ERR_INVALID_ARG, param, NULL,
                                 "'%s' must be {id, type: \"function\", function: {name, arguments}}", param);
        out->n_tool_calls = (int)k + 1;
        struct chat_tool_call *call = &calls[k];
        snprintf(param, sizeof param, "messages[%zu].tool_calls[%zu].id", i, k);
        if ((rc = jstr_opt(c, "id", param, (char **)&call->id, e)))
            return rc;
        snprintf(param, sizeof param, "messages[%zu].tool_calls[%zu].function.name", i, k);
        if ((rc = jstr_opt(f, "name", param, (char **)&call->name, e)))
            return rc;
        if (!call->name || !tool_name_ok(call->name))
            return api_error_set(e, ERR_INVALID_ARG, param, NULL,
                                 "'%s' must be 1 to 64 letters, digits, '_' or '-'", param);
        snprintf(param, sizeof param, "messages[%zu].tool_calls[%zu].function.arguments", i, k);
        if ((rc = jstr_opt(f, "arguments", param, (char **)&call->arguments, e)))
            return rc;
        if (!call->arguments && !(call->arguments = strdup("{}")))
            return api_error_set(e, ERR_NOMEM, param, NULL, "out of memory");
    }
    return 0;
}

/* tools [{type: "function", function: {name, description, parameters, strict}}], tool_choice and
 * parallel_tool_calls. */
static int jtools(json_t *o, struct gen_request *r, struct api_error *e)
{
    int rc;
    json_t *tools = jget(o, "tools"), *choice = jget(o, "tool_choice");
    if ((rc = jbool(o, "parallel_tool_calls", &r->parallel_tool_calls, e)))
        return rc;
    if (tools && !json_is_array(tools))
        return api_error_set(e, ERR_INVALID_ARG, "tools", NULL, "'tools' must be an array, got %s",
                             json_type_name(tools));
    size_t n = tools ? json_array_size(tools) : 0;
    if (n > REQ_MAX_TOOLS)
        return api_error_set(e, ERR_INVALID_ARG, "tools", NULL, "'tools' may hold at most %d tools, got %zu",
                             REQ_MAX_TOOLS, n);
    if (n) {
        r->tools = calloc(n, sizeof *r->tools);
        r->tool_params = calloc(n, sizeof *r->tool_params);
        if (!r->tools || !r->tool_params)
            return api_error_set(e, ERR_NOMEM, "tools", NULL, "out of memory");
    }
    for (size_t i = 0; i < n; i++) {
        char param[64];
        json_t *t = json_array_get(tools, i);
        json_t *type = json_is_object(t) ? jget(t, "type") : NULL;
        json_t *f = json_is_object(t) ? jget(t, "function") : NULL;
        snprintf(param, sizeof param, "tools[%zu]", i);
        if (!json_is_object(t) || !json_is_string(type) || strcmp(json_string_value(type), "function") ||
            !json_is_object(f))
            return api_error_set(e, ERR_INVALID_ARG, param, NULL,
                                 "'%s' must be {\"type\": \"function\", \"function\": {name, description, parameters}}",
                                 param);
        json_t *name = jget(f, "name"), *desc = jget(f, "description"), *params = jget(f, "parameters");
        json_t *strict = jget(f, "strict");
        snprintf(param, sizeof param, "tools[%zu].function.name", i);
        if (!json_is_string(name) || !tool_name_ok(json_string_value(name)))
            return api_error_set(e, ERR_INVALID_ARG, param, NULL,
                                 "'%s' must be a string of 1 to 64 letters, digits, '_' or '-'", param);
        for (size_t k = 0; k < i; k++)
            if (!strcmp(r->tools[k].name, json_string_value(name)))
                return api_error_set(e, ERR_INVALID_ARG, param, NULL, "'%s': two tools are named '%s'", param,
                                     json_string_value(name));
        snprintf(param, sizeof param, "tools[%zu].function.description", i);
        if (desc && !json_is_string(desc))
            return api_error_set(e, ERR_INVALID_ARG, param, NULL, "'%s' must be a string", param);
        snprintf(param, sizeof param, "tools[%zu].function.parameters", i);
        if (params && !json_is_object(params))
            return api_error_set(e, ERR_INVALID_ARG, param, NULL, "'%s' must be a JSON Schema object, got %s", param,
                                 json_type_name(params));
        snprintf(param, sizeof param, "tools[%zu].function.strict", i);
        if (strict && !json_is_boolean(strict))
            return api_error_set(e, ERR_INVALID_ARG, param, NULL, "'%s' must be a boolean", param);
        r->n_tools = (int)i + 1;
        r->tools[i].name = strdup(json_string_value(name));
        json_t *shown = json_pack("{s:s,s:{s:O,s:O?,s:O?}}", "type", "function", "function", "name", name,
                                  "description", desc, "parameters", params);
        r->tools[i].json = shown ? json_dumps(shown, 0) : NULL;
        json_decref(shown);
        if (params)
            r->tool_params[i] = json_dumps(params, JSON_COMPACT);
        if (!r->tools[i].name || !r->tools[i].json || (params && !r->tool_params[i]))
            return api_error_set(e, ERR_NOMEM, "tools", NULL, "out of memory");
    }
    r->tool_choice = n ? GEN_TOOLS_AUTO : GEN_TOOLS_NONE;
    if (!choice)
        return 0;
    const char *cs = json_is_string(choice) ? json_string_value(choice) : NULL;
    if (cs && !strcmp(cs, "none")) {
        r->tool_choice = GEN_TOOLS_NONE;
        return 0;
    }
    if (!n)
        return api_error_set(e, ERR_INVALID_ARG, "tool_choice", NULL,
                             "'tool_choice' is only allowed when 'tools' are given");
    if (cs && !strcmp(cs, "auto")) {
        r->tool_choice = GEN_TOOLS_AUTO;
        return 0;
    }
    if (cs && !strcmp(cs, "required")) {
        r->tool_choice = GEN_TOOLS_REQUIRED;
        return 0;
    }
    json_t *type = json_is_object(choice) ? jget(choice, "type") : NULL;
    json_t *f = json_is_object(choice) ? jget(choice, "function") : NULL;
    json_t *name = json_is_object(f) ? jget(f, "name") : NULL;
    if (!json_is_string(type) || strcmp(json_string_value(type), "function") || !json_is_string(name))
        return api_error_set(e, ERR_INVALID_ARG, "tool_choice", NULL,
                             "'tool_choice' must be \"none\", \"auto\", \"required\" or {\"type\": \"function\", "
                             "\"function\": {\"name\": ...}}");
    for (size_t i = 0; i < n; i++)
        if (!strcmp(r->tools[i].name, json_string_value(name))) {
            r->tool_choice = GEN_TOOLS_NAMED;
            r->tool_named = (int)i;
            return 0;
        }
    return api_error_set(e, ERR_INVALID_ARG, "tool_choice.function.name", NULL,
                         "'tool_choice.function.name' is '%.64s', which is not one of the tools", json_string_value(name));
}

/* logit_bias {"token id": bias in [-100, 100]} (ids checked against the vocabulary by the server). */
static int jlogit_bias(json_t *o, struct gen_request *r, struct api_error *e)
{
    json_t *lb = jget(o, "logit_bias");
    if (!lb)
        return 0;
    if (!json_is_object(lb))
        return api_error_set(e, ERR_INVALID_ARG, "logit_bias", NULL,
                             "'logit_bias' must be an object mapping token ids to biases, got %s", json_type_name(lb));
    size_t n = json_object_size(lb);
    if (n > REQ_MAX_LOGIT_BIAS)
        return api_error_set(e, ERR_INVALID_ARG, "logit_bias", NULL, "'logit_bias' may hold at most %d entries, got %zu",
                             REQ_MAX_LOGIT_BIAS, n);
    r->logit_bias = calloc(n ? n : 1, sizeof *r->logit_bias);
    if (!r->logit_bias)
        return api_error_set(e, ERR_NOMEM, "logit_bias", NULL, "out of memory");
    const char *key;
    json_t *v;
    json_object_foreach(lb, key, v) {
        char *end;
        errno = 0;
        long long id = strtoll(key, &end, 10);
        if (!*key || *end || errno == ERANGE || id < 0 || id > INT32_MAX || !(key[0] >= '0' && key[0] <= '9'))
            return api_error_set(e, ERR_INVALID_ARG, "logit_bias", NULL,
                                 "'logit_bias' keys must be token ids (non-negative integers as strings), got '%.32s'",
                                 key);
        if (!json_is_number(v) || !isfinite(json_number_value(v)) || json_number_value(v) < -100 ||
            json_number_value(v) > 100)
            return api_error_set(e, ERR_INVALID_ARG, "logit_bias", NULL,
                                 "'logit_bias' values must be numbers from -100 to 100; token %s has %s%s", key,
                                 json_is_number(v) ? "" : json_type_name(v), json_is_number(v) ? "one out of range" : "");
        r->logit_bias[r->n_logit_bias++] = (struct sampler_bias){(int32_t)id, (float)json_number_value(v)};
    }
    return 0;
}

/* messages: [{role, content}] where content is a string, null (assistant), or text parts. */
static int jmessages(json_t *o, struct gen_request *r, struct api_error *e)
{
    json_t *v = jget(o, "messages");
    if (!v)
        return api_error_set(e, ERR_INVALID_ARG, "messages", NULL, "'messages' is required");
    if (!json_is_array(v))
        return api_error_set(e, ERR_INVALID_ARG, "messages", NULL, "'messages' must be an array, got %s",
                             json_type_name(v));
    size_t n = json_array_size(v);
    if (!n)
        return api_error_set(e, ERR_INVALID_ARG, "messages", NULL, "'messages' must hold at least one message");
    if (n > 4096)
        return api_error_set(e, ERR_INVALID_ARG, "messages", NULL, "'messages' holds too many messages (%zu)", n);
    r->messages = calloc(n, sizeof *r->messages);
    if (!r->messages)
        return api_error_set(e, ERR_NOMEM, "messages", NULL, "out of memory");
    for (size_t i = 0; i < n; i++) {
        json_t *m = json_array_get(v, i);
        char param[64];
        snprintf(param, sizeof param, "messages[%zu]", i);
        if (!json_is_object(m))
            return api_error_set(e, ERR_INVALID_ARG, param, NULL, "'%s' must be an object, got %s", param,
                                 json_type_name(m));
        json_t *role = json_object_get(m, "role");
        snprintf(param, sizeof param, "messages[%zu].role", i);
        if (!role || !json_is_string(role))
            return api_error_set(e, ERR_INVALID_ARG, param, NULL, "'%s' must be a string", param);
        const char *rs = json_string_value(role);
        if (!strcmp(rs, "developer"))
            rs = "system"; /* OpenAI's newer name for the system role */
        if (strcmp(rs, "system") && strcmp(rs, "user") && strcmp(rs, "assistant") && strcmp(rs, "tool"))
            return api_error_set(e, ERR_INVALID_ARG, param, NULL,
                                 "'%s' must be one of system, developer, user, assistant, tool; got '%.64s'", param, rs);
        r->n_messages = (int)i + 1; /* from here on deinit frees what this message holds */
        int rc = jmessage_tools(m, i, rs, &r->messages[i], e);
        if (rc)
            return rc;
        snprintf(param, sizeof param, "messages[%zu].content", i);
        json_t *c = json_object_get(m, "content");
        char *text = NULL;
        if (c && json_is_string(c)) {
            text = strdup(json_string_value(c));
        } else if ((!c || json_is_null(c)) && !strcmp(rs, "assistant")) {
            text = strdup("");
        } else if (c && json_is_array(c)) {
            rc = jtext_parts(c, param, &text, e);
            if (rc)
                return rc;
        } else {
            return api_error_set(e, ERR_INVALID_ARG, param, NULL, "'%s' must be a string or an array of text parts",
                                 param);
        }
        char *role_copy = strdup(rs);
        if (!text || !role_copy) {
            free(text);
            free(role_copy);
            return api_error_set(e, ERR_NOMEM, param, NULL, "out of memory");
        }
        r->messages[i].role = role_copy;
        r->messages[i].content = text;
        r->n_messages = (int)i + 1;
    }
    return 0;
}

static void gen_request_init(struct gen_request *r, enum api_kind kind, const struct gen_defaults *d)
{
    memset(r, 0, sizeof *r);
    r->kind = kind;
    r->max_tokens = -1;
    r->n = 1;
    r->logprobs = -1;
    r->spec = -1;
    r->add_special = true;
    r->parse_special = d->parse_special;
    r->add_generation_prompt = true;
    r->parallel_tool_calls = true;
    r->sp.temperature = d->temperature;
    r->sp.top_k = d->top_k;
    r->sp.top_p = d->top_p;
    r->sp.min_p = d->min_p;
    r->sp.repeat_penalty = d->repeat_penalty;
    r->sp.repeat_last_n = 64;
    r->sp.frequency_penalty = 0;
    r->sp.presence_penalty = 0;
    r->sp.seed = 0;
}

void gen_request_deinit(struct gen_request *r)
{
    if (!r)
        return;
    free(r->model);
    for (int i = 0; i < r->n_prompts; i++) {
        free(r->prompts[i].text);
        free(r->prompts[i].tokens);
    }
    free(r->prompts);
    for (int i = 0; i < r->n_messages; i++) {
        struct chat_message *m = &r->messages[i];
        free((char *)m->role);
        free((char *)m->content);
        free((char *)m->tool_call_id);
        free((char *)m->name);
        for (int k = 0; k < m->n_tool_calls; k++) {
            free((char *)m->tool_calls[k].id);
            free((char *)m->tool_calls[k].name);
            free((char *)m->tool_calls[k].arguments);
        }
        free((void *)m->tool_calls);
    }
    free(r->messages);
    for (int i = 0; i < r->n_tools; i++) {
        free((char *)r->tools[i].name);
        free((char *)r->tools[i].json);
        free(r->tool_params[i]);
    }
    free(r->tools);
    free(r->tool_params);
    free(r->logit_bias);
    for (int i = 0; i < r->n_stop; i++)
        free(r->stop[i]);
    free(r->stop);
    free(r->tokens);
    free(r->constraint_text);
    free(r->prediction);
    memset(r, 0, sizeof *r);
}

/* Sampling fields shared by every generation endpoint. */
static int parse_sampling(json_t *o, struct gen_request *r, struct api_error *e)
{
    int rc;
    long long x;
    bool present;
    if ((rc = jnum(o, "temperature", 0, 2, false, &r->sp.temperature, e)) ||
        (rc = jnum(o, "top_p", 0, 1, true, &r->sp.top_p, e)) || (rc = jnum(o, "min_p", 0, 1, false, &r->sp.min_p, e)) ||
        (rc = jnum(o, "frequency_penalty", -2, 2, false, &r->sp.frequency_penalty, e)) ||
        (rc = jnum(o, "presence_penalty", -2, 2, false, &r->sp.presence_penalty, e)) ||
        (rc = jnum(o, "repetition_penalty", 0, 10, true, &r->sp.repeat_penalty, e)) ||
        (rc = jnum(o, "repeat_penalty", 0, 10, true, &r->sp.repeat_penalty, e)))
        return rc;
    /* top_k: -1 or 0 turn it off (vLLM uses -1, llama.cpp 0). */
    if ((rc = jint(o, "top_k", -1, 1 << 20, &x, &present, e)))
        return rc;
    if (present)
        r->sp.top_k = x < 0 ? 0 : (int)x;
    if ((rc = jint(o, "repeat_last_n", -1, 1 << 20, &x, &present, e)))
        return rc;
    if (present)
        r->sp.repeat_last_n = (int)x;
    if ((rc = jint(o, "seed", INT64_MIN, INT64_MAX, &x, &present, e)))
        return rc;
    if (present) {
        r->sp.seed = (uint64_t)x;
        r->seed_set = true;
    }
    if ((rc = jnum(o, "timeout", 0, 1e6, true, &r->timeout, e)))
        return rc;
    return jbool(o, "ignore_eos", &r->ignore_eos, e);
}

/* Fields that would change the output and that wafer does not implement: refused, never dropped. */
static int refuse_unsupported(json_t *o, struct api_error *e)
{
    static const char *const names[] = {"functions", "function_call"};
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
        json_t *v = jget(o, names[i]);
        if (v && !(json_is_array(v) && json_array_size(v) == 0) && !(json_is_string(v) && !strcmp(json_string_value(v), "none")))
            return api_error_set(e, ERR_UNSUPPORTED, names[i], NULL,
                                 "'%s' (the legacy function calling) is not supported by wafer: use 'tools' and "
                                 "'tool_choice'", names[i]);
    }
    json_t *sfx = jget(o, "suffix");
    if (sfx && !(json_is_string(sfx) && json_string_length(sfx) == 0))
        return api_error_set(e, ERR_UNSUPPORTED, "suffix", NULL, "'suffix' (insertion) is not supported by wafer");
    return 0;
}

/* Takes one constraint: kind, flags, the schema serialized compact (key order kept: it is the generation
 * order) or the GBNF text. */
static int constraint_set(struct gen_request *r, int kind, unsigned flags, json_t *schema, const char *gbnf,
                          const char *param, struct api_error *e)
{
    if (r->constraint_kind)
        return api_error_set(e, ERR_INVALID_ARG, param, NULL,
                             "'%s' and '%s' both constrain the output; send only one", r->constraint_param, param);
    if (schema && !json_is_object(schema) && !json_is_boolean(schema))
        return api_error_set(e, ERR_INVALID_ARG, param, NULL, "the JSON schema in '%s' must be an object, got %s",
                             param, json_type_name(schema));
    char *text = schema ? json_dumps(schema, JSON_COMPACT | JSON_ENCODE_ANY) : gbnf ? strdup(gbnf) : NULL;
    if ((schema || gbnf) && !text)
        return api_error_set(e, ERR_NOMEM, param, NULL, "out of memory");
    r->constraint_kind = kind;
    r->constraint_flags = flags;
    r->constraint_text = text;
    r->constraint_param = param;
    return 0;
}

/* response_format {type: text | json_object | json_schema {name, schema, strict}} (OpenAI; llama.cpp's
 * {type: json_object, schema} too), grammar (GBNF) and json_schema (llama.cpp). */
static int jconstraint(json_t *o, struct gen_request *r, struct api_error *e)
{
    int rc;
    json_t *rf = jget(o, "response_format");
    if (rf) {
        json_t *t = json_is_object(rf) ? json_object_get(rf, "type") : NULL;
        const char *type = t && json_is_string(t) ? json_string_value(t) : NULL;
        if (!type)
            return api_error_set(e, ERR_INVALID_ARG, "response_format", NULL,
                                 "'response_format' must be an object with a 'type': text, json_object or json_schema");
        json_t *sch = jget(rf, "schema");
        if (!strcmp(type, "json_schema")) {
            json_t *js = jget(rf, "json_schema");
            if (!js || !json_is_object(js))
                return api_error_set(e, ERR_INVALID_ARG, "response_format.json_schema", NULL,
                                     "'response_format.json_schema' must be an object {name, schema, strict}");
            json_t *nm = jget(js, "name"), *st = jget(js, "strict");
            if (nm && !json_is_string(nm))
                return api_error_set(e, ERR_INVALID_ARG, "response_format.json_schema.name", NULL,
                                     "'response_format.json_schema.name' must be a string");
            if (st && !json_is_boolean(st))
                return api_error_set(e, ERR_INVALID_ARG, "response_format.json_schema.strict", NULL,
                                     "'response_format.json_schema.strict' must be a boolean");
            sch = jget(js, "schema");
            if (!sch) /* OpenAI's default: any JSON object */
                rc = constraint_set(r, GRAMMAR_KIND_JSON_OBJECT, 0, NULL, NULL, "response_format", e);
            else
                rc = constraint_set(r, GRAMMAR_KIND_SCHEMA, st && json_is_true(st) ? GRAMMAR_SCHEMA_STRICT : 0, sch,
                                    NULL, "response_format", e);
        } else if (!strcmp(type, "json_object")) {
            rc = sch ? constraint_set(r, GRAMMAR_KIND_SCHEMA, 0, sch, NULL, "response_format", e)
                     : constraint_set(r, GRAMMAR_KIND_JSON_OBJECT, 0, NULL, NULL, "response_format", e);
        } else if (!strcmp(type, "text")) {
            rc = 0;
        } else {
            rc = api_error_set(e, ERR_INVALID_ARG, "response_format.type", NULL,
                               "'response_format.type' must be text, json_object or json_schema, got '%.64s'", type);
        }
        if (rc)
            return rc;
    }
    json_t *g = jget(o, "grammar");
    if (g) {
        if (!json_is_string(g))
            return api_error_set(e, ERR_INVALID_ARG, "grammar", NULL, "'grammar' must be a GBNF string, got %s",
                                 json_type_name(g));
        if (json_string_length(g) && (rc = constraint_set(r, GRAMMAR_KIND_GBNF, 0, NULL, json_string_value(g), "grammar", e)))
            return rc;
    }
    json_t *js = jget(o, "json_schema");
    if (js && (rc = constraint_set(r, GRAMMAR_KIND_SCHEMA, 0, js, NULL, "json_schema", e)))
        return rc;
    return 0;
}

static int parse_openai(json_t *o, struct gen_request *r, struct api_error *e)
{
    int rc;
    long long x;
    bool present;
    if ((rc = jstr(o, "model", &r->model, e)) || (rc = refuse_unsupported(o, e)))
        return rc;
    if (r->kind == API_CHAT)
        rc = jmessages(o, r, e);
    else if (!(rc = jprompt(o, "prompt", true, r, e)))
        rc = jbool(o, "parse_special", &r->parse_special, e);
    if (rc)
        return rc;
    /* max_completion_tokens is the chat API's newer name; both are accepted, the newer one wins. */
    if ((rc = jint(o, "max_tokens", 1, REQ_MAX_TOKENS_LIMIT, &x, &present, e)))
        return rc;
    if (present)
        r->max_tokens = (int)x;
    if (r->kind == API_CHAT) {
        if ((rc = jint(o, "max_completion_tokens", 1, REQ_MAX_TOKENS_LIMIT, &x, &present, e)))
            return rc;
        if (present)
            r->max_tokens = (int)x;
    }
    if ((rc = parse_sampling(o, r, e)) || (rc = jstop(o, "stop", r, e)) || (rc = jconstraint(o, r, e)) ||
        (rc = jlogit_bias(o, r, e)))
        return rc;
    if (r->kind == API_CHAT) {
        if ((rc = jtools(o, r, e)))
            return rc;
        if (r->tool_choice != GEN_TOOLS_NONE && r->constraint_kind)
            return api_error_set(e, ERR_INVALID_ARG, r->constraint_param, NULL,
                                 "'%s' cannot be combined with tools (the tool calls have their own grammar); "
                                 "send tool_choice \"none\" or leave it out", r->constraint_param);
    } else if (jget(o, "tools") || jget(o, "tool_choice")) {
        return api_error_set(e, ERR_INVALID_ARG, jget(o, "tools") ? "tools" : "tool_choice", NULL,
                             "tools are a chat completions feature (POST /v1/chat/completions)");
    }
    if ((rc = jint(o, "n", 1, REQ_MAX_N, &x, &present, e)))
        return rc;
    if (present)
        r->n = (int)x;
    if ((rc = jint(o, "best_of", 1, REQ_MAX_N, &x, &present, e)))
        return rc;
    if (present && x != r->n)
        return api_error_set(e, ERR_UNSUPPORTED, "best_of", NULL, "'best_of' other than n is not supported");
    if ((rc = jprediction(o, r, e)))
        return rc;
    if (r->prediction && r->n > 1)
        return api_error_set(e, ERR_INVALID_ARG, "prediction", NULL, "'prediction' cannot be combined with n > 1");
    if ((rc = jbool(o, "stream", &r->stream, e)) || (rc = jbool(o, "return_token_ids", &r->return_token_ids, e)))
        return rc;
    json_t *so = jget(o, "stream_options");
    if (so) {
        if (!json_is_object(so))
            return api_error_set(e, ERR_INVALID_ARG, "stream_options", NULL, "'stream_options' must be an object");
        if (!r->stream)
            return api_error_set(e, ERR_INVALID_ARG, "stream_options", NULL,
                                 "'stream_options' is only allowed when 'stream' is true");
        if ((rc = jbool(so, "include_usage", &r->include_usage, e))) {
            snprintf(e->param, sizeof e->param, "stream_options.include_usage");
            return rc;
        }
    }
    if (r->kind == API_CHAT) {
        bool lp = false;
        if ((rc = jbool(o, "logprobs", &lp, e)) ||
            (rc = jint(o, "top_logprobs", 0, REQ_MAX_LOGPROBS, &x, &present, e)))
            return rc;
        if (present && !lp)
            return api_error_set(e, ERR_INVALID_ARG, "top_logprobs", NULL,
                                 "'top_logprobs' requires 'logprobs' to be true");
        if (lp)
            r->logprobs = present ? (int)x : 0;
    } else {
        if ((rc = jint(o, "logprobs", 0, REQ_MAX_LOGPROBS, &x, &present, e)))
            return rc;
        if (present)
            r->logprobs = (int)x;
        if ((rc = jbool(o, "echo", &r->echo, e)))
            return rc;
        json_t *fmt = jget(o, "logprobs_format");
        if (fmt) {
            const char *f = json_string_value(fmt);
            if (!f || (strcmp(f, "chat") && strcmp(f, "completions")))
                return api_error_set(e, ERR_INVALID_ARG, "logprobs_format", NULL,
                                     "'logprobs_format' must be \"completions\" (the default) or \"chat\"");
            r->chat_logprobs = !strcmp(f, "chat");
            if (r->chat_logprobs && r->echo)
                return api_error_set(e, ERR_UNSUPPORTED, "logprobs_format", NULL,
                                     "'logprobs_format' \"chat\" cannot be combined with 'echo'");
        }
        if (r->echo && r->stream)
            return api_error_set(e, ERR_UNSUPPORTED, "echo", NULL, "'echo' cannot be combined with 'stream'");
    }
    return 0;
}

/* The simple API: {prompt, max_new_tokens, temperature, top_p, top_k, do_sample, stop_sequences, seed}. */
static int parse_generate(json_t *o, struct gen_request *r, struct api_error *e)
{
    int rc;
    long long x;
    bool present;
    if ((rc = jstr(o, "model", &r->model, e)) || (rc = jprompt(o, "prompt", false, r, e)) ||
        (rc = jbool(o, "parse_special", &r->parse_special, e)))
        return rc;
    if ((rc = jint(o, "max_new_tokens", 1, REQ_MAX_TOKENS_LIMIT, &x, &present, e)))
        return rc;
    if (present)
        r->max_tokens = (int)x;
    if ((rc = parse_sampling(o, r, e)) || (rc = jstop(o, "stop_sequences", r, e)))
        return rc;
    bool do_sample = true;
    if ((rc = jbool(o, "do_sample", &do_sample, e)))
        return rc;
    if (!do_sample)
        r->sp.temperature = 0; /* greedy */
    return jbool(o, "stream", &r->stream, e);
}

/* {content | prompt | text, add_special, parse_special, with_pieces}, or {messages, add_generation_prompt,
 * with_pieces}: the tokens a chat request with these messages would have as its prompt. */
static int parse_tokenize(json_t *o, struct gen_request *r, struct api_error *e)
{
    int rc;
    if ((rc = jstr(o, "model", &r->model, e)))
        return rc;
    if (jget(o, "messages")) {
        static const char *const text_keys[] = {"content", "prompt", "text", "add_special", "parse_special"};
        for (size_t i = 0; i < sizeof text_keys / sizeof text_keys[0]; i++)
            if (jget(o, text_keys[i]))
                return api_error_set(e, ERR_INVALID_ARG, text_keys[i], NULL,
                                     "'%s' cannot be combined with 'messages' (the chat template decides the "
                                     "special tokens)",
                                     text_keys[i]);
        if ((rc = jmessages(o, r, e)) || (rc = jbool(o, "add_generation_prompt", &r->add_generation_prompt, e)))
            return rc;
    } else {
        const char *key = jget(o, "content") ? "content" : jget(o, "prompt") ? "prompt" : "text";
        if ((rc = jprompt(o, key, false, r, e)) || (rc = jbool(o, "add_special", &r->add_special, e)) ||
            (rc = jbool(o, "parse_special", &r->parse_special, e)))
            return rc;
    }
    return jbool(o, "with_pieces", &r->with_pieces, e);
}

static int parse_detokenize(json_t *o, struct gen_request *r, struct api_error *e)
{
    int rc;
    if ((rc = jstr(o, "model", &r->model, e)))
        return rc;
    json_t *t = jget(o, "tokens");
    if (!t)
        return api_error_set(e, ERR_INVALID_ARG, "tokens", NULL, "'tokens' is required");
    if (!json_is_array(t))
        return api_error_set(e, ERR_INVALID_ARG, "tokens", NULL, "'tokens' must be an array of token ids, got %s",
                             json_type_name(t));
    return jtokens(t, "tokens", &r->tokens, &r->n_tokens, e);
}

static int parse_object(enum api_kind kind, json_t *o, const struct gen_defaults *d, struct gen_request *out,
                        struct api_error *e)
{
    gen_request_init(out, kind, d);
    if (!json_is_object(o))
        return api_error_set(e, ERR_INVALID_ARG, "", NULL, "the request body must be a JSON object, got %s",
                             json_type_name(o));
    int rc;
    switch (kind) {
    case API_COMPLETIONS:
    case API_CHAT: rc = parse_openai(o, out, e); break;
    case API_GENERATE: rc = parse_generate(o, out, e); break;
    case API_TOKENIZE: rc = parse_tokenize(o, out, e); break;
    case API_DETOKENIZE: rc = parse_detokenize(o, out, e); break;
    default: rc = api_error_set(e, ERR_INTERNAL, "", NULL, "unknown endpoint kind");
    }
    if (rc)
        gen_request_deinit(out);
    return rc;
}

static json_t *parse_json(const char *body, size_t len, struct api_error *e)
{
    if (!body || !len) {
        api_error_set(e, ERR_FORMAT, "", NULL, "the request body is empty; send a JSON object");
        return NULL;
    }
    json_error_t je;
    json_t *o = json_loadb(body, len, JSON_REJECT_DUPLICATES, &je);
    if (!o)
        api_error_set(e, ERR_FORMAT, "", NULL, "malformed JSON at line %d, column %d: %s", je.line, je.column,
                      je.text);
    return o;
}

int request_parse(enum api_kind kind, const char *body, size_t len, const struct gen_defaults *d,
                  struct gen_request *out, struct api_error *e)
{
    memset(out, 0, sizeof *out);
    memset(e, 0, sizeof *e);
    json_t *o = parse_json(body, len, e);
    if (!o)
        return e->code;
    int rc = parse_object(kind, o, d, out, e);
    json_decref(o);
    return rc;
}

int url_decode(char *s, size_t len)
{
    size_t w = 0;
    for (size_t i = 0; i < len; i++) {
        char c = s[i];
        if (c == '+') {
            c = ' ';
        } else if (c == '%') {
            if (i + 2 >= len)
                return -1;
            int v = 0;
            for (int k = 1; k <= 2; k++) {
                char h = s[i + (size_t)k];
                v <<= 4;
                if (h >= '0' && h <= '9')
                    v |= h - '0';
                else if (h >= 'a' && h <= 'f')
                    v |= h - 'a' + 10;
                else if (h >= 'A' && h <= 'F')
                    v |= h - 'A' + 10;
                else
                    return -1;
            }
            c = (char)v;
            i += 2;
        }
        s[w++] = c;
    }
    s[w] = 0;
    return (int)w;
}

int request_parse_query(const char *query, size_t len, const struct gen_defaults *d, struct gen_request *out,
                        struct api_error *e)
{
    memset(out, 0, sizeof *out);
    memset(e, 0, sizeof *e);
    static const char *const ints[] = {"max_new_tokens", "top_k", "seed", "repeat_last_n"};
    static const char *const nums[] = {"temperature", "top_p", "min_p", "repetition_penalty", "frequency_penalty",
                                       "presence_penalty", "timeout"};
    json_t *o = json_object();
    json_t *stops = json_array();
    char *q = malloc(len + 1);
    int rc = 0;
    if (!o || !stops || !q) {
        rc = api_error_set(e, ERR_NOMEM, "", NULL, "out of memory");
        goto done;
    }
    memcpy(q, query ? query : "", len);
    q[len] = 0;
    for (char *save = NULL, *kv = strtok_r(q, "&", &save); kv; kv = strtok_r(NULL, "&", &save)) {
        char *eq = strchr(kv, '=');
        char *val = eq ? eq + 1 : kv + strlen(kv);
        if (eq)
            *eq = 0;
        if (url_decode(kv, strlen(kv)) < 0 || url_decode(val, strlen(val)) < 0) {
            rc = api_error_set(e, ERR_INVALID_ARG, kv, NULL, "bad percent-encoding in the query string");
            goto done;
        }
        json_t *jv = NULL;
        bool is_int = false, is_num = false;
        for (size_t i = 0; i < sizeof ints / sizeof ints[0]; i++)
            is_int |= !strcmp(kv, ints[i]);
        for (size_t i = 0; i < sizeof nums / sizeof nums[0]; i++)
            is_num |= !strcmp(kv, nums[i]);
        if (is_int) {
            /* decimal digits with an optional sign, nothing else: "2e1", "1.0", " 5" or "0x10" are not integers
             * (strtod would read 2e1 as 20 while strtoll stops at 2) */
            char *end;
            errno = 0;
            long long ix = strtoll(val, &end, 10);
            bool digits = val[0] >= '0' && val[0] <= '9';
            if ((val[0] == '-' || val[0] == '+') && val[1] >= '0' && val[1] <= '9')
                digits = true;
            if (!digits || *end || errno == ERANGE) {
                rc = api_error_set(e, ERR_INVALID_ARG, kv, NULL, "'%s' must be an integer, got '%.64s'", kv, val);
                goto done;
            }
            jv = json_integer(ix);
        } else if (is_num) {
            char *end;
            double x = strtod(val, &end);
            if (!*val || *end || !isfinite(x)) {
                rc = api_error_set(e, ERR_INVALID_ARG, kv, NULL, "'%s' must be a number, got '%.64s'", kv, val);
                goto done;
            }
            jv = json_real(x);
        } else if (!strcmp(kv, "do_sample") || !strcmp(kv, "ignore_eos") || !strcmp(kv, "parse_special")) {
            if (!strcmp(val, "true") || !strcmp(val, "1"))
                jv = json_true();
            else if (!strcmp(val, "false") || !strcmp(val, "0"))
                jv = json_false();
            else {
                rc = api_error_set(e, ERR_INVALID_ARG, kv, NULL, "'%s' must be true or false, got '%.64s'", kv, val);
                goto done;
            }
        } else if (!strcmp(kv, "stop") || !strcmp(kv, "stop_sequences")) {
            json_array_append_new(stops, json_string(val));
            continue;
        } else {
            jv = json_string(val);
        }
        if (!jv) { /* json_string refuses invalid UTF-8 */
            rc = api_error_set(e, ERR_INVALID_ARG, kv, NULL, "'%s' is not valid UTF-8", kv);
            goto done;
        }
        json_object_set_new(o, kv, jv);
    }
    if (json_array_size(stops))
        json_object_set(o, "stop_sequences", stops);
    rc = parse_object(API_GENERATE, o, d, out, e);
    if (!rc)
        out->stream = true;
done:
    free(q);
    json_decref(stops);
    json_decref(o);
    return rc;
}

int request_parse_batch(const char *body, size_t len, const struct gen_defaults *d, struct gen_request **items,
                        struct api_error **errs, int *n, struct api_error *e)
{
    *items = NULL;
    *errs = NULL;
    *n = 0;
    memset(e, 0, sizeof *e);
    json_t *o = parse_json(body, len, e);
    if (!o)
        return e->code;
    int rc = 0;
    json_t *reqs = json_is_object(o) ? jget(o, "requests") : NULL;
    json_t *common = json_is_object(o) ? jget(o, "common_params") : NULL;
    if (!json_is_object(o)) {
        rc = api_error_set(e, ERR_INVALID_ARG, "", NULL, "the request body must be a JSON object");
        goto done;
    }
    if (!reqs || !json_is_array(reqs) || json_array_size(reqs) == 0) {
        rc = api_error_set(e, ERR_INVALID_ARG, "requests", NULL, "'requests' must be a non-empty array of objects");
        goto done;
    }
    if (json_array_size(reqs) > REQ_MAX_PROMPTS) {
        rc = api_error_set(e, ERR_INVALID_ARG, "requests", NULL, "'requests' may hold at most %d items, got %zu",
                           REQ_MAX_PROMPTS, json_array_size(reqs));
        goto done;
    }
    if (common && !json_is_object(common)) {
        rc = api_error_set(e, ERR_INVALID_ARG, "common_params", NULL, "'common_params' must be an object");
        goto done;
    }
    size_t cnt = json_array_size(reqs);
    *items = calloc(cnt, sizeof **items);
    *errs = calloc(cnt, sizeof **errs);
    if (!*items || !*errs) {
        rc = api_error_set(e, ERR_NOMEM, "", NULL, "out of memory");
        goto done;
    }
    *n = (int)cnt;
    for (size_t i = 0; i < cnt; i++) {
        json_t *it = json_array_get(reqs, i);
        json_t *merged = common ? json_deep_copy(common) : json_object();
        if (!merged) {
            rc = api_error_set(e, ERR_NOMEM, "", NULL, "out of memory");
            goto done;
        }
        if (json_is_object(it))
            json_object_update(merged, it);
        if (!json_is_object(it)) {
            api_error_set(&(*errs)[i], ERR_INVALID_ARG, "requests", NULL, "'requests[%zu]' must be an object, got %s",
                          i, json_type_name(it));
            gen_request_init(&(*items)[i], API_GENERATE, d);
        } else if (parse_object(API_GENERATE, merged, d, &(*items)[i], &(*errs)[i])) {
            /* keep the item's own error; prefix the parameter with its index */
            char p[2 * sizeof(*errs)[i].param];
            snprintf(p, sizeof p, "requests[%zu]%s%s", i, (*errs)[i].param[0] ? "." : "", (*errs)[i].param);
            size_t pl = strnlen(p, sizeof(*errs)[i].param - 1);
            memcpy((*errs)[i].param, p, pl);
            (*errs)[i].param[pl] = 0;
        }
        json_decref(merged);
    }
done:
    if (rc) {
        gen_request_batch_free(*items, *errs, *n);
        *items = NULL;
        *errs = NULL;
        *n = 0;
    }
    json_decref(o);
    return rc;
}

void gen_request_batch_free(struct gen_request *items, struct api_error *errs, int n)
{
    if (items)
        for (int i = 0; i < n; i++)
            gen_request_deinit(&items[i]);
    free(items);
    free(errs);
}
