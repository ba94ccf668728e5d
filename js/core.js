// The aplc package's API over its WebAssembly module (spec/js.md). Loading the module
// is the entry point's job (index.js in Node and browsers, the playground's bundle with
// the bytes inlined); everything here only calls it.
//
// The run loop below plays the part the Rust runtime's driver plays natively: it polls
// the VM's sans-IO machine for its next action, performs it (a JavaScript provider, a
// JavaScript tool), and hands the answer back with the time read from the host's clock.
import * as wasm from './pkg/aplc_js.js';

const SCRIPT = Symbol('aplc.script');

/** A run that failed (timeout, budgets, unknown step, missing input, cancelled, ...). */
export class AplRunError extends Error {
  constructor(message, { kind, step = null, line = null, column = null, context = {}, lastStepErrors = [] } = {}) {
    super(message);
    this.name = 'AplRunError';
    this.kind = kind;
    this.step = step;
    this.line = line;
    this.column = column;
    this.context = context;
    this.lastStepErrors = lastStepErrors;
  }
}

/** Source that does not compile: `diagnostics` says why, `rendered` as `aplc check` prints it. */
export class AplCompileError extends Error {
  constructor(report) {
    const errors = report.diagnostics.filter((d) => d.severity === 'error');
    const first = errors[0];
    const where = first ? `: ${first.code} ${first.message} (line ${first.line}, column ${first.column})` : '';
    super(`the agent has ${errors.length} error${errors.length === 1 ? '' : 's'}${where}`);
    this.name = 'AplCompileError';
    this.diagnostics = report.diagnostics;
    this.rendered = report.rendered;
  }
}

/** A provider call that failed; `kind` is a provider error kind (`auth`, `rate_limited`, ...). */
export class AplProviderError extends Error {
  constructor(message, kind = 'other') {
    super(message);
    this.name = 'AplProviderError';
    this.kind = kind;
  }
}

function compileOptions(options = {}) {
  const { relaxed, dialect, fileName, denyWarnings, inputs } = options;
  return JSON.stringify({ relaxed, dialect, fileName, denyWarnings, inputs });
}

/** Checks an agent as `aplc check` does: `{ok, diagnostics}`. */
export function check(source, options = {}) {
  const report = JSON.parse(wasm.check(String(source), compileOptions(options)));
  return { ok: report.ok, diagnostics: report.diagnostics, rendered: report.rendered };
}

/** The bundle `aplc build` writes for `source`, or an AplCompileError. */
export function compile(source, options = {}) {
  const built = wasm.build(String(source), compileOptions(options));
  try {
    const bytes = built.bytes();
    if (bytes === undefined) throw new AplCompileError(JSON.parse(built.report()));
    return bytes;
  } finally {
    built.free();
  }
}

/** The step graph of `source`: `{ok, diagnostics, entry, steps: [{name, reachable, jumps, ends}] | null}`. */
export function graph(source, options = {}) {
  return JSON.parse(wasm.graph(String(source), compileOptions(options)));
}

/** A loaded agent, run any number of times with `start`. */
export class Program {
  #inner;
  constructor(inner) {
    this.#inner = inner;
  }
  /** @internal */
  get inner() {
    return this.#inner;
  }
  get steps() {
    return this.#inner.steps();
  }
  get inputs() {
    return this.#inner.inputs();
  }
  start(options = {}) {
    return runProgram(this.#inner, options);
  }
}

/** Loads bundle bytes; garbage or truncated bytes throw. */
export function loadBundle(bytes, options = {}) {
  return new Program(wasm.Program.load(toBytes(bytes), options.dialect));
}

function toBytes(bytes) {
  if (bytes instanceof Uint8Array) return bytes;
  if (bytes instanceof ArrayBuffer) return new Uint8Array(bytes);
  if (ArrayBuffer.isView(bytes)) return new Uint8Array(bytes.buffer, bytes.byteOffset, bytes.byteLength);
  throw new TypeError('expected the bundle as a Uint8Array or an ArrayBuffer');
}

function programFor(agent, options) {
  if (agent instanceof Program) return agent.inner;
  if (typeof agent === 'string') {
    const inputs = Object.keys(options.context ?? {});
    const compiled = wasm.compile_for_run(agent, compileOptions({ ...options, inputs }));
    try {
      const program = compiled.take_program();
      if (program === undefined) throw new AplCompileError(JSON.parse(compiled.report()));
      return program;
    } finally {
      compiled.free();
    }
  }
  return wasm.Program.load(toBytes(agent), options.dialect);
}

/**
 * Runs an agent (source, bundle bytes or a Program) to its end; returns the final context
 * (`aplc run --json`'s) or throws an AplRunError carrying the context so far.
 */
export async function start(agent, options = {}) {
  return runProgram(programFor(agent, options), options);
}

/** The scripted provider: `aplc run --mock`'s answers, one per call, in order. */
export function scripted(answers) {
  const script = new wasm.Script(typeof answers === 'string' ? answers : JSON.stringify(answers));
  const provider = async () => {
    const next = JSON.parse(script.next_json());
    if (next.error) throw new AplProviderError(next.error.message, next.error.kind);
    return next.response;
  };
  provider[SCRIPT] = script;
  return provider;
}

/** The OpenAI Chat Completions endpoint under `baseURL` (a trailing `/v1` is fine). */
export function chatCompletionsURL(baseURL = 'https://api.openai.com') {
  const url = new URL(String(baseURL).trim());
  if (url.protocol !== 'http:' && url.protocol !== 'https:') {
    throw new TypeError('baseURL: expected an http:// or https:// URL');
  }
  if (url.username || url.password) throw new TypeError('baseURL: put the key in apiKey, not in the URL');
  const base = url.pathname.replace(/\/+$/, '');
  url.pathname = base.endsWith('/v1') ? `${base}/chat/completions` : `${base}/v1/chat/completions`;
  return url.toString();
}

function statusKind(status) {
  if (status === 401 || status === 403) return 'auth';
  if (status === 429) return 'rate_limited';
  if (status >= 500) return 'server';
  if (status >= 300 && status < 400) return 'transport';
  if (status >= 400) return 'invalid_request';
  return 'invalid_response';
}

/**
 * A provider for an OpenAI-compatible server, over `fetch`. The key stays in this
 * closure: it is sent only in the Authorization header and never appears in an error.
 */
export function openaiCompatible({ baseURL, apiKey, model, stream = false, headers = {}, fetch: fetchImpl } = {}) {
  const endpoint = chatCompletionsURL(baseURL);
  const doFetch = fetchImpl ?? globalThis.fetch;
  const redact = (text) => (apiKey ? String(text).split(apiKey).join('<redacted>') : String(text));
  return async function openaiProvider(request, { signal, onDelta } = {}) {
    const body = { ...request };
    if (model) body.model = model;
    if (stream) {
      body.stream = true;
      body.stream_options = { include_usage: true };
    }
    const sent = { 'content-type': 'application/json', accept: stream ? 'text/event-stream' : 'application/json', ...headers };
    if (apiKey) sent.authorization = `Bearer ${apiKey}`;
    let response;
    try {
      response = await doFetch(endpoint, { method: 'POST', headers: sent, body: JSON.stringify(body), signal });
    } catch (error) {
      if (signal?.aborted) throw error;
      throw new AplProviderError(redact(`${endpoint}: ${error.message}${error.cause ? ` (${error.cause.message ?? error.cause})` : ''}`), 'transport');
    }
    if (!response.ok) {
      const text = (await response.text().catch(() => '')).slice(0, 1000);
      throw new AplProviderError(redact(`HTTP ${response.status} from ${endpoint}: ${text}`), statusKind(response.status));
    }
    if (!stream) {
      const text = await response.text();
      try {
        return JSON.parse(text);
      } catch (error) {
        throw new AplProviderError(`invalid provider response: the response is not JSON (${error.message})`, 'invalid_response');
      }
    }
    return readStream(response, onDelta);
  };
}

async function readStream(response, onDelta) {
  const assembler = new wasm.Stream();
  try {
    const reader = response.body.getReader();
    for (;;) {
      const { done, value } = await reader.read();
      if (done) break;
      let deltas;
      try {
        deltas = JSON.parse(assembler.feed(value));
      } catch (error) {
        throw new AplProviderError(error.message, 'invalid_response');
      }
      for (const text of deltas) onDelta?.(text);
      if (assembler.done()) {
        await reader.cancel().catch(() => {});
        break;
      }
    }
    try {
      return JSON.parse(assembler.finish());
    } catch (error) {
      throw new AplProviderError(error.message, 'invalid_response');
    }
  } finally {
    assembler.free();
  }
}

function toolsOf(tools = {}) {
  const table = new Map();
  const descriptors = [];
  for (const [name, tool] of Object.entries(tools)) {
    if (!tool || typeof tool.fn !== 'function') throw new TypeError(`tool ${name}: expected {descriptor, fn}`);
    const descriptor = { name, ...(tool.descriptor ?? {}) };
    table.set(descriptor.name, tool);
    descriptors.push({ descriptor, withContext: Boolean(tool.withContext) });
  }
  return { table, descriptors };
}

// A thrown Error's message; other error types keep their name (`TypeError: ...`), as
// Python's exceptions do in the Python package.
function errorText(error) {
  if (error instanceof AplProviderError) return error.message;
  if (error instanceof Error) return error.name === 'Error' ? error.message : `${error.name}: ${error.message}`;
  return String(error);
}

// What an awaited call became: its value, its error, or why the run stopped waiting.
const DEADLINE = Symbol('deadline');
const ABORTED = Symbol('aborted');

async function runProgram(program, options) {
  const { context = {}, provider, tools, timeoutMs, maxSteps, maxRuns, onEvent, signal } = options;
  if (typeof provider !== 'function') throw new TypeError('start: `provider` must be a function (e.g. scripted([...]) or openaiCompatible({...}))');
  const { table, descriptors } = toolsOf(tools);
  const settings = JSON.stringify({ context, timeoutMs, maxSteps, maxRuns, events: typeof onEvent === 'function', tools: descriptors });
  const run = new wasm.Run(program, settings);
  const started = performance.now();
  const now = () => performance.now() - started;
  const deliver = () => {
    if (typeof onEvent !== 'function') return;
    for (const event of JSON.parse(run.events())) onEvent(event);
  };
  // One controller per run: an abort of the caller's signal, or the deadline, aborts the
  // call in flight (a provider's fetch gets its signal).
  let stop;
  const stopped = new Promise((resolve) => (stop = resolve));
  const onAbort = () => {
    run.cancel();
    stop(ABORTED);
  };
  if (signal?.aborted) run.cancel();
  signal?.addEventListener('abort', onAbort, { once: true });
  const until = async (work) => {
    const left = run.deadline_ms() - now();
    let timer;
    const deadline = new Promise((resolve) => {
      timer = setTimeout(() => resolve(DEADLINE), Math.max(0, Math.min(left, 2 ** 31 - 1)));
    });
    const controller = new AbortController();
    try {
      const result = await Promise.race([work(controller.signal).then((value) => ({ value }), (error) => ({ error })), deadline, stopped]);
      if (result === DEADLINE || result === ABORTED) controller.abort();
      return result;
    } finally {
      clearTimeout(timer);
    }
  };
  try {
    deliver();
    for (;;) {
      const action = JSON.parse(run.poll(now()));
      deliver();
      if (action.type === 'continue') continue;
      if (action.type === 'done') break;
      if (action.type === 'provider') {
        await callProvider(run, provider, action.request, until, now, onEvent);
      } else if (action.type === 'tool') {
        await callTool(run, table, action, until, now);
      } else {
        run.abandon_input('the run needs input from a person, and JavaScript runs have nobody to ask');
      }
      deliver();
    }
    const outcome = JSON.parse(run.finish());
    deliver();
    if (outcome.error) {
      const { kind, message, step, line, column } = outcome.error;
      throw new AplRunError(message, { kind, step, line, column, context: outcome.context, lastStepErrors: outcome.lastStepErrors });
    }
    return outcome.context;
  } finally {
    signal?.removeEventListener('abort', onAbort);
    run.free();
  }
}

async function callProvider(run, provider, request, until, now, onEvent) {
  const script = provider[SCRIPT];
  if (script) {
    run.answer_scripted(now(), script);
    return;
  }
  let index = 0;
  let open = true;
  const onDelta = (text) => {
    if (!open || typeof onEvent !== 'function' || !text) return;
    onEvent(JSON.parse(run.delta(now(), index++, String(text))));
  };
  const result = await until((signal) => Promise.resolve().then(() => provider(request, { signal, onDelta })));
  open = false;
  if (result === DEADLINE) return run.time_out(now());
  if (result === ABORTED) return undefined;
  if ('error' in result) return run.fail_provider(now(), result.error?.kind ?? 'other', errorText(result.error));
  let text;
  try {
    text = JSON.stringify(result.value);
  } catch (error) {
    return run.fail_provider(now(), 'invalid_response', `invalid provider response: ${error.message}`);
  }
  if (text === undefined) return run.fail_provider(now(), 'invalid_response', 'invalid provider response: the provider returned nothing');
  return run.answer_provider(now(), text);
}

async function callTool(run, table, action, until, now) {
  const tool = table.get(action.name);
  if (!tool) return run.fail_tool(now(), 'the tool has a descriptor but no implementation');
  const result = await until(() => Promise.resolve().then(() => tool.fn(action.arguments, action.context ?? undefined)));
  if (result === DEADLINE) return run.time_out(now());
  if (result === ABORTED) return undefined;
  if ('error' in result) return run.fail_tool(now(), errorText(result.error));
  let text;
  try {
    text = JSON.stringify(result.value ?? null);
  } catch (error) {
    return run.fail_tool(now(), `the tool's result is not JSON: ${error.message}`);
  }
  return run.answer_tool(now(), text);
}
