'use strict';
// Wrapped functions against the real `tally serve`: 1,000 calls with many
// in flight, some throwing; the exported pack passes `tally verify`'s
// twelve checks with the outcomes and the coverage line the calls made.
const test = require('node:test');
const assert = require('node:assert/strict');
const { Agent } = require('..');
const { startWitness, makeAgent, chain, exportAndVerify } = require('./helpers');

const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

test('1,000 wrapped calls in flight at once, some throwing, verify with the right outcomes and coverage', async (t) => {
  const witness = await startWitness(t);
  const { state, vkey } = makeAgent(t, 'claims-bot', witness);
  const agent = new Agent('claims-bot', { stateDir: state, source: 'claims' });
  t.after(() => agent.close());

  class LookupFailed extends Error {}
  const tools = agent.wrapTools({
    lookup: async ({ id }) => {
      await sleep(id % 5);
      if (id % 7 === 0) throw new LookupFailed(`no claim ${id}`);
      return { id, amount: id * 10 };
    },
    add: (a, b) => a + b,
  });
  // One tool the program has but does not wrap: coverage names it.
  await agent.declareTools([{ name: 'lookup', description: 'find a claim' }, 'add', 'refund']);

  const results = await Promise.allSettled(Array.from({ length: 1000 }, (_, id) => tools.lookup({ id })));
  const thrown = results.filter((r) => r.status === 'rejected');
  assert.equal(thrown.length, Math.ceil(1000 / 7));
  // Errors are rethrown unchanged.
  for (const r of thrown) assert.ok(r.reason instanceof LookupFailed);
  assert.deepEqual(results[3], { status: 'fulfilled', value: { id: 3, amount: 30 } });
  assert.equal(tools.add(2, 3), 5);
  await agent.note('batch done');

  const synced = await agent.sync({ timeout: 120_000 });
  assert.equal(synced.complete, true, synced.error);
  assert.equal(synced.pending, 0);
  assert.equal(synced.records, 2 * 1001 + 2);
  await agent.close();

  const records = chain(state, 'claims-bot');
  const decisions = records.filter((r) => r.kind === 'decision');
  const outcomes = records.filter((r) => r.kind === 'outcome');
  assert.equal(decisions.length, 1001);
  assert.equal(outcomes.length, 1001);
  const byStatus = {};
  for (const o of outcomes) byStatus[o.body.status] = (byStatus[o.body.status] || 0) + 1;
  assert.deepEqual(byStatus, { ok: 1001 - thrown.length, error: thrown.length });
  // Every outcome follows its own decision.
  const seqOf = new Map(decisions.map((d) => [d.body.call_id, d.seq]));
  for (const o of outcomes) assert.ok(o.seq > seqOf.get(o.body.call_id));

  const verified = exportAndVerify(t, 'claims-bot', witness, vkey, state);
  const out = verified.stdout + verified.stderr;
  assert.equal(verified.status, 0, out);
  assert.match(out, /PASS: 12 checks, 12 pass, 0 pending, 0 not checked; 2004 records from 1 agent/, out);
  assert.match(out, /outcomes: pass: 1001 decisions each have exactly one outcome/, out);
  assert.match(out, /coverage: claims-bot: 1 declared tool is not recorded: refund/, out);
  assert.match(out, /coverage: claims-bot: tool source claims: 3 tools, declared at seq 0/, out);
});
