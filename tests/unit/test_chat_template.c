/* Tests for chat templates: family detection from the Jinja text models ship, and rendering of one
 * conversation (system, user, assistant, user, assistant with padded content, user, generation prompt) per
 * family, each expectation written out from what that family's reference template produces. */
#include "testutil.h"

#include "core/err.h"
#include "server/chat_template.h"

#include <stdlib.h>
#include <string.h>

/* ---- templates as models ship them (Jinja source, newlines as in tokenizer_config.json) ---- */

static const char *tmpl_tinyllama =
    "{% for message in messages %}\n{% if message['role'] == 'user' %}\n{{ '<|user|>\n' + message['content'] + "
    "eos_token }}\n{% elif message['role'] == 'system' %}\n{{ '<|system|>\n' + message['content'] + eos_token }}\n"
    "{% elif message['role'] == 'assistant' %}\n{{ '<|assistant|>\n'  + message['content'] + eos_token }}\n"
    "{% endif %}\n{% if loop.last and add_generation_prompt %}\n{{ '<|assistant|>' }}\n{% endif %}\n{% endfor %}";

static const char *tmpl_stablelm_zephyr =
    "{% for message in messages %}\n{% if message['role'] == 'user' %}\n{{ '<|user|>\n' + message['content'] + "
    "'<|endoftext|>' }}\n{% elif message['role'] == 'assistant' %}\n{{ '<|assistant|>\n'  + message['content'] + "
    "'<|endoftext|>' }}\n{% endif %}\n{% if loop.last and add_generation_prompt %}\n{{ '<|assistant|>' }}\n"
    "{% endif %}\n{% endfor %}";

static const char *tmpl_llama3 =
    "{% set loop_messages = messages %}{% for message in loop_messages %}{% set content = "
    "'<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n'+ message['content'] | trim + "
    "'<|eot_id|>' %}{% if loop.index0 == 0 %}{% set content = bos_token + content %}{% endif %}{{ content }}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}"
    "{% endif %}";

static const char *tmpl_qwen2 =
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}{{ "
    "'<|im_start|>system\\nYou are a helpful assistant.<|im_end|>\\n' }}{% endif %}{{'<|im_start|>' + "
    "message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n'}}{% endfor %}{% if "
    "add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}";

static const char *tmpl_llama2 =
    "{% if messages[0]['role'] == 'system' %}{% set loop_messages = messages[1:] %}{% set system_message = "
    "messages[0]['content'] %}{% else %}{% set loop_messages = messages %}{% set system_message = false %}"
    "{% endif %}{% for message in loop_messages %}{% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}"
    "{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}{% endif %}"
    "{% if loop.index0 == 0 and system_message != false %}{% set content = '<<SYS>>\\n' + system_message + "
    "'\\n<</SYS>>\\n\\n' + message['content'] %}{% else %}{% set content = message['content'] %}{% endif %}"
    "{% if message['role'] == 'user' %}{{ bos_token + '[INST] ' + content.strip() + ' [/INST]' }}"
    "{% elif message['role'] == 'assistant' %}{{ ' '  + content.strip() + ' ' + eos_token }}{% endif %}"
    "{% endfor %}";

static const char *tmpl_mistral_v02 =
    "{{ bos_token }}{% for message in messages %}{% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}"
    "{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}{% endif %}"
    "{% if message['role'] == 'user' %}{{ '[INST] ' + message['content'] + ' [/INST]' }}{% elif "
    "message['role'] == 'assistant' %}{{ message['content'] + eos_token}}{% else %}{{ raise_exception('Only "
    "user and assistant roles are supported!') }}{% endif %}{% endfor %}";

static const char *tmpl_mistral_v1 =
    "{%- if messages[0]['role'] == 'system' %}\n    {%- set system_message = messages[0]['content'] %}\n"
    "    {%- set loop_messages = messages[1:] %}\n{%- else %}\n    {%- set loop_messages = messages %}\n"
    "{%- endif %}\n\n{{- bos_token }}\n{%- for message in loop_messages %}\n    {%- if message['role'] == "
    "'user' %}\n        {%- if loop.first and system_message is defined %}\n            {{- ' [INST] ' + "
    "system_message + '\\n\\n' + message['content'] + ' [/INST]' }}\n        {%- else %}\n            {{- ' "
    "[INST] ' + message['content'] + ' [/INST]' }}\n        {%- endif %}\n    {%- elif message['role'] == "
    "'assistant' %}\n        {{- ' ' + message['content'] + eos_token}}\n    {%- endif %}\n{%- endfor %}\n";

static const char *tmpl_mistral_v3 =
    "{{- bos_token }}\n{%- for message in loop_messages %}\n    {%- if message[\"role\"] == \"user\" %}\n"
    "        {%- if tools is not none and (message == user_messages[-1]) %}\n            {{- \"[AVAILABLE_TOOLS] "
    "[\" }}\n        {%- endif %}\n        {%- if loop.last and system_message is defined %}\n            {{- "
    "\"[INST] \" + system_message + \"\\n\\n\" + message[\"content\"] + \"[/INST]\" }}\n        {%- else %}\n"
    "            {{- \"[INST] \" + message[\"content\"] + \"[/INST]\" }}\n        {%- endif %}\n    {%- elif "
    "message[\"role\"] == \"assistant\" %}\n        {{- \" \" + message[\"content\"]|trim + eos_token}}\n"
    "    {%- endif %}\n{%- endfor %}\n";

static const char *tmpl_mistral_nemo =
    "{{- bos_token }}\n{%- for message in loop_messages %}\n    {%- if message[\"role\"] == \"user\" %}\n"
    "        {%- if tools is not none and (message == user_messages[-1]) %}\n            {{- "
    "\"[AVAILABLE_TOOLS][\" }}\n        {%- endif %}\n        {%- if loop.last and system_message is defined %}\n"
    "            {{- \"[INST]\" + system_message + \"\\n\\n\" + message[\"content\"] + \"[/INST]\" }}\n"
    "        {%- else %}\n            {{- \"[INST]\" + message[\"content\"] + \"[/INST]\" }}\n        {%- endif %}\n"
    "    {%- elif message[\"role\"] == \"assistant\" %}\n        {{- message[\"content\"] + eos_token}}\n"
    "    {%- endif %}\n{%- endfor %}\n";

static const char *tmpl_mistral_v7 =
    "{{ bos_token }}{% for message in messages %}{% if message['role'] == 'user' %}{{ '[INST] ' + "
    "message['content'] + '[/INST]' }}{% elif message['role'] == 'system' %}{{ '[SYSTEM_PROMPT] ' + "
    "message['content'] + '[/SYSTEM_PROMPT]' }}{% elif message['role'] == 'assistant' %}{{ ' ' + "
    "message['content'] + eos_token }}{% else %}{{ raise_exception('Only user, system and assistant roles are "
    "supported!') }}{% endif %}{% endfor %}";

static const char *tmpl_gemma =
    "{{ bos_token }}{% if messages[0]['role'] == 'system' %}{{ raise_exception('System role not supported') }}"
    "{% endif %}{% for message in messages %}{% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}"
    "{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}{% endif %}"
    "{% if (message['role'] == 'assistant') %}{% set role = 'model' %}{% else %}{% set role = message['role'] %}"
    "{% endif %}{{ '<start_of_turn>' + role + '\\n' + message['content'] | trim + '<end_of_turn>\\n' }}"
    "{% endfor %}{% if add_generation_prompt %}{{'<start_of_turn>model\\n'}}{% endif %}";

static const char *tmpl_phi3 =
    "{% for message in messages %}{% if message['role'] == 'system' %}{{'<|system|>\\n' + message['content'] + "
    "'<|end|>\\n'}}{% elif message['role'] == 'user' %}{{'<|user|>\\n' + message['content'] + '<|end|>\\n'}}"
    "{% elif message['role'] == 'assistant' %}{{'<|assistant|>\\n' + message['content'] + '<|end|>\\n'}}"
    "{% endif %}{% endfor %}{% if add_generation_prompt %}{{ '<|assistant|>\\n' }}{% else %}{{ eos_token }}"
    "{% endif %}";

static const char *tmpl_phi4 =
    "{% for message in messages %}{% if (message['role'] == 'system') %}{{'<|im_start|>system<|im_sep|>' + "
    "message['content'] + '<|im_end|>'}}{% endif %}{% endfor %}";

static const char *tmpl_glm_edge =
    "{% for item in messages %}{% if item['role'] == 'system' %}<|system|>\n{{ item['content'] }}{% elif "
    "item['role'] == 'user' %}<|user|>\n{{ item['content'] }}{% elif item['role'] == 'assistant' %}"
    "<|assistant|>\n{{ item['content'] }}{% endif %}{% endfor %}<|assistant|>";

static void test_detect(void **state)
{
    (void)state;
    assert_int_equal(chat_family_detect(tmpl_tinyllama), CHAT_ZEPHYR);
    assert_int_equal(chat_family_detect(tmpl_stablelm_zephyr), CHAT_ZEPHYR);
    assert_int_equal(chat_family_detect(tmpl_llama3), CHAT_LLAMA3);
    assert_int_equal(chat_family_detect(tmpl_qwen2), CHAT_CHATML);
    assert_int_equal(chat_family_detect(tmpl_llama2), CHAT_LLAMA2);
    assert_int_equal(chat_family_detect(tmpl_mistral_v02), CHAT_MISTRAL_LEGACY);
    assert_int_equal(chat_family_detect(tmpl_mistral_v1), CHAT_MISTRAL_V1);
    assert_int_equal(chat_family_detect(tmpl_mistral_v3), CHAT_MISTRAL_V3);
    assert_int_equal(chat_family_detect(tmpl_mistral_nemo), CHAT_MISTRAL_V3_TEKKEN);
    assert_int_equal(chat_family_detect(tmpl_mistral_v7), CHAT_MISTRAL_V7);
    assert_int_equal(chat_family_detect(tmpl_gemma), CHAT_GEMMA);
    assert_int_equal(chat_family_detect(tmpl_phi3), CHAT_PHI3);
    /* look-alikes we do not render */
    assert_int_equal(chat_family_detect(tmpl_phi4), CHAT_NONE);
    assert_int_equal(chat_family_detect(tmpl_glm_edge), CHAT_NONE);
    assert_int_equal(chat_family_detect("{{ messages[0]['content'] }}"), CHAT_NONE);
    assert_int_equal(chat_family_detect(""), CHAT_NONE);
    assert_int_equal(chat_family_detect(NULL), CHAT_NONE);
    /* a bare family name */
    assert_int_equal(chat_family_detect("chatml"), CHAT_CHATML);
    assert_int_equal(chat_family_detect("mistral-v7-tekken"), CHAT_MISTRAL_V7_TEKKEN);
}

static void test_names(void **state)
{
    (void)state;
    for (int f = CHAT_NONE + 1; f < CHAT_FAMILY_COUNT_; f++) {
        enum chat_family back = CHAT_NONE;
        const char *name = chat_family_name((enum chat_family)f);
        assert_int_equal(chat_family_from_name(name, &back), 0);
        assert_int_equal(back, f);
        assert_non_null(strstr(chat_family_list(), name));
    }
    enum chat_family out = CHAT_LLAMA3;
    assert_int_equal(chat_family_from_name("llama-3", &out), ERR_INVALID_ARG);
    assert_int_equal(chat_family_from_name("none", &out), ERR_INVALID_ARG);
    assert_int_equal(chat_family_from_name(NULL, &out), ERR_INVALID_ARG);
    assert_int_equal(out, CHAT_LLAMA3);
    assert_string_equal(chat_family_name(CHAT_FAMILY_COUNT_), "unknown");
}

/* The conversation llama.cpp's chat template test uses. */
static const struct chat_message conv[] = {
    {"system", "You are a helpful assistant"},
    {"user", "Hello"},
    {"assistant", "Hi there"},
    {"user", "Who are you"},
    {"assistant", "   I am an assistant   "},
    {"user", "Another question"},
};
#define CONV_N ((int)(sizeof(conv) / sizeof(conv[0])))

static void expect_render(enum chat_family f, const struct chat_message *msgs, int n, bool gen, const char *want)
{
    char err[ERR_MSG_MAX] = "";
    char *got = chat_template_apply(f, msgs, n, gen, "<s>", "</s>", err);
    if (!got)
        fail_msg("%s: %s", chat_family_name(f), err);
    if (strcmp(got, want) != 0)
        print_error("%s rendered\n[%s]\nwanted\n[%s]\n", chat_family_name(f), got, want);
    assert_string_equal(got, want);
    free(got);
}

static void test_render_families(void **state)
{
    (void)state;
    expect_render(CHAT_CHATML, conv, CONV_N, true,
                  "<|im_start|>system\nYou are a helpful assistant<|im_end|>\n<|im_start|>user\nHello<|im_end|>\n"
                  "<|im_start|>assistant\nHi there<|im_end|>\n<|im_start|>user\nWho are you<|im_end|>\n"
                  "<|im_start|>assistant\n   I am an assistant   <|im_end|>\n<|im_start|>user\nAnother question"
                  "<|im_end|>\n<|im_start|>assistant\n");
    expect_render(CHAT_LLAMA3, conv, CONV_N, true,
                  "<|start_header_id|>system<|end_header_id|>\n\nYou are a helpful assistant<|eot_id|>"
                  "<|start_header_id|>user<|end_header_id|>\n\nHello<|eot_id|>"
                  "<|start_header_id|>assistant<|end_header_id|>\n\nHi there<|eot_id|>"
                  "<|start_header_id|>user<|end_header_id|>\n\nWho are you<|eot_id|>"
                  "<|start_header_id|>assistant<|end_header_id|>\n\nI am an assistant<|eot_id|>"
                  "<|start_header_id|>user<|end_header_id|>\n\nAnother question<|eot_id|>"
                  "<|start_header_id|>assistant<|end_header_id|>\n\n");
    /* official Llama 2 chat: each turn stripped, BOS before every later [INST], spaces around answers */
    expect_render(CHAT_LLAMA2, conv, CONV_N, true,
                  "[INST] <<SYS>>\nYou are a helpful assistant\n<</SYS>>\n\nHello [/INST] Hi there </s>"
                  "<s>[INST] Who are you [/INST] I am an assistant </s><s>[INST] Another question [/INST]");
    expect_render(CHAT_MISTRAL_LEGACY, conv, CONV_N, true,
                  "[INST] You are a helpful assistant\nHello [/INST]Hi there</s>[INST] Who are you [/INST]"
                  "   I am an assistant   </s>[INST] Another question [/INST]");
    expect_render(CHAT_MISTRAL_V1, conv, CONV_N, true,
                  " [INST] You are a helpful assistant\n\nHello [/INST] Hi there</s> [INST] Who are you [/INST]"
                  "    I am an assistant   </s> [INST] Another question [/INST]");
    /* v3: the system prompt travels with the last user message */
    expect_render(CHAT_MISTRAL_V3, conv, CONV_N, true,
                  "[INST] Hello[/INST] Hi there</s>[INST] Who are you[/INST] I am an assistant</s>"
                  "[INST] You are a helpful assistant\n\nAnother question[/INST]");
    expect_render(CHAT_MISTRAL_V3_TEKKEN, conv, CONV_N, true,
                  "[INST]Hello[/INST]Hi there</s>[INST]Who are you[/INST]   I am an assistant   </s>"
                  "[INST]You are a helpful assistant\n\nAnother question[/INST]");
    expect_render(CHAT_MISTRAL_V7, conv, CONV_N, true,
                  "[SYSTEM_PROMPT] You are a helpful assistant[/SYSTEM_PROMPT][INST] Hello[/INST] Hi there</s>"
                  "[INST] Who are you[/INST]    I am an assistant   </s>[INST] Another question[/INST]");
    expect_render(CHAT_MISTRAL_V7_TEKKEN, conv, CONV_N, true,
                  "[SYSTEM_PROMPT]You are a helpful assistant[/SYSTEM_PROMPT][INST]Hello[/INST]Hi there</s>"
                  "[INST]Who are you[/INST]   I am an assistant   </s>[INST]Another question[/INST]");
    /* TinyLlama / zephyr-7b: every turn ends with the EOS text and a newline */
    expect_render(CHAT_ZEPHYR, conv, CONV_N, true,
                  "<|system|>\nYou are a helpful assistant</s>\n<|user|>\nHello</s>\n<|assistant|>\nHi there</s>\n"
                  "<|user|>\nWho are you</s>\n<|assistant|>\n   I am an assistant   </s>\n<|user|>\n"
                  "Another question</s>\n<|assistant|>\n");
    /* gemma has no system role: it opens the first user turn */
    expect_render(CHAT_GEMMA, conv, CONV_N, true,
                  "<start_of_turn>user\nYou are a helpful assistant\n\nHello<end_of_turn>\n<start_of_turn>model\n"
                  "Hi there<end_of_turn>\n<start_of_turn>user\nWho are you<end_of_turn>\n<start_of_turn>model\n"
                  "I am an assistant<end_of_turn>\n<start_of_turn>user\nAnother question<end_of_turn>\n"
                  "<start_of_turn>model\n");
    expect_render(CHAT_PHI3, conv, CONV_N, true,
                  "<|system|>\nYou are a helpful assistant<|end|>\n<|user|>\nHello<|end|>\n<|assistant|>\n"
                  "Hi there<|end|>\n<|user|>\nWho are you<|end|>\n<|assistant|>\n   I am an assistant   <|end|>\n"
                  "<|user|>\nAnother question<|end|>\n<|assistant|>\n");
}

static void test_render_variants(void **state)
{
    (void)state;
    /* without the generation prompt, ending on a user turn */
    expect_render(CHAT_CHATML, conv + 1, 1, false, "<|im_start|>user\nHello<|im_end|>\n");
    expect_render(CHAT_LLAMA3, conv + 1, 1, false, "<|start_header_id|>user<|end_header_id|>\n\nHello<|eot_id|>");
    expect_render(CHAT_GEMMA, conv + 1, 1, false, "<start_of_turn>user\nHello<end_of_turn>\n");
    /* no system message */
    expect_render(CHAT_LLAMA2, conv + 1, 3, true, "[INST] Hello [/INST] Hi there </s><s>[INST] Who are you [/INST]");
    expect_render(CHAT_MISTRAL_V1, conv + 1, 1, true, " [INST] Hello [/INST]");
    /* the model's own EOS text */
    char err[ERR_MSG_MAX];
    char *p = chat_template_apply(CHAT_ZEPHYR, conv + 1, 1, true, "<s>", "<|endoftext|>", err);
    assert_non_null(p);
    assert_string_equal(p, "<|user|>\nHello<|endoftext|>\n<|assistant|>\n");
    free(p);
    /* NULL bos/eos: the SentencePiece defaults */
    p = chat_template_apply(CHAT_LLAMA2, conv + 1, 3, true, NULL, NULL, err);
    assert_non_null(p);
    assert_string_equal(p, "[INST] Hello [/INST] Hi there </s><s>[INST] Who are you [/INST]");
    free(p);
    /* a system message alone still reaches the model where the family cannot place it */
    expect_render(CHAT_GEMMA, conv, 1, true,
                  "<start_of_turn>user\nYou are a helpful assistant<end_of_turn>\n<start_of_turn>model\n");
    expect_render(CHAT_LLAMA2, conv, 1, true, "[INST] <<SYS>>\nYou are a helpful assistant\n<</SYS>> [/INST]");
    expect_render(CHAT_MISTRAL_V3, conv, 1, true, "[INST] You are a helpful assistant[/INST]");
    /* a NULL content is empty */
    const struct chat_message nul[] = {{"user", NULL}};
    expect_render(CHAT_CHATML, nul, 1, true, "<|im_start|>user\n<|im_end|>\n<|im_start|>assistant\n");
    /* two system messages merged into gemma's first user turn */
    const struct chat_message two_sys[] = {{"system", " A "}, {"system", "B"}, {"user", "Q"}};
    expect_render(CHAT_GEMMA, two_sys, 3, true,
                  "<start_of_turn>user\nA\n\nB\n\nQ<end_of_turn>\n<start_of_turn>model\n");
}

static void test_bad_input(void **state)
{
    (void)state;
    char err[ERR_MSG_MAX] = "";
    const struct chat_message bad[] = {{"user", "hi"}, {"tool", "42"}};
    assert_null(chat_template_apply(CHAT_CHATML, bad, 2, true, "<s>", "</s>", err));
    assert_string_equal(err, "messages[1].role is \"tool\": only \"system\", \"user\" and \"assistant\" are supported");

    const struct chat_message norole[] = {{NULL, "hi"}};
    assert_null(chat_template_apply(CHAT_LLAMA3, norole, 1, true, "<s>", "</s>", err));
    assert_string_equal(err, "messages[0] has no role");

    err[0] = 0;
    assert_null(chat_template_apply(CHAT_CHATML, conv, 0, true, "<s>", "</s>", err));
    assert_string_equal(err, "messages must contain at least one message");
    err[0] = 0;
    assert_null(chat_template_apply(CHAT_CHATML, NULL, 3, true, "<s>", "</s>", err));
    assert_string_equal(err, "messages must contain at least one message");

    err[0] = 0;
    assert_null(chat_template_apply(CHAT_NONE, conv, CONV_N, true, "<s>", "</s>", err));
    assert_non_null(strstr(err, "no chat template"));
    assert_non_null(strstr(err, "chatml"));
    assert_null(chat_template_apply((enum chat_family)99, conv, CONV_N, true, "<s>", "</s>", err));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_detect),
        cmocka_unit_test(test_names),
        cmocka_unit_test(test_render_families),
        cmocka_unit_test(test_render_variants),
        cmocka_unit_test(test_bad_input),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
