// Structured output through the official openai npm client (v5), unchanged: chat.completions.parse with a
// plain json_schema response_format and with a zod schema (zodResponseFormat), a json_schema chat completion
// streamed, and tool calls: tool_choice "required" with a plain tool and with zodFunction (parsed_arguments).
// Usage: node structured_client.mjs BASE_URL. Prints one JSON line; exits non-zero on a mismatch.
import OpenAI from "openai";
import { zodFunction, zodResponseFormat } from "openai/helpers/zod";
import { z } from "zod";
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

const Place = z.object({ city: z.string().max(12), population: z.number().int().min(0).max(99999) });
const zparsed = await client.chat.completions.parse({
  model, messages: [{ role: "user", content: "A city" }], max_tokens: 120, temperature: 1.0,
  response_format: zodResponseFormat(Place, "place"),
});
assert.equal(zparsed.choices[0].finish_reason, "stop");
out.zod_parsed = Place.parse(zparsed.choices[0].message.parsed); // throws unless it fits the zod schema

const weather = {
  type: "function",
  function: {
    name: "get_weather",
    description: "The weather in a city",
    parameters: {
      type: "object",
      properties: { city: { type: "string", maxLength: 10 }, days: { type: "integer", minimum: 1, maximum: 7 } },
      required: ["city", "days"],
      additionalProperties: false,
    },
  },
};
const called = await client.chat.completions.create({
  model, messages: [{ role: "user", content: "Weather in Paris?" }], max_tokens: 150, temperature: 1.0,
  tools: [weather], tool_choice: "required", parallel_tool_calls: false,
});
const call = called.choices[0].message.tool_calls[0];
assert.equal(called.choices[0].finish_reason, "tool_calls");
assert.equal(call.type, "function");
assert.equal(call.function.name, "get_weather");
out.tool_arguments = JSON.parse(call.function.arguments);

const Lookup = z.object({ id: z.number().int().min(0).max(999), tag: z.enum(["a", "b"]) });
const zcalled = await client.chat.completions.parse({
  model, messages: [{ role: "user", content: "Look it up" }], max_tokens: 150, temperature: 1.0,
  tools: [zodFunction({ name: "lookup", parameters: Lookup })], tool_choice: "required", parallel_tool_calls: false,
});
const zcall = zcalled.choices[0].message.tool_calls[0];
out.zod_tool_arguments = Lookup.parse(zcall.function.parsed_arguments);
console.log(JSON.stringify(out));
