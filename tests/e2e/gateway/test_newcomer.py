"""A newcomer's path through the gateway, with the real parts of run.sh:
the quickstart's example client (examples/mcp_client.py) as README.md runs
it, its one-line errors, and calls through `tally gateway` while the
witness takes connections but never answers.
"""

import json
import os
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import anyio
from mcp import ClientSession, StdioServerParameters
from mcp.client.stdio import stdio_client

from test_gateway import AGENT, SERVER, TALLY, chain, free_port, state, tally  # noqa: F401 (state: a fixture)

EXAMPLE = Path(__file__).resolve().parents[3] / "examples/mcp_client.py"


def example(state: Path, *args: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, TALLY_STATE_DIR=str(state))
    env.pop("TALLY_API_KEY", None)
    env.pop("TALLY_WITNESS_URL", None)
    cmd = [sys.executable, str(EXAMPLE), "--tally", TALLY, *args, "--", "node", SERVER, "stdio"]
    return subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=120)


def test_the_example_client_records_calls(state: Path) -> None:
    done = example(state, "--agent", AGENT)
    assert done.returncode == 0, done.stdout + done.stderr
    assert " tools: " in done.stdout and "echo(" in done.stdout, done.stdout
    kinds = [e["record"]["kind"] for e in chain(state)]
    assert kinds.count("decision") == 2 and kinds.count("outcome") == 2 and "tools" in kinds, kinds


def test_the_example_client_says_what_went_wrong_in_one_line(tmp_path: Path) -> None:
    empty = tmp_path / "no-state"
    done = example(empty, "--agent", "nobody")
    assert done.returncode == 1, done.stdout + done.stderr
    assert "Traceback" not in done.stderr, done.stderr
    ours = [line for line in done.stderr.splitlines() if line.startswith("mcp_client: ")]
    assert len(ours) == 1 and "the gateway or the server behind it exited" in ours[0], done.stderr
    # The gateway's own message, just above, names the cause.
    assert "agent nobody has no key in" in done.stderr, done.stderr

    missing = example(empty, "--agent", "nobody", "--tally", str(tmp_path / "no-such-tally"))
    assert missing.returncode == 1 and "Traceback" not in missing.stderr, missing.stderr
    assert "no-such-tally not found" in missing.stderr, missing.stderr

    debug = example(empty, "--agent", "nobody", "--debug")
    assert debug.returncode != 0 and "Traceback" in debug.stderr, debug.stderr


class SilentWitness:
    """Accepts connections and never answers, counting them."""

    def __init__(self) -> None:
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(64)
        self.sock.settimeout(0.2)
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}"
        self.accepted = 0
        self.held: list[socket.socket] = []
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self.run, daemon=True)
        self.thread.start()

    def run(self) -> None:
        while not self.stop.is_set():
            try:
                conn, _ = self.sock.accept()
            except OSError:
                continue
            self.accepted += 1
            self.held.append(conn)

    def close(self) -> None:
        self.stop.set()
        self.thread.join()
        for c in self.held:
            c.close()
        self.sock.close()


def test_calls_do_not_wait_for_a_witness_that_never_answers(state: Path, tmp_path: Path) -> None:
    # Pin a real witness's key, then point the agent at one that never answers.
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    env = {k: v for k, v in os.environ.items() if k not in ("TALLY_API_KEY", "TALLY_WITNESS_URL")}
    serve = subprocess.Popen(
        [TALLY, "serve", "--listen", f"127.0.0.1:{port}", "--data-dir", str(tmp_path / "witness")],
        stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, env=env,
    )
    try:
        api_key = None
        for line in serve.stdout:
            if line.strip().startswith("API key"):
                api_key = line.split()[2]
            if line.startswith("tally: listening on "):
                break
        assert api_key, "no API key in the first start's banner"
        tally(state, "agent", "init", AGENT, "--witness", url, "--api-key", api_key)
    finally:
        serve.terminate()
        serve.wait(timeout=60)

    silent = SilentWitness()
    # The agent's pinned witness is now the silent one (TALLY_WITNESS_URL
    # would not move it: docs/operations.md, "The agent's witness").
    config = state / "agents" / AGENT / "config.json"
    pinned = json.loads(config.read_text())
    pinned["witness"]["url"] = silent.url
    config.write_text(json.dumps(pinned))
    try:
        params = StdioServerParameters(
            command=TALLY,
            args=["gateway", "--agent", AGENT, "--", "node", SERVER, "stdio"],
            env=dict(os.environ, TALLY_STATE_DIR=str(state)),
        )

        async def session() -> None:
            async with stdio_client(params) as (r, w):
                async with ClientSession(r, w) as s:
                    await s.initialize()
                    await s.list_tools()
                    for i in range(3):
                        result = await s.call_tool("echo", {"message": f"call {i}"})
                        assert not result.is_error
                    # The background sync did try the witness, which has
                    # answered nothing: the calls above did not wait for it.
                    deadline = time.monotonic() + 60
                    while silent.accepted == 0 and time.monotonic() < deadline:
                        await anyio.sleep(0.05)
                    assert silent.accepted > 0

        anyio.run(session)
    finally:
        silent.close()
    entries = chain(state)
    decisions = [e for e in entries if e["record"]["kind"] == "decision"]
    outcomes = [e for e in entries if e["record"]["kind"] == "outcome"]
    assert len(decisions) == 3 and len(outcomes) == 3
    assert not any(e["receipted"] for e in entries)
