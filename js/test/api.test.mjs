// The package's API: check, compile, loadBundle, start with scripted and JavaScript
// providers, tools, live events, abort and run errors, with the native CLI as the
// reference where there is one.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { mkdtempSync, readFileSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import path from 'node:path';
import * as aplc from '../index.js';
import { aplc as native, fixtures, withoutTimes } from './support.mjs';

const HELLO = '{# inputs: name #}\n# prompt: hello\n## system\nBe brief.\n## user\nSay hi to {{ name }}.\n';
const answer = (content) => ({ choices: [{ message: { role: 'assistant', content } }], usage: { prompt_tokens: 3, completion_tokens: 1, total_tokens: 4 } });

test('check reports diagnostics with their spans', () => {
  assert.deepEqual(aplc.check(HELLO).diagnostics, []);
  assert.equal(aplc.check(HELLO).ok, true);
  const bad = aplc.check('# prompt: a\n## user\nhi\n\n# post: a\n{{ set_context("next_step", "nowhere") }}\n');
  assert.equal(bad.ok, false);
  const [d] = bad.diagnostics;
  assert.equal(d.code, 'APL0014');
  assert.equal(d.severity, 'error');
  assert.match(d.message, /Unknown step: nowhere/);
  assert.equal(d.line, 6);
  assert.ok(d.column >= 1 && d.endLine === 6 && d.endColumn > d.column, JSON.stringify(d));
  const warned = aplc.check(readFileSync(path.join(fixtures, 'check/warn_unreachable_step.apl'), 'utf8'));
  assert.equal(warned.ok, true);
  assert.ok(warned.diagnostics.some((x) => x.code === 'APL0016' && x.severity === 'warning'));
});

test('compile gives aplc build\'s bytes, and aplc run runs them', () => {
  const dir = mkdtempSync(path.join(tmpdir(), 'aplc-js-'));
  writeFileSync(path.join(dir, 'agent.apl'), HELLO);
  const built = native(['build', 'agent.apl', '-o', 'native.aplb'], { cwd: dir });
  assert.equal(built.status, 0, built.stderr);
  const bytes = aplc.compile(HELLO);
  assert.ok(bytes instanceof Uint8Array);
  assert.deepEqual(Buffer.from(bytes), readFileSync(path.join(dir, 'native.aplb')));
  writeFileSync(path.join(dir, 'js.aplb'), bytes);
  writeFileSync(path.join(dir, 'ctx.json'), '{"name": "Ada"}');
  writeFileSync(path.join(dir, 'mock.json'), '["Hi Ada!"]');
  const run = native(['run', 'js.aplb', '--context', 'ctx.json', '--mock', 'mock.json', '--quiet'], { cwd: dir });
  assert.equal(run.status, 0, run.stderr);
  assert.equal(run.stdout, 'Hi Ada!\n');
});

test('compile throws the diagnostics of source with errors', () => {
  assert.throws(() => aplc.compile('text before any step\n'), (error) => {
    assert.equal(error.name, 'AplCompileError');
    assert.ok(error.diagnostics.length > 0 && error.diagnostics.every((d) => d.line >= 1));
    assert.match(error.rendered, /agent\.apl/);
    return true;
  });
});

test('loadBundle runs compiled bytes and refuses garbage and truncated bytes', async () => {
  const bytes = aplc.compile(HELLO);
  const program = aplc.loadBundle(bytes);
  assert.deepEqual(program.steps, ['hello']);
  const context = await program.start({ context: { name: 'Ada' }, provider: aplc.scripted(['Hi!']) });
  assert.equal(context.result_text, 'Hi!');
  assert.throws(() => aplc.loadBundle(new Uint8Array([1, 2, 3, 4])), /invalid bundle/);
  assert.throws(() => aplc.loadBundle(bytes.slice(0, bytes.length - 7)), /invalid bundle/);
  const flipped = bytes.slice();
  flipped[flipped.length - 3] ^= 0xff;
  assert.throws(() => aplc.loadBundle(flipped), /invalid bundle/);
  assert.throws(() => aplc.loadBundle('not bytes'), TypeError);
});

test('a JavaScript provider gets the Chat Completions request and answers', async () => {
  const seen = [];
  const context = await aplc.start(HELLO, {
    context: { name: 'Ada' },
    provider: async (request, { signal }) => {
      seen.push(request);
      assert.ok(signal instanceof AbortSignal);
      return answer('Hi Ada!');
    },
  });
  assert.equal(context.result_text, 'Hi Ada!');
  assert.equal(context.name, 'Ada');
  assert.equal(seen.length, 1);
  assert.equal(seen[0].model, 'gpt-4o');
  assert.deepEqual(seen[0].messages, [
    { role: 'system', content: 'Be brief.' },
    { role: 'user', content: 'Say hi to Ada.' },
  ]);
});

test('a provider that throws or answers garbage is a failed call, and the run goes on', async () => {
  const context = await aplc.start('# prompt: a\n## user\nhi\n', { provider: async () => { throw new TypeError('model unreachable'); } });
  assert.deepEqual(context.errors, ['provider error: TypeError: model unreachable']);
  const garbage = await aplc.start('# prompt: a\n## user\nhi\n', { provider: () => ({ nope: 1 }) });
  assert.match(garbage.errors[0], /^provider error: invalid provider response/);
});

test('tools run with their arguments and, when asked, the context', async () => {
  const calls = [];
  const tools = {
    add: {
      descriptor: { description: 'Adds.', parameters: { type: 'object', properties: { a: { type: 'number' }, b: { type: 'number' } }, required: ['a', 'b'] } },
      fn: async ({ a, b }, context) => {
        calls.push(context);
        return a + b;
      },
    },
    whoami: { descriptor: { parameters: { type: 'object' } }, withContext: true, fn: (_args, context) => context.name },
  };
  const toolCall = (id, name, args) => ({ id, type: 'function', function: { name, arguments: JSON.stringify(args) } });
  const context = await aplc.start('# prompt: a\n## user\nadd\n', {
    context: { name: 'Ada' },
    tools,
    provider: aplc.scripted([{ content: null, tool_calls: [toolCall('c1', 'add', { a: 2, b: 3 }), toolCall('c2', 'whoami', {}), toolCall('c3', 'add', { a: 'x' })] }, 'done']),
  });
  assert.deepEqual(calls, [undefined]);
  const results = context.context_history[0].result_tool_calls ?? context.result_tool_calls;
  const contents = context.context_history.flatMap((h) => h.result_tool_calls ?? []).map((r) => [r.tool_call_id, r.content, r.with_error]);
  assert.ok(results !== undefined);
  assert.deepEqual(contents.slice(0, 2), [['c1', 5, false], ['c2', 'Ada', false]]);
  assert.equal(contents[2][0], 'c3');
  assert.equal(contents[2][2], true, 'arguments that fail the schema never reach the tool');
});

test('onEvent gets the events of aplc run --events, live', async () => {
  const dir = path.join(fixtures, 'events');
  const events = [];
  let liveBeforeProvider = 0;
  const script = aplc.scripted(JSON.parse(readFileSync(path.join(dir, 'mock.json'), 'utf8')));
  const descriptors = JSON.parse(readFileSync(path.join(dir, 'tools.json'), 'utf8'));
  await aplc.start(readFileSync(path.join(dir, 'agent.apl'), 'utf8'), {
    provider: async (request) => {
      // The provider_call event of this very call has reached the listener already.
      if (events.at(-1)?.type === 'provider_call') liveBeforeProvider += 1;
      return script(request);
    },
    tools: {
      add: { descriptor: descriptors.add.descriptor, fn: ({ num1, num2 }) => num1 + num2 },
      fail: { descriptor: descriptors.fail.descriptor, fn: () => { throw new Error('`python3` failed with exit status 3: the tool broke on purpose'); } },
    },
    onEvent: (event) => events.push(event),
  });
  assert.equal(liveBeforeProvider, 3);
  // The reference: the native CLI's events of the same run, its tools run for real.
  const out = path.join(mkdtempSync(path.join(tmpdir(), 'aplc-js-')), 'events.jsonl');
  const run = native(['run', 'agent.apl', '--mock', 'mock.json', '--tools', 'tools.json', '--events', out, '--quiet'], { cwd: dir });
  assert.equal(run.status, 3, run.stderr);
  const expected = readFileSync(out, 'utf8').trim().split('\n').map((line) => JSON.parse(line));
  const timeless = (list) => list.map(({ t_ms, duration_ms, latency_ms, totals, ...rest }) => (totals ? { ...rest, totals: { ...totals, elapsed_ms: 0 } } : rest));
  assert.deepEqual(timeless(events), timeless(expected));
});

test('scripted providers stream nothing, but a provider\'s deltas become provider_delta events', async () => {
  const events = [];
  await aplc.start('# prompt: a\n## user\nhi\n', {
    provider: async (_request, { onDelta }) => {
      onDelta('Hel');
      onDelta('lo');
      return answer('Hello');
    },
    onEvent: (e) => events.push(e),
  });
  const call = events.find((e) => e.type === 'provider_call');
  const deltas = events.filter((e) => e.type === 'provider_delta');
  assert.deepEqual(deltas.map((d) => [d.call_seq ?? d.seq, d.index, d.text]).map(([, i, t]) => [i, t]), [[0, 'Hel'], [1, 'lo']]);
  assert.ok(deltas.every((d) => d.step === 'a'));
  assert.ok(events.indexOf(deltas[0]) > events.indexOf(call));
});

test('run errors throw AplRunError with the context so far', async () => {
  const source = readFileSync(path.join(fixtures, 'run/unknown_step.apl'), 'utf8');
  await assert.rejects(aplc.start(source, { provider: aplc.scripted(['x']) }), (error) => {
    assert.ok(error instanceof aplc.AplRunError);
    assert.equal(error.kind, 'unknown_step');
    assert.match(error.message, /Unknown step: finish/);
    assert.equal(error.context.global_runs, 1);
    return true;
  });
  await assert.rejects(aplc.start('{# inputs: who #}\n# prompt: a\n## user\n{{ who }}\n', { provider: aplc.scripted([]) }), { name: 'AplRunError', kind: 'missing_input' });
  await assert.rejects(aplc.start(HELLO, {}), TypeError);
});

test('the run timeout stops a provider that never answers', async () => {
  const started = Date.now();
  await assert.rejects(
    aplc.start('# prompt: a\n## user\nhi\n', { timeoutMs: 200, provider: (_r, { signal }) => new Promise((_, reject) => signal.addEventListener('abort', () => reject(new Error('aborted')))) }),
    (error) => error.kind === 'timeout',
  );
  assert.ok(Date.now() - started < 60_000);
});

test('an AbortSignal cancels the run, in a call or before it starts', async () => {
  const controller = new AbortController();
  let aborted = false;
  const run = aplc.start('# prompt: a\n## user\nhi\n', {
    signal: controller.signal,
    provider: (_request, { signal }) =>
      new Promise(() => {
        signal.addEventListener('abort', () => (aborted = true));
        controller.abort();
      }),
  });
  await assert.rejects(run, (error) => error instanceof aplc.AplRunError && error.kind === 'cancelled');
  assert.ok(aborted, 'the provider\'s own signal was aborted');
  await assert.rejects(aplc.start(HELLO, { context: { name: 'x' }, signal: AbortSignal.abort(), provider: aplc.scripted(['x']) }), { kind: 'cancelled' });
});

test('the step graph marks the entry and unreachable steps', () => {
  const g = aplc.graph(readFileSync(path.join(fixtures, 'check/warn_unreachable_step.apl'), 'utf8'));
  assert.equal(g.entry, 0);
  assert.ok(g.steps.length >= 2);
  assert.ok(g.steps.some((s) => !s.reachable));
  assert.equal(aplc.graph('nothing\n').steps, null);
});

test('the final context of a fixture run equals the native one through a bundle too', async () => {
  const name = 'loop_by_runs';
  const source = readFileSync(path.join(fixtures, `run/${name}.apl`), 'utf8');
  const mock = JSON.parse(readFileSync(path.join(fixtures, `run/${name}.mock.json`), 'utf8'));
  const program = aplc.loadBundle(aplc.compile(source, { fileName: `${name}.apl` }));
  const fromBundle = await program.start({ provider: aplc.scripted(mock) });
  const fromSource = await aplc.start(source, { provider: aplc.scripted(mock), fileName: `${name}.apl` });
  assert.deepEqual(withoutTimes(fromBundle), withoutTimes(fromSource));
});
