// Structured output through the official openai npm client (v5), unchanged: chat.completions.parse with a
// plain json_schema response_format (zod is not a declared dependency), and a json_schema chat completion
// streamed. Usage: node structured_client.mjs BASE_URL. Prints one JSON line; exits non-zero on a mismatch.
import OpenAI from "openai";
import assert from "node:assert/strict";

const base = process.argv[2];
const client = new OpenAI({ baseURL: `${base}/v1`, apiKey: "sk-test", maxRetries: 0, timeout: 60000 });
const schema = {
  type: "object",
  properties: { city: { type: "string", maxLength: 12 }, population: { type: "integer", minimum: 0, maximum: 99999 } },
  required: ["city", "population"],
  additionalProperties: false,
};
const response_format = { type: "json_schema", json_schema: { name: "place", schema, strict: true } };
const out = {};
const model = (await client.models.list()).data[0].id;
const parsed = await client.chat.completions.parse({
  model, messages: [{ role: "user", content: "A city as JSON" }], max_tokens: 120, temperature: 1.0, response_format,
});
const msg = parsed.choices[0].message;
assert.equal(parsed.choices[0].finish_reason, "stop");
assert.equal(typeof msg.parsed, "object");
out.parsed = msg.parsed;

let text = "";
let finish = null;
const stream = await client.chat.completions.create({
  model, messages: [{ role: "user", content: "Another" }], max_tokens: 120, temperature: 1.0, stream: true,
  response_format,
});
for await (const chunk of stream)
  for (const ch of chunk.choices) {
    if (ch.delta.content) text += ch.delta.content;
    if (ch.finish_reason) finish = ch.finish_reason;
  }
assert.equal(finish, "stop");
out.streamed = JSON.parse(text);
console.log(JSON.stringify(out));
