// Builds the playground into dist/: one classic script (src/main.js, CodeMirror and the
// aplc package's core with the WebAssembly module inlined), the page and its styles.
// A classic script with everything inlined is what lets the page work opened as plain
// files (file://), where browsers refuse module scripts and fetch. Needs js/pkg (js/build.sh).
import { build } from 'esbuild';
import { copyFileSync, existsSync, mkdirSync, statSync } from 'node:fs';
import path from 'node:path';
import { fileURLToPath } from 'node:url';

const here = path.dirname(fileURLToPath(import.meta.url));
const wasm = path.join(here, '../js/pkg/aplc_js_bg.wasm');
if (!existsSync(wasm)) {
  console.error(`playground/build.mjs: no ${wasm}: build the package first (js/build.sh)`);
  process.exit(1);
}
const dist = path.join(here, 'dist');
mkdirSync(dist, { recursive: true });
await build({
  entryPoints: [path.join(here, 'src/main.js')],
  bundle: true,
  format: 'iife',
  target: 'es2022',
  minify: true,
  legalComments: 'linked',
  loader: { '.wasm': 'binary' },
  // The glue's default init fetches by import.meta.url; the page always passes the bytes.
  define: { 'import.meta.url': '"about:blank"' },
  outfile: path.join(dist, 'playground.js'),
  logLevel: 'warning',
});
for (const file of ['index.html', 'style.css']) copyFileSync(path.join(here, 'src', file), path.join(dist, file));
console.log(`playground/dist: playground.js ${statSync(path.join(dist, 'playground.js')).size} bytes`);
