// `serve up examples/local.yaml` driven by the official OpenAI Node client: compat/serve.sh
// starts the service (scaled to zero) and passes the endpoint in ARBITER_URL. The first
// request arrives while no replica runs: it must be held and answered, not refused.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import OpenAI from 'openai';

const baseURL = process.env.ARBITER_URL;
const model = process.env.ARBITER_MODEL;
assert.ok(baseURL && model, 'run through compat/serve.sh');
const client = new OpenAI({ baseURL, apiKey: 'unused', maxRetries: 0, timeout: 120_000 });

test('first request at zero replicas is answered, with usage', async () => {
  const r = await client.chat.completions.create({ model, messages: [{ role: 'user', content: 'Hello from zero' }], max_tokens: 7 });
  assert.equal(r.object, 'chat.completion');
  assert.ok(r.choices[0].message.content.length > 0);
  assert.equal(r.usage.completion_tokens, 7);
  assert.ok(r.usage.prompt_tokens > 0);
  assert.equal(r.usage.total_tokens, r.usage.prompt_tokens + r.usage.completion_tokens);
});

test('streaming with include_usage: deltas, then the usage chunk', async () => {
  const stream = await client.chat.completions.create({
    model, messages: [{ role: 'user', content: 'Stream please' }], max_tokens: 9, stream: true, stream_options: { include_usage: true },
  });
  let text = '', usage = null, chunks = 0;
  for await (const chunk of stream) {
    chunks++;
    if (chunk.usage) usage = chunk.usage;
    for (const c of chunk.choices) text += c.delta?.content ?? '';
  }
  assert.ok(chunks >= 9, `only ${chunks} chunks`);
  assert.ok(text.length > 0);
  assert.equal(usage?.completion_tokens, 9);
  assert.ok(usage.prompt_tokens > 0);
});

test('streaming without include_usage: no usage chunk', async () => {
  const stream = await client.chat.completions.create({ model, messages: [{ role: 'user', content: 'Hi' }], max_tokens: 4, stream: true });
  let sawUsage = false, text = '';
  for await (const chunk of stream) {
    if (chunk.usage) sawUsage = true;
    for (const c of chunk.choices) text += c.delta?.content ?? '';
  }
  assert.ok(text.length > 0);
  assert.equal(sawUsage, false);
});

test('completions and models through the endpoint', async () => {
  const c = await client.completions.create({ model, prompt: 'Once upon a time', max_tokens: 3 });
  assert.equal(c.usage.completion_tokens, 3);
  const ids = [];
  for await (const m of client.models.list()) ids.push(m.id);
  assert.ok(ids.includes(model), `models ${ids}`);
});

test('unknown model raises NotFoundError', async () => {
  await assert.rejects(
    client.chat.completions.create({ model: 'no-such-model', messages: [{ role: 'user', content: 'x' }] }),
    (err) => err instanceof OpenAI.NotFoundError,
  );
});
