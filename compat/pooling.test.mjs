// vLLM's rerank, score and tokenize endpoints and one audio transcription, through Arbiter,
// against simulated replicas serving a reranker (replicasim -task score, RERANK_MODEL) and a
// Whisper model (-task transcription, WHISPER_MODEL); TOKENIZE_MODEL is a generation model.
// compat/run.sh and compat/serve.sh pass them with ARBITER_URL (the /v1 base).
import { test } from 'node:test';
import assert from 'node:assert/strict';
import OpenAI, { toFile } from 'openai';

const baseURL = process.env.ARBITER_URL;
const rerankModel = process.env.RERANK_MODEL;
const whisperModel = process.env.WHISPER_MODEL;
const tokenizeModel = process.env.TOKENIZE_MODEL;
assert.ok(baseURL && rerankModel && whisperModel && tokenizeModel, 'run through compat/run.sh or compat/serve.sh');
const root = baseURL.replace(/\/v1\/?$/, '');
const client = new OpenAI({ baseURL, apiKey: 'unused', maxRetries: 0, timeout: 120_000 });

async function postJSON(path, body) {
  const r = await fetch(root + path, { method: 'POST', headers: { 'Content-Type': 'application/json' }, body: JSON.stringify(body) });
  const text = await r.text();
  assert.equal(r.status, 200, `${path}: ${r.status} ${text}`);
  return JSON.parse(text);
}

test('rerank (/v1/rerank and /rerank): the relevant document first, usage total_tokens', async () => {
  for (const path of ['/v1/rerank', '/rerank']) {
    const r = await postJSON(path, {
      model: rerankModel, query: 'What is the capital of France?',
      documents: ['Berlin is the capital of Germany.', 'Paris is the capital of France.', 'Horses are animals.'], top_n: 2,
    });
    assert.equal(r.results.length, 2);
    assert.equal(r.results[0].index, 1);
    assert.equal(r.results[0].document.text, 'Paris is the capital of France.');
    assert.ok(r.results[0].relevance_score >= r.results[1].relevance_score);
    assert.ok(r.usage.total_tokens > 0);
  }
});

test('score (/score): one text_1 against two text_2, with prompt tokens in usage', async () => {
  const r = await postJSON('/score', { model: rerankModel, text_1: 'a black cat', text_2: ['a black cat', 'a red bus'] });
  assert.equal(r.data.length, 2);
  assert.ok(r.data[0].score > r.data[1].score);
  assert.ok(r.usage.prompt_tokens > 0);
  assert.equal(r.usage.total_tokens, r.usage.prompt_tokens);
});

test('tokenize and detokenize round trip', async () => {
  const t = await postJSON('/tokenize', { model: tokenizeModel, prompt: 'Hello world' });
  assert.ok(t.count > 0 && t.tokens.length === t.count);
  const d = await postJSON('/detokenize', { model: tokenizeModel, tokens: t.tokens.slice(1) });
  assert.equal(d.prompt, 'Hello world');
});

test('a rerank for the generation model is vLLM\'s 404, not a replica\'s error', async () => {
  const r = await fetch(root + '/rerank', { method: 'POST', headers: { 'Content-Type': 'application/json' }, body: JSON.stringify({ model: tokenizeModel, query: 'q', documents: ['d'] }) });
  const body = await r.json();
  assert.equal(r.status, 404);
  assert.match(body.error.message, /does not support Rerank \(Score\) API/);
});

// 2 s of 16 kHz mono 16-bit PCM silence, as a WAV file.
function wav(seconds) {
  const n = seconds * 32000, b = Buffer.alloc(44 + n);
  b.write('RIFF', 0); b.writeUInt32LE(36 + n, 4); b.write('WAVEfmt ', 8); b.writeUInt32LE(16, 16);
  b.writeUInt16LE(1, 20); b.writeUInt16LE(1, 22); b.writeUInt32LE(16000, 24); b.writeUInt32LE(32000, 28);
  b.writeUInt16LE(2, 32); b.writeUInt16LE(16, 34); b.write('data', 36); b.writeUInt32LE(n, 40);
  return b;
}

test('audio.transcriptions.create (multipart) with the audio\'s seconds as usage', async () => {
  const r = await client.audio.transcriptions.create({ model: whisperModel, file: await toFile(wav(2), 'hello.wav', { type: 'audio/wav' }) });
  assert.ok(r.text.length > 0, 'no text');
  assert.equal(r.usage?.type, 'duration');
  assert.equal(r.usage?.seconds, 2);
});
