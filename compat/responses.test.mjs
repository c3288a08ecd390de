// The official OpenAI Node SDK's Responses API (responses.create, whole and streamed) and
// models.retrieve. compat/run.sh and compat/serve.sh pass ARBITER_URL and ARBITER_MODEL;
// under serve.sh the first call finds the service at zero replicas.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import OpenAI from 'openai';

const baseURL = process.env.ARBITER_URL;
const model = process.env.ARBITER_MODEL;
assert.ok(baseURL && model, 'run through compat/run.sh or compat/serve.sh');
const client = new OpenAI({ baseURL, apiKey: 'unused', maxRetries: 0, timeout: 120_000 });

test('responses.create, whole, with usage', async () => {
  const r = await client.responses.create({ model, instructions: 'Be brief.', input: 'Hello', max_output_tokens: 6 });
  assert.equal(r.object, 'response');
  assert.ok(r.id.startsWith('resp_'), r.id);
  assert.ok(r.output_text.length > 0, 'no output_text');
  assert.equal(r.usage.output_tokens, 6);
  assert.ok(r.usage.input_tokens > 0);
  assert.equal(r.usage.total_tokens, r.usage.input_tokens + r.usage.output_tokens);
});

test('responses.create, streamed: typed events ending with response.completed', async () => {
  const stream = await client.responses.create({
    model, input: [{ role: 'user', content: [{ type: 'input_text', text: 'Stream please' }] }], max_output_tokens: 5, stream: true,
  });
  const types = [];
  let text = '', usage = null;
  for await (const ev of stream) {
    types.push(ev.type);
    if (ev.type === 'response.output_text.delta') text += ev.delta;
    if (ev.type === 'response.completed') usage = ev.response.usage;
  }
  assert.equal(types[0], 'response.created');
  assert.equal(types.at(-1), 'response.completed');
  assert.ok(text.length > 0);
  assert.equal(usage?.output_tokens, 5);
});

test('models.retrieve: the served model, and NotFoundError for another', async () => {
  const m = await client.models.retrieve(model);
  assert.equal(m.id, model);
  assert.equal(m.object, 'model');
  await assert.rejects(client.models.retrieve('no-such/model'), (err) => err instanceof OpenAI.NotFoundError);
});
