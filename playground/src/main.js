// The playground: an editor with the compiler's live diagnostics, the step graph drawn
// as SVG, and a run panel (scripted answers or an OpenAI-compatible endpoint) with the
// run's events and final context. Everything runs in the page: the aplc package's core
// with its WebAssembly module inlined (build.mjs); no other host is ever called, except
// the endpoint a person types in.
import { EditorView, basicSetup } from 'codemirror';
import { linter, lintGutter } from '@codemirror/lint';
import { initSync } from '../../js/pkg/aplc_js.js';
import wasmBytes from '../../js/pkg/aplc_js_bg.wasm';
import { check, graph, start, scripted, openaiCompatible, AplRunError, AplCompileError } from '../../js/core.js';

initSync({ module: wasmBytes });

const EXAMPLE = `{# An agent with two steps: it asks, then checks the answer. #}
# prompt: ask
## system
You answer in one word.
## user
What colour is the sky?

# post: ask
{% if 'blue' in result_text | lower %}
{{ set_context('next_step', 'done') }}
{% else %}
{{ set_context('next_step', 'ask') }}
{% endif %}

# prompt: done
## user
Say thanks.
`;

const $ = (id) => document.getElementById(id);

// ---- Share: the agent and the answers in the URL fragment -------------------------

function encode(text) {
  const bytes = new TextEncoder().encode(text);
  let binary = '';
  for (const b of bytes) binary += String.fromCharCode(b);
  return btoa(binary).replace(/\+/g, '-').replace(/\//g, '_').replace(/=+$/, '');
}

function decode(text) {
  const binary = atob(text.replace(/-/g, '+').replace(/_/g, '/'));
  return new TextDecoder().decode(Uint8Array.from(binary, (c) => c.charCodeAt(0)));
}

function fromFragment() {
  const params = new URLSearchParams(location.hash.slice(1));
  const read = (key) => {
    try {
      return params.has(key) ? decode(params.get(key)) : null;
    } catch {
      return null;
    }
  };
  return { agent: read('agent'), answers: read('answers') };
}

// ---- The editor and its live diagnostics ------------------------------------------

function offset(doc, line, column) {
  const l = doc.line(Math.min(Math.max(line, 1), doc.lines));
  return Math.min(l.from + Math.max(column - 1, 0), l.to);
}

function showDiagnostics(diagnostics) {
  const list = $('diagnostics');
  list.replaceChildren(
    ...diagnostics.map((d) => {
      const item = document.createElement('li');
      item.className = d.severity;
      item.dataset.code = d.code;
      item.textContent = `${d.line}:${d.column} ${d.severity} ${d.code} ${d.message}`;
      return item;
    }),
  );
}

const aplLinter = linter(
  (view) => {
    const source = view.state.doc.toString();
    const report = check(source);
    showDiagnostics(report.diagnostics);
    drawGraph(source);
    return report.diagnostics.map((d) => {
      const from = offset(view.state.doc, d.line, d.column);
      const to = Math.max(offset(view.state.doc, d.endLine, d.endColumn), from + 1);
      return { from, to: Math.min(to, view.state.doc.length), severity: d.severity, message: `${d.code} ${d.message}${d.help ? `\nhelp: ${d.help}` : ''}` };
    });
  },
  { delay: 250 },
);

// ---- The step graph as SVG ----------------------------------------------------------

const SVG = 'http://www.w3.org/2000/svg';
function el(name, attrs = {}, parent) {
  const node = document.createElementNS(SVG, name);
  for (const [k, v] of Object.entries(attrs)) node.setAttribute(k, v);
  parent?.appendChild(node);
  return node;
}

// Rows by distance from the entry step along jumps; steps no jump reaches go last.
function layers(steps, entry) {
  const depth = new Array(steps.length).fill(-1);
  const queue = entry === null ? [] : [entry];
  if (entry !== null) depth[entry] = 0;
  while (queue.length) {
    const at = queue.shift();
    for (const jump of steps[at].jumps) {
      if (typeof jump.to === 'number' && depth[jump.to] < 0) {
        depth[jump.to] = depth[at] + 1;
        queue.push(jump.to);
      }
    }
  }
  const max = Math.max(0, ...depth);
  return depth.map((d, i) => (d < 0 ? max + 1 + (steps[i].reachable ? 0 : 0) : d));
}

function drawGraph(source) {
  const box = $('graph');
  const g = graph(source);
  if (!g.steps) {
    box.dataset.state = 'errors';
    box.querySelector('svg')?.classList.add('stale');
    return;
  }
  box.dataset.state = 'ok';
  const rows = layers(g.steps, g.entry);
  const W = 130, H = 34, GX = 30, GY = 46;
  const byRow = new Map();
  const pos = g.steps.map((_, i) => {
    const row = rows[i];
    const col = byRow.get(row) ?? 0;
    byRow.set(row, col + 1);
    return { x: 20 + col * (W + GX), y: 40 + row * (H + GY) };
  });
  const maxCols = Math.max(1, ...byRow.values());
  const maxRow = Math.max(0, ...rows);
  const endY = 40 + (maxRow + 1) * (H + GY);
  const width = 40 + maxCols * (W + GX) + 60;
  const svg = el('svg', { viewBox: `0 0 ${width} ${endY + 40}`, role: 'img', 'aria-label': 'step graph' });
  const defs = el('defs', {}, svg);
  const marker = el('marker', { id: 'arrow', viewBox: '0 0 10 10', refX: 10, refY: 5, markerWidth: 7, markerHeight: 7, orient: 'auto-start-reverse' }, defs);
  el('path', { d: 'M0,0 L10,5 L0,10 z', fill: '#555' }, marker);
  const edges = el('g', { class: 'edges' }, svg);
  const end = { x: width - 50, y: endY };
  let needEnd = false;
  let needAny = false;
  const any = { x: width - 50, y: 20 };
  g.steps.forEach((step, i) => {
    const from = pos[i];
    for (const jump of step.jumps) {
      let to;
      let cls = 'edge';
      if (typeof jump.to === 'number') to = pos[jump.to];
      else if (jump.to === 'return') (to = { x: end.x - W / 2 + 12, y: end.y - H / 2 + 12 }), (needEnd = true);
      else if (jump.to === '*') (to = { x: any.x - W / 2 + 12, y: any.y - H / 2 + 12 }), (cls += ' dynamic'), (needAny = true);
      else continue;
      if (to === from) {
        el('path', { class: cls, d: `M${from.x + W},${from.y + 10} C${from.x + W + 30},${from.y - 10} ${from.x + W + 30},${from.y + H + 10} ${from.x + W},${from.y + H - 10}`, 'marker-end': 'url(#arrow)' }, edges);
        continue;
      }
      const x1 = from.x + W / 2, y1 = from.y + H;
      const x2 = to.x + W / 2, y2 = to.y > from.y ? to.y : to.y + H;
      el('path', { class: cls, d: `M${x1},${y1} C${x1},${(y1 + y2) / 2} ${x2},${(y1 + y2) / 2} ${x2},${y2}`, 'marker-end': 'url(#arrow)' }, edges);
    }
    if (step.jumps.some((j) => j.unknown !== undefined)) {
      el('path', { class: 'edge unknown', d: `M${from.x + W},${from.y + H / 2} l30,0` }, edges);
    }
  });
  const nodes = el('g', { class: 'steps' }, svg);
  g.steps.forEach((step, i) => {
    const classes = ['step'];
    if (i === g.entry) classes.push('entry');
    if (!step.reachable) classes.push('unreachable');
    if (step.ends.length) classes.push('ends');
    const node = el('g', { class: classes.join(' '), 'data-step': step.name, transform: `translate(${pos[i].x},${pos[i].y})` }, nodes);
    el('title', {}, node).textContent = `${step.name}${step.reachable ? '' : ' (unreachable)'}${step.ends.length ? `\nthe run can end here: ${step.ends.join('; ')}` : ''}`;
    el('rect', { width: W, height: H, rx: 8 }, node);
    el('text', { x: W / 2, y: H / 2 }, node).textContent = step.name.length > 18 ? `${step.name.slice(0, 17)}…` : step.name;
    if (i === g.entry) {
      el('circle', { cx: -12, cy: H / 2, r: 5, fill: '#1d2330' }, node);
      el('line', { x1: -7, y1: H / 2, x2: -1, y2: H / 2, class: 'edge', 'marker-end': 'url(#arrow)' }, node);
    }
  });
  const terminal = (at, label, cls) => {
    const node = el('g', { class: `terminal ${cls}`, transform: `translate(${at.x - W / 2 + 12},${at.y - H / 2 + 12})` }, svg);
    el('circle', { cx: 0, cy: 0, r: 12, fill: '#fff', stroke: '#555' }, node);
    el('text', { x: 0, y: 0 }, node).textContent = label;
  };
  if (needEnd) terminal(end, '⏹', 'return');
  if (needAny) terminal(any, '*', 'any');
  box.replaceChildren(svg);
}

// ---- The run --------------------------------------------------------------------

function tree(value, key) {
  const isObject = value !== null && typeof value === 'object';
  if (!isObject) {
    const row = document.createElement('div');
    row.className = 'leaf';
    if (key !== undefined) row.dataset.key = key;
    const k = document.createElement('span');
    k.className = 'key';
    k.textContent = key === undefined ? '' : `${key}: `;
    const v = document.createElement('span');
    v.className = 'value';
    v.textContent = JSON.stringify(value);
    row.append(k, v);
    return row;
  }
  const details = document.createElement('details');
  if (key !== undefined) details.dataset.key = key;
  const summary = document.createElement('summary');
  const size = Array.isArray(value) ? `[${value.length}]` : `{${Object.keys(value).length}}`;
  summary.innerHTML = '';
  summary.append(Object.assign(document.createElement('span'), { className: 'key', textContent: key === undefined ? 'context' : key }), ` ${size}`);
  details.append(summary);
  for (const [k, v] of Object.entries(value)) details.append(tree(v, k));
  return details;
}

function eventLine(event) {
  const item = document.createElement('li');
  item.dataset.type = event.type;
  const time = Object.assign(document.createElement('span'), { className: 't', textContent: `${event.t_ms.toFixed(1)} ms ` });
  const bits = [event.type];
  if (event.step) bits.push(event.step);
  if (event.phase) bits.push(event.phase);
  if (event.model) bits.push(event.model);
  if (event.tool) bits.push(event.tool);
  if (event.to) bits.push(`→ ${event.to}`);
  if (event.duration_ms !== undefined) bits.push(`${event.duration_ms.toFixed(1)} ms`);
  if (event.latency_ms !== undefined) bits.push(`${event.latency_ms.toFixed(1)} ms`);
  if (event.message) bits.push(event.message);
  if (event.error?.message) bits.push(event.error.message);
  if (event.outcome) bits.push(event.outcome);
  if (event.error || event.type === 'error' || event.with_error) item.className = 'error';
  item.append(time, bits.join(' · '));
  return item;
}

let controller = null;

async function run(view) {
  $('run-error').textContent = '';
  $('timeline').replaceChildren();
  $('final-context').replaceChildren();
  $('final-context').dataset.state = 'running';
  let context;
  let provider;
  try {
    context = JSON.parse($('context').value || '{}');
    if (document.querySelector('input[name=mode]:checked').value === 'scripted') {
      provider = scripted(JSON.parse($('answers').value || '[]'));
    } else {
      provider = openaiCompatible({ baseURL: $('base-url').value, apiKey: $('api-key').value || undefined, model: $('model').value || undefined, stream: $('stream').checked });
    }
  } catch (error) {
    $('run-error').textContent = error.message;
    $('final-context').dataset.state = 'failed';
    return;
  }
  controller = new AbortController();
  $('run').disabled = true;
  $('stop').disabled = false;
  const timeline = $('timeline');
  try {
    const final = await start(view.state.doc.toString(), { context, provider, signal: controller.signal, onEvent: (e) => e.type !== 'provider_delta' && timeline.append(eventLine(e)) });
    $('final-context').replaceChildren(tree(final));
    $('final-context').dataset.state = 'done';
  } catch (error) {
    $('run-error').textContent = error instanceof AplCompileError ? error.rendered : `${error.kind ?? error.name}: ${error.message}`;
    if (error instanceof AplRunError) $('final-context').replaceChildren(tree(error.context));
    $('final-context').dataset.state = 'failed';
  } finally {
    $('final-context').querySelector('details')?.setAttribute('open', '');
    $('run').disabled = false;
    $('stop').disabled = true;
    controller = null;
  }
}

// ---- Wiring ---------------------------------------------------------------------

const shared = fromFragment();
if (shared.answers !== null) $('answers').value = shared.answers;
const view = new EditorView({
  doc: shared.agent ?? EXAMPLE,
  extensions: [basicSetup, lintGutter(), aplLinter, EditorView.lineWrapping],
  parent: $('editor'),
});
window.aplcPlayground = { view };

for (const radio of document.querySelectorAll('input[name=mode]')) {
  radio.addEventListener('change', () => {
    const openai = radio.value === 'openai' && radio.checked;
    if (!radio.checked) return;
    $('openai-settings').hidden = !openai;
    $('scripted-settings').hidden = openai;
  });
}
$('run-form').addEventListener('submit', (event) => {
  event.preventDefault();
  run(view);
});
$('stop').addEventListener('click', () => controller?.abort());
$('share').addEventListener('click', () => {
  // The key is never shared: only the agent and the scripted answers.
  location.hash = `agent=${encode(view.state.doc.toString())}&answers=${encode($('answers').value)}`;
  navigator.clipboard?.writeText(location.href).catch(() => {});
  $('status').textContent = 'link in the address bar';
});
drawGraph(view.state.doc.toString());
showDiagnostics(check(view.state.doc.toString()).diagnostics);
$('status').textContent = 'ready';
document.body.dataset.ready = 'true';
