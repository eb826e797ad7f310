'use strict';
// The README's examples run as they are: every ```js block of "The API",
// and the AI SDK adapter's (the OpenAI, Anthropic and MCP ones reach the
// network: their code paths are run by test/adapter-*.test.js).
const test = require('node:test');
const assert = require('node:assert/strict');
const { spawnSync } = require('node:child_process');
const fs = require('node:fs');
const path = require('node:path');
const { makeAgent } = require('./helpers');

const pkg = path.resolve(__dirname, '..');
const readme = fs.readFileSync(path.join(pkg, 'README.md'), 'utf8');

function blocks(from, to) {
  const part = readme.slice(readme.indexOf(from), to ? readme.indexOf(to) : undefined);
  return [...part.matchAll(/```js\n([\s\S]*?)```/g)].map((m) => m[1]);
}

test('the README examples run', (t) => {
  const { state } = makeAgent(t, 'claims-bot');
  // Inside the package, so that `tally-agent` and the pinned frameworks resolve.
  const dir = fs.mkdtempSync(path.join(pkg, '.readme-'));
  t.after(() => fs.rmSync(dir, { recursive: true, force: true }));
  const examples = [
    ...blocks('## The API', '## Adapters').map((code) => ['cjs', code]),
    ...blocks('### Vercel AI SDK', '### OpenAI').map((code) => ['mjs', code]),
  ];
  assert.ok(examples.length >= 9, `${examples.length} examples`);
  for (const [i, [ext, code]] of examples.entries()) {
    const file = path.join(dir, `example-${i}.${ext}`);
    fs.writeFileSync(file, code);
    const r = spawnSync(process.execPath, [file], { cwd: dir, env: { ...process.env, TALLY_STATE_DIR: state }, encoding: 'utf8', timeout: 60_000 });
    assert.equal(r.status, 0, `example ${i}:\n${code}\n${r.stdout}${r.stderr}`);
    assert.doesNotMatch(r.stderr, /Error/, `example ${i}:\n${code}\n${r.stderr}`);
  }
});
