/*
 * tool_call: OpenAI tools on chat completions. From the request's tools and tool_choice, the GBNF grammar
 * the model's answer must follow in its chat family's tool format (chat_template.h: Hermes, Llama 3,
 * Mistral, generic JSON), with each call's arguments constrained by its function's parameter schema (the
 * JSON Schema compiler's grammar); and, once the answer is written, the calls read back out of it as
 * OpenAI's message.tool_calls, each one's arguments validated against its function's schema.
 *
 * tool_choice auto lets the model write either plain text or calls: the grammar's text branch is any text
 * that does not begin with the format's call marker (<tool_call>, [TOOL_CALLS], "{" for Llama 3), so an
 * answer is a call exactly when it begins with the marker (the generic form: a {"response": TEXT} object).
 */
#ifndef WAFER_SERVER_TOOL_CALL_H
#define WAFER_SERVER_TOOL_CALL_H

#include "server/chat_template.h"
#include "server/request_validate.h"

#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>

/* The GBNF grammar for an answer to g (g->tool_choice not GEN_TOOLS_NONE) in format fmt: 0 and *gbnf
 * (malloc'd, caller frees), or a negative code with e naming the tool whose parameters cannot be compiled
 * (ERR_INVALID_ARG / ERR_UNSUPPORTED with the compiler's JSON pointer), ERR_NOMEM. */
int tool_grammar_build(enum chat_tool_format fmt, const struct gen_request *g, char **gbnf, struct api_error *e);

/* tool_choice auto: whether the answer begun in text[0..len) is already known to be text, not calls (it
 * does not begin with the format's call marker). Always false for the generic form (its text is inside a
 * JSON object). */
bool tool_answer_is_text(enum chat_tool_format fmt, const char *text, size_t len);

/* Reads an answer text[0..len) written under tool_grammar_build's grammar. *calls gets a new JSON array of
 * OpenAI tool calls [{id, type: "function", function: {name, arguments: JSON text}}] (empty when the answer
 * is text); *content a new JSON string when the text part is not the answer itself (the generic form's
 * response), else NULL (the answer is calls, or its text is the content as written). Call ids
 * are id_prefix + "_" + the call's index, or the model's own id (Mistral). Each call's arguments are
 * validated against its tool's parameter schema (tools / params as gen_request holds them). 0, or
 * ERR_INVALID_ARG with the reason in err (ERR_MSG_MAX): a call the grammar should have made impossible. */
int tool_calls_parse(enum chat_tool_format fmt, const char *text, size_t len, const struct chat_tool *tools,
                     char *const *params, int n_tools, const char *id_prefix, json_t **calls, json_t **content,
                     char *err);

#endif
