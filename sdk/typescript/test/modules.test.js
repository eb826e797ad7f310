'use strict';
// The package loads from ESM and CommonJS, under its own name, with the
// same classes; a script that uses an agent and never closes it exits by
// itself, its queued outcome recorded at exit.
const test = require('node:test');
const assert = require('node:assert/strict');
const { spawnSync } = require('node:child_process');
const path = require('node:path');
const { makeAgent, chain } = require('./helpers');

const pkg = path.resolve(__dirname, '..');

function run(args, state, cwd = pkg) {
  const r = spawnSync(process.execPath, args, { cwd, env: { ...process.env, TALLY_STATE_DIR: state }, encoding: 'utf8', timeout: 30_000 });
  assert.equal(r.error, undefined, 'the script did not exit by itself');
  assert.equal(r.status, 0, r.stderr);
  return r.stdout;
}

test('ESM and CommonJS both load, and node -e scripts exit by themselves', (t) => {
  const { state } = makeAgent(t, 'mod-bot');
  const esm = run(
    ['--input-type=module', '-e', `
      import { Agent, TallyError, NotRecorded } from 'tally-agent';
      import tally from 'tally-agent';
      const a = new Agent('mod-bot');
      const add = a.wrapTool('add', (x, y) => x + y);
      console.log(add(1, 2), tally.Agent === Agent, NotRecorded.prototype instanceof TallyError);
    `],
    state,
  );
  assert.equal(esm.trim(), '3 true true');
  const cjs = run(['-e', `
      const { Agent } = require('tally-agent');
      const a = new Agent('mod-bot');
      a.wrapTool('sub', async (x, y) => x - y)(5, 2).then((v) => console.log(v, a.source));
    `], state);
  assert.equal(cjs.trim(), '3 sdk-node');
  assert.deepEqual(
    chain(state, 'mod-bot').map((r) => [r.kind, r.body.tool ?? r.body.status]),
    [
      ['decision', 'add'],
      ['outcome', 'ok'],
      ['decision', 'sub'],
      ['outcome', 'ok'],
    ],
  );
});

test('without stateDir or TALLY_STATE_DIR, ./.tally is the state folder', (t) => {
  const { state } = makeAgent(t, 'cwd-bot');
  const r = spawnSync(process.execPath, ['-e', `
    try { new (require(${JSON.stringify(pkg)}).Agent)('cwd-bot'); } catch (e) { console.log(e.code, e.message); }
  `], { cwd: path.dirname(state), env: { ...process.env, TALLY_STATE_DIR: '' }, encoding: 'utf8' });
  assert.match(r.stdout, /^agent_not_found .*\.tally.*TALLY_STATE_DIR is not set/);
});
