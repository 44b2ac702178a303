/*
 * chat_template: OpenAI messages -> prompt text for the chat formats of the common open-weight families.
 *
 * We do not run the GGUF's Jinja template. Detection looks for marker substrings in it, in the spirit of
 * llama.cpp's llm_chat_detect_template (checked in a fixed order, because several formats share markers:
 * chatml before anything else, [INST] formats before <|user|> ones, phi3's <|end|> before zephyr). Families
 * whose markers we see but do not render (phi4's <|im_sep|>, SmolVLM, GLM) are reported as unknown rather
 * than rendered as a look-alike.
 *
 * Rendering follows what each family's reference Jinja template produces for the same messages, with the
 * leading BOS left out (the tokenizer adds it): Llama 2 strips contents and opens every later turn with BOS;
 * Mistral v3 puts the system prompt before the last user message, v1 before the first; Llama 3 and Gemma
 * trim contents. Families whose templates reject a system message get it merged the way llama.cpp does:
 * Gemma prepends it to the next user turn ("\n\n"), the legacy [INST] format prepends it with "\n".
 * Several system messages are joined with "\n\n" where they are merged.
 *
 * Every byte of the output is either template markup or message content, and the renderer records which:
 * content goes in through buf_put_text and is remembered as a span, wherever it is later copied (a system
 * prompt merged into a user turn, a turn trimmed as a whole). The server tokenizes the prompt with special
 * tokens parsed only outside those spans, so "</s>" or "<|im_end|>" typed by a user stays text and cannot
 * close their turn, while the template's own markers are the real special tokens.
 *
 * Tools (OpenAI's tools, assistant tool_calls and role "tool" results) are rendered in the format each
 * family's models were trained on, as llama.cpp's common/chat.cpp renders them: Hermes blocks on ChatML
 * (Qwen 2.5, Hermes 2/3), Meta's JSON calls and ipython turns on Llama 3, [AVAILABLE_TOOLS] / [TOOL_CALLS] /
 * [TOOL_RESULTS] on Mistral v3 and v7; every other family gets the generic form, which rewrites the
 * conversation into plain messages (a system message listing the tools, calls and results as JSON) and
 * renders those. Tool definitions, arguments and results are content, never markup.
 */
#include "server/chat_template.h"

#include "core/err.h"
#include "engine/tokenizer/tokenizer.h"

#include <ctype.h>
#include <jansson.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

static const char *const chat_family_names[CHAT_FAMILY_COUNT_] = {
    [CHAT_NONE] = "none",
    [CHAT_LLAMA2] = "llama2",
    [CHAT_LLAMA3] = "llama3",
    [CHAT_CHATML] = "chatml",
    [CHAT_MISTRAL_V1] = "mistral-v1",
    [CHAT_MISTRAL_V3] = "mistral-v3",
    [CHAT_MISTRAL_V7] = "mistral-v7",
    [CHAT_ZEPHYR] = "zephyr",
    [CHAT_GEMMA] = "gemma",
    [CHAT_PHI3] = "phi3",
    [CHAT_MISTRAL_V3_TEKKEN] = "mistral-v3-tekken",
    [CHAT_MISTRAL_V7_TEKKEN] = "mistral-v7-tekken",
    [CHAT_MISTRAL_LEGACY] = "mistral-legacy",
};

const char *chat_family_name(enum chat_family f)
{
    if ((int)f < 0 || f >= CHAT_FAMILY_COUNT_)
        return "unknown";
    return chat_family_names[f];
}

const char *chat_family_list(void)
{
    return "llama2, llama3, chatml, mistral-v1, mistral-v3, mistral-v3-tekken, mistral-v7, mistral-v7-tekken, "
           "mistral-legacy, zephyr, gemma, phi3";
}

int chat_family_from_name(const char *name, enum chat_family *out)
{
    if (name)
        for (int f = CHAT_NONE + 1; f < CHAT_FAMILY_COUNT_; f++)
            if (strcmp(name, chat_family_names[f]) == 0) {
                *out = (enum chat_family)f;
                return 0;
            }
    return ERR_INVALID_ARG;
}

static bool has(const char *text, const char *marker)
{
    return strstr(text, marker) != NULL;
}

enum chat_family chat_family_detect(const char *t)
{
    enum chat_family named;
    if (!t)
        return CHAT_NONE;
    if (chat_family_from_name(t, &named) == 0)
        return named;
    if (has(t, "<|im_start|>")) {
        /* phi4 (<|im_sep|>) and SmolVLM (<end_of_utterance>) reuse the token for other formats */
        if (has(t, "<|im_sep|>") || has(t, "<end_of_utterance>"))
            return CHAT_NONE;
        return CHAT_CHATML;
    }
    if (strncmp(t, "mistral", 7) == 0 || has(t, "[INST]")) {
        if (has(t, "[SYSTEM_PROMPT]"))
            return CHAT_MISTRAL_V7;
        /* Mistral's own v1/v3 templates: v1 writes the system message inside ' [INST] ', v3 announces tools */
        if (has(t, "' [INST] ' + system_message") || has(t, "[AVAILABLE_TOOLS]")) {
            if (has(t, " [INST]"))
                return CHAT_MISTRAL_V1;
            if (has(t, "\"[INST]\""))
                return CHAT_MISTRAL_V3_TEKKEN;
            return CHAT_MISTRAL_V3;
        }
        return has(t, "<<SYS>>") ? CHAT_LLAMA2 : CHAT_MISTRAL_LEGACY;
    }
    if (has(t, "<|assistant|>") && has(t, "<|end|>"))
        return CHAT_PHI3;
    if (has(t, "[gMASK]"))
        return CHAT_NONE; /* ChatGLM: <|user|> without zephyr's end-of-turn */
    /* zephyr ends each turn with the EOS token (TinyLlama, zephyr-7b) or <|endoftext|> (StableLM zephyr);
     * GLM-Edge writes <|user|> turns with no terminator at all */
    if (has(t, "<|user|>") && (has(t, "eos_token") || has(t, "<|endoftext|>") || has(t, "</s>")))
        return CHAT_ZEPHYR;
    if (has(t, "<start_of_turn>"))
        return CHAT_GEMMA;
    if (has(t, "<|start_header_id|>") && has(t, "<|end_header_id|>"))
        return CHAT_LLAMA3;
    return CHAT_NONE;
}

/* ---- growing output string ---- */

struct chat_buf {
    char *p;
    size_t len, cap;
    struct tok_span *sp; /* content spans in p, in order, disjoint, adjacent ones merged */
    size_t n_sp, cap_sp;
    bool oom;
};

static void buf_free(struct chat_buf *b)
{
    free(b->p);
    free(b->sp);
}

/* Records [off, off + n) as content. */
static void buf_mark(struct chat_buf *b, size_t off, size_t n)
{
    if (b->oom || n == 0)
        return;
    if (b->n_sp && b->sp[b->n_sp - 1].off + b->sp[b->n_sp - 1].len == off) {
        b->sp[b->n_sp - 1].len += n;
        return;
    }
    if (b->n_sp == b->cap_sp) {
        size_t cap = b->cap_sp ? b->cap_sp * 2 : 16;
        struct tok_span *sp = realloc(b->sp, cap * sizeof *sp);
        if (!sp) {
            b->oom = true;
            return;
        }
        b->sp = sp;
        b->cap_sp = cap;
    }
    b->sp[b->n_sp++] = (struct tok_span){off, n};
}

/* Appends markup. */
static void buf_put(struct chat_buf *b, const char *s, size_t n)
{
    if (b->oom || n == 0)
        return;
    if (b->len + n + 1 > b->cap) {
        size_t cap = b->cap ? b->cap : 256;
        while (cap < b->len + n + 1)
            cap *= 2;
        char *p = realloc(b->p, cap);
        if (!p) {
            b->oom = true;
            return;
        }
        b->p = p;
        b->cap = cap;
    }
    memcpy(b->p + b->len, s, n);
    b->len += n;
    b->p[b->len] = 0;
}

static void buf_puts(struct chat_buf *b, const char *s)
{
    buf_put(b, s, strlen(s));
}

/* Appends message content (text, never markup). */
static void buf_put_text(struct chat_buf *b, const char *s)
{
    size_t off = b->len, n = strlen(s);
    buf_put(b, s, n);
    buf_mark(b, off, n);
}

/* Appends bytes [lo, hi) of src, keeping which of them are content. */
static void buf_append_range(struct chat_buf *b, const struct chat_buf *src, size_t lo, size_t hi)
{
    size_t base = b->len;
    if (hi <= lo)
        return;
    buf_put(b, src->p + lo, hi - lo);
    for (size_t i = 0; i < src->n_sp; i++) {
        size_t a = src->sp[i].off, z = a + src->sp[i].len;
        a = a < lo ? lo : a;
        z = z > hi ? hi : z;
        if (a < z)
            buf_mark(b, base + (a - lo), z - a);
    }
}

static void buf_append(struct chat_buf *b, const struct chat_buf *src) { buf_append_range(b, src, 0, src->len); }

/* [lo, hi) of s[0..n) without leading and trailing ASCII whitespace (Python's str.strip() on ASCII text). */
static void trim_range(const char *s, size_t n, size_t *lo, size_t *hi)
{
    size_t a = 0;
    while (a < n && isspace((unsigned char)s[a]))
        a++;
    while (n > a && isspace((unsigned char)s[n - 1]))
        n--;
    *lo = a;
    *hi = n;
}

/* Appends message content s trimmed. */
static void buf_put_text_trimmed(struct chat_buf *b, const char *s)
{
    size_t lo, hi, off = b->len;
    trim_range(s, strlen(s), &lo, &hi);
    buf_put(b, s + lo, hi - lo);
    buf_mark(b, off, hi - lo);
}

/* Appends a system message to a pending system prompt, "\n\n" between several. */
static void buf_put_joined(struct chat_buf *b, const char *s, bool trim)
{
    if (b->len)
        buf_puts(b, "\n\n");
    if (trim)
        buf_put_text_trimmed(b, s);
    else
        buf_put_text(b, s);
}

/* Empties b (a pending system prompt, a scratch turn) for reuse. */
static void buf_clear(struct chat_buf *b)
{
    b->len = 0;
    b->n_sp = 0;
}

/* ---- messages ---- */

enum chat_role { ROLE_SYSTEM, ROLE_USER, ROLE_ASSISTANT, ROLE_TOOL };

struct chat_ctx {
    const struct chat_message *msgs;
    const enum chat_role *roles;
    int n;
    const char *bos, *eos;
    bool gen;
    const struct chat_tool *tools;
    int n_tools;
};

enum chat_tool_format chat_tool_format_of(enum chat_family f)
{
    switch (f) {
    case CHAT_CHATML: return CHAT_TOOLS_HERMES;
    case CHAT_LLAMA3: return CHAT_TOOLS_LLAMA3;
    case CHAT_MISTRAL_V3:
    case CHAT_MISTRAL_V3_TEKKEN:
    case CHAT_MISTRAL_V7:
    case CHAT_MISTRAL_V7_TEKKEN: return CHAT_TOOLS_MISTRAL;
    default: return CHAT_TOOLS_GENERIC;
    }
}

const char *chat_tool_format_name(enum chat_tool_format t)
{
    switch (t) {
    case CHAT_TOOLS_LLAMA3: return "llama3";
    case CHAT_TOOLS_HERMES: return "hermes";
    case CHAT_TOOLS_MISTRAL: return "mistral";
    default: return "generic";
    }
}

/* Appends s as a JSON string literal (content). */
static void buf_put_json_string(struct chat_buf *b, const char *s)
{
    json_t *j = json_string(s);
    char *t = j ? json_dumps(j, JSON_ENCODE_ANY) : NULL;
    if (!t)
        b->oom = true;
    else
        buf_put_text(b, t);
    free(t);
    json_decref(j);
}

/* A call's arguments text ("{}" when empty). */
static const char *call_args(const struct chat_tool_call *tc)
{
    return tc->arguments && *tc->arguments ? tc->arguments : "{}";
}

static bool msg_has_tools(const struct chat_ctx *c)
{
    if (c->n_tools)
        return true;
    for (int i = 0; i < c->n; i++)
        if (c->roles[i] == ROLE_TOOL || c->msgs[i].n_tool_calls)
            return true;
    return false;
}

static const char *msg_content(const struct chat_ctx *c, int i)
{
    return c->msgs[i].content ? c->msgs[i].content : "";
}

/* Index of the first (or last) user message, -1 when there is none. */
static int find_user(const struct chat_ctx *c, bool last)
{
    int found = -1;
    for (int i = 0; i < c->n; i++)
        if (c->roles[i] == ROLE_USER) {
            found = i;
            if (!last)
                break;
        }
    return found;
}

/* Hermes / Qwen 2.5: the tools block ends the (first) system message; calls are <tool_call> blocks in the
 * assistant turn; consecutive tool results share one user turn of <tool_response> blocks. */
static void render_chatml(const struct chat_ctx *c, struct chat_buf *b)
{
    int first = 0;
    if (c->n_tools) {
        buf_puts(b, "<|im_start|>system\n");
        if (c->n && c->roles[0] == ROLE_SYSTEM) {
            buf_put_text(b, msg_content(c, 0));
            buf_puts(b, "\n\n");
            first = 1;
        }
        buf_puts(b, "# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
                    "You are provided with function signatures within <tools></tools> XML tags:\n<tools>");
        for (int t = 0; t < c->n_tools; t++) {
            buf_puts(b, "\n");
            buf_put_text(b, c->tools[t].json);
        }
        buf_puts(b, "\n</tools>\n\nFor each function call, return a json object with function name and arguments "
                    "within <tool_call></tool_call> XML tags:\n<tool_call>\n{\"name\": <function-name>, "
                    "\"arguments\": <args-json-object>}\n</tool_call><|im_end|>\n");
    }
    for (int i = first; i < c->n; i++) {
        if (c->roles[i] == ROLE_TOOL) {
            if (i == 0 || c->roles[i - 1] != ROLE_TOOL)
                buf_puts(b, "<|im_start|>user");
            buf_puts(b, "\n<tool_response>\n");
            buf_put_text(b, msg_content(c, i));
            buf_puts(b, "\n</tool_response>");
            if (i + 1 == c->n || c->roles[i + 1] != ROLE_TOOL)
                buf_puts(b, "<|im_end|>\n");
            continue;
        }
        if (c->msgs[i].n_tool_calls) {
            buf_puts(b, "<|im_start|>assistant\n");
            buf_put_text(b, msg_content(c, i));
            for (int k = 0; k < c->msgs[i].n_tool_calls; k++) {
                const struct chat_tool_call *tc = &c->msgs[i].tool_calls[k];
                if (k || *msg_content(c, i))
                    buf_puts(b, "\n");
                buf_puts(b, "<tool_call>\n{\"name\": ");
                buf_put_json_string(b, tc->name);
                buf_puts(b, ", \"arguments\": ");
                buf_put_text(b, call_args(tc));
                buf_puts(b, "}\n</tool_call>");
            }
            buf_puts(b, "<|im_end|>\n");
            continue;
        }
        buf_puts(b, "<|im_start|>");
        buf_puts(b, c->msgs[i].role);
        buf_puts(b, "\n");
        buf_put_text(b, msg_content(c, i));
        buf_puts(b, "<|im_end|>\n");
    }
    if (c->gen)
        buf_puts(b, "<|im_start|>assistant\n");
}

/* Llama 3.1+ JSON tool calling (Meta's template): the tools and the answer format go into the first user
 * message; a call is the assistant's whole turn, {"name": N, "parameters": ARGS}; results are ipython turns. */
static void render_llama3(const struct chat_ctx *c, struct chat_buf *b)
{
    int first_user = c->n_tools ? find_user(c, false) : -1;
    for (int i = 0; i < c->n; i++) {
        buf_puts(b, "<|start_header_id|>");
        buf_puts(b, c->roles[i] == ROLE_TOOL ? "ipython" : c->msgs[i].role);
        buf_puts(b, "<|end_header_id|>\n\n");
        if (i == first_user) {
            buf_puts(b, "Given the following functions, please respond with a JSON for a function call with its "
                        "proper arguments that best answers the given prompt.\n\nRespond in the format "
                        "{\"name\": function name, \"parameters\": dictionary of argument name and its value}. "
                        "Do not use variables.\n\n");
            for (int t = 0; t < c->n_tools; t++) {
                buf_put_text(b, c->tools[t].json);
                buf_puts(b, "\n\n");
            }
        }
        if (c->msgs[i].n_tool_calls) {
            for (int k = 0; k < c->msgs[i].n_tool_calls; k++) {
                const struct chat_tool_call *tc = &c->msgs[i].tool_calls[k];
                if (k)
                    buf_puts(b, "\n");
                buf_puts(b, "{\"name\": ");
                buf_put_json_string(b, tc->name);
                buf_puts(b, ", \"parameters\": ");
                buf_put_text(b, call_args(tc));
                buf_puts(b, "}");
            }
        } else {
            buf_put_text_trimmed(b, msg_content(c, i));
        }
        buf_puts(b, "<|eot_id|>");
    }
    if (c->gen)
        buf_puts(b, "<|start_header_id|>assistant<|end_header_id|>\n\n");
}

/* zephyr and phi3: "<|role|>\n" content terminator "\n" */
static void render_tagged(const struct chat_ctx *c, struct chat_buf *b, const char *terminator)
{
    for (int i = 0; i < c->n; i++) {
        buf_puts(b, "<|");
        buf_puts(b, c->msgs[i].role);
        buf_puts(b, "|>\n");
        buf_put_text(b, msg_content(c, i));
        buf_puts(b, terminator);
        buf_puts(b, "\n");
    }
    if (c->gen)
        buf_puts(b, "<|assistant|>\n");
}

static void render_gemma(const struct chat_ctx *c, struct chat_buf *b, struct chat_buf *sys)
{
    for (int i = 0; i < c->n; i++) {
        if (c->roles[i] == ROLE_SYSTEM) {
            buf_put_joined(sys, msg_content(c, i), true);
            continue;
        }
        bool user = c->roles[i] == ROLE_USER;
        buf_puts(b, user ? "<start_of_turn>user\n" : "<start_of_turn>model\n");
        if (user && sys->len) {
            buf_append(b, sys);
            buf_puts(b, "\n\n");
            buf_clear(sys);
        }
        buf_put_text_trimmed(b, msg_content(c, i));
        buf_puts(b, "<end_of_turn>\n");
    }
    if (sys->len) { /* a system prompt with no user turn after it still reaches the model */
        buf_puts(b, "<start_of_turn>user\n");
        buf_append(b, sys);
        buf_puts(b, "<end_of_turn>\n");
    }
    if (c->gen)
        buf_puts(b, "<start_of_turn>model\n");
}

/* Llama 2 chat: "[INST] <<SYS>>\n{sys}\n<</SYS>>\n\n{user} [/INST] {assistant} </s><s>[INST] ..." where each
 * turn's text (system block included) is stripped as a whole. No generation prefix: the prompt already ends
 * with [/INST]. */
static void llama2_user_turn(const struct chat_ctx *c, struct chat_buf *b, struct chat_buf *sys,
                             struct chat_buf *tmp, const char *content)
{
    buf_clear(tmp);
    if (sys->len) {
        buf_puts(tmp, "<<SYS>>\n");
        buf_append(tmp, sys);
        buf_puts(tmp, "\n<</SYS>>\n\n");
        buf_clear(sys);
    }
    buf_put_text(tmp, content);
    if (b->len)
        buf_puts(b, c->bos);
    buf_puts(b, "[INST] ");
    size_t lo = 0, hi = 0;
    if (tmp->p && !tmp->oom)
        trim_range(tmp->p, tmp->len, &lo, &hi);
    buf_append_range(b, tmp, lo, hi);
    buf_puts(b, " [/INST]");
}

static void render_llama2(const struct chat_ctx *c, struct chat_buf *b, struct chat_buf *sys, struct chat_buf *tmp)
{
    for (int i = 0; i < c->n; i++) {
        switch (c->roles[i]) {
        case ROLE_SYSTEM:
            buf_put_joined(sys, msg_content(c, i), false);
            break;
        case ROLE_USER:
            llama2_user_turn(c, b, sys, tmp, msg_content(c, i));
            break;
        case ROLE_ASSISTANT:
            buf_puts(b, " ");
            buf_put_text_trimmed(b, msg_content(c, i));
            buf_puts(b, " ");
            buf_puts(b, c->eos);
            break;
        case ROLE_TOOL: /* never here: rewritten by the generic form, or rendered by render_mistral_tools */
            break;
        }
    }
    if (sys->len)
        llama2_user_turn(c, b, sys, tmp, "");
}

/* The first Mistral Instruct templates (and llama.cpp's generic [INST] format): "[INST] {user} [/INST]{assistant}</s>",
 * a system message written into the turn followed by "\n". */
static void render_mistral_legacy(const struct chat_ctx *c, struct chat_buf *b)
{
    bool in_turn = false;
    for (int i = 0; i < c->n; i++) {
        if (c->roles[i] != ROLE_ASSISTANT && !in_turn) {
            buf_puts(b, "[INST] ");
            in_turn = true;
        }
        buf_put_text(b, msg_content(c, i));
        switch (c->roles[i]) {
        case ROLE_SYSTEM:
            buf_puts(b, "\n");
            break;
        case ROLE_USER:
            buf_puts(b, " [/INST]");
            break;
        case ROLE_ASSISTANT:
            buf_puts(b, c->eos);
            in_turn = false;
            break;
        case ROLE_TOOL: /* never here: rewritten by the generic form, or rendered by render_mistral_tools */
            break;
        }
    }
    if (in_turn && c->roles[c->n - 1] == ROLE_SYSTEM)
        buf_puts(b, " [/INST]");
}

/* Mistral v1 / v3 / v3-tekken as Mistral's templates: the system prompt goes into one user turn (v1: the
 * first, v3: the last), "\n\n" before the user text. v1 opens turns with " [INST] " and closes " [/INST]";
 * v3 "[INST] " and "[/INST]", then " " + trimmed answer; tekken has no spaces and does not trim. */
static void render_mistral_v1_v3(const struct chat_ctx *c, struct chat_buf *b, struct chat_buf *sys,
                                 enum chat_family f)
{
    const char *open = f == CHAT_MISTRAL_V1 ? " [INST] " : f == CHAT_MISTRAL_V3 ? "[INST] " : "[INST]";
    const char *close = f == CHAT_MISTRAL_V1 ? " [/INST]" : "[/INST]";
    const char *answer_sep = f == CHAT_MISTRAL_V3_TEKKEN ? "" : " ";
    for (int i = 0; i < c->n; i++)
        if (c->roles[i] == ROLE_SYSTEM)
            buf_put_joined(sys, msg_content(c, i), false);
    int sys_at = find_user(c, f != CHAT_MISTRAL_V1);
    for (int i = 0; i < c->n; i++) {
        switch (c->roles[i]) {
        case ROLE_SYSTEM:
            break;
        case ROLE_USER:
            buf_puts(b, open);
            if (i == sys_at && sys->len) {
                buf_append(b, sys);
                buf_puts(b, "\n\n");
            }
            buf_put_text(b, msg_content(c, i));
            buf_puts(b, close);
            break;
        case ROLE_ASSISTANT:
            buf_puts(b, answer_sep);
            if (f == CHAT_MISTRAL_V3)
                buf_put_text_trimmed(b, msg_content(c, i));
            else
                buf_put_text(b, msg_content(c, i));
            buf_puts(b, c->eos);
            break;
        case ROLE_TOOL: /* never here: rewritten by the generic form, or rendered by render_mistral_tools */
            break;
        }
    }
    if (sys_at < 0 && sys->len) { /* no user turn to carry it: the system prompt becomes one */
        buf_puts(b, open);
        buf_append(b, sys);
        buf_puts(b, close);
    }
}

/* Mistral v7: system prompts in place as [SYSTEM_PROMPT] blocks; tekken drops the spaces. */
static void render_mistral_v7(const struct chat_ctx *c, struct chat_buf *b, bool tekken)
{
    const char *sp = tekken ? "" : " ";
    for (int i = 0; i < c->n; i++) {
        switch (c->roles[i]) {
        case ROLE_SYSTEM:
            buf_puts(b, "[SYSTEM_PROMPT]");
            buf_puts(b, sp);
            buf_put_text(b, msg_content(c, i));
            buf_puts(b, "[/SYSTEM_PROMPT]");
            break;
        case ROLE_USER:
            buf_puts(b, "[INST]");
            buf_puts(b, sp);
            buf_put_text(b, msg_content(c, i));
            buf_puts(b, "[/INST]");
            break;
        case ROLE_ASSISTANT:
            buf_puts(b, sp);
            buf_put_text(b, msg_content(c, i));
            buf_puts(b, c->eos);
            break;
        case ROLE_TOOL: /* never here: rewritten by the generic form, or rendered by render_mistral_tools */
            break;
        }
    }
}

/* Mistral v3 / v7 with tools: [AVAILABLE_TOOLS] before the last user turn, calls as [TOOL_CALLS] with a JSON
 * array (each call's 9-character id), results as [TOOL_RESULTS] {"content", "call_id"}. v3 puts the system
 * prompt into the last user turn, v7 writes [SYSTEM_PROMPT] blocks in place; the tekken variants drop the
 * spaces after the tags. */
static void render_mistral_tools(const struct chat_ctx *c, struct chat_buf *b, struct chat_buf *sys,
                                 enum chat_family f)
{
    bool v7 = f == CHAT_MISTRAL_V7 || f == CHAT_MISTRAL_V7_TEKKEN;
    const char *sp = f == CHAT_MISTRAL_V3 || f == CHAT_MISTRAL_V7 ? " " : "";
    int last_user = find_user(c, true);
    if (!v7)
        for (int i = 0; i < c->n; i++)
            if (c->roles[i] == ROLE_SYSTEM)
                buf_put_joined(sys, msg_content(c, i), false);
    for (int i = 0; i < c->n; i++) {
        switch (c->roles[i]) {
        case ROLE_SYSTEM:
            if (v7) {
                buf_puts(b, "[SYSTEM_PROMPT]");
                buf_puts(b, sp);
                buf_put_text(b, msg_content(c, i));
                buf_puts(b, "[/SYSTEM_PROMPT]");
            }
            break;
        case ROLE_USER:
            if (i == last_user && c->n_tools) {
                buf_puts(b, "[AVAILABLE_TOOLS]");
                buf_puts(b, sp);
                buf_puts(b, "[");
                for (int t = 0; t < c->n_tools; t++) {
                    if (t)
                        buf_puts(b, ", ");
                    buf_put_text(b, c->tools[t].json);
                }
                buf_puts(b, "][/AVAILABLE_TOOLS]");
            }
            buf_puts(b, "[INST]");
            buf_puts(b, sp);
            if (i == last_user && sys->len) {
                buf_append(b, sys);
                buf_puts(b, "\n\n");
            }
            buf_put_text(b, msg_content(c, i));
            buf_puts(b, "[/INST]");
            break;
        case ROLE_ASSISTANT:
            if (*msg_content(c, i)) {
                buf_puts(b, sp);
                buf_put_text(b, msg_content(c, i));
            }
            if (c->msgs[i].n_tool_calls) {
                buf_puts(b, "[TOOL_CALLS]");
                buf_puts(b, sp);
                buf_puts(b, "[");
                for (int k = 0; k < c->msgs[i].n_tool_calls; k++) {
                    const struct chat_tool_call *tc = &c->msgs[i].tool_calls[k];
                    buf_puts(b, k ? ", {\"name\": " : "{\"name\": ");
                    buf_put_json_string(b, tc->name);
                    buf_puts(b, ", \"arguments\": ");
                    buf_put_text(b, call_args(tc));
                    if (tc->id) {
                        buf_puts(b, ", \"id\": ");
                        buf_put_json_string(b, tc->id);
                    }
                    buf_puts(b, "}");
                }
                buf_puts(b, "]");
            }
            buf_puts(b, c->eos);
            break;
        case ROLE_TOOL:
            buf_puts(b, "[TOOL_RESULTS]");
            buf_puts(b, sp);
            buf_puts(b, "{\"content\": ");
            buf_put_json_string(b, msg_content(c, i));
            if (c->msgs[i].tool_call_id) {
                buf_puts(b, ", \"call_id\": ");
                buf_put_json_string(b, c->msgs[i].tool_call_id);
            }
            buf_puts(b, "}[/TOOL_RESULTS]");
            break;
        }
    }
}

/* The generic tool form: the conversation rewritten into system / user / assistant messages (tools listed
 * in a first system message, calls and results as JSON), for families with no tool format of their own.
 * *out gets the messages (strings in *texts, all malloc'd; free with generic_free). 0 or ERR_NOMEM. */
static int generic_rewrite(const struct chat_ctx *c, struct chat_message **out, int *n_out)
{
    int n = c->n + (c->n_tools ? 1 : 0), k = 0;
    struct chat_message *m = calloc((size_t)n, sizeof *m);
    if (!m)
        return ERR_NOMEM;
    *out = m;
    *n_out = 0;
    if (c->n_tools) {
        struct chat_buf t = {0};
        buf_puts(&t, "You can call these tools:\n");
        for (int i = 0; i < c->n_tools; i++) {
            buf_puts(&t, c->tools[i].json);
            buf_puts(&t, "\n");
        }
        buf_puts(&t, "\nAnswer with one JSON object: {\"tool_calls\": [{\"name\": <tool name>, \"arguments\": "
                     "<arguments object>}]} to call tools, or {\"response\": <your answer>} to answer directly.");
        free(t.sp);
        if (t.oom || !t.p)
            return ERR_NOMEM;
        m[k].role = "system";
        m[k++].content = t.p;
        *n_out = k;
    }
    for (int i = 0; i < c->n; i++, k++) {
        const struct chat_message *src = &c->msgs[i];
        json_t *o = NULL;
        m[k].role = c->roles[i] == ROLE_TOOL ? "user" : src->role;
        if (c->roles[i] == ROLE_TOOL) {
            o = json_pack("{s:{s:s?,s:s?,s:s}}", "tool_response", "tool_call_id", src->tool_call_id, "name",
                          src->name, "content", msg_content(c, i));
        } else if (src->n_tool_calls) {
            json_t *calls = json_array();
            for (int j = 0; calls && j < src->n_tool_calls; j++) {
                json_t *args = json_loads(call_args(&src->tool_calls[j]), JSON_DECODE_ANY, NULL);
                json_array_append_new(calls, json_pack("{s:s,s:o}", "name", src->tool_calls[j].name, "arguments",
                                                       args ? args : json_string(call_args(&src->tool_calls[j]))));
            }
            o = calls ? json_pack("{s:o}", "tool_calls", calls) : NULL;
        }
        if (o) {
            m[k].content = json_dumps(o, 0);
            json_decref(o);
        } else if (c->roles[i] == ROLE_TOOL || src->n_tool_calls) {
            m[k].content = NULL;
        } else {
            m[k].content = strdup(msg_content(c, i));
        }
        *n_out = k + 1;
        if (!m[k].content)
            return ERR_NOMEM;
    }
    return 0;
}

static void generic_free(struct chat_message *m, int n)
{
    for (int i = 0; m && i < n; i++)
        free((char *)m[i].content);
    free(m);
}

char *chat_template_apply(enum chat_family f, const struct chat_message *msgs, int n_msgs,
                          bool add_generation_prompt, const char *bos_text, const char *eos_text, char *err)
{
    return chat_template_render(f, msgs, n_msgs, add_generation_prompt, bos_text, eos_text, NULL, NULL, err);
}

char *chat_template_render(enum chat_family f, const struct chat_message *msgs, int n_msgs,
                           bool add_generation_prompt, const char *bos_text, const char *eos_text,
                           struct tok_span **content, size_t *n_content, char *err)
{
    return chat_template_render_tools(f, msgs, n_msgs, NULL, 0, add_generation_prompt, bos_text, eos_text, content,
                                      n_content, err);
}

char *chat_template_render_tools(enum chat_family f, const struct chat_message *msgs, int n_msgs,
                                 const struct chat_tool *tools, int n_tools, bool add_generation_prompt,
                                 const char *bos_text, const char *eos_text, struct tok_span **content,
                                 size_t *n_content, char *err)
{
    struct chat_message *gm = NULL;
    int n_gm = 0;
    struct chat_buf out = {0}, sys = {0}, tmp = {0};
    enum chat_role *roles = NULL;
    if (content)
        *content = NULL;
    if (n_content)
        *n_content = 0;

    if ((int)f <= CHAT_NONE || f >= CHAT_FAMILY_COUNT_) {
        err_set(err, ERR_INVALID_ARG, "no chat template for this model: choose one of %s", chat_family_list());
        return NULL;
    }
    if (!msgs || n_msgs <= 0) {
        err_set(err, ERR_INVALID_ARG, "messages must contain at least one message");
        return NULL;
    }
    roles = malloc(((size_t)n_msgs + 1) * sizeof(*roles)); /* + 1: the generic form's tools message */
    if (!roles)
        goto oom;
    for (int i = 0; i < n_msgs; i++) {
        const char *r = msgs[i].role;
        if (!r) {
            err_set(err, ERR_INVALID_ARG, "messages[%d] has no role", i);
            goto fail;
        }
        if (strcmp(r, "system") == 0) {
            roles[i] = ROLE_SYSTEM;
        } else if (strcmp(r, "user") == 0) {
            roles[i] = ROLE_USER;
        } else if (strcmp(r, "assistant") == 0) {
            roles[i] = ROLE_ASSISTANT;
        } else if (strcmp(r, "tool") == 0) {
            roles[i] = ROLE_TOOL;
        } else {
            err_set(err, ERR_INVALID_ARG,
                    "messages[%d].role is \"%.64s\": only \"system\", \"user\", \"assistant\" and \"tool\" are "
                    "supported", i, r);
            goto fail;
        }
        if (msgs[i].n_tool_calls && roles[i] != ROLE_ASSISTANT) {
            err_set(err, ERR_INVALID_ARG, "messages[%d] has tool_calls: only assistant messages make calls", i);
            goto fail;
        }
    }
    struct chat_ctx c = {
        .msgs = msgs,
        .roles = roles,
        .n = n_msgs,
        .bos = bos_text ? bos_text : "<s>",
        .eos = eos_text ? eos_text : "</s>",
        .gen = add_generation_prompt,
        .tools = tools,
        .n_tools = n_tools > 0 && tools ? n_tools : 0,
    };
    if (msg_has_tools(&c) && chat_tool_format_of(f) == CHAT_TOOLS_GENERIC) {
        if (generic_rewrite(&c, &gm, &n_gm))
            goto oom;
        for (int i = 0; i < n_gm; i++) /* the rewritten roles: system, user or assistant */
            roles[i] = !strcmp(gm[i].role, "system") ? ROLE_SYSTEM : !strcmp(gm[i].role, "user") ? ROLE_USER
                                                                                                 : ROLE_ASSISTANT;
        c.msgs = gm;
        c.n = n_gm;
        c.n_tools = 0;
    } else if (msg_has_tools(&c) && chat_tool_format_of(f) == CHAT_TOOLS_MISTRAL) {
        render_mistral_tools(&c, &out, &sys, f);
        goto rendered;
    }
    switch (f) {
    case CHAT_CHATML:
        render_chatml(&c, &out);
        break;
    case CHAT_LLAMA3:
        render_llama3(&c, &out);
        break;
    case CHAT_ZEPHYR:
        render_tagged(&c, &out, c.eos);
        break;
    case CHAT_PHI3:
        render_tagged(&c, &out, "<|end|>");
        break;
    case CHAT_GEMMA:
        render_gemma(&c, &out, &sys);
        break;
    case CHAT_LLAMA2:
        render_llama2(&c, &out, &sys, &tmp);
        break;
    case CHAT_MISTRAL_LEGACY:
        render_mistral_legacy(&c, &out);
        break;
    case CHAT_MISTRAL_V1:
    case CHAT_MISTRAL_V3:
    case CHAT_MISTRAL_V3_TEKKEN:
        render_mistral_v1_v3(&c, &out, &sys, f);
        break;
    case CHAT_MISTRAL_V7:
    case CHAT_MISTRAL_V7_TEKKEN:
        render_mistral_v7(&c, &out, f == CHAT_MISTRAL_V7_TEKKEN);
        break;
    default:
        break;
    }
rendered:
    if (out.oom || sys.oom || tmp.oom)
        goto oom;
    if (!out.p) { /* every message empty: an empty prompt is still a prompt */
        out.p = calloc(1, 1);
        if (!out.p)
            goto oom;
    }
    free(roles);
    generic_free(gm, n_gm);
    buf_free(&sys);
    buf_free(&tmp);
    if (content && n_content) {
        *content = out.sp;
        *n_content = out.n_sp;
        out.sp = NULL;
    }
    free(out.sp);
    return out.p;
oom:
    err_set(err, ERR_NOMEM, "out of memory rendering the chat prompt");
fail:
    free(roles);
    generic_free(gm, n_gm);
    buf_free(&out);
    buf_free(&sys);
    buf_free(&tmp);
    return NULL;
}
