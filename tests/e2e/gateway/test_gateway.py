"""End-to-end tests of `tally gateway` over stdio (test_gateway_http.py: over HTTP).

The official MCP Python SDK client drives `tally gateway -- node
server-everything stdio`; the tests then read the agent's local chain with
`tally status --json --records` and check what was recorded. Run through
run.sh, which installs the pinned client and server.
"""

import hashlib
import json
import os
import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path

import anyio
import pytest
from mcp import ClientSession, StdioServerParameters
from mcp.client.stdio import stdio_client

TALLY = os.environ.get("TALLY_BIN", str(Path(__file__).resolve().parents[3] / "target/debug/tally"))
SERVER = os.environ.get(
    "SERVER_EVERYTHING",
    str(Path(__file__).resolve().parent / "node_modules/@modelcontextprotocol/server-everything/dist/index.js"),
)
AGENT = "e2e-bot"


def tally(state: Path, *args: str, check: bool = True) -> subprocess.CompletedProcess:
    env = dict(os.environ, TALLY_STATE_DIR=str(state))
    env.pop("TALLY_API_KEY", None)
    env.pop("TALLY_WITNESS_URL", None)
    return subprocess.run([TALLY, *args], env=env, capture_output=True, text=True, check=check, timeout=120)


def chain(state: Path) -> list[dict]:
    out = tally(state, "status", "--agent", AGENT, "--json", "--records").stdout
    return json.loads(out)["agents"][0]["chain"]


def check_links(entries: list[dict]) -> None:
    """seq is contiguous from 0 and every prev names the previous record's hash."""
    for i, e in enumerate(entries):
        r = e["record"]
        assert r["seq"] == i
        assert r["prev"] == (entries[i - 1]["hash"] if i else None)
        assert r["agent"] == AGENT


def outcomes_by_decision(entries: list[dict]) -> dict[str, list[dict]]:
    out: dict[str, list[dict]] = {}
    for e in entries:
        if e["record"]["kind"] == "outcome":
            out.setdefault(e["record"]["body"]["decision"], []).append(e["record"]["body"])
    return out


@pytest.fixture()
def state(tmp_path: Path) -> Path:
    s = tmp_path / "state"
    tally(s, "agent", "init", AGENT)
    return s


def gateway_params(state: Path, server_cmd: list[str], *extra: str, wrapper: list[str] | None = None) -> StdioServerParameters:
    cmd = [*(wrapper or []), TALLY, "gateway", "--agent", AGENT, *extra, "--", *server_cmd]
    env = dict(os.environ, TALLY_STATE_DIR=str(state))
    return StdioServerParameters(command=cmd[0], args=cmd[1:], env=env)


def test_calls_errors_cancellation_and_server_death_are_recorded(state: Path, tmp_path: Path) -> None:
    pidfile = tmp_path / "server.pid"
    # The shell records the server's pid, then becomes the server.
    server_cmd = ["sh", "-c", f'echo $$ > "{pidfile}"; exec node "{SERVER}" stdio']
    seen: dict = {}

    async def session() -> None:
        async with stdio_client(gateway_params(state, server_cmd)) as (r, w):
            async with ClientSession(r, w) as s:
                await s.initialize()
                listed = await s.list_tools()
                seen["tools"] = sorted(t.name for t in listed.tools)

                ok = await s.call_tool("echo", {"message": "hello through tally"})
                assert not ok.is_error and "hello through tally" in ok.content[0].text
                total = await s.call_tool("get-sum", {"a": 2, "b": 3})
                assert not total.is_error and "5" in total.content[0].text

                bad = await s.call_tool("get-sum", {"a": "not a number"})
                assert bad.is_error
                missing = await s.call_tool("no-such-tool", {})
                assert missing.is_error

                # Abandoning the call makes the SDK send notifications/cancelled.
                with anyio.move_on_after(1.0) as scope:
                    await s.call_tool("trigger-long-running-operation", {"duration": 30, "steps": 3})
                assert scope.cancelled_caught

                # Kill the server with a call in flight: the client gets a
                # JSON-RPC error for it from the gateway.
                async def kill_soon() -> None:
                    await anyio.sleep(1.0)
                    os.kill(int(pidfile.read_text().strip()), signal.SIGKILL)

                async with anyio.create_task_group() as tg:
                    tg.start_soon(kill_soon)
                    try:
                        res = await s.call_tool("trigger-long-running-operation", {"duration": 30, "steps": 3})
                        seen["killed_call"] = ("result", res.is_error)
                    except Exception as e:  # McpError from the gateway's error answer
                        seen["killed_call"] = ("error", str(e))

    async def run() -> None:
        try:
            await session()
        except BaseException as e:  # the transport may complain once the server is gone
            if "killed_call" not in seen:
                raise
            seen["teardown"] = repr(e)

    anyio.run(run)

    assert seen["killed_call"][0] == "error", seen
    assert "exited" in seen["killed_call"][1], seen

    entries = chain(state)
    check_links(entries)
    kinds = [e["record"]["kind"] for e in entries]
    tools_records = [e["record"]["body"] for e in entries if e["record"]["kind"] == "tools"]
    assert tools_records, kinds
    recorded_names = sorted(t["name"] for body in tools_records[-1:] for t in body["tools"])
    assert recorded_names == seen["tools"]
    for body in tools_records:
        for t in body["tools"]:
            assert t["recorded"] is True
            assert len(t["digest"]) == 64 and "input_schema" in t["parts"]

    decisions = [e for e in entries if e["record"]["kind"] == "decision"]
    outcomes = outcomes_by_decision(entries)
    got = []
    for d in decisions:
        outs = outcomes.get(d["hash"], [])
        assert len(outs) == 1, f"decision {d['record']['body']} has outcomes {outs}"
        assert outs[0]["call_id"] == d["record"]["body"]["call_id"]
        got.append((d["record"]["body"]["tool"], outs[0]["status"]))
    assert got == [
        ("echo", "ok"),
        ("get-sum", "ok"),
        ("get-sum", "error"),
        ("no-such-tool", "error"),
        ("trigger-long-running-operation", "cancelled"),
        ("trigger-long-running-operation", "server_exited"),
    ], got
    # Every outcome names a decision of this chain.
    assert sum(len(v) for v in outcomes.values()) == len(decisions)
    # Salted hashes only: the arguments never appear in the chain.
    assert "hello through tally" not in json.dumps(entries)

    status = tally(state, "status", "--agent", AGENT).stdout
    assert f"chain head: seq {len(entries) - 1}" in status
    assert f"not yet receipted: {len(entries)}" in status
    assert "witness: none configured" in status


class RawClient:
    """A bare newline-delimited JSON-RPC client on a gateway's stdio, for
    tests that need to misbehave in ways the SDK client does not."""

    def __init__(self, state: Path, server_cmd: list[str]) -> None:
        env = dict(os.environ, TALLY_STATE_DIR=str(state))
        self.p = subprocess.Popen(
            [TALLY, "gateway", "--agent", AGENT, "--", *server_cmd],
            env=env,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )

    def send(self, msg: dict) -> None:
        assert self.p.stdin is not None
        self.p.stdin.write(json.dumps(msg).encode() + b"\n")
        self.p.stdin.flush()

    def read(self) -> dict:
        assert self.p.stdout is not None
        line = self.p.stdout.readline()
        assert line, "the gateway closed its output"
        return json.loads(line)

    def initialize(self) -> None:
        self.send({"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {
            "protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "raw", "version": "1"}}})
        while self.read().get("id") != 0:
            pass
        self.send({"jsonrpc": "2.0", "method": "notifications/initialized"})


def test_a_call_in_flight_when_the_client_dies_ends_as_client_gone(state: Path) -> None:
    c = RawClient(state, ["node", SERVER, "stdio"])
    c.initialize()
    c.send({"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {
        "name": "trigger-long-running-operation", "arguments": {"duration": 30, "steps": 30},
        "_meta": {"progressToken": "p1"}}})
    # The first progress notification shows the server is running the call.
    while c.read().get("method") != "notifications/progress":
        pass
    # The client dies: both of its pipes close, nothing is cancelled.
    assert c.p.stdin is not None and c.p.stdout is not None
    c.p.stdin.close()
    c.p.stdout.close()
    assert c.p.wait(timeout=60) is not None

    entries = chain(state)
    check_links(entries)
    decisions = [e for e in entries if e["record"]["kind"] == "decision"]
    assert [d["record"]["body"]["tool"] for d in decisions] == ["trigger-long-running-operation"]
    outcomes = outcomes_by_decision(entries)
    assert [o["status"] for o in outcomes[decisions[0]["hash"]]] == ["client_gone"]


FAKE_SERVER = r"""
import json, sys
marker = sys.argv[1]
for line in sys.stdin:
    msg = json.loads(line)
    if msg.get("method") == "initialize":
        print(json.dumps({"jsonrpc": "2.0", "id": msg["id"], "result": {
            "protocolVersion": "2025-06-18", "capabilities": {"tools": {}},
            "serverInfo": {"name": "fake", "version": "1"}}}), flush=True)
    elif msg.get("method") == "tools/call":
        # Tell the test the call arrived, then never answer.
        with open(marker, "w") as f:
            f.write(line)
"""


def test_a_forwarded_decision_survives_kill_9_of_the_gateway(state: Path, tmp_path: Path) -> None:
    server = tmp_path / "server.py"
    server.write_text(FAKE_SERVER)
    marker = tmp_path / "got-call"
    c = RawClient(state, ["python3", str(server), str(marker)])
    c.initialize()
    c.send({"jsonrpc": "2.0", "id": 7, "method": "tools/call", "params": {
        "name": "refund", "arguments": {"order": 42}}})
    deadline = time.monotonic() + 30
    while not marker.exists() or not marker.read_text():
        assert time.monotonic() < deadline, "the call never reached the server"
        time.sleep(0.001)
    # The server has the call: kill the gateway at once, without warning.
    c.p.kill()
    c.p.wait(timeout=30)
    assert c.p.returncode == -signal.SIGKILL
    # The next run (here `tally status`, which opens the store the same way)
    # finds the decision.
    entries = chain(state)
    check_links(entries)
    decisions = [e["record"]["body"] for e in entries if e["record"]["kind"] == "decision"]
    assert [(d["tool"], d["call_id"]) for d in decisions] == [("refund", "7")]


def test_store_content_lets_a_call_be_disclosed(state: Path) -> None:
    async def session() -> None:
        async with stdio_client(gateway_params(state, ["node", SERVER, "stdio"], "--store-content")) as (r, w):
            async with ClientSession(r, w) as s:
                await s.initialize()
                await s.list_tools()
                await s.call_tool("echo", {"message": "disclose me"})

    anyio.run(session)
    entries = chain(state)
    check_links(entries)
    # The salt and content kept in the store recompute the decision's hash:
    # SHA-256(salt || JCS(arguments)), docs/protocol.md section 6.1.
    decision = next(e for e in entries if e["record"]["kind"] == "decision")
    assert decision["record"]["body"]["tool"] == "echo"
    secret = decision["secret"]
    assert secret["content"] == {"message": "disclose me"}
    jcs = json.dumps(secret["content"], sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()
    assert hashlib.sha256(bytes.fromhex(secret["salt"]) + jcs).hexdigest() == decision["record"]["body"]["input_hash"]
    outcome = next(e for e in entries if e["record"]["kind"] == "outcome")
    assert outcome["record"]["body"]["status"] == "ok"
    assert "disclose me" in json.dumps(outcome["secret"]["content"])


def can_drop_dac_override() -> bool:
    if shutil.which("setpriv") is None:
        return False
    probe = subprocess.run(
        ["setpriv", "--bounding-set", "-dac_override,-dac_read_search", "--", "sh", "-c", "test -w /proc/1/environ"],
        capture_output=True,
    )
    return probe.returncode in (0, 1)


@pytest.mark.skipif(not can_drop_dac_override(), reason="needs setpriv to run the gateway without CAP_DAC_OVERRIDE")
def test_fail_closed_when_the_store_is_unwritable(state: Path, tmp_path: Path) -> None:
    # A first record creates the store; then it is made read-only. The
    # gateway runs without CAP_DAC_OVERRIDE so that even as root the file
    # mode binds it.
    tally(state, "record", "note", "--agent", AGENT, "before the store became read-only")
    agent_dir = state / "agents" / AGENT
    store = agent_dir / "chain.redb"
    before = store.read_bytes()
    store.chmod(0o444)
    agent_dir.chmod(0o555)
    seen_by_server = tmp_path / "server-stdin.log"
    server_cmd = ["sh", "-c", f'tee -a "{seen_by_server}" | node "{SERVER}" stdio']
    wrapper = ["setpriv", "--bounding-set", "-dac_override,-dac_read_search,-fowner", "--"]
    result: dict = {}

    async def session() -> None:
        async with stdio_client(gateway_params(state, server_cmd, wrapper=wrapper)) as (r, w):
            async with ClientSession(r, w) as s:
                await s.initialize()
                listed = await s.list_tools()
                result["tools"] = len(listed.tools)
                try:
                    res = await s.call_tool("echo", {"message": "must not run"})
                    result["call"] = ("result", res.is_error, res.content[0].text if res.content else "")
                except Exception as e:
                    result["call"] = ("error", str(e))

    try:
        anyio.run(session)
    finally:
        agent_dir.chmod(0o755)
        store.chmod(0o644)

    assert result["tools"] > 0  # other traffic still flows
    kind, *detail = result["call"]
    text = " ".join(str(d) for d in detail)
    assert "not forwarded" in text and "could not be recorded" in text, result
    log = seen_by_server.read_text()
    assert '"tools/list"' in log
    assert '"tools/call"' not in log and "must not run" not in log
    assert store.read_bytes() == before


def test_signals_reach_the_server_and_its_exit_code_passes_through(state: Path, tmp_path: Path) -> None:
    marker = tmp_path / "got-term"
    ready = tmp_path / "trap-set"
    script = (
        f'trap \'echo term > "{marker}"; exit 7\' TERM; touch "{ready}"; '
        "while true; do sleep 0.1; done"
    )
    env = dict(os.environ, TALLY_STATE_DIR=str(state))
    p = subprocess.Popen(
        [TALLY, "gateway", "--agent", AGENT, "--", "sh", "-c", script],
        env=env,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    # The signal must reach the server after its trap is set, however
    # loaded the machine is.
    deadline = time.time() + 60
    while not ready.exists() and time.time() < deadline:
        time.sleep(0.05)
    assert ready.exists(), "the server never started"
    p.send_signal(signal.SIGTERM)
    code = p.wait(timeout=30)
    assert marker.read_text().strip() == "term"
    assert code == 7

    failing = subprocess.run(
        [TALLY, "gateway", "--agent", AGENT, "--", "sh", "-c", "echo oops >&2; exit 3"],
        env=env,
        input=b"",
        capture_output=True,
        timeout=30,
    )
    assert failing.returncode == 3
    assert b"oops" in failing.stderr


def test_bytes_are_forwarded_unchanged(state: Path, tmp_path: Path) -> None:
    # `cat` as the "server" echoes what it receives: odd spacing, key order
    # and unicode escapes come back byte for byte.
    env = dict(os.environ, TALLY_STATE_DIR=str(state))
    lines = [
        b'{ "jsonrpc":"2.0",  "method":"notifications/initialized" }\n',
        b'{"id":"x\\u0041","jsonrpc":"2.0","method":"ping","params":{"z":1,"a":[1.50,2e3]}}\n',
        b"not json at all\n",
    ]
    out = subprocess.run(
        [TALLY, "gateway", "--agent", AGENT, "--", "cat"],
        env=env,
        input=b"".join(lines),
        capture_output=True,
        timeout=30,
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout == b"".join(lines)


# ---- with a real witness: runs once `tally serve` exists ----


def serve_available() -> bool:
    try:
        return subprocess.run([TALLY, "serve", "--help"], capture_output=True, timeout=30).returncode == 0
    except (OSError, subprocess.SubprocessError):
        return False


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.skipif(not serve_available(), reason="`tally serve` (the witness) is not built")
def test_sync_to_a_real_witness_and_verify_the_pack(state: Path, tmp_path: Path) -> None:
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    data = tmp_path / "witness"
    env = {k: v for k, v in os.environ.items() if k not in ("TALLY_API_KEY", "TALLY_WITNESS_URL")}
    serve = subprocess.Popen(
        [TALLY, "serve", "--listen", f"127.0.0.1:{port}", "--data-dir", str(data)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        env=env,
    )
    try:
        deadline = time.time() + 60
        while time.time() < deadline:
            with socket.socket() as s:
                if s.connect_ex(("127.0.0.1", port)) == 0:
                    break
            time.sleep(0.2)
        created = subprocess.run(
            [TALLY, "project", "create", "e2e", "--witness", url, "--data-dir", str(data)],
            capture_output=True, text=True, timeout=60, env=env,
        )
        assert created.returncode == 0, created.stderr
        api_key = next(w for w in created.stdout.split() if w.startswith("tally_"))
        public_key = tally(state, "agent", "init", AGENT).stdout.split("public key:")[1].split()[0]
        added = subprocess.run(
            [TALLY, "agent", "add", AGENT, "--public-key", public_key, "--witness", url, "--api-key", api_key],
            capture_output=True, text=True, timeout=60, env=env,
        )
        assert added.returncode == 0, added.stderr
        pinned = tally(state, "agent", "init", AGENT, "--witness", url, "--api-key", api_key).stdout
        vkey = pinned.strip().splitlines()[-1].strip()
        assert vkey.startswith("tally.local/log/")

        async def session() -> None:
            async with stdio_client(gateway_params(state, ["node", SERVER, "stdio"], "--strict")) as (r, w):
                async with ClientSession(r, w) as s:
                    await s.initialize()
                    await s.list_tools()
                    assert not (await s.call_tool("echo", {"message": "witnessed"})).is_error
                    assert not (await s.call_tool("get-sum", {"a": 1, "b": 2})).is_error

        anyio.run(session)
        synced = tally(state, "agent", "sync", AGENT, check=False)
        assert synced.returncode == 0, synced.stdout + synced.stderr
        entries = chain(state)
        check_links(entries)
        assert entries and all(e["receipted"] for e in entries)

        pack = tmp_path / "pack.jsonl"
        keys = tmp_path / "agent-keys.json"
        for cmd in (
            ["export", "--agent", AGENT, "-o", str(pack)],
            ["keys", "export", "--agent", AGENT, "-o", str(keys)],
        ):
            done = subprocess.run([TALLY, *cmd, "--witness", url, "--api-key", api_key], capture_output=True, text=True, timeout=60, env=env)
            assert done.returncode == 0, done.stderr
        verify = subprocess.run(
            [TALLY, "verify", str(pack), "--agent-keys", str(keys), "--witness-key", vkey],
            capture_output=True, text=True, timeout=120,
        )
        assert verify.returncode == 0, verify.stdout + verify.stderr
        assert "PASS" in verify.stdout
        n_tools = len(next(e for e in entries if e["record"]["kind"] == "tools")["record"]["body"]["tools"])
        assert f"coverage: {AGENT}: all {n_tools} declared tools are recorded" in verify.stdout, verify.stdout
    finally:
        serve.send_signal(signal.SIGTERM)
        serve.wait(timeout=60)


def test_tally_record_for_scripts(state: Path) -> None:
    d = json.loads(tally(state, "record", "decision", "--agent", AGENT, "--tool", "refund", "--input", '{"order": 7}').stdout)
    assert d["kind"] == "decision" and d["receipt"] == "no_witness"
    o = json.loads(
        tally(state, "record", "outcome", "--agent", AGENT, "--call-id", d["call_id"], "--status", "ok", "--output", '{"done": true}').stdout
    )
    n = json.loads(tally(state, "record", "note", "--agent", AGENT, "checked by hand").stdout)
    entries = chain(state)
    check_links(entries)
    assert [e["record"]["kind"] for e in entries] == ["decision", "outcome", "note"]
    assert entries[1]["record"]["body"]["decision"] == d["hash"] == entries[0]["hash"]
    assert o["seq"] == 1 and n["seq"] == 2
    # No open decision with that call id any more.
    again = tally(state, "record", "outcome", "--agent", AGENT, "--call-id", d["call_id"], "--status", "ok", check=False)
    assert again.returncode == 2 and "no open decision" in again.stderr
    # Bad input is refused with exit 2, never a crash.
    bad = tally(state, "record", "decision", "--agent", AGENT, "--tool", "x", "--input", '{"a":1,"a":2}', check=False)
    assert bad.returncode == 2 and "duplicate" in bad.stderr
