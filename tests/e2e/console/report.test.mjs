// `tally report` (docs/protocol.md §11.3) rendered in Debian's headless
// chromium, driven by playwright-core, from a pack of the real binary: `tally
// serve`, the real `tally gateway --store-content` in front of the pinned
// @modelcontextprotocol/server-everything (an MCP server on the official
// TypeScript SDK, spoken to in MCP JSON-RPC over the gateway's stdio), and
// records from the CLI with hostile names. The passing report is screenshot
// (verdict and charts visible), printed to PDF and read back with pdftotext:
// its pages hold the verdict, each agent and each of the twelve checks. A
// disclosure of the gateway's echo call made with `tally disclose` is shown
// in the report. A tampered pack's report leads with FAIL and the failing
// check, in the page and in the PDF. Screenshots and PDFs go to
// target/report-screenshots/.
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
const shots = join(root, "target/report-screenshots");
const work = mkdtempSync(join(tmpdir(), "tally-report-e2e-"));
const state = join(work, "state");
const serverEverything =
  process.env.SERVER_EVERYTHING ||
  join(import.meta.dirname, "node_modules/@modelcontextprotocol/server-everything/dist/index.js");

const HOSTILE_TOOL = "<script>alert(1)</script>";
const BIDI_TOOL = "refund\u202Eexe.txt";
const CHECKS = [
  "schema", "agent_keys", "record_signatures", "record_hashes", "chain", "witness_signatures",
  "inclusion", "receipts", "timing", "outcomes", "head", "log_consistency",
];

let server;
let url;
let apiKey;
let vkey;
let browser;

function tally(args, { ok = true } = {}) {
  const r = spawnSync(bin, args, {
    env: { ...process.env, TALLY_STATE_DIR: state, TALLY_WITNESS_URL: url, TALLY_API_KEY: apiKey },
    encoding: "utf8",
    timeout: 120_000,
  });
  if (ok && r.status !== 0) {
    throw new Error(`tally ${args.join(" ")} exited ${r.status}: ${r.stderr}${r.stdout}`);
  }
  return r;
}

async function startServer() {
  server = spawn(bin, ["serve", "--data-dir", join(work, "data"), "--listen", "127.0.0.1:0"], {
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

/** initialize, tools/list, tools/call echo and get-sum through the gateway. */
async function gatewaySession(agent) {
  const gw = spawn(
    bin,
    ["gateway", "--agent", agent, "--store-content", "--", process.execPath, serverEverything, "stdio"],
    {
      env: { ...process.env, TALLY_STATE_DIR: state, TALLY_WITNESS_URL: url, TALLY_API_KEY: apiKey },
      stdio: ["pipe", "pipe", "pipe"],
    },
  );
  let err = "";
  gw.stderr.on("data", (d) => (err += d));
  const exited = new Promise((r) => gw.once("exit", (code) => r(code)));
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
      if (msg.id !== undefined && !msg.method && waiting.has(msg.id)) {
        waiting.get(msg.id)(msg);
        waiting.delete(msg.id);
      }
    }
  });
  let id = 0;
  const send = (msg) => gw.stdin.write(JSON.stringify({ jsonrpc: "2.0", ...msg }) + "\n");
  const request = (method, params) =>
    new Promise((ok, reject) => {
      const n = ++id;
      const timer = setTimeout(() => reject(new Error(`no answer to ${method}: ${err}`)), 30_000);
      waiting.set(n, (msg) => {
        clearTimeout(timer);
        if (msg.error) reject(new Error(`${method}: ${JSON.stringify(msg.error)}`));
        else ok(msg.result);
      });
      send({ id: n, method, params });
    });
  await request("initialize", {
    protocolVersion: "2025-06-18",
    capabilities: {},
    clientInfo: { name: "tally-report-e2e", version: "1" },
  });
  send({ method: "notifications/initialized" });
  await request("tools/list", {});
  await request("tools/call", { name: "echo", arguments: { message: "hello <b>through</b> tally" } });
  await request("tools/call", { name: "get-sum", arguments: { a: 2, b: 3 } });
  gw.stdin.end();
  const code = await exited;
  assert.equal(code, 0, `gateway exited ${code}: ${err}`);
}

/** The call id of the agent's first decision calling `tool`. */
function callId(agent, tool) {
  const s = JSON.parse(tally(["status", "--agent", agent, "--json", "--records"]).stdout);
  const chain = s.agents[0].chain;
  assert.ok(chain, `the chain of ${agent}: ${JSON.stringify(s)}`);
  const d = chain.find((r) => r.record.kind === "decision" && r.record.body.tool === tool);
  assert.ok(d, `a decision calling ${tool}`);
  return d.record.body.call_id;
}

function pdfText(pdf) {
  const r = spawnSync("pdftotext", ["-layout", pdf, "-"], { encoding: "utf8" });
  assert.equal(r.status, 0, r.stderr);
  return r.stdout;
}

async function render(html, name) {
  const page = await browser.newPage({ viewport: { width: 1100, height: 1400 } });
  // Nothing outside the file is fetched: count every request.
  const requests = [];
  page.on("request", (r) => requests.push(r.url()));
  await page.goto(`file://${html}`);
  await page.screenshot({ path: join(shots, `${name}.png`), fullPage: false });
  const pdf = join(shots, `${name}.pdf`);
  await page.pdf({ path: pdf, format: "A4", printBackground: true, displayHeaderFooter: false });
  assert.deepEqual(requests.filter((u) => !u.startsWith("file://")), [], "no request leaves the file");
  return { page, pdf };
}

before(async () => {
  rmSync(shots, { recursive: true, force: true });
  mkdirSync(shots, { recursive: true });
  await startServer();
  initAgent("claims-bot");
  initAgent("mcp-bot");
  tally(["record", "decision", "--agent", "claims-bot", "--tool", HOSTILE_TOOL, "--call-id", "c1", "--wait-receipt"]);
  tally(["record", "outcome", "--agent", "claims-bot", "--call-id", "c1", "--status", "error", "--wait-receipt"]);
  tally(["record", "decision", "--agent", "claims-bot", "--tool", BIDI_TOOL, "--call-id", "c2", "--wait-receipt"]);
  tally(["record", "outcome", "--agent", "claims-bot", "--call-id", "c2", "--status", "ok", "--wait-receipt"]);
  await gatewaySession("mcp-bot");
  tally(["agent", "sync", "mcp-bot"]);
  tally(["keys", "export", "-o", join(work, "agent-keys.json")]);
  tally(["export", "--agent", "claims-bot", "--agent", "mcp-bot", "-o", join(work, "pack.jsonl")]);
  browser = await chromium.launch({
    executablePath: chromiumPath,
    headless: true,
    args: ["--no-sandbox", "--disable-gpu", "--disable-background-networking"],
  });
});

after(async () => {
  await browser?.close();
  server?.kill("SIGTERM");
  rmSync(work, { recursive: true, force: true });
});

test("a passing pack's report: verdict, charts, each agent and check in the PDF, a disclosed call", async () => {
  const disclosure = join(work, "echo.json");
  tally(["disclose", "--agent", "mcp-bot", "--call-id", callId("mcp-bot", "echo"), "-o", disclosure]);
  const html = join(work, "report.html");
  const r = tally([
    "report", join(work, "pack.jsonl"), "--agent-keys", join(work, "agent-keys.json"),
    "--witness-key", vkey, "--disclosure", disclosure, "-o", html,
  ]);
  assert.equal(r.status, 0);
  const source = readFileSync(html, "utf8");
  assert.ok(!source.includes("<script"), "no script in the page");
  const { page, pdf } = await render(html, "report-pass");
  // The verdict is the first thing, and it is visible.
  const verdict = page.locator("#verdict h1");
  assert.equal(await verdict.textContent(), "PASS");
  assert.ok(await verdict.isVisible());
  const box = await verdict.boundingBox();
  assert.ok(box.y < 200, `the verdict leads the page (y=${box.y})`);
  // A chart per agent, with bars.
  assert.equal(await page.locator("section.agent svg").count(), 2);
  assert.ok((await page.locator("section.agent svg rect").count()) >= 3);
  // Hostile names are text, not markup: no alert ran, the names show.
  const agentText = await page.locator("section.agent").first().textContent();
  assert.ok(agentText.includes(HOSTILE_TOOL), agentText);
  assert.ok(agentText.includes("refund\\u{202e}exe.txt"), agentText);
  // The disclosed call shows its content and the tool's answer.
  const disclosed = await page.locator("#disclosures").textContent();
  assert.ok(disclosed.includes("match"), disclosed);
  assert.ok(disclosed.includes("hello <b>through</b> tally"), disclosed);
  await page.close();

  const text = pdfText(pdf);
  writeFileSync(join(shots, "report-pass.txt"), text);
  assert.ok(text.trimStart().startsWith("PASS"), text.slice(0, 300));
  for (const agent of ["claims-bot", "mcp-bot"]) assert.ok(text.includes(`Agent ${agent}`), `${agent} in the PDF`);
  for (const check of CHECKS) assert.ok(text.includes(check), `${check} in the PDF`);
  assert.ok(text.includes("tally verify "), "the reproducing command");
  const pages = text.split("\f").filter((p) => p.trim()).length;
  assert.ok(pages >= 4, `a page per agent and section (${pages} pages)`);
});

test("a tampered pack's report leads with FAIL and the failing check", async () => {
  const lines = readFileSync(join(work, "pack.jsonl"), "utf8").split("\n");
  // Change the tool name of claims-bot's second decision: its signature no
  // longer verifies.
  const i = lines.findIndex((l) => l.includes('"call_id":"c2"') && l.includes('"kind":"decision"'));
  assert.ok(i > 0, "the decision line");
  lines[i] = lines[i].replace('"call_id":"c2"', '"call_id":"c9"');
  writeFileSync(join(work, "tampered.jsonl"), lines.join("\n"));
  const html = join(work, "tampered.html");
  const r = tally(
    ["report", join(work, "tampered.jsonl"), "--agent-keys", join(work, "agent-keys.json"), "--witness-key", vkey, "-o", html],
    { ok: false },
  );
  assert.equal(r.status, 1, r.stderr);
  const { page, pdf } = await render(html, "report-fail");
  assert.equal(await page.locator("#verdict h1").textContent(), "FAIL");
  const failing = await page.locator("#verdict ul").first().textContent();
  assert.ok(failing.includes("record_signatures"), failing);
  await page.close();
  const text = pdfText(pdf);
  writeFileSync(join(shots, "report-fail.txt"), text);
  assert.ok(text.trimStart().startsWith("FAIL"), text.slice(0, 300));
  assert.ok(text.indexOf("record_signatures") < text.indexOf("Agent claims-bot"), "the failing check before the agents");
});
