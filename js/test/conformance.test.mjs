// The conformance fixtures (fixtures/run/*.apl, as cli/tests/fixtures.rs runs them) through
// the package and through the native `aplc run --json --mock`: the final contexts are
// equal, time fields aside, and a failed run fails the same way in both.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { readdirSync, readFileSync, existsSync } from 'node:fs';
import path from 'node:path';
import { start, scripted, AplRunError } from '../index.js';
import { aplc, fixtures, withoutTimes } from './support.mjs';

const dir = path.join(fixtures, 'run');
const names = readdirSync(dir).filter((f) => f.endsWith('.apl')).map((f) => f.slice(0, -4)).sort();

function json(file) {
  return existsSync(file) ? JSON.parse(readFileSync(file, 'utf8')) : undefined;
}

async function viaPackage(name) {
  const base = path.join(dir, name);
  const options = json(`${base}.options.json`) ?? {};
  try {
    const context = await start(readFileSync(`${base}.apl`, 'utf8'), {
      provider: scripted(json(`${base}.mock.json`)),
      context: json(`${base}.context.json`),
      relaxed: options.relaxed,
      maxRuns: options.max_runs,
      maxSteps: options.max_steps,
      timeoutMs: options.timeout_ms,
      fileName: `${name}.apl`,
    });
    return { context, failed: false };
  } catch (error) {
    assert.ok(error instanceof AplRunError, `${name}: ${error.stack}`);
    return { context: error.context, failed: true, kind: error.kind };
  }
}

function natively(name) {
  // Run from the fixture's directory, so that messages name the file as the package does.
  const base = name;
  const options = json(path.join(dir, `${name}.options.json`)) ?? {};
  const args = ['run', `${base}.apl`, '--json', '--quiet', '--mock', `${base}.mock.json`];
  if (existsSync(path.join(dir, `${name}.context.json`))) args.push('--context', `${base}.context.json`);
  if (options.relaxed) args.push('--relaxed');
  if (options.max_runs !== undefined) args.push('--max-runs', String(options.max_runs));
  if (options.max_steps !== undefined) args.push('--max-steps', String(options.max_steps));
  if (options.timeout_ms !== undefined) args.push('--timeout', String(options.timeout_ms));
  const { status, stdout, stderr } = aplc(args, { cwd: dir });
  assert.ok(stdout.trim(), `${name}: aplc printed no context (exit ${status}): ${stderr}`);
  return { context: JSON.parse(stdout), status };
}

test('every run fixture is a conformance case', () => {
  assert.ok(names.length >= 30, `only ${names.length} fixtures in ${dir}`);
});

for (const name of names) {
  test(`conformance: ${name}`, async () => {
    const js = await viaPackage(name);
    const native = natively(name);
    // Exit 1 (run failed) and 2 (refused before the first step) are run errors in both.
    assert.equal(js.failed, native.status === 1 || native.status === 2, `${name}: exit ${native.status}, js ${js.kind}`);
    assert.deepEqual(withoutTimes(js.context), withoutTimes(native.context));
  });
}
