// Browser tests of the tally console (docs/console.md) against the real binary:
// Debian's chromium, headless, driven by playwright-core. Starts
// `tally serve` on a temporary data folder and a free loopback port, posts
// records with the CLI (`tally agent init/add`, `tally record ...`) and
// through the real `tally gateway` in front of the pinned
// @modelcontextprotocol/server-everything (spoken to in MCP JSON-RPC over
// the gateway's stdin and stdout), then loads every page, checks what it
// shows against those records and against `tally verify`, uploads packs on
// the verify pages, and opens auditor links: one for all records (before
// and after it is revoked), one limited to a time range, one that expires
// in an hour. Screenshots go to target/console-screenshots/.
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
// The agent whose calls go through the real gateway and MCP server.
const GATEWAY_AGENT = "mcp-bot";
const serverEverything =
  process.env.SERVER_EVERYTHING ||
  join(import.meta.dirname, "node_modules/@modelcontextprotocol/server-everything/dist/index.js");

let server;
let url;
let apiKey;
let vkey;
let operator; // persistent context (the operator's browser)
let auditor; // another browser, another profile (the auditor's)
let page;
let dialogs = [];
let auditorUrl;
let gatewayTools; // tool names the MCP server listed through the gateway
let gatewayResults; // the two tools/call results

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

/**
 * An MCP client session through `tally gateway --agent <agent> -- node
 * server-everything stdio`, in JSON-RPC over the gateway's stdin/stdout:
 * initialize, notifications/initialized, tools/list, tools/call echo and
 * get-sum; then stdin is closed and the gateway must exit 0.
 */
async function gatewaySession(agent, extra = []) {
  // echo is marked an action tool with no proof to read: its outcome is
  // "unknown" (docs/protocol.md §5.2), which the agent page states.
  const gw = spawn(bin, ["gateway", "--agent", agent, "--action", "echo", ...extra, "--", process.execPath, serverEverything, "stdio"], {
    env: { ...process.env, TALLY_STATE_DIR: state, TALLY_WITNESS_URL: url, TALLY_API_KEY: apiKey },
    stdio: ["pipe", "pipe", "pipe"],
  });
  let err = "";
  gw.stderr.on("data", (d) => (err += d));
  const exited = new Promise((r) => gw.once("exit", (code, signal) => r({ code, signal })));
  const waiting = new Map();
  let buf = "";
  gw.stdout.on("data", (d) => {
    buf += d;
    let i;
    while ((i = buf.indexOf("\n")) >= 0) {
      const line = buf.slice(0, i).trim();
      buf = buf.slice(i + 1);
      if (!line) continue;
      const msg = JSON.parse(line);
      // Answers to our requests; the server's notifications are ignored.
      if (msg.id !== undefined && !msg.method && waiting.has(msg.id)) {
        waiting.get(msg.id)(msg);
        waiting.delete(msg.id);
      }
    }
  });
  let id = 0;
  const send = (msg) => gw.stdin.write(JSON.stringify({ jsonrpc: "2.0", ...msg }) + "\n");
  const request = (method, params) =>
    new Promise((resolveAnswer, reject) => {
      const n = ++id;
      const timer = setTimeout(() => reject(new Error(`no answer to ${method} through the gateway: ${err}`)), 30_000);
      waiting.set(n, (msg) => {
        clearTimeout(timer);
        if (msg.error) reject(new Error(`${method}: ${JSON.stringify(msg.error)}`));
        else resolveAnswer(msg.result);
      });
      send({ id: n, method, params });
    });
  try {
    const init = await request("initialize", {
      protocolVersion: "2025-06-18",
      capabilities: {},
      clientInfo: { name: "tally-console-e2e", version: "1" },
    });
    assert.ok(init.serverInfo, "initialize answered");
    send({ method: "notifications/initialized" });
    const listed = await request("tools/list", {});
    const echo = await request("tools/call", { name: "echo", arguments: { message: "hello through tally" } });
    const sum = await request("tools/call", { name: "get-sum", arguments: { a: 2, b: 3 } });
    gw.stdin.end();
    const { code, signal } = await exited;
    assert.equal(code, 0, `gateway exited ${code} ${signal}: ${err}`);
    return { tools: listed.tools.map((t) => t.name), echo, sum };
  } catch (e) {
    gw.kill("SIGKILL");
    throw e;
  }
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
  // mcp-bot: a tool list and two answered calls, through the real gateway
  // and MCP server; then every record is synced.
  initAgent(GATEWAY_AGENT);
  const session = await gatewaySession(GATEWAY_AGENT);
  gatewayTools = session.tools;
  gatewayResults = [session.echo, session.sum];
  tally(["agent", "sync", GATEWAY_AGENT]);
  tally(["keys", "export", "-o", join(work, "agent-keys.json")]);
  tally(["export", "--agent", "claims-bot", "-o", join(work, "pack.jsonl")]);
  tally(["export", "--agent", GATEWAY_AGENT, "-o", join(work, "mcp.pack.jsonl")]);
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
  assert.equal(size, "12");
  assert.equal(await page.textContent("#agent-count"), "3");
  assert.equal(await page.textContent("#records-24h"), "12");
  const rows = await page.$$eval("#agents tbody tr", (trs) => trs.map((tr) => [...tr.cells].map((c) => c.textContent.trim())));
  assert.deepEqual(rows.map((r) => [r[0], r[1]]), [["claims-bot", "6"], [GATEWAY_AGENT, "5"], ["other-bot", "1"]]);
  const bars = await page.$$eval("svg.chart rect.bar", (rs) => rs.map((r) => Number(r.dataset.count)));
  assert.equal(bars.length, 24);
  assert.equal(bars.reduce((a, b) => a + b, 0), 12);
  assert.equal((await page.textContent("#checkpoint-note")).trim(), checkpoint.trim());
  // The session cookie, and the login form's anti-CSRF cookie, are HttpOnly
  // and SameSite=Strict.
  const cookies = await operator.cookies();
  const session = cookies.find((c) => c.name === "tally_console");
  assert.ok(session, "a session cookie");
  assert.equal(session.path, "/console");
  const login = cookies.find((c) => c.name === "tally_login");
  assert.ok(login, "the login form's cookie");
  assert.equal(login.path, "/console/login");
  for (const c of [session, login]) {
    assert.equal(c.httpOnly, true);
    assert.equal(c.sameSite, "Strict");
  }
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
  // Text from records is isolated, so right-to-left text or a bidirectional
  // control in it cannot reorder the rest of the row (protocol.md §11.2).
  const bidi = await page.$eval("#calls tr.error td.tool bdi.ext", (b) => getComputedStyle(b).unicodeBidi);
  assert.equal(bidi, "isolate");
  assert.equal(await page.locator("main script, main img, #notes img").count(), 0);
  assert.equal(await page.locator("script").count(), 1);
  noInjectedDialogs();
  // The open-decisions and errors cards stand out too (class "card warn",
  // "card bad"), not only the rows.
  assert.equal(await page.$eval("#open-count", (e) => e.parentElement.className), "card warn");
  assert.equal(await page.$eval("#error-count", (e) => e.parentElement.className), "card bad");
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

test("agent page's report: the same verdict and checks as tally report, downloaded and rendered in the browser", async () => {
  await page.goto(`${url}/console/agents/claims-bot`);
  const href = await page.getAttribute("#download-report", "href");
  const resp = await page.context().request.get(new URL(href, url).toString());
  assert.equal(resp.status(), 200);
  assert.match(resp.headers()["content-type"], /^text\/html/);
  const html = await resp.text();
  assert.ok(!html.includes("<script"), "no script in the report");
  const file = join(work, "console-report.html");
  writeFileSync(file, html);
  const cli = verifyCli(join(work, "pack.jsonl"));
  const report = await operator.newPage();
  const requests = [];
  report.on("request", (r) => requests.push(r.url()));
  await report.goto(`file://${file}`);
  // The verdict leads and is the CLI's; every check is named; nothing is fetched.
  assert.equal(await report.textContent("#verdict h1"), cli.status === 0 ? "PASS" : "FAIL");
  const text = await report.textContent("body");
  assert.ok(text.includes("claims-bot"), "the agent");
  for (const check of ["schema", "agent_keys", "record_signatures", "chain", "witness_signatures", "inclusion", "receipts", "timing", "outcomes", "head", "log_consistency"]) {
    assert.ok(text.includes(check), `${check} in the report`);
  }
  assert.ok(text.includes(HOSTILE_TOOL), "the hostile tool name as text");
  assert.deepEqual(requests.filter((u) => !u.startsWith("file://")), []);
  noInjectedDialogs();
  await report.screenshot({ path: join(shots, "02b-agent-report.png"), fullPage: false });
  await report.close();
  // JSON, for a period, from the period form's route.
  const json = await page.context().request.get(`${url}/console/agents/claims-bot/report?format=json&from=2000-01-01T00:00:00.000Z`);
  assert.equal(json.status(), 200);
  const data = await json.json();
  assert.equal(data.agents[0].agent, "claims-bot");
  assert.equal(data.verification.checks.length, 12);
});

test("gateway agent page: the server's declared tools, the calls through the gateway, coverage equal to tally verify's", async () => {
  // What the client got through the gateway is what the server answers.
  assert.match(gatewayResults[0].content[0].text, /hello through tally/);
  assert.match(gatewayResults[1].content[0].text, /\b5\b/);
  assert.ok(gatewayTools.includes("echo") && gatewayTools.includes("get-sum"), gatewayTools.join(" "));
  await page.goto(`${url}/console`);
  await page.click(`#agents a:text('${GATEWAY_AGENT}')`);
  await page.waitForURL(`${url}/console/agents/${GATEWAY_AGENT}`);
  // A tool list, two decisions and two outcomes.
  assert.equal(await page.textContent("#record-count"), "5");
  assert.match(await page.textContent("#chain-head"), /seq\s*4/);
  assert.equal(await page.textContent("#call-count"), "2");
  assert.equal(await page.textContent("#open-count"), "0");
  assert.equal(await page.textContent("#error-count"), "0");
  // The declared tool list is the one the server listed, every tool recorded.
  const declared = await page.$$eval("#tool-lists table tbody tr", (trs) =>
    trs.map((tr) => [tr.cells[0].textContent, tr.cells[1].textContent]),
  );
  assert.deepEqual(
    declared.map((r) => r[0]).sort(),
    [...gatewayTools].sort(),
  );
  assert.ok(declared.every((r) => r[1] === "yes"), JSON.stringify(declared));
  // The calls, newest first, each a decision/outcome pair with status ok.
  const calls = await page.$$eval("#calls tbody tr", (trs) =>
    trs.map((tr) => ({ cls: tr.className, tool: tr.cells[0].textContent, status: tr.cells[2].textContent })),
  );
  assert.deepEqual(calls, [
    { cls: "ok", tool: "get-sum", status: "ok" },
    { cls: "ok", tool: "echo", status: "ok" },
  ]);
  // Coverage and the checks: what `tally verify` says of the exported pack.
  const cli = verifyCli(join(work, "mcp.pack.jsonl"));
  assert.equal(cli.status, 0, cli.stdout + cli.stderr);
  const cliCoverage = cli.stdout.split("\n").filter((l) => l.startsWith("coverage: "));
  const shown = await page.$$eval("ul.coverage li", (lis) => lis.map((li) => li.textContent));
  assert.deepEqual(shown, cliCoverage);
  // The gateway declared its server's tools under its default source, the
  // server's command line (docs/operations.md "Several writers for one agent").
  const source = [process.execPath, serverEverything, "stdio"].join(" ");
  assert.deepEqual(shown, [
    `coverage: ${GATEWAY_AGENT}: all ${gatewayTools.length} declared tools are recorded`,
    `coverage: ${GATEWAY_AGENT}: tool source ${source}: ${gatewayTools.length} tools, declared at seq 0`,
    `coverage: ${GATEWAY_AGENT}: action calls: 0 posted, 1 unknown, 0 failed`,
    `coverage: ${GATEWAY_AGENT}: no claim without a call`,
  ]);
  // The action statement, the action column, and the calls filtered by state.
  assert.equal(await page.textContent("#action-count"), "0 / 1 / 0");
  assert.deepEqual(await page.$$eval("#action-statement li", (lis) => lis.map((li) => li.textContent)), shown.slice(2));
  const states = await page.$$eval("#calls tbody tr", (trs) => trs.map((tr) => [tr.cells[0].textContent, tr.cells[6].textContent]));
  assert.deepEqual(states, [["get-sum", "—"], ["echo", "unknown"]]);
  assert.equal(await page.textContent("pre.report-text"), cli.stdout);
  await page.$eval("#tool-lists", (d) => (d.open = true)); // shown in the screenshot
  await page.screenshot({ path: join(shots, "03-agent-gateway.png"), fullPage: true });
  // The echo call's decision: its record page names the tool, with a proof.
  await page.click("#calls tbody tr:has(td.tool > bdi:text-is('echo')) td:nth-child(4) a");
  await page.waitForURL(/\/console\/records\/\d+$/);
  assert.equal(await page.textContent("#record-kind"), "decision");
  const record = JSON.parse(await page.textContent("#record-json"));
  assert.equal(record.agent, GATEWAY_AGENT);
  assert.equal(record.body.tool, "echo");
  assert.ok((await page.locator("#inclusion li").count()) > 0);
  await page.screenshot({ path: join(shots, "04-record-gateway.png"), fullPage: true });
  // An auditor lists the calls without proof: the filter by state.
  await page.goto(`${url}/console/agents/${GATEWAY_AGENT}`);
  await page.selectOption("form.filters select[name=status]", "unknown");
  await page.click("form.filters button[type=submit]");
  await page.waitForURL(/status=unknown/);
  assert.match(await page.textContent("form.filters span.small"), /^1 of 2 calls$/);
  assert.deepEqual(await page.$$eval("#calls tbody tr td.tool", (tds) => tds.map((td) => td.textContent)), ["echo"]);
  await page.screenshot({ path: join(shots, "04b-agent-gateway-unknown-actions.png"), fullPage: true });
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
  await page.screenshot({ path: join(shots, "05-record.png"), fullPage: true });
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
  const passClass = await page.getAttribute("p.result", "class");
  await page.screenshot({ path: join(shots, "06-verify.png"), fullPage: true });
  // A tampered pack fails, naming the check.
  const tampered = readFileSync(join(work, "pack.jsonl"), "utf8").replace('"lookup"', '"lookuq"');
  writeFileSync(join(work, "tampered.jsonl"), tampered);
  await page.setInputFiles("#agent_keys", join(work, "agent-keys.json"));
  await page.setInputFiles("#pack", join(work, "tampered.jsonl"));
  await Promise.all([page.waitForURL(`${url}/console/verify`), page.click("#verify-form button[type=submit]")]);
  assert.match(await page.textContent("p.result"), /^FAIL: .*record_signatures/);
  const failClass = await page.getAttribute("p.result", "class");
  assert.equal(await page.textContent("pre.report-text"), verifyCli(join(work, "tampered.jsonl")).stdout);
  await page.screenshot({ path: join(shots, "07-verify-fail.png"), fullPage: true });
  // Swapped files are named as `tally verify` names them, in the page.
  await page.setInputFiles("#agent_keys", join(work, "pack.jsonl"));
  await page.setInputFiles("#pack", join(work, "agent-keys.json"));
  await Promise.all([page.waitForURL(`${url}/console/verify`), page.click("#verify-form button[type=submit]")]);
  assert.match(
    await page.textContent("#verify-result p.error"),
    /the file chosen as agent-keys\.json is a pack, not agent-keys\.json: choose it under the pack/,
  );
  const swappedCli = tally(["verify", join(work, "agent-keys.json"), "--agent-keys", join(work, "pack.jsonl"), "--witness-key", vkey], { ok: false });
  assert.equal(swappedCli.status, 2, swappedCli.stderr);
  assert.match(swappedCli.stderr, /is a pack/);
  await page.screenshot({ path: join(shots, "07b-verify-swapped.png"), fullPage: true });
  // The result line is styled as a pass or a failure.
  assert.equal(passClass, "result pass");
  assert.equal(failClass, "result fail");
});

test("auditor link: read-only, scoped, and refused at once after revocation", async () => {
  await page.goto(`${url}/console/links`);
  await page.check("input[name=agent][value=claims-bot]");
  await page.fill("#label", "<b>external audit</b>");
  await Promise.all([page.waitForURL(`${url}/console/links`), page.click("#link-form button[type=submit]")]);
  const href = await page.getAttribute("#new-link-url", "href");
  assert.match(href, /^\/console\/a\/[0-9a-f]{16}_[0-9a-f]{64}$/);
  assert.equal(await page.textContent("#links tbody tr td:first-child"), "<b>external audit</b>");
  await page.screenshot({ path: join(shots, "08-links.png"), fullPage: true });
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
  await ap.screenshot({ path: join(shots, "09-auditor.png"), fullPage: true });
  await ap.click("#agents a:text('claims-bot')");
  await ap.waitForURL(`${auditorUrl}/agents/claims-bot`);
  assert.equal(await ap.textContent("#call-count"), "3");
  assert.equal(await ap.textContent("#calls tr.error td.tool"), HOSTILE_TOOL);
  await ap.screenshot({ path: join(shots, "10-auditor-agent.png"), fullPage: true });
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
  await ap.screenshot({ path: join(shots, "11-auditor-revoked.png"), fullPage: true });
  for (const path of ["/agents/claims-bot", "/pack", "/agent-keys.json"]) {
    const r = await fetch(`${auditorUrl}${path}`);
    assert.equal(r.status, 404, path);
  }
  noInjectedDialogs();
});

/** The record lines of a pack file, in order. */
function packRecords(file) {
  return readFileSync(file, "utf8")
    .split("\n")
    .filter(Boolean)
    .map((l) => JSON.parse(l))
    .filter((l) => l.type === "record");
}

const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

/** Makes an auditor link on the links page; returns its absolute URL. */
async function makeLink({ agents, since = "", until = "", hours = "", label }) {
  await page.goto(`${url}/console/links`);
  for (const a of agents) await page.check(`input[name=agent][value=${a}]`);
  await page.fill("#since", since);
  await page.fill("#until", until);
  if (hours) await page.fill("#expires_hours", hours);
  await page.fill("#label", label);
  await Promise.all([page.waitForURL(`${url}/console/links`), page.click("#link-form button[type=submit]")]);
  const href = await page.getAttribute("#new-link-url", "href");
  assert.match(href, /^\/console\/a\/[0-9a-f]{16}_[0-9a-f]{64}$/);
  return `${url}${href}`;
}

test("auditor link limited to a time range: nothing outside it is shown, counted or served", async () => {
  // claims-bot's records so far (seq 0-5). The range starts at seq 2's
  // receive time (the decision of call c2) and ends before the records
  // posted below, which must stay invisible to the link.
  const before = packRecords(join(work, "pack.jsonl"));
  assert.equal(before.length, 6);
  const since = before[2].witnessed.received;
  await sleep(20);
  const until = new Date().toISOString(); // every record above was received earlier
  await sleep(20);
  tally(["record", "decision", "--agent", "claims-bot", "--tool", "late-tool", "--call-id", "c4", "--wait-receipt"]);
  tally(["record", "outcome", "--agent", "claims-bot", "--call-id", "c4", "--status", "ok", "--wait-receipt"]);
  tally(["record", "note", "--agent", "claims-bot", "after the range", "--wait-receipt"]);
  tally(["export", "--agent", "claims-bot", "-o", join(work, "pack-all.jsonl")]);
  const all = packRecords(join(work, "pack-all.jsonl"));
  assert.equal(all.length, 9);
  assert.ok(all.slice(6).every((r) => r.witnessed.received >= until), "late records are after until");
  const inRange = all.filter((r) => r.witnessed.received >= since && r.witnessed.received < until);
  assert.deepEqual(inRange.map((r) => r.record.seq), [2, 3, 4, 5]);

  const link = await makeLink({ agents: ["claims-bot"], since, until, label: "range audit" });
  const row = await page.$$eval("#links tbody tr", (trs) =>
    trs.map((tr) => [...tr.cells].map((c) => c.textContent.trim())).find((r) => r[0] === "range audit"),
  );
  assert.ok(row[2].includes(since) && row[2].includes(until), `range column: ${row[2]}`);
  await page.screenshot({ path: join(shots, "12-links-range.png"), fullPage: true });

  const ap = auditor.pages()[0];
  let resp = await ap.goto(link);
  assert.equal(resp.status(), 200);
  const scope = await ap.textContent("#scope");
  assert.ok(scope.includes(since) && scope.includes(until), scope);
  await ap.screenshot({ path: join(shots, "13-auditor-range.png"), fullPage: true });
  await ap.click("#agents a:text('claims-bot')");
  await ap.waitForURL(`${link}/agents/claims-bot`);
  await ap.screenshot({ path: join(shots, "14-auditor-range-agent.png"), fullPage: true });
  // Only the in-range calls: c2 (lookup, ok) and c3 (refund, open).
  const calls = await ap.$$eval("#calls tbody tr", (trs) => trs.map((tr) => tr.cells[0].textContent));
  assert.deepEqual(calls.sort(), ["lookup", "refund"]);
  const text = await ap.textContent("main");
  assert.ok(!text.includes("late-tool") && !text.includes("after the range") && !text.includes(HOSTILE_TOOL), "out-of-range records are not shown");
  // Coverage as `tally verify` reports it for the link's own pack.
  await ap.goto(link);
  const [download] = await Promise.all([ap.waitForEvent("download"), ap.click("a:text('Download the pack')")]);
  const packFile = join(work, "auditor-range.pack.jsonl");
  await download.saveAs(packFile);
  assert.deepEqual(packRecords(packFile).map((r) => r.record.seq), [2, 3, 4, 5]);
  const keysResp = await fetch(`${link}/agent-keys.json`);
  assert.equal(keysResp.status, 200);
  writeFileSync(join(work, "auditor-keys.json"), await keysResp.text());
  const cli = tally(
    ["verify", packFile, "--agent-keys", join(work, "auditor-keys.json"), "--witness-key", vkey],
    { ok: false },
  );
  assert.equal(cli.status, 0, cli.stdout + cli.stderr);
  assert.match(cli.stdout, /; 4 records from 1 agent$/m);
  await ap.goto(`${link}/agents/claims-bot`);
  const shown = await ap.$$eval("ul.coverage li", (lis) => lis.map((li) => li.textContent));
  assert.deepEqual(shown, cli.stdout.split("\n").filter((l) => l.startsWith("coverage: ")));

  // Record pages: in range 200 (with its proof), out of range 404.
  const byIndex = (seq) => all.find((r) => r.record.seq === seq).witnessed.index;
  resp = await ap.goto(`${link}/records/${byIndex(2)}`);
  assert.equal(resp.status(), 200);
  assert.equal(JSON.parse(await ap.textContent("#record-json")).body.tool, "lookup");
  assert.ok((await ap.locator("#inclusion li").count()) > 0);
  assert.equal(await ap.locator("a[href^='/console/records'], a[href^='/console/agents'], a[href='/console/links']").count(), 0);
  await ap.screenshot({ path: join(shots, "15-auditor-record.png"), fullPage: true });
  for (const seq of [0, 1, 6, 7, 8]) {
    resp = await ap.goto(`${link}/records/${byIndex(seq)}`);
    assert.equal(resp.status(), 404, `record seq ${seq} is outside the range`);
  }
  await ap.screenshot({ path: join(shots, "16-auditor-record-out-of-range.png"), fullPage: true });
  // The pack of an out-of-range record is not served either.
  for (const seq of [0, 7]) {
    const r = await fetch(`${link}/records/${byIndex(seq)}/pack`);
    assert.equal(r.status, 404, `pack of record seq ${seq}`);
  }

  // The auditor's verify page: the pack the link gave, verified in the
  // browser exactly as `tally verify` prints it.
  await ap.goto(`${link}/verify`);
  assert.equal(await ap.inputValue("#witness_key"), vkey);
  await ap.setInputFiles("#agent_keys", join(work, "auditor-keys.json"));
  await ap.setInputFiles("#pack", packFile);
  await Promise.all([ap.waitForURL(`${link}/verify`), ap.click("#verify-form button[type=submit]")]);
  assert.equal(await ap.textContent("pre.report-text"), cli.stdout);
  await ap.screenshot({ path: join(shots, "17-auditor-verify.png"), fullPage: true });

  // The count and the chain head reflect the range only (seq 2-5), not the
  // chain's records after `until`.
  await ap.goto(link);
  const homeRows = await ap.$$eval("#agents tbody tr", (trs) => trs.map((tr) => [...tr.cells].map((c) => c.textContent.trim())));
  assert.deepEqual(homeRows.map((r) => [r[0], r[1]]), [["claims-bot", "4"]], "auditor home: records in range");
  await ap.goto(`${link}/agents/claims-bot`);
  assert.equal(await ap.textContent("#record-count"), "4", "auditor agent page: records in range");
  assert.match(await ap.textContent("#chain-head"), /^seq\s*5\D/, "auditor agent page: head of the range");
  noInjectedDialogs();
});

test("auditor record page offers a pack of the record that tally verify passes", async () => {
  const link = await makeLink({ agents: [GATEWAY_AGENT], label: "record pack" });
  const ap = auditor.pages()[0];
  const rec = packRecords(join(work, "mcp.pack.jsonl")).find((r) => r.record.kind === "decision");
  const resp = await ap.goto(`${link}/records/${rec.witnessed.index}`);
  assert.equal(resp.status(), 200);
  assert.equal(await ap.locator("#download-record-pack").count(), 1, "auditor record page has a download button");
  assert.equal(
    await ap.getAttribute("#download-record-pack", "href"),
    `${new URL(link).pathname}/records/${rec.witnessed.index}/pack`,
  );
  await ap.screenshot({ path: join(shots, "19-auditor-record-gateway.png"), fullPage: true });
  const [download] = await Promise.all([ap.waitForEvent("download"), ap.click("#download-record-pack")]);
  const file = join(work, "auditor-record.pack.jsonl");
  await download.saveAs(file);
  // The pack runs from the decision through its outcome (the gateway may
  // record the next call's decision before this call's outcome).
  const outcome = packRecords(join(work, "mcp.pack.jsonl")).find(
    (r) => r.record.kind === "outcome" && r.record.body.call_id === rec.record.body.call_id,
  );
  const seqs = packRecords(file).map((r) => r.record.seq);
  assert.equal(seqs[0], rec.record.seq);
  assert.equal(seqs.at(-1), outcome.record.seq);
  const cli = verifyCli(file);
  assert.equal(cli.status, 0, cli.stdout + cli.stderr);
  assert.match(cli.stdout, new RegExp(`^PASS: 12 checks, .*; ${seqs.length} records from 1 agent$`, "m"));
});

test("auditor link expiry: an hour at least, shown to the auditor; an expired link cannot be made", async () => {
  const made = Date.now();
  const link = await makeLink({ agents: ["claims-bot"], hours: "1", label: "one hour" });
  const row = await page.$$eval("#links tbody tr", (trs) =>
    trs.map((tr) => [...tr.cells].map((c) => c.textContent.trim())).find((r) => r[0] === "one hour"),
  );
  const expires = Date.parse(row[3]);
  assert.ok(Math.abs(expires - (made + 3_600_000)) < 60_000, `expires ${row[3]}`);
  assert.equal(row[4], "active");
  const ap = auditor.pages()[0];
  const resp = await ap.goto(link);
  assert.equal(resp.status(), 200);
  assert.ok((await ap.textContent("#scope")).includes(`the link expires at ${row[3]}`));

  // The form will not make a link that is already expired: the browser
  // refuses 0 hours, and so does the server when the browser is bypassed.
  await page.goto(`${url}/console/links`);
  const links = await page.locator("#links tbody tr").count();
  await page.check("input[name=agent][value=claims-bot]");
  await page.fill("#expires_hours", "0");
  await page.click("#link-form button[type=submit]");
  assert.equal(await page.$eval("#expires_hours", (e) => e.validity.rangeUnderflow), true);
  await page.$eval("#link-form", (f) => (f.noValidate = true));
  const [answer] = await Promise.all([
    page.waitForResponse((r) => r.url() === `${url}/console/links` && r.request().method() === "POST"),
    page.click("#link-form button[type=submit]"),
  ]);
  assert.equal(answer.status(), 400);
  assert.match(await page.textContent("p.error"), /expires after must be 1 to 8760 hours/);
  assert.equal(await page.locator("#new-link-url").count(), 0);
  assert.equal(await page.locator("#links tbody tr").count(), links);
  await page.screenshot({ path: join(shots, "18-links-expiry-refused.png"), fullPage: true });
});

test("tool checks on the agent page and in the auditor view: the check records and the verifier's statement", async () => {
  // The server's tools approved with `tally tools approve`, then a session
  // through `tally gateway --lock --policy` (docs/operations.md "Approved
  // tool definitions"): the tools are as approved, so each check proceeds.
  initAgent("checked-bot");
  const lock = join(work, "tools.lock.json");
  const policy = join(work, "tools.policy.json");
  writeFileSync(policy, JSON.stringify({ tally_tools_policy: 1 }));
  tally(["tools", "approve", "--out", lock, "--by", "alice", "--source", "ev", "--", process.execPath, serverEverything, "stdio"]);
  await gatewaySession("checked-bot", ["--source", "ev", "--lock", lock, "--policy", policy]);
  tally(["agent", "sync", "checked-bot"]);
  tally(["export", "--agent", "checked-bot", "-o", join(work, "checked.pack.jsonl")]);
  tally(["keys", "export", "-o", join(work, "checked-keys.json")]);
  const cli = tally(["verify", join(work, "checked.pack.jsonl"), "--agent-keys", join(work, "checked-keys.json"), "--witness-key", vkey]);
  const statement = cli.stdout.split("\n").filter((l) => l.startsWith("coverage: checked-bot: tool checks"));
  assert.equal(statement.length, 1, cli.stdout);
  assert.match(statement[0], /tool checks: \d+ run, 0 paused or stopped the session; 0 calls to a tool not as approved/);

  await page.goto(`${url}/console/agents/checked-bot`);
  const kinds = await page.$$eval("#notes tbody tr", (trs) => trs.map((tr) => [tr.cells[2].textContent, tr.cells[3].textContent]));
  const checks = kinds.filter(([k]) => k === "tool_check");
  assert.ok(checks.length >= 1, JSON.stringify(kinds));
  assert.ok(checks.every(([, text]) => text.startsWith("proceed at ev")), JSON.stringify(checks));
  const shown = await page.$$eval("ul.coverage li", (lis) => lis.map((li) => li.textContent));
  assert.ok(shown.includes(statement[0]), JSON.stringify(shown));
  await page.screenshot({ path: join(shots, "19-agent-tool-checks.png"), fullPage: true });

  // The auditor view shows the same statement for a link to this agent.
  await page.goto(`${url}/console/links`);
  await page.check("input[name=agent][value=checked-bot]");
  await Promise.all([page.waitForURL(`${url}/console/links`), page.click("#link-form button[type=submit]")]);
  const href = await page.getAttribute("#new-link-url", "href");
  const ap = auditor.pages()[0];
  await ap.goto(`${url}${href}/agents/checked-bot`);
  const audited = await ap.$$eval("ul.coverage li", (lis) => lis.map((li) => li.textContent));
  assert.ok(audited.includes(statement[0]), JSON.stringify(audited));
});
