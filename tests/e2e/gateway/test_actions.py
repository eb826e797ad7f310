"""End-to-end tests of the gateway's action tools (docs/protocol.md §5.2
"Action outcomes"): `tally gateway --action TOOL=PATH` reads each call's
proof from the structured result. The official MCP Python SDK client drives
two gateways of one agent over stdio, one in front of a small server of the
test's own whose `send_email` returns a message id (mail_server.py), one in
front of server-everything; a real `tally serve` witnesses the records and
`tally verify` states the action calls of the exported pack. Over
Streamable HTTP the same flags give the same states."""

import hashlib
import json
import signal
import subprocess
import sys
from pathlib import Path

import anyio
import pytest
from mcp import ClientSession
from mcp.client.stdio import stdio_client

from test_gateway import AGENT, SERVER, TALLY, chain, check_links, gateway_params, outcomes_by_decision, state, tally  # noqa: F401 (state: a fixture)
from mcp.client.streamable_http import streamable_http_client
from test_gateway_http import Gateway, Upstream, start_witness

MAIL = [sys.executable, str(Path(__file__).resolve().parent / "mail_server.py")]


def actions(entries: list[dict]) -> list[tuple[str, str, str | None, bool, str | None]]:
    """(tool, status, state, has proof_hash, proof) per decision, in chain order."""
    outcomes = outcomes_by_decision(entries)
    out = []
    for e in entries:
        if e["record"]["kind"] == "decision":
            [o] = outcomes[e["hash"]]
            out.append((e["record"]["body"]["tool"], o["status"], o.get("state"), "proof_hash" in o, o.get("proof")))
    return out


async def calls(params, script) -> None:
    async with stdio_client(params) as (r, w):
        async with ClientSession(r, w) as s:
            await s.initialize()
            await s.list_tools()
            await script(s)


async def mail_calls(s: ClientSession) -> None:
    sent = await s.call_tool("send_email", {"to": "ann@example.com", "body": "hello"})
    assert not sent.is_error and sent.structured_content["message_id"] == "<5.ann@example.com@mail.example.com>"
    queued = await s.call_tool("send_email", {"to": "bob@later.example.com"})
    assert not queued.is_error and queued.structured_content["message_id"] is None
    refused = await s.call_tool("send_email", {"to": "bounce@example.com"})
    assert refused.is_error
    assert not (await s.call_tool("lookup", {"to": "ann@example.com"})).is_error


async def everything_calls(s: ClientSession) -> None:
    weather = await s.call_tool("get-structured-content", {"location": "New York"})
    assert weather.structured_content["temperature"] == 33
    assert not (await s.call_tool("echo", {"message": "sent"})).is_error


def test_action_outcomes_resolve_from_the_structured_result_and_verify(state: Path, tmp_path: Path) -> None:
    serve, url, api_key, env = start_witness(tmp_path)
    try:
        public_key = tally(state, "agent", "init", AGENT).stdout.split("public key:")[1].split()[0]
        added = subprocess.run(
            [TALLY, "agent", "add", AGENT, "--public-key", public_key, "--witness", url, "--api-key", api_key],
            capture_output=True, text=True, timeout=60, env=env,
        )
        assert added.returncode == 0, added.stderr
        vkey = tally(state, "agent", "init", AGENT, "--witness", url, "--api-key", api_key).stdout.strip().splitlines()[-1].strip()

        mail = gateway_params(state, MAIL, "--source", "mail", "--action", "send_email=message_id")
        anyio.run(calls, mail, mail_calls)
        everything = gateway_params(
            state, ["node", SERVER, "stdio"], "--source", "everything",
            "--action", "get-structured-content=$.temperature", "--action", "echo", "--proof-in-clear",
        )
        anyio.run(calls, everything, everything_calls)

        entries = chain(state)
        check_links(entries)
        assert actions(entries) == [
            ("send_email", "ok", "posted", True, None),
            ("send_email", "ok", "unknown", False, None),
            ("send_email", "error", "failed", False, None),
            ("lookup", "ok", None, False, None),
            ("get-structured-content", "ok", "posted", False, "33"),
            ("echo", "ok", "unknown", False, None),
        ]
        # The message id is not in the records; the proof's own salt is in
        # the agent's local store beside the result's, so the id can be
        # disclosed alone: SHA-256(salt || JCS(id)) is the proof_hash.
        assert "mail.example.com" not in str([e["record"] for e in entries])
        posted = next(e for e in entries if e["record"]["body"].get("state") == "posted")
        proof_salt = bytes.fromhex(posted["secret"]["proof"]["salt"])
        assert posted["secret"]["salt"] != posted["secret"]["proof"]["salt"]
        message_id = json.dumps("<5.ann@example.com@mail.example.com>").encode()
        assert hashlib.sha256(proof_salt + message_id).hexdigest() == posted["record"]["body"]["proof_hash"]

        synced = tally(state, "agent", "sync", AGENT, check=False)
        assert synced.returncode == 0, synced.stdout + synced.stderr
        pack, keys = tmp_path / "pack.jsonl", tmp_path / "agent-keys.json"
        for cmd in (["export", "--agent", AGENT, "-o", str(pack)], ["keys", "export", "--agent", AGENT, "-o", str(keys)]):
            done = subprocess.run([TALLY, *cmd, "--witness", url, "--api-key", api_key], capture_output=True, text=True, timeout=60, env=env)
            assert done.returncode == 0, done.stderr
        verify = subprocess.run(
            [TALLY, "verify", str(pack), "--agent-keys", str(keys), "--witness-key", vkey],
            capture_output=True, text=True, timeout=120,
        )
        assert verify.returncode == 0, verify.stdout + verify.stderr
        lines = verify.stdout.splitlines()
        assert f"coverage: {AGENT}: action calls: 2 posted, 2 unknown, 1 failed" in lines, verify.stdout
        assert f"coverage: {AGENT}: no claim without a call" in lines, verify.stdout
        assert lines[-1].startswith("PASS: 12 checks"), verify.stdout
    finally:
        serve.send_signal(signal.SIGTERM)
        serve.wait(timeout=60)


def test_action_outcomes_over_streamable_http(state: Path) -> None:
    upstream = Upstream()
    try:
        gw = Gateway(state, upstream.url, "--action", "get-structured-content=temperature", "--action", "echo")

        async def session() -> None:
            async with streamable_http_client(gw.url) as (r, w):
                async with ClientSession(r, w) as s:
                    await s.initialize()
                    await everything_calls(s)
                    bad = await s.call_tool("get-structured-content", {"location": "Atlantis"})
                    assert bad.is_error

        anyio.run(session)
        assert gw.stop() == 0, "".join(gw.stderr)
    finally:
        upstream.kill()
    entries = chain(state)
    check_links(entries)
    assert actions(entries) == [
        ("get-structured-content", "ok", "posted", True, None),
        ("echo", "ok", "unknown", False, None),
        ("get-structured-content", "error", "failed", False, None),
    ]


@pytest.mark.parametrize(
    "flag, message",
    [
        ("send_email=", "proof path is empty"),
        ("send_email=a[x]", "is not an array index"),
        ("bad\u0007name=id", "is not a tool name"),
    ],
)
def test_a_bad_action_flag_is_a_usage_error(state: Path, flag: str, message: str) -> None:
    done = tally(state, "gateway", "--agent", AGENT, "--action", flag, "--", *MAIL, check=False)
    assert done.returncode == 2, done.stdout + done.stderr
    assert message in done.stderr, done.stderr
