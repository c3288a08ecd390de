// LoRA adapters through `serve up` (issue 51), driven by the official OpenAI Node client:
// compat/serve.sh starts a service at zero replicas whose run: command gives vLLM's
// --enable-lora and one --lora-modules adapter, and whose arbiter.adapters name two more
// that the routers load at run time. Clients call each adapter by name, as they call a model.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import OpenAI from 'openai';

const baseURL = process.env.ARBITER_URL;
const base = process.env.LORA_BASE;
const adapters = (process.env.LORA_ADAPTERS ?? '').split(',').filter(Boolean);
assert.ok(baseURL && base && adapters.length === 3, 'run through compat/serve.sh');
const client = new OpenAI({ baseURL, apiKey: 'unused', maxRetries: 0, timeout: 120_000 });

test('an adapter called at zero replicas wakes the service and is answered', async () => {
  const r = await client.chat.completions.create({ model: adapters[1], messages: [{ role: 'user', content: 'Hello from zero' }], max_tokens: 5 });
  assert.equal(r.model, adapters[1]);
  assert.equal(r.usage.completion_tokens, 5);
});

test('each adapter and the base, warm, by name; streamed too', async () => {
  for (const model of [base, ...adapters]) {
    const r = await client.chat.completions.create({ model, messages: [{ role: 'user', content: `Hi ${model}` }], max_tokens: 4 });
    assert.equal(r.model, model);
    assert.equal(r.usage.completion_tokens, 4);
    const stream = await client.completions.create({ model, prompt: 'Once', max_tokens: 6, stream: true, stream_options: { include_usage: true } });
    let usage = null;
    for await (const chunk of stream) if (chunk.usage) usage = chunk.usage;
    assert.equal(usage?.completion_tokens, 6, `${model} stream usage`);
  }
});

test('the models list names each adapter with its base as parent', async () => {
  const byId = new Map();
  for await (const m of client.models.list()) byId.set(m.id, m);
  assert.ok(byId.has(base), `models ${[...byId.keys()]}`);
  for (const a of adapters) assert.equal(byId.get(a)?.parent, base, `${a} in ${JSON.stringify([...byId.values()])}`);
});

test('an adapter the service does not serve raises NotFoundError', async () => {
  await assert.rejects(
    client.chat.completions.create({ model: 'no-such-adapter', messages: [{ role: 'user', content: 'x' }] }),
    (err) => err instanceof OpenAI.NotFoundError,
  );
});
