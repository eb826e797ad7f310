'use strict';
// The TypeScript SDK's figures for docs/benchmarks.md "TypeScript SDK":
// the time a wrapped call adds to the bare function (p50, p99), for a sync
// function and an async one (both decideSync on the calling thread), and
// recorded calls per second from one process.
// Needs the release addon (`node build.js` in sdk/typescript) and a tally
// binary for `tally agent init` (TALLY_BIN, else target/release/tally, else
// target/debug/tally). Run: node sdk/typescript/bench/bench.js [calls]
const { spawnSync } = require('node:child_process');
const fs = require('node:fs');
const os = require('node:os');
const path = require('node:path');
const { Agent } = require('..');

const root = path.resolve(__dirname, '..', '..', '..');
const TALLY =
  process.env.TALLY_BIN ||
  [path.join(root, 'target', 'release', 'tally'), path.join(root, 'target', 'debug', 'tally')].find((p) => fs.existsSync(p));
const N = Number(process.argv[2] || 20_000);
const WARMUP = 2_000;

function quantile(sorted, q) {
  return sorted[Math.min(sorted.length - 1, Math.floor(q * sorted.length))];
}

function timesSync(fn, n) {
  const out = new Float64Array(n);
  for (let i = 0; i < n; i++) {
    const t0 = process.hrtime.bigint();
    fn({ a: i, note: 'claim lookup' });
    out[i] = Number(process.hrtime.bigint() - t0) / 1000;
  }
  return out.sort();
}

async function timesAsync(fn, n) {
  const out = new Float64Array(n);
  for (let i = 0; i < n; i++) {
    const t0 = process.hrtime.bigint();
    await fn({ a: i, note: 'claim lookup' });
    out[i] = Number(process.hrtime.bigint() - t0) / 1000;
  }
  return out.sort();
}

async function main() {
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'tally-node-bench-'));
  const state = path.join(dir, 'state');
  const init = spawnSync(TALLY, ['agent', 'init', 'bench-bot'], { env: { ...process.env, TALLY_STATE_DIR: state }, encoding: 'utf8' });
  if (init.status !== 0) throw new Error(init.stderr);
  const agent = new Agent('bench-bot', { stateDir: state, source: 'bench' });

  const bareSync = (x) => x.a + 1;
  const bareAsync = async (x) => x.a + 1;
  const wrappedSync = agent.wrapTool('lookup', bareSync);
  const wrappedAsync = agent.wrapTool('lookup_async', bareAsync);
  timesSync(wrappedSync, WARMUP);
  await timesAsync(wrappedAsync, WARMUP);

  const rows = [];
  const us = (v) => v.toFixed(1);
  for (const [label, bare, wrapped] of [
    ['sync function (decision on the calling thread)', timesSync(bareSync, N), timesSync(wrappedSync, N)],
    ['async function (decision on the calling thread)', await timesAsync(bareAsync, N), await timesAsync(wrappedAsync, N)],
  ]) {
    rows.push(
      `| ${label} | ${us(quantile(bare, 0.5))} | ${us(quantile(wrapped, 0.5))} | ${us(quantile(wrapped, 0.5) - quantile(bare, 0.5))} | ${us(quantile(wrapped, 0.99) - quantile(bare, 0.99))} |`,
    );
  }

  // Throughput from one process: sync calls back to back; async calls
  // with 256 in flight.
  let t0 = process.hrtime.bigint();
  for (let i = 0; i < N; i++) wrappedSync({ a: i });
  const syncRate = N / (Number(process.hrtime.bigint() - t0) / 1e9);
  t0 = process.hrtime.bigint();
  let next = 0;
  await Promise.all(
    Array.from({ length: 256 }, async () => {
      while (next < N) await wrappedAsync({ a: next++ });
    }),
  );
  const asyncRate = N / (Number(process.hrtime.bigint() - t0) / 1e9);
  const status = await agent.status();
  await agent.close();
  fs.rmSync(dir, { recursive: true, force: true });

  console.log(`${N} calls per row after ${WARMUP} warm-up calls; µs per call\n`);
  console.log('| call | bare p50 | wrapped p50 | added p50 | added p99 |');
  console.log('|---|---|---|---|---|');
  for (const r of rows) console.log(r);
  console.log('\n| recorded calls per second, one process | calls/s |');
  console.log('|---|---|');
  console.log(`| sync wrapped function, back to back | ${Math.round(syncRate)} |`);
  console.log(`| async wrapped function, 256 in flight | ${Math.round(asyncRate)} |`);
  console.log(`\nrecords in the chain: ${status.store.records}`);
}

main().catch((e) => {
  console.error(e);
  process.exit(1);
});
