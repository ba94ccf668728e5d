// Types of the aplc package (spec/js.md).

export interface Diagnostic {
  code: string;
  severity: 'error' | 'warning';
  message: string;
  /** 1-based line and column (in characters) of the primary span's start. */
  line: number;
  column: number;
  endLine: number;
  endColumn: number;
  labels: { primary: boolean; message: string; line: number; column: number; endLine: number; endColumn: number }[];
  notes: string[];
  help: string | null;
  /** The edit `help` suggests (a did-you-mean), where it is one: replace the range with `replacement`. */
  suggestion: Suggestion | null;
}

/** An edit that applies a diagnostic's fix: replace `line:column` to `endLine:endColumn` (1-based, in characters) with `replacement`. */
export interface Suggestion {
  replacement: string;
  line: number;
  column: number;
  endLine: number;
  endColumn: number;
}

export interface CheckResult {
  ok: boolean;
  diagnostics: Diagnostic[];
  /** The report `aplc check` prints, without colour. */
  rendered: string;
}

export interface CompileOptions {
  /** Relaxed syntax (§6.1.1.3). */
  relaxed?: boolean;
  /** `"spec"` (the default) or `"defuss-1.1"`. */
  dialect?: string;
  /** The name recorded in the bundle and shown in messages (default `agent.apl`). */
  fileName?: string;
  /** Every warning an error. */
  denyWarnings?: boolean;
}

export type Json = null | boolean | number | string | Json[] | { [key: string]: Json };

/** An OpenAI Chat Completions request body: `{model, messages, tools?, ...}`. */
export interface ChatRequest {
  model: string;
  messages: { role: string; content: Json }[];
  tools?: Json[];
  [key: string]: Json | undefined;
}

/** An OpenAI Chat Completions response: `{choices, usage?}`. */
export interface ChatResponse {
  choices: { message: { role?: string; content: Json; tool_calls?: Json[] }; finish_reason?: string | null }[];
  usage?: { [key: string]: Json };
  [key: string]: Json | undefined;
}

export interface ProviderCall {
  /** Aborted when the run's deadline passes or the run is cancelled. */
  signal: AbortSignal;
  /** Hands a piece of streamed text to the run: a `provider_delta` event. */
  onDelta(text: string): void;
}

export type Provider = (request: ChatRequest, call: ProviderCall) => ChatResponse | Promise<ChatResponse>;

export interface Tool {
  /** The OpenAI function descriptor (`name` defaults to the key): `{description, parameters}`. */
  descriptor?: { name?: string; description?: string; parameters?: Json; strict?: boolean };
  /** Called with the arguments (checked against `parameters`) and, with `withContext`, the run's variables. */
  fn(args: any, context?: { [name: string]: Json }): unknown | Promise<unknown>;
  withContext?: boolean;
}

/** A run event, as `aplc run --events` writes it (spec/events.md). */
export interface RunEvent {
  seq: number;
  t_ms: number;
  type: string;
  [key: string]: Json | undefined;
}

export interface StartOptions extends CompileOptions {
  /** Variables injected before the first step (`with_context`). */
  context?: { [name: string]: Json };
  provider: Provider;
  tools?: { [name: string]: Tool };
  /** The run's wall-clock limit (default 120000). */
  timeoutMs?: number;
  /** Cap on steps entered (default 1000). */
  maxSteps?: number;
  /** Cap on successful provider calls. */
  maxRuns?: number;
  /** Called with each event as the run goes. */
  onEvent?: (event: RunEvent) => void;
  signal?: AbortSignal;
}

/** The final context: every variable, and `context_history`. */
export type Context = { [name: string]: Json };

export class AplRunError extends Error {
  kind: string;
  step: string | null;
  line: number | null;
  column: number | null;
  /** The context when the run failed. */
  context: Context;
  lastStepErrors: string[];
}

export class AplCompileError extends Error {
  diagnostics: Diagnostic[];
  rendered: string;
}

export class AplProviderError extends Error {
  constructor(message: string, kind?: string);
  kind: string;
}

export class Program {
  readonly steps: string[];
  readonly inputs: string[];
  start(options: Omit<StartOptions, keyof CompileOptions>): Promise<Context>;
}

export interface GraphStep {
  name: string;
  reachable: boolean;
  /** `{to: index}`, `{to: "return"}`, `{to: "*"}` (a computed target) or `{unknown: name}`. */
  jumps: ({ to: number | 'return' | '*' } | { unknown: string })[];
  /** Why a run can end after the step (empty: it always jumps on). */
  ends: string[];
}

export interface Graph extends CheckResult {
  entry: number | null;
  steps: GraphStep[] | null;
}

export function check(source: string, options?: CompileOptions): CheckResult;
export function compile(source: string, options?: CompileOptions): Uint8Array;
export function graph(source: string, options?: CompileOptions): Graph;
export function loadBundle(bytes: Uint8Array | ArrayBuffer, options?: { dialect?: string }): Program;
export function start(agent: string | Uint8Array | ArrayBuffer | Program, options: StartOptions): Promise<Context>;
export function scripted(answers: Json[] | string): Provider;
export function openaiCompatible(options: {
  baseURL?: string;
  apiKey?: string;
  /** Sent instead of the agent's `model`. */
  model?: string;
  stream?: boolean;
  headers?: { [name: string]: string };
  fetch?: typeof fetch;
}): Provider;
export function chatCompletionsURL(baseURL?: string): string;
