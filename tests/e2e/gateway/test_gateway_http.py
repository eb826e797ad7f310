"""End-to-end tests of `tally gateway --upstream URL` (MCP Streamable HTTP).

The official MCP Python SDK's Streamable HTTP client drives the real
`tally gateway` in front of `@modelcontextprotocol/server-everything` in its
Streamable HTTP mode (both pinned, see run.sh); a real `tally serve` witnesses
the records and `tally verify` checks the exported pack. The tests read the
agent's chain with `tally status --json --records`.
"""

import json
import os
import signal
import socket
import ssl
import subprocess
import threading
import time
from pathlib import Path

import anyio
import httpx2
import pytest
from mcp import ClientSession, StdioServerParameters
from mcp.client.stdio import stdio_client
from mcp.client.streamable_http import streamable_http_client

from test_gateway import AGENT, SERVER, TALLY, chain, check_links, outcomes_by_decision, tally

ROOT = Path(__file__).resolve().parents[3]
TLS = ROOT / "testdata" / "tls"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_port(port: int, timeout: float = 60) -> None:
    deadline = time.time() + timeout
    while time.time() < deadline:
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.1)
    raise AssertionError(f"nothing listens on {port}")


class Upstream:
    """server-everything in Streamable HTTP mode on a free port."""

    def __init__(self) -> None:
        self.port = free_port()
        self.p = subprocess.Popen(
            ["node", SERVER, "streamableHttp"],
            env=dict(os.environ, PORT=str(self.port)),
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        wait_port(self.port)
        self.url = f"http://127.0.0.1:{self.port}/mcp"

    def kill(self) -> None:
        if self.p.poll() is None:
            self.p.kill()
        self.p.wait(timeout=30)


class Gateway:
    """`tally gateway --upstream` on a free port; stderr is kept."""

    def __init__(self, state: Path, upstream: str, *extra: str) -> None:
        env = dict(os.environ, TALLY_STATE_DIR=str(state))
        self.p = subprocess.Popen(
            [TALLY, "gateway", "--agent", AGENT, "--upstream", upstream, "--listen", "127.0.0.1:0", *extra],
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )
        self.stderr: list[str] = []
        assert self.p.stderr is not None
        for line in self.p.stderr:
            self.stderr.append(line)
            if "listening on" in line:
                self.url = line.split("listening on ")[1].split(",")[0].strip()
                break
        else:
            raise AssertionError(f"the gateway did not start: {''.join(self.stderr)}")
        self.reader = threading.Thread(target=self._drain, daemon=True)
        self.reader.start()

    def _drain(self) -> None:
        assert self.p.stderr is not None
        for line in self.p.stderr:
            self.stderr.append(line)

    def stop(self) -> int:
        if self.p.poll() is None:
            self.p.send_signal(signal.SIGTERM)
        code = self.p.wait(timeout=60)
        self.reader.join(timeout=10)
        return code


@pytest.fixture()
def state(tmp_path: Path) -> Path:
    s = tmp_path / "state"
    tally(s, "agent", "init", AGENT)
    return s


@pytest.fixture()
def upstream():
    u = Upstream()
    yield u
    u.kill()


def decided(entries: list[dict]) -> list[tuple[str, str]]:
    """(tool, outcome status) per decision, in chain order; one outcome each."""
    outcomes = outcomes_by_decision(entries)
    got = []
    for e in entries:
        if e["record"]["kind"] != "decision":
            continue
        outs = outcomes.get(e["hash"], [])
        assert len(outs) == 1, f"decision {e['record']['body']} has outcomes {outs}"
        assert outs[0]["call_id"] == e["record"]["body"]["call_id"]
        got.append((e["record"]["body"]["tool"], outs[0]["status"]))
    return got


async def the_calls(s: ClientSession, seen: dict) -> None:
    """The same session over either transport: list, call, stream progress, cancel."""
    await s.initialize()
    listed = await s.list_tools()
    seen["tools"] = sorted(t.name for t in listed.tools)
    ok = await s.call_tool("echo", {"message": "hello over http"})
    assert not ok.is_error and "hello over http" in ok.content[0].text
    total = await s.call_tool("get-sum", {"a": 2, "b": 3})
    assert "5" in total.content[0].text
    bad = await s.call_tool("get-sum", {"a": "not a number"})
    assert bad.is_error
    progress: list[float] = []

    async def on_progress(p: float, total: float | None, message: str | None) -> None:
        progress.append(p)

    done = await s.call_tool(
        "trigger-long-running-operation", {"duration": 2, "steps": 4}, progress_callback=on_progress
    )
    assert not done.is_error
    seen["progress"] = progress
    # Abandoning a call makes the SDK send notifications/cancelled.
    with anyio.move_on_after(1.5) as scope:
        await s.call_tool("trigger-long-running-operation", {"duration": 30, "steps": 3})
    assert scope.cancelled_caught


EXPECTED = [
    ("echo", "ok"),
    ("get-sum", "ok"),
    ("get-sum", "error"),
    ("trigger-long-running-operation", "ok"),
    ("trigger-long-running-operation", "cancelled"),
]


def start_witness(tmp_path: Path):
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
    wait_port(port)
    created = subprocess.run(
        [TALLY, "project", "create", "e2e", "--witness", url, "--data-dir", str(data)],
        capture_output=True, text=True, timeout=60, env=env,
    )
    assert created.returncode == 0, created.stderr
    api_key = next(w for w in created.stdout.split() if w.startswith("tally_"))
    return serve, url, api_key, env


def test_sdk_over_http_through_the_gateway_is_recorded_witnessed_and_verifies(
    state: Path, tmp_path: Path, upstream: Upstream
) -> None:
    serve, url, api_key, env = start_witness(tmp_path)
    try:
        public_key = tally(state, "agent", "init", AGENT).stdout.split("public key:")[1].split()[0]
        added = subprocess.run(
            [TALLY, "agent", "add", AGENT, "--public-key", public_key, "--witness", url, "--api-key", api_key],
            capture_output=True, text=True, timeout=60, env=env,
        )
        assert added.returncode == 0, added.stderr
        pinned = tally(state, "agent", "init", AGENT, "--witness", url, "--api-key", api_key).stdout
        vkey = pinned.strip().splitlines()[-1].strip()

        gw = Gateway(state, upstream.url)
        seen: dict = {}

        async def session() -> None:
            # Leaving the block ends the session: the SDK sends DELETE.
            async with streamable_http_client(gw.url) as (r, w):
                async with ClientSession(r, w) as s:
                    await the_calls(s, seen)

        anyio.run(session)
        assert gw.stop() == 0, "".join(gw.stderr)
        assert len(seen["tools"]) == 13
        assert len(seen["progress"]) >= 2, seen

        entries = chain(state)
        check_links(entries)
        assert decided(entries) == EXPECTED
        tools = [e["record"]["body"] for e in entries if e["record"]["kind"] == "tools"]
        assert sorted(t["name"] for t in tools[-1]["tools"]) == seen["tools"]
        assert "hello over http" not in json.dumps(entries)

        synced = tally(state, "agent", "sync", AGENT, check=False)
        assert synced.returncode == 0, synced.stdout + synced.stderr
        assert all(e["receipted"] for e in chain(state))
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
        assert f"coverage: {AGENT}: all 13 declared tools are recorded" in verify.stdout, verify.stdout
    finally:
        serve.send_signal(signal.SIGTERM)
        serve.wait(timeout=60)


def comparable(entries: list[dict]) -> list[tuple]:
    """What must be equal over stdio and HTTP: kinds, tools, call ids,
    statuses, whether there is an output, and the tool list's digests."""
    out = []
    for e in entries:
        r = e["record"]
        b = r["body"]
        if r["kind"] == "tools":
            out.append(("tools", tuple((t["name"], t["recorded"], t["digest"]) for t in b["tools"])))
        elif r["kind"] == "decision":
            out.append(("decision", b["call_id"], b["tool"]))
        else:
            out.append((r["kind"], b.get("call_id"), b.get("status"), "output_hash" in b))
    return out


def test_the_same_calls_make_the_same_records_over_stdio_and_http(tmp_path: Path, upstream: Upstream) -> None:
    over_stdio = tmp_path / "stdio"
    over_http = tmp_path / "http"
    for s in (over_stdio, over_http):
        tally(s, "agent", "init", AGENT)

    async def via_stdio() -> None:
        params = StdioServerParameters(
            command=TALLY,
            args=["gateway", "--agent", AGENT, "--", "node", SERVER, "stdio"],
            env=dict(os.environ, TALLY_STATE_DIR=str(over_stdio)),
        )
        async with stdio_client(params) as (r, w):
            async with ClientSession(r, w) as s:
                await the_calls(s, {})

    gw = Gateway(over_http, upstream.url)

    async def via_http() -> None:
        async with streamable_http_client(gw.url) as (r, w):
            async with ClientSession(r, w) as s:
                await the_calls(s, {})

    anyio.run(via_stdio)
    anyio.run(via_http)
    gw.stop()
    a, b = chain(over_stdio), chain(over_http)
    check_links(a)
    check_links(b)
    assert decided(a) == EXPECTED
    assert comparable(a) == comparable(b)


def test_concurrent_sessions_with_the_same_request_ids_keep_their_calls_apart(
    state: Path, upstream: Upstream
) -> None:
    gw = Gateway(state, upstream.url, "--store-content")
    results: dict = {}

    async def one(name: str, delay: float) -> None:
        async with streamable_http_client(gw.url) as (r, w):
            async with ClientSession(r, w) as s:
                await s.initialize()
                # Both sessions number their requests alike: ids collide.
                await anyio.sleep(delay)
                long = await s.call_tool("trigger-long-running-operation", {"duration": 1, "steps": 2})
                echo = await s.call_tool("echo", {"message": f"from {name}"})
                results[name] = (long.is_error, echo.content[0].text)

    async def both() -> None:
        async with anyio.create_task_group() as tg:
            tg.start_soon(one, "A", 0.0)
            tg.start_soon(one, "B", 0.3)

    anyio.run(both)
    gw.stop()
    assert results["A"] == (False, "Echo: from A") and results["B"] == (False, "Echo: from B"), results
    entries = chain(state)
    check_links(entries)
    decisions = [e for e in entries if e["record"]["kind"] == "decision"]
    call_ids = [d["record"]["body"]["call_id"] for d in decisions]
    assert len(call_ids) == 4 and len(set(call_ids)) == 2, call_ids
    outcomes = {e["record"]["body"]["decision"]: e for e in entries if e["record"]["kind"] == "outcome"}
    for d in decisions:
        o = outcomes[d["hash"]]
        assert o["record"]["body"]["status"] == "ok"
        sent = d["secret"]["content"]
        got = json.dumps(o["secret"]["content"])
        if d["record"]["body"]["tool"] == "echo":
            # Each echo's outcome holds its own session's answer.
            assert f"Echo: {sent['message']}" in got, (sent, got)


def test_kill_9_of_the_gateway_mid_call_keeps_the_decision(state: Path, upstream: Upstream) -> None:
    gw = Gateway(state, upstream.url)
    seen: dict = {}

    async def session() -> None:
        async with streamable_http_client(gw.url) as (r, w):
            async with ClientSession(r, w) as s:
                await s.initialize()
                first = anyio.Event()

                async def on_progress(p: float, total: float | None, message: str | None) -> None:
                    first.set()

                async def kill_at_first_progress() -> None:
                    await first.wait()
                    gw.p.kill()
                    seen["killed"] = True

                async with anyio.create_task_group() as tg:
                    tg.start_soon(kill_at_first_progress)
                    try:
                        with anyio.fail_after(30):
                            await s.call_tool(
                                "trigger-long-running-operation", {"duration": 20, "steps": 20},
                                progress_callback=on_progress,
                            )
                    except Exception as e:  # the connection to the gateway is gone
                        seen["error"] = repr(e)

    try:
        anyio.run(session)
    except BaseException:
        if not seen.get("killed"):
            raise
    assert gw.p.wait(timeout=30) == -signal.SIGKILL
    entries = chain(state)
    check_links(entries)
    decisions = [e["record"]["body"] for e in entries if e["record"]["kind"] == "decision"]
    assert [d["tool"] for d in decisions] == ["trigger-long-running-operation"]


def test_an_upstream_that_dies_mid_stream_ends_the_call_server_exited(state: Path, upstream: Upstream) -> None:
    gw = Gateway(state, upstream.url)
    seen: dict = {}

    async def session() -> None:
        async with streamable_http_client(gw.url) as (r, w):
            async with ClientSession(r, w) as s:
                await s.initialize()
                await s.call_tool("echo", {"message": "before"})
                first = anyio.Event()

                async def on_progress(p: float, total: float | None, message: str | None) -> None:
                    first.set()

                async def kill_at_first_progress() -> None:
                    await first.wait()
                    upstream.kill()

                async with anyio.create_task_group() as tg:
                    tg.start_soon(kill_at_first_progress)
                    try:
                        with anyio.fail_after(60):
                            await s.call_tool(
                                "trigger-long-running-operation", {"duration": 20, "steps": 20},
                                progress_callback=on_progress,
                            )
                        seen["call"] = "answered"
                    except Exception as e:
                        seen["call"] = repr(e)

    try:
        anyio.run(session)
    except BaseException:
        if "call" not in seen:
            raise
    assert seen["call"] != "answered", seen
    assert gw.stop() == 0
    entries = chain(state)
    check_links(entries)
    assert decided(entries) == [("echo", "ok"), ("trigger-long-running-operation", "server_exited")]


def test_https_listener_and_a_clear_error_for_an_upstream_that_is_not_mcp(
    state: Path, tmp_path: Path, upstream: Upstream
) -> None:
    gw = Gateway(
        state, upstream.url, "--tls-cert", str(TLS / "server.pem"), "--tls-key", str(TLS / "server.key")
    )
    assert gw.url.startswith("https://127.0.0.1:")

    async def session() -> None:
        trust = ssl.create_default_context(cafile=str(TLS / "ca.pem"))
        async with httpx2.AsyncClient(verify=trust, timeout=30) as http:
            async with streamable_http_client(gw.url, http_client=http) as (r, w):
                async with ClientSession(r, w) as s:
                    await s.initialize()
                    res = await s.call_tool("echo", {"message": "over tls"})
                    assert "over tls" in res.content[0].text

    anyio.run(session)
    gw.stop()
    assert decided(chain(state)) == [("echo", "ok")]

    # A web server that is not an MCP endpoint: the gateway says so and exits 2.
    (tmp_path / "site").mkdir()
    port = free_port()
    web = subprocess.Popen(
        ["python3", "-m", "http.server", str(port), "--bind", "127.0.0.1", "--directory", str(tmp_path / "site")],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        wait_port(port)
        env = dict(os.environ, TALLY_STATE_DIR=str(state))
        out = subprocess.run(
            [TALLY, "gateway", "--agent", AGENT, "--upstream", f"http://127.0.0.1:{port}/mcp", "--listen", "127.0.0.1:0"],
            env=env, capture_output=True, text=True, timeout=60,
        )
        assert out.returncode == 2, out.stderr
        assert "not an MCP endpoint" in out.stderr, out.stderr
        # And one that is not there at all.
        web.kill()
        web.wait(timeout=30)
        out = subprocess.run(
            [TALLY, "gateway", "--agent", AGENT, "--upstream", f"http://127.0.0.1:{port}/mcp", "--listen", "127.0.0.1:0"],
            env=env, capture_output=True, text=True, timeout=60,
        )
        assert out.returncode == 2 and "cannot reach it" in out.stderr, out.stderr
    finally:
        if web.poll() is None:
            web.kill()
            web.wait(timeout=30)
