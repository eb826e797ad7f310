// Browser tests of the tally console (issue 7) against the real binary:
// Debian's chromium, headless, driven by playwright-core. Starts
// `tally serve` on a temporary data folder and a free loopback port, posts
// records with the CLI (`tally agent init/add`, `tally record ...`), then
// loads every page, checks what it shows against those records, uploads a
// pack on the verify page, and opens an auditor link before and after it is
// revoked. Screenshots go to target/console-screenshots/.
//
// Run with tests/e2e/console/run.sh (it builds the binary and sets TALLY_BIN).

import { test, before, after } from "node:test";
import assert from "node:assert/strict";
import { spawn, spawnSync } from "node:child_process";
import { mkdtempSync, mkdirSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join, resolve } from "node:path";
import { chromium } from "playwright-core";

const root = resolve(import.meta.dirname, "../../..");
const bin = process.env.TALLY_BIN || join(root, "target/debug/tally");
const chromiumPath = process.env.CHROMIUM || "/usr/bin/chromium";
const shots = join(root, "target/console-screenshots");
const work = mkdtempSync(join(tmpdir(), "tally-console-e2e-"));
const state = join(work, "state");

const HOSTILE_TOOL = "<script>alert(1)</script>";
const HOSTILE_NOTE = "<img src=x onerror=alert(2)> & \"quoted\"";

let server;
let url;
let apiKey;
let vkey;
let operator; // persistent context (the operator's browser)
let auditor; // another browser, another profile (the auditor's)
let page;
let dialogs = [];
let auditorUrl;

function flags(profile) {
  return [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    `--user-data-dir=${profile}`,
  ];
}

async function browser(name) {
  const profile = join(work, `profile-${name}`);
  mkdirSync(profile, { recursive: true });
  // playwright-core takes the profile folder as its own argument and passes
  // --user-data-dir itself; the other flags go as they are.
  const ctx = await chromium.launchPersistentContext(profile, {
    executablePath: chromiumPath,
    headless: true,
    args: flags(profile).filter((f) => !f.startsWith("--user-data-dir")),
    acceptDownloads: true,
    viewport: { width: 1280, height: 900 },
  });
  return ctx;
}

function tally(args, { ok = true } = {}) {
  const r = spawnSync(bin, args, {
    env: { ...process.env, TALLY_STATE_DIR: state, TALLY_WITNESS_URL: url, TALLY_API_KEY: apiKey },
    encoding: "utf8",
    timeout: 60_000,
  });
  if (ok && r.status !== 0) {
    throw new Error(`tally ${args.join(" ")} exited ${r.status}: ${r.stderr}${r.stdout}`);
  }
  return r;
}

async function startServer() {
  const data = join(work, "data");
  server = spawn(bin, ["serve", "--data-dir", data, "--listen", "127.0.0.1:0"], {
    stdio: ["ignore", "pipe", "pipe"],
  });
  let out = "";
  let err = "";
  server.stderr.on("data", (d) => (err += d));
  await new Promise((resolveStart, reject) => {
    const timer = setTimeout(() => reject(new Error(`tally serve did not start: ${out}${err}`)), 30_000);
    server.stdout.on("data", (d) => {
      out += d;
      const m = out.match(/listening on (http:\/\/127\.0\.0\.1:\d+)/);
      if (m) {
        clearTimeout(timer);
        url = m[1];
        resolveStart();
      }
    });
    server.on("exit", (code) => reject(new Error(`tally serve exited ${code}: ${out}${err}`)));
  });
  apiKey = out.match(/API key\s+(tally_\S+)/)[1];
  vkey = out.match(/witness key\s+(\S+)/)[1];
}

function initAgent(name) {
  const r = tally(["agent", "init", name, "--witness", url, "--api-key", apiKey]);
  const pk = r.stdout.match(/public key:\s+(\S+)/)[1];
  tally(["agent", "add", name, "--public-key", pk]);
}

before(async () => {
  rmSync(shots, { recursive: true, force: true });
  mkdirSync(shots, { recursive: true });
  await startServer();
  initAgent("claims-bot");
  initAgent("other-bot");
  // claims-bot: an answered call that errored (hostile tool name), an ok
  // call, an open call, a hostile note.
  tally(["record", "decision", "--agent", "claims-bot", "--tool", HOSTILE_TOOL, "--call-id", "c1", "--wait-receipt"]);
  tally(["record", "outcome", "--agent", "claims-bot", "--call-id", "c1", "--status", "error", "--wait-receipt"]);
  tally(["record", "decision", "--agent", "claims-bot", "--tool", "lookup", "--call-id", "c2", "--wait-receipt"]);
  tally(["record", "outcome", "--agent", "claims-bot", "--call-id", "c2", "--status", "ok", "--wait-receipt"]);
  tally(["record", "decision", "--agent", "claims-bot", "--tool", "refund", "--call-id", "c3", "--wait-receipt"]);
  tally(["record", "note", "--agent", "claims-bot", HOSTILE_NOTE, "--wait-receipt"]);
  tally(["record", "note", "--agent", "other-bot", "not for the auditor", "--wait-receipt"]);
  tally(["keys", "export", "-o", join(work, "agent-keys.json")]);
  tally(["export", "--agent", "claims-bot", "-o", join(work, "pack.jsonl")]);
  operator = await browser("operator");
  page = operator.pages()[0] || (await operator.newPage());
  page.on("dialog", async (d) => {
    dialogs.push(d.message());
    await d.accept();
  });
});

after(async () => {
  await operator?.close();
  await auditor?.close();
  if (server && server.exitCode === null) {
    server.kill("SIGTERM");
    await new Promise((r) => server.once("exit", r));
  }
  rmSync(work, { recursive: true, force: true });
});

/** `tally verify` on a file: exit code and stdout. */
function verifyCli(pack) {
  const r = tally(["verify", pack, "--agent-keys", join(work, "agent-keys.json"), "--witness-key", vkey], { ok: false });
  return { status: r.status, stdout: r.stdout, stderr: r.stderr };
}

/** No script from a record ran: the only dialogs are our revoke confirmations. */
function noInjectedDialogs() {
  assert.deepEqual(dialogs.filter((m) => !m.startsWith("Revoke this auditor link")), []);
}

test("operator pages need a login", async () => {
  const resp = await page.goto(`${url}/console`);
  assert.equal(new URL(page.url()).pathname, "/console/login");
  assert.equal(resp.status(), 200);
  const csp = resp.headers()["content-security-policy"];
  assert.match(csp, /default-src 'none'/);
  assert.doesNotMatch(csp, /unsafe/);
  await page.fill("#api_key", "tally_0000000000000000_000000000000000000000000000000000000000000000000");
  await page.click("button[type=submit]");
  assert.match(await page.textContent("p.error"), /unknown or revoked/);
  await page.screenshot({ path: join(shots, "00-login.png"), fullPage: true });
});

test("overview shows agents, records per hour, checkpoint and log size", async () => {
  await page.goto(`${url}/console/login`);
  await page.fill("#api_key", apiKey);
  await page.click("button[type=submit]");
  await page.waitForURL(`${url}/console`);
  const checkpoint = await (await fetch(`${url}/checkpoint`)).text();
  const size = checkpoint.split("\n")[1];
  assert.equal(await page.textContent("#log-size"), size);
  assert.equal(size, "7");
  assert.equal(await page.textContent("#agent-count"), "2");
  assert.equal(await page.textContent("#records-24h"), "7");
  const rows = await page.$$eval("#agents tbody tr", (trs) => trs.map((tr) => [...tr.cells].map((c) => c.textContent.trim())));
  assert.deepEqual(rows.map((r) => [r[0], r[1]]), [["claims-bot", "6"], ["other-bot", "1"]]);
  const bars = await page.$$eval("svg.chart rect.bar", (rs) => rs.map((r) => Number(r.dataset.count)));
  assert.equal(bars.length, 24);
  assert.equal(bars.reduce((a, b) => a + b, 0), 7);
  assert.equal((await page.textContent("#checkpoint-note")).trim(), checkpoint.trim());
  // The cookie is HttpOnly and SameSite=Strict.
  const [cookie] = await operator.cookies();
  assert.equal(cookie.name, "tally_console");
  assert.equal(cookie.httpOnly, true);
  assert.equal(cookie.sameSite, "Strict");
  await page.screenshot({ path: join(shots, "01-overview.png"), fullPage: true });
});

test("agent page: head, keys, calls with open decisions and errors standing out, hostile text as text", async () => {
  await page.click("#agents a:text('claims-bot')");
  await page.waitForURL(`${url}/console/agents/claims-bot`);
  assert.equal(await page.textContent("#record-count"), "6");
  assert.equal(await page.textContent("#call-count"), "3");
  assert.equal(await page.textContent("#open-count"), "1");
  assert.equal(await page.textContent("#error-count"), "1");
  assert.match(await page.textContent("#chain-head"), /seq\s*5/);
  assert.match(await page.textContent("#keys tbody"), /active/);
  // Open decisions and errors stand out.
  assert.equal(await page.textContent("#calls tr.open td.tool"), "refund");
  assert.equal(await page.textContent("#calls tr.error td.tool"), HOSTILE_TOOL);
  assert.equal(await page.locator("#calls tr.ok").count(), 1);
  // Hostile text is text: no element was made from it, no script ran.
  assert.equal(await page.textContent("#notes td.note-text"), HOSTILE_NOTE);
  assert.equal(await page.locator("main script, main img, #notes img").count(), 0);
  assert.equal(await page.locator("script").count(), 1);
  noInjectedDialogs();
});

test("agent page coverage equals tally verify's", async () => {
  await page.goto(`${url}/console/agents/claims-bot`);
  const cli = verifyCli(join(work, "pack.jsonl"));
  const cliCoverage = cli.stdout.split("\n").filter((l) => l.startsWith("coverage: "));
  const shown = await page.$$eval("ul.coverage li", (lis) => lis.map((li) => li.textContent));
  assert.deepEqual(shown, cliCoverage);
  assert.ok(shown.length > 0);
  const checks = await page.$$eval("table.checks tbody tr", (trs) => trs.map((tr) => tr.dataset.check));
  assert.equal(checks.length, 12);
  // Search and filter.
  await page.fill("input[name=q]", "refund");
  await page.click("form.filters button");
  await page.waitForURL(/q=refund/);
  assert.match(await page.textContent("form.filters .small"), /1 of 3 calls/);
  await page.goto(`${url}/console/agents/claims-bot`);
  await page.screenshot({ path: join(shots, "02-agent.png"), fullPage: true });
});

test("record page: record, entry, proof, checkpoint, and a one-record pack that verifies", async () => {
  await page.goto(`${url}/console/agents/claims-bot`);
  // The decision of the errored call: its "decided" link.
  await page.click("#calls tr.error td:nth-child(4) a");
  await page.waitForURL(/\/console\/records\/\d+$/);
  assert.equal(await page.textContent("#record-kind"), "decision");
  const record = JSON.parse(await page.textContent("#record-json"));
  assert.equal(record.body.tool, HOSTILE_TOOL);
  assert.equal(record.agent, "claims-bot");
  const entry = JSON.parse(await page.textContent("#entry-json"));
  assert.deepEqual(entry.record, record);
  const checkpoint = await (await fetch(`${url}/checkpoint`)).text();
  assert.equal((await page.textContent("#record-checkpoint")).trim(), checkpoint.trim());
  const proof = await page.$$eval("#inclusion li", (lis) => lis.map((li) => li.textContent));
  const index = Number(await page.textContent("#record-index"));
  const api = await (await fetch(`${url}/v1/proof/inclusion?index=${index}&size=${checkpoint.split("\n")[1]}`)).json();
  assert.deepEqual(proof, api.inclusion);
  assert.ok(proof.length > 0);
  noInjectedDialogs();
  await page.screenshot({ path: join(shots, "03-record.png"), fullPage: true });
  const [download] = await Promise.all([page.waitForEvent("download"), page.click("#download-record-pack")]);
  const file = join(work, "record.pack.jsonl");
  await download.saveAs(file);
  const cli = verifyCli(file);
  assert.equal(cli.status, 0, cli.stdout + cli.stderr);
  assert.match(cli.stdout, /^PASS: 12 checks, .*; 2 records from 1 agent$/m);
});

test("verify page prints exactly what tally verify prints, and stores nothing", async () => {
  await page.goto(`${url}/console/verify`);
  assert.equal(await page.inputValue("#witness_key"), vkey);
  await page.setInputFiles("#agent_keys", join(work, "agent-keys.json"));
  await page.setInputFiles("#pack", join(work, "pack.jsonl"));
  await Promise.all([page.waitForURL(`${url}/console/verify`), page.click("#verify-form button[type=submit]")]);
  const cli = verifyCli(join(work, "pack.jsonl"));
  assert.equal(cli.status, 0, cli.stdout);
  const text = await page.textContent("pre.report-text");
  assert.equal(text, cli.stdout);
  assert.equal(await page.textContent("p.result"), cli.stdout.trim().split("\n").at(-1));
  await page.screenshot({ path: join(shots, "04-verify.png"), fullPage: true });
  // A tampered pack fails, naming the check.
  const tampered = readFileSync(join(work, "pack.jsonl"), "utf8").replace('"lookup"', '"lookuq"');
  writeFileSync(join(work, "tampered.jsonl"), tampered);
  await page.setInputFiles("#agent_keys", join(work, "agent-keys.json"));
  await page.setInputFiles("#pack", join(work, "tampered.jsonl"));
  await Promise.all([page.waitForURL(`${url}/console/verify`), page.click("#verify-form button[type=submit]")]);
  assert.match(await page.textContent("p.result"), /^FAIL: .*record_signatures/);
  assert.equal(await page.textContent("pre.report-text"), verifyCli(join(work, "tampered.jsonl")).stdout);
  await page.screenshot({ path: join(shots, "05-verify-fail.png"), fullPage: true });
});

test("auditor link: read-only, scoped, and refused at once after revocation", async () => {
  await page.goto(`${url}/console/links`);
  await page.check("input[name=agent][value=claims-bot]");
  await page.fill("#label", "<b>external audit</b>");
  await Promise.all([page.waitForURL(`${url}/console/links`), page.click("#link-form button[type=submit]")]);
  const href = await page.getAttribute("#new-link-url", "href");
  assert.match(href, /^\/console\/a\/[0-9a-f]{16}_[0-9a-f]{64}$/);
  assert.equal(await page.textContent("#links tbody tr td:first-child"), "<b>external audit</b>");
  await page.screenshot({ path: join(shots, "06-links.png"), fullPage: true });
  auditorUrl = `${url}${href}`;

  auditor = await browser("auditor");
  const ap = auditor.pages()[0] || (await auditor.newPage());
  ap.on("dialog", async (d) => {
    dialogs.push(d.message());
    await d.dismiss();
  });
  let resp = await ap.goto(auditorUrl);
  assert.equal(resp.status(), 200);
  assert.match(await ap.textContent("header"), /read-only auditor view/);
  const agents = await ap.$$eval("#agents tbody td:first-child", (tds) => tds.map((t) => t.textContent));
  assert.deepEqual(agents, ["claims-bot"]);
  assert.equal(await ap.locator("text=Auditor links").count(), 0);
  await ap.screenshot({ path: join(shots, "07-auditor.png"), fullPage: true });
  await ap.click("#agents a:text('claims-bot')");
  await ap.waitForURL(`${auditorUrl}/agents/claims-bot`);
  assert.equal(await ap.textContent("#call-count"), "3");
  assert.equal(await ap.textContent("#calls tr.error td.tool"), HOSTILE_TOOL);
  await ap.screenshot({ path: join(shots, "08-auditor-agent.png"), fullPage: true });
  resp = await ap.goto(`${auditorUrl}/agents/other-bot`);
  assert.equal(resp.status(), 404);
  // The pack the link offers verifies.
  await ap.goto(auditorUrl);
  const [download] = await Promise.all([ap.waitForEvent("download"), ap.click("a:text('Download the pack')")]);
  const file = join(work, "auditor.pack.jsonl");
  await download.saveAs(file);
  const cli = verifyCli(file);
  assert.equal(cli.status, 0, cli.stdout + cli.stderr);
  assert.match(cli.stdout, /6 records from 1 agent/);
  // The auditor is not logged in to operator pages.
  await ap.goto(`${url}/console`);
  assert.equal(new URL(ap.url()).pathname, "/console/login");

  // Revoke in the operator's browser (the page asks first).
  await page.goto(`${url}/console/links`);
  await Promise.all([page.waitForURL(`${url}/console/links`), page.click("#links form.revoke button")]);
  assert.ok(dialogs.some((m) => m.startsWith("Revoke this auditor link")));
  assert.equal(await page.textContent("#links tbody tr td:nth-child(5)"), "revoked");
  resp = await ap.goto(auditorUrl);
  assert.equal(resp.status(), 404);
  assert.match(await ap.textContent("p.error"), /unknown, expired or revoked/);
  await ap.screenshot({ path: join(shots, "09-auditor-revoked.png"), fullPage: true });
  for (const path of ["/agents/claims-bot", "/pack", "/agent-keys.json"]) {
    const r = await fetch(`${auditorUrl}${path}`);
    assert.equal(r.status, 404, path);
  }
  noInjectedDialogs();
});
