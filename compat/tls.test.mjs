// service.tls: `serve up` of a file with a TLS pair serves its endpoint over HTTPS, and the
// official OpenAI Node client talks to it, trusting only the test CA that compat/tls.sh
// made (NODE_EXTRA_CA_CERTS): no verification is turned off anywhere.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import tls from 'node:tls';
import OpenAI from 'openai';

const baseURL = process.env.ARBITER_URL;
const model = process.env.ARBITER_MODEL;
const serial = process.env.WANT_SERIAL; // the leaf's serial, as hex digits
assert.ok(baseURL?.startsWith('https://') && model && serial, 'run through compat/tls.sh');
const client = new OpenAI({ baseURL, apiKey: 'unused', maxRetries: 0, timeout: 120_000 });

test('the endpoint presents the expected certificate, verified against the test CA', async () => {
  const { hostname, port } = new URL(baseURL);
  const cert = await new Promise((resolve, reject) => {
    const s = tls.connect({ host: hostname, port: Number(port), servername: undefined }, () => {
      const c = s.getPeerCertificate();
      s.end();
      resolve(c);
    });
    s.on('error', reject);
  });
  assert.equal(parseInt(cert.serialNumber, 16), parseInt(serial, 16));
});

test('chat completion over HTTPS, with usage', async () => {
  const r = await client.chat.completions.create({ model, messages: [{ role: 'user', content: 'Hello over TLS' }], max_tokens: 6 });
  assert.equal(r.object, 'chat.completion');
  assert.equal(r.usage.completion_tokens, 6);
});

test('streaming over HTTPS', async () => {
  const stream = await client.chat.completions.create({
    model, messages: [{ role: 'user', content: 'Stream over TLS' }], max_tokens: 8, stream: true, stream_options: { include_usage: true },
  });
  let text = '', usage = null;
  for await (const chunk of stream) {
    if (chunk.usage) usage = chunk.usage;
    for (const c of chunk.choices) text += c.delta?.content ?? '';
  }
  assert.ok(text.length > 0);
  assert.equal(usage?.completion_tokens, 8);
});

test('models over HTTPS', async () => {
  const ids = [];
  for await (const m of client.models.list()) ids.push(m.id);
  assert.ok(ids.includes(model), `models ${ids}`);
});
