// Drives the Batch API of wafer serve with the official openai npm client (v5), unchanged: files.create
// (multipart upload, purpose "batch"), batches.create, batches.retrieve (polled until the batch ends),
// files.content (the output file), batches.list (auto-paging over `after`) and batches.cancel, plus a typed
// 404. Usage: node batch_client.mjs BASE_URL INPUT.jsonl LONG_INPUT.jsonl
// Prints one JSON line with what it saw; exits non-zero on the first mismatch.
import OpenAI, { toFile } from "openai";
import assert from "node:assert/strict";
import fs from "node:fs";

const [base, input, longInput] = process.argv.slice(2);
const client = new OpenAI({ baseURL: `${base}/v1`, apiKey: "sk-test", maxRetries: 0, timeout: 60000 });
const out = {};
const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

const file = await client.files.create({ file: fs.createReadStream(input), purpose: "batch" });
assert.equal(file.object, "file");
assert.equal(file.purpose, "batch");
assert.equal(file.bytes, fs.statSync(input).size);
out.file_id = file.id;

let batch = await client.batches.create({
  input_file_id: file.id, endpoint: "/v1/completions", completion_window: "24h", metadata: { job: "node" },
});
assert.equal(batch.object, "batch");
assert.equal(batch.input_file_id, file.id);
assert.deepEqual(batch.metadata, { job: "node" });
const seen = new Set([batch.status]);
const deadline = Date.now() + 60000;
while (!["completed", "failed", "expired", "cancelled"].includes(batch.status)) {
  assert.ok(Date.now() < deadline, `batch ${batch.id} did not end: ${batch.status}`);
  await sleep(100);
  batch = await client.batches.retrieve(batch.id);
  seen.add(batch.status);
}
out.status = batch.status;
out.request_counts = batch.request_counts;
out.statuses_seen = [...seen];
for (const k of ["created_at", "in_progress_at", "finalizing_at", "completed_at", "expires_at"])
  assert.equal(typeof batch[k], "number", k);
const content = await client.files.content(batch.output_file_id);
out.output = (await content.text()).split("\n").filter((x) => x).map((x) => JSON.parse(x));
const outFile = await client.files.retrieve(batch.output_file_id);
assert.equal(outFile.purpose, "batch_output");

// a second batch, cancelled while it runs
const file2 = await client.files.create({ file: await toFile(fs.readFileSync(longInput), "long.jsonl"), purpose: "batch" });
let b2 = await client.batches.create({ input_file_id: file2.id, endpoint: "/v1/completions", completion_window: "24h" });
const cancelled = await client.batches.cancel(b2.id);
assert.ok(["cancelling", "cancelled"].includes(cancelled.status), cancelled.status);
while (b2.status !== "cancelled") {
  assert.ok(Date.now() < deadline + 60000, `batch ${b2.id} was not cancelled: ${b2.status}`);
  await sleep(100);
  b2 = await client.batches.retrieve(b2.id);
}
out.cancelled_counts = b2.request_counts;
out.cancelled_at = b2.cancelled_at;

// list: newest first, one per page so that the client follows `after` across pages
const ids = [];
for await (const b of client.batches.list({ limit: 1 })) ids.push(b.id);
out.listed = ids;
assert.deepEqual(ids.slice(0, 2), [b2.id, batch.id]);

try {
  await client.batches.retrieve("batch_nope");
  assert.fail("no error for an unknown batch");
} catch (e) {
  assert.ok(e instanceof OpenAI.NotFoundError, String(e));
  out.not_found = e.status;
}
console.log(JSON.stringify(out));
