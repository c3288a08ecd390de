// The router, driven by the official OpenAI Node client. compat/run.sh starts a simulated
// replica and the router and passes their addresses in ARBITER_URL and REPLICA_URL.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import OpenAI from 'openai';

const baseURL = process.env.ARBITER_URL;
const replicaURL = process.env.REPLICA_URL;
const model = process.env.ARBITER_MODEL;
assert.ok(baseURL && replicaURL && model, 'run through compat/run.sh');
const client = new OpenAI({ baseURL, apiKey: 'unused', maxRetries: 0, timeout: 20_000 });

test('models.list shows the served model', async () => {
  const ids = [];
  for await (const m of client.models.list()) ids.push(m.id);
  assert.ok(ids.includes(model), `models ${ids}`); // beside run.sh's reranker and Whisper model
});

test('chat completion with usage', async () => {
  const r = await client.chat.completions.create({ model, messages: [{ role: 'user', content: 'Hello' }], max_tokens: 6 });
  assert.equal(r.object, 'chat.completion');
  assert.equal(r.choices[0].message.role, 'assistant');
  assert.ok(r.choices[0].message.content.length > 0);
  assert.equal(r.usage.completion_tokens, 6);
  assert.ok(r.usage.prompt_tokens > 0);
});

test('streamed chat: deltas, no usage chunk unless asked', async () => {
  const stream = await client.chat.completions.create({ model, messages: [{ role: 'user', content: 'Hi' }], max_tokens: 5, stream: true });
  let text = '', chunks = 0, sawUsage = false, finish = null;
  for await (const chunk of stream) {
    chunks++;
    if (chunk.usage) sawUsage = true;
    for (const c of chunk.choices) {
      text += c.delta?.content ?? '';
      finish = c.finish_reason ?? finish;
    }
  }
  assert.ok(chunks >= 5, `only ${chunks} chunks`);
  assert.ok(text.length > 0);
  assert.equal(finish, 'length');
  assert.equal(sawUsage, false, 'the router must strip the usage chunk it added');
});

test('streamed chat with include_usage gets the usage chunk', async () => {
  const stream = await client.chat.completions.create({
    model, messages: [{ role: 'user', content: 'Hi' }], max_tokens: 4, stream: true, stream_options: { include_usage: true },
  });
  let usage = null;
  for await (const chunk of stream) if (chunk.usage) usage = chunk.usage;
  assert.equal(usage?.completion_tokens, 4);
});

test('completions and embeddings', async () => {
  const c = await client.completions.create({ model, prompt: 'Once upon a time', max_tokens: 3 });
  assert.equal(c.object, 'text_completion');
  assert.equal(c.usage.completion_tokens, 3);
  const e = await client.embeddings.create({ model, input: 'embed me' });
  assert.equal(e.data.length, 1);
  assert.ok(e.data[0].embedding.length > 0);
});

// The SDK asks for base64 by default and decodes it; a server that ignored encoding_format
// would decode to garbage or zeros.
test('embeddings: one real unit vector per input, base64 decoded by the SDK', async () => {
  const input = ['first text', 'second text', 'first text'];
  const e = await client.embeddings.create({ model, input });
  assert.equal(e.data.length, 3);
  e.data.forEach((d, i) => assert.equal(d.index, i));
  for (const d of e.data) {
    const norm = Math.sqrt(d.embedding.reduce((a, x) => a + x * x, 0));
    assert.ok(Math.abs(norm - 1) < 1e-3, `norm ${norm}, want a unit vector`);
  }
  assert.deepEqual(e.data[0].embedding, e.data[2].embedding, 'equal inputs embed equally');
  assert.notDeepEqual(e.data[0].embedding, e.data[1].embedding);
  const asFloats = await client.embeddings.create({ model, input: 'first text', encoding_format: 'float' });
  const a = asFloats.data[0].embedding, b = e.data[0].embedding;
  assert.equal(a.length, b.length);
  assert.ok(a.every((x, i) => Math.abs(x - b[i]) < 1e-6), 'base64 and float answers agree');
});

test('n choices and logprobs come back as the SDK types them', async () => {
  const r = await client.chat.completions.create({
    model, messages: [{ role: 'user', content: 'Hello' }], max_tokens: 3, n: 2, logprobs: true, top_logprobs: 2,
  });
  assert.deepEqual(r.choices.map((c) => c.index), [0, 1]);
  assert.equal(r.usage.completion_tokens, 6);
  const lp = r.choices[1].logprobs.content;
  assert.equal(lp.length, 3);
  assert.equal(lp[0].top_logprobs.length, 2);
  assert.ok(lp[0].logprob <= 0 && Array.isArray(lp[0].bytes));
  const c = await client.completions.create({ model, prompt: 'Once upon', max_tokens: 2, logprobs: 1, echo: true });
  assert.ok(c.choices[0].text.startsWith('Once upon'));
  assert.equal(c.choices[0].logprobs.tokens.length, 2);
});

test('out-of-range sampling parameters raise BadRequestError with vLLM\'s message', async () => {
  await assert.rejects(
    client.chat.completions.create({ model, messages: [{ role: 'user', content: 'x' }], temperature: -1 }),
    (err) => err instanceof OpenAI.BadRequestError && /temperature must be non-negative, got -1.0/.test(err.message),
  );
  await assert.rejects(
    client.completions.create({ model, prompt: 'x', max_tokens: 2 ** 40 }),
    (err) => err instanceof OpenAI.BadRequestError && /maximum context length is 131072 tokens/.test(err.message),
  );
});

test('unknown model raises NotFoundError', async () => {
  await assert.rejects(
    client.chat.completions.create({ model: 'no-such-model', messages: [{ role: 'user', content: 'x' }] }),
    (err) => err instanceof OpenAI.NotFoundError && err.status === 404 && err.code === 'model_not_found',
  );
});

test('bad request raises BadRequestError', async () => {
  await assert.rejects(
    client.chat.completions.create({ model, messages: [] }),
    (err) => err instanceof OpenAI.BadRequestError && /messages/.test(err.message),
  );
});

test('a replica dying mid-stream surfaces as an APIError in the stream', async () => {
  const fault = await fetch(`${replicaURL}/admin/fault`, { method: 'POST', body: JSON.stringify({ kind: 'die_mid_stream', after_tokens: 2, count: 1 }) });
  assert.equal(fault.status, 200);
  const stream = await client.chat.completions.create({ model, messages: [{ role: 'user', content: 'Hi' }], max_tokens: 8, stream: true });
  let text = '';
  await assert.rejects(async () => {
    for await (const chunk of stream) text += chunk.choices[0]?.delta?.content ?? '';
  }, (err) => err instanceof OpenAI.APIError && /mid-stream/.test(err.message));
  assert.ok(text.length > 0, 'the tokens before the failure were delivered');
});
