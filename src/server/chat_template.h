/*
 * chat_template: renders OpenAI chat messages into a prompt string the way the model was trained. The family
 * is recognized from the GGUF's tokenizer.chat_template text (Jinja, which we do not execute: we match
 * marker substrings, as llama.cpp's llm_chat_detect_template does) or chosen by name (--chat-template).
 * Families: llama2 ([INST] with <<SYS>>), llama3 (<|start_header_id|>), chatml (<|im_start|>: Qwen,
 * SmolLM), mistral (v1/v3/v7 [INST] variants), zephyr (<|user|>), plus gemma/phi3 if cheap.
 */
#ifndef WAFER_SERVER_CHAT_TEMPLATE_H
#define WAFER_SERVER_CHAT_TEMPLATE_H

#include <stdbool.h>
#include <stddef.h>

enum chat_family {
    CHAT_NONE = 0,
    CHAT_LLAMA2,
    CHAT_LLAMA3,
    CHAT_CHATML,
    CHAT_MISTRAL_V1,
    CHAT_MISTRAL_V3,
    CHAT_MISTRAL_V7,
    CHAT_ZEPHYR,
    CHAT_GEMMA,
    CHAT_PHI3,
    CHAT_MISTRAL_V3_TEKKEN, /* v3 without the spaces (Mistral Nemo) */
    CHAT_MISTRAL_V7_TEKKEN, /* v7 without the spaces (Mistral Small 3.x); chosen by name only */
    CHAT_MISTRAL_LEGACY,    /* "[INST] " turns without <<SYS>> (the first Mistral 7B Instruct templates) */
    CHAT_FAMILY_COUNT_
};

/* A function call an assistant message made (OpenAI's message.tool_calls[i]). */
struct chat_tool_call {
    const char *id;        /* may be NULL */
    const char *name;
    const char *arguments; /* the arguments object as JSON text */
};

struct chat_message {
    const char *role; /* "system", "user", "assistant", "tool" (others refused) */
    const char *content;
    const struct chat_tool_call *tool_calls; /* assistant: the calls it made, [n_tool_calls]; may be NULL */
    int n_tool_calls;
    const char *tool_call_id; /* tool: the call this message answers (may be NULL) */
    const char *name;         /* tool: the function's name (may be NULL) */
};

/* A function the model may call (OpenAI's tools[i].function). */
struct chat_tool {
    const char *name;
    const char *json; /* the whole tool as JSON text, {"type": "function", "function": {name, description,
                         parameters}}, written into the prompt as the family's template writes it */
};

/* How a family's models write tool calls (and how tools, calls and results are rendered):
 * LLAMA3  {"name": N, "parameters": ARGS} as the whole answer (Meta's Llama 3.1+ JSON tool calling; one
 *         call per turn), results in "ipython" turns;
 * HERMES  <tool_call>\n{"name": N, "arguments": ARGS}\n</tool_call>, one or more (Hermes 2/3, Qwen 2.5 on
 *         ChatML), results in <tool_response> blocks of a user turn;
 * MISTRAL [TOOL_CALLS][{"name": N, "arguments": ARGS, "id": 9 alphanumerics}, ...] (v3 / v7, tekken or
 *         not), results in [TOOL_RESULTS] blocks;
 * GENERIC every other family: the answer is one JSON object, {"tool_calls": [{"name", "arguments"}...]}
 *         or (tool_choice auto) {"response": TEXT}; tools listed in a system message, results as user
 *         turns holding {"tool_response": ...}. */
enum chat_tool_format { CHAT_TOOLS_GENERIC, CHAT_TOOLS_LLAMA3, CHAT_TOOLS_HERMES, CHAT_TOOLS_MISTRAL };
enum chat_tool_format chat_tool_format_of(enum chat_family f);
const char *chat_tool_format_name(enum chat_tool_format t);

/* Family from template text (NULL or unrecognized -> CHAT_NONE). A text that is exactly a family name
 * gives that family. Templates of families we do not render (phi4, SmolVLM, GLM) give CHAT_NONE rather
 * than a look-alike. */
enum chat_family chat_family_detect(const char *template_text);
/* Family from a name ("llama2", "llama3", "chatml", "mistral-v1", "mistral-v3", "mistral-v7", "zephyr", ...);
 * returns 0 or ERR_INVALID_ARG. */
int chat_family_from_name(const char *name, enum chat_family *out);
const char *chat_family_name(enum chat_family f);
/* Comma-separated names, for error messages. */
const char *chat_family_list(void);

/* Renders messages into a malloc'd prompt (caller frees) ending with the assistant prefix when
 * add_generation_prompt. bos_text/eos_text are the model's BOS/EOS token texts, used by families that
 * write them literally (NULL: "<s>" and "</s>"). NULL and a message (ERR_MSG_MAX) on a bad role or family,
 * an empty list or out of memory. The prompt is tokenized with special tokens parsed in the markup only
 * (chat_template_render gives the content spans) and without adding BOS twice: it never begins with the BOS
 * text (the tokenizer adds BOS when the model asks for it); BOS texts inside it (llama2's later turns) are
 * written literally. A NULL content is an empty one. */
char *chat_template_apply(enum chat_family f, const struct chat_message *msgs, int n_msgs,
                          bool add_generation_prompt, const char *bos_text, const char *eos_text, char *err);

struct tok_span;
/* chat_template_apply that also says which bytes came from message contents: *content gets their spans
 * (malloc'd, caller frees; sorted, disjoint; NULL when there are none) and *n_content their number, for
 * tokenizer_encode_spans, so that special-token text inside a message stays text and only the template's
 * markup becomes special tokens. content and n_content may be NULL (then this is chat_template_apply). */
char *chat_template_render(enum chat_family f, const struct chat_message *msgs, int n_msgs,
                           bool add_generation_prompt, const char *bos_text, const char *eos_text,
                           struct tok_span **content, size_t *n_content, char *err);

/* chat_template_render with tools[0..n_tools) offered to the model (n_tools 0: none listed; tool messages
 * and assistant tool calls are rendered either way), in the family's tool format (chat_tool_format_of).
 * Tool definitions, call arguments and tool results are content, never markup. */
char *chat_template_render_tools(enum chat_family f, const struct chat_message *msgs, int n_msgs,
                                 const struct chat_tool *tools, int n_tools, bool add_generation_prompt,
                                 const char *bos_text, const char *eos_text, struct tok_span **content,
                                 size_t *n_content, char *err);

#endif
