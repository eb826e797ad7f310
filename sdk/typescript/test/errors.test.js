'use strict';
// Bad input is a clear error with a stable code, and a call whose decision
// is not recorded (or, strict, not receipted) does not run.
const test = require('node:test');
const assert = require('node:assert/strict');
const tally = require('..');
const { Agent, TallyError, AgentNotFound, BadContent, Invalid, NoReceipt, Closed } = tally;
const { startWitness, makeAgent, chain } = require('./helpers');

test('a missing agent names where it looked', (t) => {
  const { state } = makeAgent(t, 'someone');
  assert.throws(
    () => new Agent('nobody', { stateDir: state }),
    (e) => e instanceof AgentNotFound && e instanceof TallyError && e.code === 'agent_not_found' && e.message.includes(state),
  );
  assert.throws(() => new Agent('bad\u0007name', { stateDir: state }), (e) => e instanceof Invalid && e.code === 'invalid');
  assert.throws(() => new Agent(42), (e) => e instanceof Invalid);
});

test('arguments JSON cannot hold (BigInt, a cycle) are refused before the function runs', async (t) => {
  const { state } = makeAgent(t, 'bad-input');
  const agent = new Agent('bad-input', { stateDir: state });
  let ran = 0;
  const tools = agent.wrapTools({
    sync: () => ran++,
    later: async () => ran++,
  });
  assert.throws(() => tools.sync({ n: 10n }), (e) => e instanceof BadContent && e.code === 'bad_content' && /BigInt/.test(e.message));
  const cycle = { a: 1 };
  cycle.self = cycle;
  await assert.rejects(tools.later(cycle), (e) => e instanceof BadContent && /circular/.test(e.message));
  // Duplicate keys cannot happen in JS; a bad tool name is refused by the core.
  const bad = agent.wrapTool('bad\u0001tool', () => ran++);
  assert.throws(() => bad({}), (e) => e instanceof Invalid && e.code === 'invalid');
  assert.equal(ran, 0);
  await assert.rejects(agent.note(7), Invalid);
  await assert.rejects(agent.sync({ timeout: -1 }), Invalid);
  // A result JSON cannot hold: the call still returns it; its outcome has no output hash.
  const big = agent.wrapTool('big', () => 2n ** 70n);
  const warned = new Promise((resolve) => process.once('warning', resolve));
  assert.equal(big(), 2n ** 70n);
  assert.match((await warned).message, /without an output hash/);
  // call(): one outcome per decision.
  const h = await agent.call('manual', { q: 1 });
  h.error(new TypeError('boom'));
  assert.throws(() => h.outcome(1), (e) => e instanceof Invalid && /already recorded/.test(e.message));
  await agent.close();
  // Closed: fail closed.
  assert.throws(() => tools.sync({}), (e) => e instanceof Closed && e.code === 'closed');
  await assert.rejects(tools.later({}), Closed);
  assert.equal(ran, 0);

  const records = chain(state, 'bad-input');
  assert.deepEqual(
    records.map((r) => [r.kind, r.body.tool ?? r.body.status]),
    [
      ['decision', 'big'],
      ['outcome', 'ok'],
      ['decision', 'manual'],
      ['outcome', 'error'],
    ],
  );
  assert.equal(records[1].body.output_hash, undefined);
});

test('strict: a witness that refuses the agent stops the call, which is recorded not_run', async (t) => {
  const witness = await startWitness(t);
  // Set up at the witness's URL but never added to its project: refused.
  const { state } = makeAgent(t, 'stranger', witness, { register: false });
  const agent = new Agent('stranger', { stateDir: state, strict: true, strictTimeoutMs: 3_000 });
  let ran = 0;
  const pay = agent.wrapTool('pay', () => ran++);
  await assert.rejects(pay({ amount: 5 }), (e) => {
    assert.ok(e instanceof NoReceipt, e);
    assert.equal(e.code, 'no_receipt');
    // The syncer keeps retrying a refusal; strict gives up at its timeout
    // and says what the witness answered.
    assert.match(e.message, /^no accepted witness receipt: none within 3000 ms \(last sync error: \[agent_not_allowed\] .*stranger is not registered/);
    return true;
  });
  assert.equal(ran, 0);
  await agent.close();
  const records = chain(state, 'stranger');
  assert.deepEqual(
    records.map((r) => [r.kind, r.body.tool ?? r.body.status]),
    [
      ['decision', 'pay'],
      ['outcome', 'not_run'],
    ],
  );
});

test('strict per agent or per tool: a call runs once its decision has an accepted receipt', async (t) => {
  const witness = await startWitness(t);
  const { state } = makeAgent(t, 'careful', witness);
  const agent = new Agent('careful', { stateDir: state });
  t.after(() => agent.close());
  const order = [];
  const pay = agent.wrapTool(
    'pay',
    async () => {
      const s = await agent.status();
      // The decision (seq 0) is receipted before the function runs.
      order.push(s.store.receipted);
      return 'paid';
    },
    { strict: true },
  );
  assert.equal(await pay({ amount: 5 }), 'paid');
  assert.ok(order[0] >= 1, `receipted before the call: ${order[0]}`);
  // Not strict: the call does not wait for the witness.
  const look = agent.wrapTool('look', (x) => x);
  assert.equal(look(3), 3);
  const h = await agent.call('manual', {}, { strict: true });
  h.outcome('done');
  const s = await agent.sync({ timeout: 30_000 });
  assert.deepEqual([s.complete, s.records, s.pending], [true, 6, 0]);
});

test('without a witness, strict says none is configured and the call does not run', async (t) => {
  const { state } = makeAgent(t, 'offline');
  const agent = new Agent('offline', { stateDir: state, strict: true });
  t.after(() => agent.close());
  let ran = 0;
  const f = agent.wrapTool('f', () => ran++);
  await assert.rejects(f(), (e) => e instanceof NoReceipt && /no witness is configured for agent offline/.test(e.message));
  assert.equal(ran, 0);
  const s = await agent.sync({ timeout: 100 });
  assert.equal(s.complete, false);
  assert.match(s.error, /^\[no_witness\]/);
});
