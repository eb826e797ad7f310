'use strict';
// What the tests share: the real `tally` binary (TALLY_BIN, else the
// workspace's debug build), a `tally serve` witness on a free loopback
// port with a project, and agents set up with the CLI as a user would
// (docs/operations.md; tests/e2e/gateway/test_gateway_http.py does the same).
const { spawn, spawnSync } = require('node:child_process');
const fs = require('node:fs');
const net = require('node:net');
const os = require('node:os');
const path = require('node:path');

const TALLY = process.env.TALLY_BIN || path.resolve(__dirname, '..', '..', '..', 'target', 'debug', 'tally');

function cleanEnv(extra = {}) {
  const env = { ...process.env, ...extra };
  delete env.TALLY_API_KEY;
  delete env.TALLY_WITNESS_URL;
  return env;
}

function tempDir(t) {
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'tally-node-'));
  t.after(() => fs.rmSync(dir, { recursive: true, force: true }));
  return dir;
}

/** Runs the CLI; throws with its output unless `check` is false. */
function tally(args, { state, check = true, timeout = 120_000 } = {}) {
  const env = cleanEnv(state ? { TALLY_STATE_DIR: state } : {});
  const r = spawnSync(TALLY, args, { env, encoding: 'utf8', timeout, maxBuffer: 1 << 28 });
  if (check && r.status !== 0) {
    throw new Error(`tally ${args.join(' ')} exited ${r.status}: ${(r.stdout + r.stderr).slice(0, 4000)}`);
  }
  return r;
}

function freePort() {
  return new Promise((resolve, reject) => {
    const s = net.createServer();
    s.unref();
    s.on('error', reject);
    s.listen(0, '127.0.0.1', () => {
      const { port } = s.address();
      s.close(() => resolve(port));
    });
  });
}

async function waitPort(port, ms = 60_000) {
  const until = Date.now() + ms;
  for (;;) {
    const ok = await new Promise((resolve) => {
      const c = net.connect(port, '127.0.0.1');
      c.on('connect', () => {
        c.destroy();
        resolve(true);
      });
      c.on('error', () => resolve(false));
    });
    if (ok) return;
    if (Date.now() > until) throw new Error(`nothing listens on 127.0.0.1:${port}`);
    await new Promise((r) => setTimeout(r, 50));
  }
}

/** `tally serve` with a project; stopped when the test ends. */
async function startWitness(t) {
  const dir = tempDir(t);
  const port = await freePort();
  const url = `http://127.0.0.1:${port}`;
  const data = path.join(dir, 'witness');
  const serve = spawn(TALLY, ['serve', '--listen', `127.0.0.1:${port}`, '--data-dir', data], {
    env: cleanEnv(),
    stdio: 'ignore',
  });
  t.after(
    () =>
      new Promise((resolve) => {
        if (serve.exitCode !== null) return resolve();
        serve.on('exit', resolve);
        serve.kill('SIGTERM');
      }),
  );
  await waitPort(port);
  const created = tally(['project', 'create', 'e2e', '--witness', url, '--data-dir', data]);
  const apiKey = created.stdout.split(/\s+/).find((w) => w.startsWith('tally_'));
  return { url, apiKey, dir };
}

/**
 * A new agent in a fresh state folder; with a witness, registered there
 * and its log key pinned (`vkey`). `register: false` leaves it unknown
 * to the witness, which then refuses its records.
 */
function makeAgent(t, name, witness, { register = true } = {}) {
  const state = path.join(tempDir(t), 'state');
  const init = tally(['agent', 'init', name], { state });
  if (!witness) return { state };
  const publicKey = init.stdout.split('public key:')[1].trim().split(/\s+/)[0];
  if (register) {
    tally(['agent', 'add', name, '--public-key', publicKey, '--witness', witness.url, '--api-key', witness.apiKey], { state });
  }
  const pinned = tally(['agent', 'init', name, '--witness', witness.url, '--api-key', witness.apiKey], { state });
  const vkey = pinned.stdout.trim().split('\n').pop().trim();
  return { state, vkey };
}

/**
 * The agent's local chain, as `tally status --json --records` shows it.
 * It lists records only when no writer holds the chain (docs/operations.md
 * "Several writers for one agent"): a writer just closed may still be
 * letting go of the store for a moment, so ask again for up to 10 s.
 */
function chain(state, name) {
  const until = Date.now() + 10_000;
  for (;;) {
    const out = tally(['status', '--json', '--records'], { state }).stdout;
    const agent = JSON.parse(out).agents.find((a) => a.agent === name);
    if (agent && agent.chain) return agent.chain.map((e) => e.record);
    if (Date.now() > until) throw new Error(`tally status lists no records for ${name}: ${out.slice(0, 2000)}`);
    spawnSync('sleep', ['0.05']);
  }
}

/** Exports the agent's pack, keys and head.json from the witness and runs `tally verify` (docs/operations.md). */
function exportAndVerify(t, name, witness, vkey, state) {
  const dir = tempDir(t);
  const pack = path.join(dir, 'pack.jsonl');
  const keys = path.join(dir, 'keys.json');
  const auth = ['--witness', witness.url, '--api-key', witness.apiKey];
  tally(['export', '--agent', name, '-o', pack, ...auth], { state });
  const head = path.join(dir, 'head.json');
  tally(['keys', 'export', '--agent', name, '-o', keys, ...auth], { state });
  tally(['head', '--pack', pack, '-o', head, ...auth], { state });
  return tally(['verify', pack, '--agent-keys', keys, '--witness-key', vkey, '--head', head], { check: false });
}

module.exports = { TALLY, tally, tempDir, startWitness, makeAgent, chain, exportAndVerify, cleanEnv };
