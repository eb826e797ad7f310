"""Helpers shared by the SDK's tests: the real `tally` binary (TALLY_BIN,
built by run.sh), agent state folders, and a real `tally serve` witness
started the way tests/e2e/gateway/test_gateway_http.py starts it."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

TALLY = os.environ.get("TALLY_BIN", str(Path(__file__).resolve().parents[3] / "target" / "debug" / "tally"))
AGENT = "claims-bot"


def clean_env(state: Path | None = None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("TALLY_API_KEY", "TALLY_WITNESS_URL", "TALLY_STATE_DIR")}
    if state is not None:
        env["TALLY_STATE_DIR"] = str(state)
    return env


def tally(state: Path | None, *args: str, check: bool = True, timeout: float = 120) -> subprocess.CompletedProcess:
    done = subprocess.run([TALLY, *args], env=clean_env(state), capture_output=True, text=True, timeout=timeout)
    if check:
        assert done.returncode == 0, f"tally {' '.join(args)}: {done.stdout}{done.stderr}"
    return done


def chain(state: Path, agent: str = AGENT) -> list[dict]:
    out = tally(state, "status", "--agent", agent, "--json", "--records").stdout
    return json.loads(out)["agents"][0]["chain"]


def check_links(entries: list[dict]) -> None:
    for i, e in enumerate(entries):
        r = e["record"]
        assert r["seq"] == i
        assert r["prev"] == (entries[i - 1]["hash"] if i else None)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_port(port: int, timeout: float = 60) -> None:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return
        except OSError:
            time.sleep(0.05)
    raise TimeoutError(f"nothing listens on {port}")


@dataclass
class Witness:
    url: str
    api_key: str
    data: Path
    process: subprocess.Popen

    def register(self, state: Path, agent: str = AGENT) -> str:
        """`tally agent init` + `agent add` + `agent init --witness`: the
        agent is known to the witness and pinned; returns the witness's
        verification key."""
        public_key = tally(state, "agent", "init", agent).stdout.split("public key:")[1].split()[0]
        tally(None, "agent", "add", agent, "--public-key", public_key, "--witness", self.url, "--api-key", self.api_key)
        pinned = tally(state, "agent", "init", agent, "--witness", self.url, "--api-key", self.api_key).stdout
        return pinned.strip().splitlines()[-1].strip()

    def verify(self, state: Path, tmp: Path, vkey: str, agent: str = AGENT) -> str:
        """Exports the pack and the agent keys and runs `tally verify`
        (exit 0: all twelve checks pass); returns its output."""
        pack, keys = tmp / "pack.jsonl", tmp / "agent-keys.json"
        for cmd in (["export", "--agent", agent, "-o", str(pack)], ["keys", "export", "--agent", agent, "-o", str(keys)]):
            tally(None, *cmd, "--witness", self.url, "--api-key", self.api_key)
        done = tally(None, "verify", str(pack), "--agent-keys", str(keys), "--witness-key", vkey, check=False)
        assert done.returncode == 0, done.stdout + done.stderr
        return done.stdout


@pytest.fixture
def witness(tmp_path: Path):
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    data = tmp_path / "witness"
    serve = subprocess.Popen(
        [TALLY, "serve", "--listen", f"127.0.0.1:{port}", "--data-dir", str(data)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        env=clean_env(),
    )
    try:
        wait_port(port)
        created = tally(None, "project", "create", "sdk", "--witness", url, "--data-dir", str(data))
        api_key = next(w for w in created.stdout.split() if w.startswith("tally_"))
        yield Witness(url, api_key, data, serve)
    finally:
        serve.terminate()
        serve.wait(timeout=60)


@pytest.fixture
def state(tmp_path: Path) -> Path:
    return tmp_path / "state"


@pytest.fixture
def local_agent(state: Path) -> Path:
    """An agent with a key and no witness."""
    tally(state, "agent", "init", AGENT)
    return state


def decisions(entries: list[dict]) -> list[dict]:
    return [e["record"]["body"] for e in entries if e["record"]["kind"] == "decision"]


def outcomes(entries: list[dict]) -> list[dict]:
    return [e["record"]["body"] for e in entries if e["record"]["kind"] == "outcome"]
