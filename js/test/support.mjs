// What the package's tests share: the repository's paths, and the native `aplc` binary
// they compare with (the workspace's own build: `cargo build -p aplc`, or APLC_BIN).
import { existsSync } from 'node:fs';
import { spawnSync } from 'node:child_process';
import { fileURLToPath } from 'node:url';
import path from 'node:path';

export const root = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '../..');
export const fixtures = path.join(root, 'fixtures');

export function aplcBin() {
  const bin = process.env.APLC_BIN ?? path.join(root, 'target/debug/aplc');
  if (!existsSync(bin)) {
    throw new Error(`no native aplc at ${bin}: run \`cargo build -p aplc\` first, or set APLC_BIN`);
  }
  return bin;
}

/** Runs the native CLI; returns {status, stdout, stderr}. */
export function aplc(args, options = {}) {
  const result = spawnSync(aplcBin(), args, { encoding: options.encoding ?? 'utf8', cwd: options.cwd ?? root, timeout: 120_000 });
  if (result.error) throw result.error;
  return result;
}

/** `value` without the time fields (`time_elapsed*`), at any depth. */
export function withoutTimes(value) {
  if (Array.isArray(value)) return value.map(withoutTimes);
  if (value && typeof value === 'object') {
    return Object.fromEntries(
      Object.entries(value)
        .filter(([key]) => !key.startsWith('time_elapsed'))
        .map(([key, v]) => [key, withoutTimes(v)]),
    );
  }
  return value;
}
