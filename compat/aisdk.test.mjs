// The Vercel AI SDK's default provider (`ai` 6, `@ai-sdk/openai` 3): openai(model) speaks the
// Responses API (POST /v1/responses). compat/run.sh and compat/serve.sh pass the endpoint in
// ARBITER_URL and the model in ARBITER_MODEL; under serve.sh the first call finds the
// service at zero replicas and must be held and answered.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { generateText, streamText } from 'ai';
import { createOpenAI } from '@ai-sdk/openai';

const baseURL = process.env.ARBITER_URL;
const model = process.env.ARBITER_MODEL;
assert.ok(baseURL && model, 'run through compat/run.sh or compat/serve.sh');
const openai = createOpenAI({ baseURL, apiKey: 'unused' });

test('generateText over the Responses API, with usage', async () => {
  const r = await generateText({ model: openai(model), prompt: 'Say hello.', maxOutputTokens: 6, maxRetries: 0 });
  assert.ok(r.text.length > 0, 'no text');
  assert.equal(r.usage.outputTokens, 6);
  assert.ok(r.usage.inputTokens > 0);
  assert.equal(r.usage.totalTokens, r.usage.inputTokens + r.usage.outputTokens);
  // 'stop': the simulator, as vLLM 0.11, reports a response cut at max_output_tokens as
  // completed, without incomplete_details, which is what the SDK maps to 'length'.
  assert.ok(['stop', 'length'].includes(r.finishReason), r.finishReason);
});

test('streamText over the Responses API: deltas, then usage', async () => {
  const r = streamText({ model: openai(model), system: 'Be brief.', prompt: 'Stream a greeting.', maxOutputTokens: 5, maxRetries: 0 });
  let text = '', parts = 0;
  for await (const delta of r.textStream) {
    parts++;
    text += delta;
  }
  assert.ok(parts >= 2, `only ${parts} text deltas`);
  assert.ok(text.length > 0);
  const usage = await r.usage;
  assert.equal(usage.outputTokens, 5);
  assert.ok(usage.inputTokens > 0);
});
