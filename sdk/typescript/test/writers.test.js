'use strict';
// The SDK is one more writer of the agent's chain (docs/architecture.md
// "Several writers, one chain"): beside `tally record` and another Node
// process, its records land in the one chain; and when the chain cannot
// be written, a wrapped function does not run (fail closed).
const test = require('node:test');
const assert = require('node:assert/strict');
const { spawn, spawnSync } = require('node:child_process');
const fs = require('node:fs');
const path = require('node:path');
const { Agent } = require('..');
const { makeAgent, chain, tally } = require('./helpers');

const pkg = JSON.stringify(path.resolve(__dirname, '..'));

test('a Node agent, a second Node process and tally record write one chain', async (t) => {
  const { state } = makeAgent(t, 'shared-bot');
  const agent = new Agent('shared-bot', { stateDir: state, source: 'first' });
  const lookup = agent.wrapTool('lookup', (id) => id);
  lookup(1);
  // This process owns the chain; the others hand it their records.
  const second = spawn(
    process.execPath,
    ['-e', `
      const { Agent } = require(${pkg});
      const a = new Agent('shared-bot', { source: 'second' });
      const f = a.wrapTool('fetch', async (u) => u.length);
      Promise.all([f('a'), f('bb'), a.note('from the second process')]).then(() => a.close());
    `],
    { env: { ...process.env, TALLY_STATE_DIR: state }, stdio: ['ignore', 'inherit', 'inherit'] },
  );
  tally(['record', 'note', '--agent', 'shared-bot', '--no-sync', 'from tally record'], { state });
  const code = await new Promise((resolve) => second.on('exit', resolve));
  assert.equal(code, 0);
  lookup(2);
  const status = await agent.status();
  assert.equal(status.owner_pid, process.pid);
  await agent.close();

  const records = chain(state, 'shared-bot');
  records.forEach((r, i) => assert.equal(r.seq, i));
  const count = (pred) => records.filter(pred).length;
  assert.equal(count((r) => r.kind === 'decision' && r.body.tool === 'lookup'), 2);
  assert.equal(count((r) => r.kind === 'decision' && r.body.tool === 'fetch'), 2);
  assert.equal(count((r) => r.kind === 'outcome' && r.body.status === 'ok'), 4);
  assert.deepEqual(
    records.filter((r) => r.kind === 'note').map((r) => r.body.text).sort(),
    ['from tally record', 'from the second process'],
  );
});

test('fail closed: with the chain store read-only, the function does not run and NotRecorded is thrown', (t) => {
  const { state } = makeAgent(t, 'ro-bot');
  tally(['record', 'note', '--agent', 'ro-bot', '--no-sync', 'before the store became read-only'], { state });
  const dir = path.join(state, 'agents', 'ro-bot');
  const store = path.join(dir, 'chain.redb');
  const before = fs.readFileSync(store);
  fs.chmodSync(store, 0o444);
  fs.chmodSync(dir, 0o555);
  const script = `
    const { Agent } = require(${pkg});
    let ran = false, out = {};
    try {
      const a = new Agent('ro-bot');
      try { a.wrapTool('pay', () => { ran = true; })({ amount: 5 }); out = { stage: 'call' }; }
      catch (e) { out = { stage: 'call', name: e.name, code: e.code, message: e.message }; }
    } catch (e) { out = { stage: 'open', name: e.name, code: e.code, message: e.message }; }
    console.log(JSON.stringify({ ...out, ran }));
  `;
  // As root, drop the capabilities that would let it write anyway, so the
  // file modes bind as they do for any other user.
  const cmd = process.getuid && process.getuid() === 0
    ? ['setpriv', ['--bounding-set', '-dac_override,-dac_read_search,-fowner', '--', process.execPath, '-e', script]]
    : [process.execPath, ['-e', script]];
  let r;
  try {
    r = spawnSync(cmd[0], cmd[1], { env: { ...process.env, TALLY_STATE_DIR: state }, encoding: 'utf8', timeout: 60_000 });
  } finally {
    fs.chmodSync(dir, 0o755);
    fs.chmodSync(store, 0o644);
  }
  assert.equal(r.status, 0, r.stderr);
  const out = JSON.parse(r.stdout.trim().split('\n').pop());
  assert.equal(out.ran, false, r.stdout);
  assert.equal(out.code, 'not_recorded', r.stdout);
  assert.equal(out.name, 'NotRecorded');
  assert.ok(fs.readFileSync(store).equals(before), 'the store is unchanged');
});
