"""Several writers of one agent's chain, through the real binary.

An MCP host starts one gateway per configured server, all for one agent. The
official MCP Python SDK drives three `tally gateway` processes of one agent
at once, each in front of its own server: server-everything over stdio,
server-everything over Streamable HTTP, and a small server of this test's own
(the SDK's MCPServer, over stdio). The first gateway to start holds the
agent's chain; the others hand it their records (gateway/src/chain/).
"""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import anyio
from mcp import ClientSession, StdioServerParameters
from mcp.client.stdio import stdio_client
from mcp.client.streamable_http import streamable_http_client

from test_gateway import AGENT, SERVER, TALLY, chain, check_links, outcomes_by_decision, tally
from test_gateway_http import Gateway, Upstream, start_witness

OWN_SERVER = """
from mcp.server.mcpserver import MCPServer

mcp = MCPServer("own")


@mcp.tool()
def add(a: int, b: int) -> int:
    return a + b


@mcp.tool()
def search(q: str) -> str:
    return "found " + q


mcp.run()
"""


def stdio_gateway(state: Path, *extra: str) -> StdioServerParameters:
    cmd = [TALLY, "gateway", "--agent", AGENT, *extra]
    env = dict(os.environ, TALLY_STATE_DIR=str(state))
    return StdioServerParameters(command=cmd[0], args=cmd[1:], env=env)


def own_server(tmp_path: Path) -> list[str]:
    path = tmp_path / "own_server.py"
    path.write_text(OWN_SERVER)
    return [sys.executable, str(path)]


def writers(state: Path) -> list[dict]:
    out = tally(state, "status", "--agent", AGENT, "--json").stdout
    return json.loads(out)["agents"][0].get("writers", [])


def registered(state: Path, tmp_path: Path):
    """A real witness with the agent registered and its log key pinned."""
    serve, url, api_key, env = start_witness(tmp_path)
    public_key = tally(state, "agent", "init", AGENT).stdout.split("public key:")[1].split()[0]
    added = subprocess.run(
        [TALLY, "agent", "add", AGENT, "--public-key", public_key, "--witness", url, "--api-key", api_key],
        capture_output=True, text=True, timeout=60, env=env,
    )
    assert added.returncode == 0, added.stderr
    pinned = tally(state, "agent", "init", AGENT, "--witness", url, "--api-key", api_key).stdout
    vkey = pinned.strip().splitlines()[-1].strip()
    return serve, url, api_key, env, vkey


def export_and_verify(state: Path, tmp_path: Path, url: str, api_key: str, env: dict, vkey: str) -> str:
    synced = tally(state, "agent", "sync", AGENT, check=False)
    assert synced.returncode == 0, synced.stdout + synced.stderr
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
    return verify.stdout


def test_three_gateways_of_one_agent_answer_every_call_into_one_chain(tmp_path: Path) -> None:
    state = tmp_path / "state"
    serve, url, api_key, env, vkey = registered(state, tmp_path)
    upstream = Upstream()
    web = None
    try:
        web = Gateway(state, upstream.url, "--name-prefix", "web.")
        results: dict[str, list] = {"every": [], "web": [], "own": []}
        listed: dict[str, list[str]] = {}

        async def every() -> None:
            params = stdio_gateway(state, "--name-prefix", "every.", "--", "node", SERVER, "stdio")
            async with stdio_client(params) as (r, w):
                async with ClientSession(r, w) as s:
                    await s.initialize()
                    listed["every"] = sorted(t.name for t in (await s.list_tools()).tools)
                    for i in range(20):
                        res = await s.call_tool("echo", {"message": f"every {i}"})
                        results["every"].append(res.is_error)

        async def over_http() -> None:
            async with streamable_http_client(web.url) as (r, w):
                async with ClientSession(r, w) as s:
                    await s.initialize()
                    listed["web"] = sorted(t.name for t in (await s.list_tools()).tools)
                    for i in range(20):
                        res = await s.call_tool("get-sum", {"a": i, "b": 1})
                        results["web"].append(res.is_error)

        async def own() -> None:
            params = stdio_gateway(state, "--name-prefix", "own.", "--", *own_server(tmp_path))
            async with stdio_client(params) as (r, w):
                async with ClientSession(r, w) as s:
                    await s.initialize()
                    listed["own"] = sorted(t.name for t in (await s.list_tools()).tools)
                    for i in range(20):
                        res = await s.call_tool("add", {"a": i, "b": 2})
                        results["own"].append(res.is_error)

        async def all_three() -> None:
            with anyio.fail_after(120):
                async with anyio.create_task_group() as tg:
                    tg.start_soon(every)
                    tg.start_soon(over_http)
                    tg.start_soon(own)

        anyio.run(all_three)
        assert web.stop() == 0, "".join(web.stderr)
        web = None
        # Every call was answered, none refused.
        assert {k: (len(v), any(v)) for k, v in results.items()} == {
            "every": (20, False), "web": (20, False), "own": (20, False)
        }, results

        entries = chain(state)
        check_links(entries)
        decisions = [e["record"]["body"] for e in entries if e["record"]["kind"] == "decision"]
        by_tool: dict[str, int] = {}
        for d in decisions:
            by_tool[d["tool"]] = by_tool.get(d["tool"], 0) + 1
        assert by_tool == {"every.echo": 20, "web.get-sum": 20, "own.add": 20}, by_tool
        # Each decision has its one outcome, ok.
        outcomes = outcomes_by_decision(entries)
        for e in entries:
            if e["record"]["kind"] == "decision":
                assert [o["status"] for o in outcomes[e["hash"]]] == ["ok"]
        sources = {
            e["record"]["body"].get("source")
            for e in entries
            if e["record"]["kind"] == "tools"
        }
        assert sources == {"every.", "web.", "own."}, sources

        out = export_and_verify(state, tmp_path, url, api_key, env, vkey)
        assert "PASS" in out, out
        n = len(listed["every"]) + len(listed["web"]) + len(listed["own"])
        assert f"coverage: {AGENT}: all {n} declared tools are recorded" in out, out
        for source, names in listed.items():
            assert f"coverage: {AGENT}: tool source {source}.: {len(names)} tools, declared at seq" in out, out
    finally:
        if web is not None:
            web.stop()
        upstream.kill()
        serve.send_signal(signal.SIGTERM)
        serve.wait(timeout=60)


def test_kill_9_of_the_gateway_holding_the_chain_mid_call_stalls_no_other(tmp_path: Path) -> None:
    state = tmp_path / "state"
    tally(state, "agent", "init", AGENT)
    upstream = Upstream()
    victim = Gateway(state, upstream.url, "--name-prefix", "victim.")
    other = None
    try:
        # The first gateway holds the chain.
        holders = [w for w in writers(state) if w["owner"]]
        assert [w["pid"] for w in holders] == [victim.p.pid], writers(state)
        other = Gateway(state, upstream.url, "--name-prefix", "other.")
        durations: list[float] = []
        seen: dict = {}

        async def victim_call() -> None:
            async with streamable_http_client(victim.url) as (r, w):
                async with ClientSession(r, w) as s:
                    await s.initialize()
                    first = anyio.Event()

                    async def on_progress(p: float, total: float | None, message: str | None) -> None:
                        first.set()

                    async def kill_at_first_progress() -> None:
                        await first.wait()
                        victim.p.kill()
                        seen["killed"] = time.monotonic()

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

        async def stdio_calls() -> None:
            params = stdio_gateway(state, "--name-prefix", "own.", "--", *own_server(tmp_path))
            async with stdio_client(params) as (r, w):
                async with ClientSession(r, w) as s:
                    await s.initialize()
                    await s.list_tools()
                    end = time.monotonic() + 6
                    i = 0
                    while time.monotonic() < end or "killed" not in seen:
                        t0 = time.monotonic()
                        res = await s.call_tool("add", {"a": i, "b": 1})
                        durations.append(time.monotonic() - t0)
                        assert not res.is_error, res
                        i += 1
                        await anyio.sleep(0.02)

        async def http_calls() -> None:
            async with streamable_http_client(other.url) as (r, w):
                async with ClientSession(r, w) as s:
                    await s.initialize()
                    end = time.monotonic() + 6
                    i = 0
                    while time.monotonic() < end or "killed" not in seen:
                        t0 = time.monotonic()
                        res = await s.call_tool("echo", {"message": f"m{i}"})
                        durations.append(time.monotonic() - t0)
                        assert not res.is_error, res
                        i += 1
                        await anyio.sleep(0.02)

        async def all_at_once() -> None:
            with anyio.fail_after(120):
                async with anyio.create_task_group() as tg:
                    tg.start_soon(stdio_calls)
                    tg.start_soon(http_calls)
                    await anyio.sleep(0.5)
                    tg.start_soon(victim_call)

        try:
            anyio.run(all_at_once)
        except BaseException:
            if "killed" not in seen:
                raise
        assert victim.p.wait(timeout=30) == -signal.SIGKILL
        # The others went on: no call waited a second, the hand-over included.
        assert len(durations) > 50, len(durations)
        assert max(durations) < 1.0, sorted(durations)[-5:]

        # Restarted, the killed gateway joins the same chain.
        victim = Gateway(state, upstream.url, "--name-prefix", "victim.")

        async def again() -> None:
            async with streamable_http_client(victim.url) as (r, w):
                async with ClientSession(r, w) as s:
                    await s.initialize()
                    res = await s.call_tool("echo", {"message": "back"})
                    assert not res.is_error

        anyio.run(again)
        assert victim.stop() == 0
        assert other.stop() == 0
        other = None
        entries = chain(state)
        check_links(entries)
        decisions = [e for e in entries if e["record"]["kind"] == "decision"]
        tools = [d["record"]["body"]["tool"] for d in decisions]
        # The killed gateway's decision is in the chain; it has no outcome.
        killed = [d for d in decisions if d["record"]["body"]["tool"] == "victim.trigger-long-running-operation"]
        assert len(killed) == 1, tools
        assert killed[0]["hash"] not in outcomes_by_decision(entries)
        assert tools.count("victim.echo") == 1
        assert tools.count("own.add") + tools.count("other.echo") == len(durations)
    finally:
        for g in (victim, other):
            if g is not None and g.p.poll() is None:
                g.p.kill()
        upstream.kill()


def test_a_source_that_stops_drops_out_of_coverage(tmp_path: Path) -> None:
    state = tmp_path / "state"
    serve, url, api_key, env, vkey = registered(state, tmp_path)
    try:
        async def session(prefix: str, lease: str, calls: int, pause: float) -> None:
            params = stdio_gateway(
                state, "--name-prefix", prefix, "--source-lease", lease, "--", *own_server(tmp_path)
            )
            async with stdio_client(params) as (r, w):
                async with ClientSession(r, w) as s:
                    await s.initialize()
                    await s.list_tools()
                    for i in range(calls):
                        await s.call_tool("add", {"a": i, "b": 1})
                        await anyio.sleep(pause)

        async def both() -> None:
            async with anyio.create_task_group() as tg:
                # "brief." lasts a second with a lease of one; "steady."
                # calls for four seconds more, past the lease.
                tg.start_soon(session, "brief.", "1", 2, 0.1)
                tg.start_soon(session, "steady.", "86400", 20, 0.25)

        anyio.run(both)
        out = export_and_verify(state, tmp_path, url, api_key, env, vkey)
        assert "PASS" in out, out
        # Only the live source's two tools count; the calls to the source
        # that dropped out were declared when made.
        assert f"coverage: {AGENT}: all 2 declared tools are recorded" in out, out
        assert f"coverage: {AGENT}: tool source brief. dropped out" in out, out
        assert f"coverage: {AGENT}: tool source steady.: 2 tools" in out, out
        assert "not in the declared tool list" not in out, out
    finally:
        serve.send_signal(signal.SIGTERM)
        serve.wait(timeout=60)


def test_bad_prefixes_and_clashing_sources_are_clear_errors(tmp_path: Path) -> None:
    state = tmp_path / "state"
    tally(state, "agent", "init", AGENT)
    env = dict(os.environ, TALLY_STATE_DIR=str(state))
    bad = subprocess.run(
        [TALLY, "gateway", "--agent", AGENT, "--name-prefix", "a\tb", "--", "true"],
        capture_output=True, text=True, timeout=60, env=env,
    )
    assert bad.returncode == 2, bad.stderr
    assert "--name-prefix" in bad.stderr and "control character" in bad.stderr, bad.stderr
    result: dict = {}

    async def long_prefix() -> None:
        # 250 bytes of prefix make "get-sum" (7 bytes) a 257-byte name.
        params = stdio_gateway(state, "--name-prefix", "p" * 250, "--", "node", SERVER, "stdio")
        async with stdio_client(params) as (r, w):
            async with ClientSession(r, w) as s:
                await s.initialize()
                await s.list_tools()
                res = await s.call_tool("echo", {"message": "fits"})
                result["short"] = res.is_error
                try:
                    res = await s.call_tool("get-sum", {"a": 1, "b": 2})
                    result["long"] = ("result", res.is_error)
                except Exception as e:
                    result["long"] = ("error", str(e))

    anyio.run(long_prefix)
    assert result["short"] is False
    kind, detail = result["long"]
    assert kind == "error" and "not forwarded" in detail and "body.tool" in detail, result

    async def clash() -> None:
        one = stdio_gateway(state, "--source", "s1", "--name-prefix", "x.", "--", *own_server(tmp_path))
        two = stdio_gateway(state, "--source", "s2", "--name-prefix", "x.", "--", *own_server(tmp_path))
        async with stdio_client(one) as (r1, w1), stdio_client(two, errlog=errlog) as (r2, w2):
            async with ClientSession(r1, w1) as s1, ClientSession(r2, w2) as s2:
                await s1.initialize()
                await s1.list_tools()
                await anyio.sleep(0.5)
                await s2.initialize()
                await s2.list_tools()
                await anyio.sleep(0.5)

    errpath = tmp_path / "two.err"
    with open(errpath, "w") as errlog:
        anyio.run(clash)
    err = errpath.read_text()
    assert "tool_name_conflict" in err or "is also declared by the agent's source" in err, err
    entries = chain(state)
    check_links(entries)
    lists = [e["record"]["body"] for e in entries if e["record"]["kind"] == "tools"]
    # The long-prefixed list and s1's: s2's clashing list was not written.
    assert [t.get("source") for t in lists].count("s2") == 0, lists
    assert [t.get("source") for t in lists].count("s1") == 1, lists
