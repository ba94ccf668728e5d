// openaiCompatible over fetch, against a small fake OpenAI server on 127.0.0.1 started
// here: plain and streamed answers, the key sent and never shown, error kinds, and the
// same final context as the native CLI's HTTP provider against the same server.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { createServer } from 'node:http';
import { execFile } from 'node:child_process';
import { promisify } from 'node:util';
import { mkdtempSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import path from 'node:path';
import { start, openaiCompatible, chatCompletionsURL } from '../index.js';
import { aplcBin, withoutTimes } from './support.mjs';

const KEY = 'sk-test-0123456789abcdef';
const AGENT = '# prompt: greet\n## user\nSay hello.\n';
const seen = [];
let server;
let baseURL;

function chunk(delta, extra = {}) {
  return `data: ${JSON.stringify({ id: 'c1', object: 'chat.completion.chunk', choices: [{ index: 0, delta, finish_reason: null }], ...extra })}\n\n`;
}

before(async () => {
  server = createServer((req, res) => {
    let body = '';
    req.on('data', (c) => (body += c));
    req.on('end', () => {
      const request = JSON.parse(body);
      seen.push({ url: req.url, headers: req.headers, body: request });
      const said = request.messages.at(-1).content;
      if (said.includes('unauthorized')) {
        res.writeHead(401, { 'content-type': 'application/json' });
        return res.end(JSON.stringify({ error: { message: `bad key ${req.headers.authorization}` } }));
      }
      if (request.stream) {
        res.writeHead(200, { 'content-type': 'text/event-stream' });
        res.write(chunk({ role: 'assistant', content: 'Hel' }));
        res.write(chunk({ content: 'lo!' }));
        res.write(`data: ${JSON.stringify({ id: 'c1', choices: [{ index: 0, delta: {}, finish_reason: 'stop' }] })}\n\n`);
        res.write(`data: ${JSON.stringify({ id: 'c1', choices: [], usage: { prompt_tokens: 5, completion_tokens: 2, total_tokens: 7 } })}\n\n`);
        return res.end('data: [DONE]\n\n');
      }
      res.writeHead(200, { 'content-type': 'application/json' });
      res.end(JSON.stringify({ id: 'c1', model: request.model, choices: [{ index: 0, message: { role: 'assistant', content: 'Hello!' }, finish_reason: 'stop' }], usage: { prompt_tokens: 5, completion_tokens: 2, total_tokens: 7 } }));
    });
  });
  await new Promise((resolve) => server.listen(0, '127.0.0.1', resolve));
  baseURL = `http://127.0.0.1:${server.address().port}`;
});

after(() => server.close());

test('the endpoint is under /v1, once', () => {
  assert.equal(chatCompletionsURL('http://h:1'), 'http://h:1/v1/chat/completions');
  assert.equal(chatCompletionsURL('http://h:1/v1/'), 'http://h:1/v1/chat/completions');
  assert.throws(() => chatCompletionsURL('ftp://h'), TypeError);
  assert.throws(() => chatCompletionsURL('http://user:pw@h'), TypeError);
});

test('a plain answer, with the key in the Authorization header only', async () => {
  seen.length = 0;
  const context = await start(AGENT, { provider: openaiCompatible({ baseURL, apiKey: KEY, model: 'tiny' }) });
  assert.equal(context.result_text, 'Hello!');
  assert.equal(context.usage.total_tokens, 7);
  assert.equal(seen.length, 1);
  assert.equal(seen[0].url, '/v1/chat/completions');
  assert.equal(seen[0].headers.authorization, `Bearer ${KEY}`);
  assert.equal(seen[0].body.model, 'tiny');
  assert.deepEqual(seen[0].body.messages, [{ role: 'user', content: 'Say hello.' }]);
});

test('a streamed answer: provider_delta events as the text arrives, then the whole answer', async () => {
  seen.length = 0;
  const events = [];
  const context = await start(AGENT, { provider: openaiCompatible({ baseURL, apiKey: KEY, stream: true }), onEvent: (e) => events.push(e) });
  assert.equal(seen[0].body.stream, true);
  assert.deepEqual(seen[0].body.stream_options, { include_usage: true });
  assert.equal(context.result_text, 'Hello!');
  assert.equal(context.usage.total_tokens, 7);
  const deltas = events.filter((e) => e.type === 'provider_delta').map((e) => e.text);
  assert.deepEqual(deltas, ['Hel', 'lo!']);
  const types = events.map((e) => e.type);
  assert.ok(types.indexOf('provider_call') < types.indexOf('provider_delta'));
  assert.ok(types.lastIndexOf('provider_delta') < types.indexOf('provider_result'));
});

test('a refused key is an auth error, and the key never shows', async () => {
  const events = [];
  const context = await start('# prompt: a\n## user\nunauthorized\n', { provider: openaiCompatible({ baseURL, apiKey: KEY }), onEvent: (e) => events.push(e) });
  assert.match(context.errors[0], /^provider error: HTTP 401/);
  assert.match(context.errors[0], /<redacted>/);
  const result = events.find((e) => e.type === 'provider_result');
  assert.equal(result.error.kind, 'auth');
  assert.ok(!JSON.stringify(context).includes(KEY) && !JSON.stringify(events).includes(KEY));
});

test('a server that is not there is a transport error', async () => {
  const closed = createServer();
  await new Promise((resolve) => closed.listen(0, '127.0.0.1', resolve));
  const port = closed.address().port;
  await new Promise((resolve) => closed.close(resolve));
  const events = [];
  await start(AGENT, { provider: openaiCompatible({ baseURL: `http://127.0.0.1:${port}`, apiKey: KEY }), onEvent: (e) => events.push(e) });
  assert.equal(events.find((e) => e.type === 'provider_result').error.kind, 'transport');
});

test('the same final context as the native HTTP provider against the same server', async () => {
  const dir = mkdtempSync(path.join(tmpdir(), 'aplc-js-'));
  writeFileSync(path.join(dir, 'agent.apl'), AGENT);
  // Asynchronous: this process's server answers the CLI meanwhile.
  const { stdout } = await promisify(execFile)(aplcBin(), ['run', 'agent.apl', '--json', '--quiet', '--base-url', baseURL], {
    cwd: dir,
    env: { ...process.env, OPENAI_API_KEY: KEY },
    timeout: 120_000,
  });
  const js = await start(AGENT, { provider: openaiCompatible({ baseURL, apiKey: KEY }) });
  assert.deepEqual(withoutTimes(js), withoutTimes(JSON.parse(stdout)));
});
