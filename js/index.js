// The aplc package's entry point, for Node (20 and later) and browsers (ES modules):
// loads the WebAssembly module once, at import, then exports the API (core.js).
import init from './pkg/aplc_js.js';

const isNode = typeof process === 'object' && typeof process.versions?.node === 'string';
if (isNode) {
  const { readFile } = await import('node:fs/promises');
  await init({ module_or_path: await readFile(new URL('./pkg/aplc_js_bg.wasm', import.meta.url)) });
} else {
  await init();
}

export * from './core.js';
