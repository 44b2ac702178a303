// Drives wafer serve with the official openai npm client (v5), unchanged: completions, chat completions,
// streaming of both (with usage), the models list and a typed error. Usage: node openai_client.mjs BASE_URL
// Prints one JSON line with what it saw; exits non-zero on the first mismatch.
import OpenAI from "openai";
import assert from "node:assert/strict";

const base = process.argv[2];
const client = new OpenAI({ baseURL: `${base}/v1`, apiKey: "sk-test", maxRetries: 0, timeout: 60000 });
const out = {};

const models = await client.models.list();
out.models = models.data.map((m) => m.id);
assert.ok(out.models.length >= 1);
const model = out.models[0];

const cmpl = await client.completions.create({ model, prompt: "Once upon a time", max_tokens: 16, temperature: 0 });
assert.equal(cmpl.object, "text_completion");
assert.equal(cmpl.choices.length, 1);
assert.equal(cmpl.usage.completion_tokens, 16);
out.completion = cmpl.choices[0].text;

let streamed = "";
let finish = null;
let usage = null;
const cstream = await client.completions.create({
  model, prompt: "Once upon a time", max_tokens: 16, temperature: 0, stream: true,
  stream_options: { include_usage: true },
});
for await (const chunk of cstream) {
  if (chunk.usage) usage = chunk.usage;
  for (const ch of chunk.choices) {
    streamed += ch.text;
    if (ch.finish_reason) finish = ch.finish_reason;
  }
}
assert.equal(streamed, out.completion);
assert.equal(finish, "length");
assert.equal(usage.completion_tokens, 16);
out.completion_stream = streamed;

const messages = [{ role: "system", content: "You tell stories." }, { role: "user", content: "Tell me a story." }];
const chat = await client.chat.completions.create({ model, messages, max_tokens: 12, temperature: 0 });
assert.equal(chat.object, "chat.completion");
assert.equal(chat.choices[0].message.role, "assistant");
out.chat = chat.choices[0].message.content;

let chatStreamed = "";
let role = null;
const sstream = await client.chat.completions.create({ model, messages, max_tokens: 12, temperature: 0, stream: true });
for await (const chunk of sstream) {
  for (const ch of chunk.choices) {
    if (ch.delta.role) role = ch.delta.role;
    chatStreamed += ch.delta.content ?? "";
  }
}
assert.equal(role, "assistant");
assert.equal(chatStreamed, out.chat);
out.chat_stream = chatStreamed;

try {
  await client.completions.create({ model: "no-such-model", prompt: "x", max_tokens: 2 });
  assert.fail("unknown model accepted");
} catch (e) {
  assert.ok(e instanceof OpenAI.NotFoundError, `expected NotFoundError, got ${e}`);
  out.error_status = e.status;
  out.error_code = e.code;
}
try {
  await client.completions.create({ model, prompt: "x", max_tokens: -1 });
  assert.fail("negative max_tokens accepted");
} catch (e) {
  assert.ok(e instanceof OpenAI.BadRequestError, `expected BadRequestError, got ${e}`);
  out.bad_param = e.param;
}

console.log(JSON.stringify(out));
