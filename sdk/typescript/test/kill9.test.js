'use strict';
// kill -9 of a Node process mid-call keeps the decision: it is durable in
// the chain before the wrapped function runs (docs/protocol.md §5).
const test = require('node:test');
const assert = require('node:assert/strict');
const { spawn } = require('node:child_process');
const path = require('node:path');
const { makeAgent, chain } = require('./helpers');

const script = `
const { Agent } = require(${JSON.stringify(path.resolve(__dirname, '..'))});
const agent = new Agent('kill-bot', { stateDir: process.env.STATE });
const transfer = agent.wrapTool('transfer', async ({ amount }) => {
  process.stdout.write('running\\n');
  await new Promise(() => setInterval(() => {}, 1000));
});
agent.call('before', { n: 1 }).then((h) => { h.outcome('done'); return transfer({ amount: 99 }); });
`;

test('kill -9 mid-call keeps the decision', async (t) => {
  const { state } = makeAgent(t, 'kill-bot');
  const child = spawn(process.execPath, ['-e', script], { env: { ...process.env, STATE: state }, stdio: ['ignore', 'pipe', 'inherit'] });
  await new Promise((resolve, reject) => {
    child.stdout.on('data', (d) => d.toString().includes('running') && resolve());
    child.on('exit', (code) => reject(new Error(`the child exited ${code} before the call ran`)));
  });
  child.kill('SIGKILL');
  await new Promise((resolve) => child.on('exit', resolve));
  const records = chain(state, 'kill-bot');
  assert.deepEqual(
    records.map((r) => [r.kind, r.body.tool ?? r.body.status]),
    [
      ['decision', 'before'],
      ['outcome', 'ok'],
      ['decision', 'transfer'],
    ],
  );
});
