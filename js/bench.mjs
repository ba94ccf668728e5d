// Per-step time of the package in Node against the native CLI (benches/README.md,
// "JavaScript"): benches/agents/self_loop.apl (500 steps, one scripted provider call
// each) run N times after a warm-up, the time per step from the median run.
//
//   node js/bench.mjs [N]          then compare: aplc bench benches/agents/self_loop.apl \
//                                    --mock benches/agents/self_loop.mock.json
import { readFileSync } from 'node:fs';
import { loadBundle, compile, scripted } from './index.js';

const runs = Number(process.argv[2] ?? 30);
const dir = new URL('../benches/agents/', import.meta.url);
const source = readFileSync(new URL('self_loop.apl', dir), 'utf8');
const answers = JSON.parse(readFileSync(new URL('self_loop.mock.json', dir), 'utf8'));
const program = loadBundle(compile(source));
const times = [];
let steps = 0;
for (let i = 0; i < runs + 5; i++) {
  const started = performance.now();
  const context = await program.start({ provider: scripted(answers) });
  const elapsed = performance.now() - started;
  steps = context.context_history.length;
  if (i >= 5) times.push(elapsed);
}
times.sort((a, b) => a - b);
const median = times[Math.floor(times.length / 2)];
console.log(JSON.stringify({ runs, steps, median_run_ms: +median.toFixed(3), per_step_us: +((median * 1000) / steps).toFixed(2) }));
