// The playground in a real browser: Debian's Chromium, headless, driven by puppeteer-core
// (which uses the installed browser and downloads none). The page is served by
// `aplc serve --playground` (the workspace's own aplc, or APLC_BIN) and opened as plain
// files too. A person's session: type an agent with a mistake, see the diagnostic, fix
// it, see the graph's nodes, run it with scripted answers, read the final context, share
// it by URL. The screenshot goes to APLC_SCREENSHOT (default target/playground.png).
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { spawn } from 'node:child_process';
import { existsSync, mkdirSync, mkdtempSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import path from 'node:path';
import { fileURLToPath, pathToFileURL } from 'node:url';
import puppeteer from 'puppeteer-core';

const here = path.dirname(fileURLToPath(import.meta.url));
const root = path.resolve(here, '../..');
const dist = path.join(root, 'playground/dist');
const chromium = process.env.CHROMIUM ?? '/usr/bin/chromium';
const aplcBin = process.env.APLC_BIN ?? path.join(root, 'target/debug/aplc');
const screenshot = process.env.APLC_SCREENSHOT ?? path.join(root, 'target/playground.png');
const WAIT = { timeout: 60_000 };

let serve;
let base;
let browser;
const requests = [];

before(async () => {
  for (const [what, file, hint] of [
    ['Chromium', chromium, 'apt-get install chromium, or set CHROMIUM'],
    ['aplc', aplcBin, 'cargo build -p aplc, or set APLC_BIN'],
    ['the built playground', path.join(dist, 'playground.js'), 'node playground/build.mjs'],
  ]) {
    if (!existsSync(file)) throw new Error(`${what} is missing at ${file}: ${hint}`);
  }
  const dir = mkdtempSync(path.join(tmpdir(), 'aplc-playground-'));
  mkdirSync(path.join(dir, 'agents'));
  writeFileSync(path.join(dir, 'tokens.txt'), 'test-token-for-the-playground\n');
  serve = spawn(aplcBin, ['serve', '--agents', path.join(dir, 'agents'), '--tokens', path.join(dir, 'tokens.txt'), '--store', `sqlite:${path.join(dir, 'runs.db')}`, '--listen', '127.0.0.1:0', '--playground', dist], { stdio: ['ignore', 'pipe', 'pipe'] });
  let stderr = '';
  serve.stderr.on('data', (d) => (stderr = (stderr + d).slice(-4000)));
  base = await new Promise((resolve, reject) => {
    let out = '';
    const timer = setTimeout(() => reject(new Error(`aplc serve did not start: ${stderr}`)), 60_000);
    serve.stdout.on('data', (d) => {
      out += d;
      const match = out.match(/listening on (http:\/\/\S+)/);
      if (match) {
        clearTimeout(timer);
        resolve(match[1]);
      }
    });
    serve.on('exit', (code) => reject(new Error(`aplc serve exited ${code}: ${stderr}`)));
  });
  browser = await puppeteer.launch({ executablePath: chromium, headless: true, args: ['--no-sandbox', '--disable-gpu', '--disable-dev-shm-usage'] });
});

after(async () => {
  await browser?.close();
  serve?.kill();
});

async function openPage(url) {
  const page = await browser.newPage();
  await page.setViewport({ width: 1400, height: 860 });
  page.on('request', (request) => requests.push(request.url()));
  const errors = [];
  page.on('pageerror', (error) => errors.push(error.message));
  await page.goto(url, { waitUntil: 'load', ...WAIT });
  await page.waitForSelector('body[data-ready="true"]', WAIT);
  assert.deepEqual(errors, []);
  return page;
}

const stepCount = (page) => page.$$eval('#graph svg g.step', (nodes) => nodes.length);

test('a person writes, fixes and runs an agent in the served playground', async () => {
  const page = await openPage(`${base}/playground`);
  // Empty the editor, then type as a person would: the role heading has no phase above it.
  await page.evaluate(() => {
    const { view } = window.aplcPlayground;
    view.dispatch({ changes: { from: 0, to: view.state.doc.length, insert: '' } });
    view.focus();
  });
  await page.keyboard.type('## user\nSay hello to the test.\n');
  await page.waitForSelector('#diagnostics li.error[data-code="APL0020"]', WAIT);
  await page.waitForSelector('.cm-lintRange-error', WAIT);
  assert.equal(await page.$eval('#graph', (g) => g.dataset.state), 'errors');

  // The fix: a phase heading above, and a second step no jump reaches.
  await page.keyboard.down('Control');
  await page.keyboard.press('Home');
  await page.keyboard.up('Control');
  await page.keyboard.type('# prompt: greet\n');
  await page.keyboard.down('Control');
  await page.keyboard.press('End');
  await page.keyboard.up('Control');
  await page.keyboard.type('\n# prompt: never\n## user\nUnreachable.\n');
  await page.waitForFunction(() => !document.querySelector('#diagnostics li.error') && document.querySelectorAll('#graph svg g.step').length === 2, WAIT);
  assert.equal(await stepCount(page), 2);
  assert.deepEqual(await page.$$eval('#graph svg g.step', (nodes) => nodes.map((n) => [n.dataset.step, n.classList.contains('entry'), n.classList.contains('unreachable')])), [
    ['greet', true, false],
    ['never', false, true],
  ]);
  assert.ok(await page.$('#diagnostics li.warning[data-code="APL0016"]'));

  await page.$eval('#answers', (a) => (a.value = '["Hello from the browser!"]'));
  await page.$eval('#context', (c) => (c.value = '{"visitor": "test"}'));
  await page.click('#run');
  await page.waitForSelector('#final-context[data-state="done"]', WAIT);
  const value = (key) => page.$eval(`#final-context [data-key="${key}"] > .value`, (v) => JSON.parse(v.textContent));
  assert.equal(await value('result_text'), 'Hello from the browser!');
  assert.equal(await value('visitor'), 'test');
  assert.equal(await value('global_runs'), 1);
  const types = await page.$$eval('#timeline li', (items) => items.map((i) => i.dataset.type));
  assert.equal(types[0], 'run_started');
  assert.ok(types.includes('provider_call') && types.includes('provider_result'));
  assert.equal(types.at(-1), 'run_finished');
  mkdirSync(path.dirname(screenshot), { recursive: true });
  await page.screenshot({ path: screenshot });

  // Share: the agent and the answers travel in the fragment, and open as they were.
  await page.click('#share');
  const shared = await page.evaluate(() => location.href);
  assert.match(shared, /#agent=.+&answers=.+/);
  const again = await openPage(shared);
  assert.equal(await again.evaluate(() => window.aplcPlayground.view.state.doc.toString()), await page.evaluate(() => window.aplcPlayground.view.state.doc.toString()));
  assert.equal(await again.$eval('#answers', (a) => a.value), '["Hello from the browser!"]');
  assert.equal(await stepCount(again), 2);
});

test('the page works opened as plain files, and calls no other host', async () => {
  const page = await openPage(pathToFileURL(path.join(dist, 'index.html')).href);
  assert.equal(await stepCount(page), 2, 'the example agent has two steps');
  await page.click('#run');
  await page.waitForSelector('#final-context[data-state="done"]', WAIT);
  const hosts = requests.map((url) => new URL(url)).filter((url) => url.protocol !== 'file:' && url.protocol !== 'data:' && url.hostname !== '127.0.0.1');
  assert.deepEqual(hosts.map(String), []);
});
