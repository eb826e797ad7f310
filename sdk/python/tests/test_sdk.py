"""The SDK against the real `tally serve`, `tally verify` and `tally record`
(sdk/python/README.md)."""

from __future__ import annotations

import asyncio
import collections
import json
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest

import tally
from conftest import AGENT, TALLY, Witness, chain, check_links, clean_env, decisions, outcomes, tally as run_tally


def test_a_thousand_calls_from_threads_and_tasks_verify_with_their_outcomes_and_coverage(
    state: Path, tmp_path: Path, witness: Witness
) -> None:
    vkey = witness.register(state)
    agent = tally.Agent(AGENT, state_dir=state)

    @agent.tool
    def lookup(claim: int) -> dict:
        """Looks a claim up."""
        return {"claim": claim, "open": claim % 2 == 0}

    @agent.tool(name="refund")
    def refund(claim: int, amount: int = 10) -> str:
        """Refunds a claim."""
        if claim % 7 == 0:
            raise ValueError(f"claim {claim} is closed")
        return f"refunded {amount}"

    async def fetch(claim: int) -> list:
        """Fetches a claim's documents."""
        await asyncio.sleep(0)
        if claim % 5 == 0:
            raise LookupError("no documents")
        return [claim]

    [fetch_recorded] = agent.wrap_tools([fetch])
    # Four declared: two wrapped, two not; `fetch` is wrapped but not declared.
    assert agent.declare_tools(["lookup", refund, "escalate", "ask_human"])

    expected: collections.Counter = collections.Counter()
    lock = threading.Lock()

    def worker(t: int) -> None:
        for i in range(t, 500, 8):
            fn, name = (lookup, "lookup") if i % 2 else (refund, "refund")
            try:
                fn(i)
                status = "ok"
            except ValueError:
                status = "error"
            with lock:
                expected[(name, status)] += 1

    threads = [threading.Thread(target=worker, args=(t,)) for t in range(8)]
    for th in threads:
        th.start()

    async def tasks() -> None:
        async def one(i: int) -> None:
            try:
                assert await fetch_recorded(i) == [i]
                status = "ok"
            except LookupError:
                status = "error"
            expected[("fetch", status)] += 1

        await asyncio.gather(*(one(i) for i in range(500)))

    asyncio.run(tasks())
    for th in threads:
        th.join()
    assert sum(expected.values()) == 1000
    assert expected[("refund", "error")] > 0 and expected[("fetch", "error")] > 0

    assert agent.sync(timeout=120).complete
    agent.close()

    entries = chain(state)
    check_links(entries)
    assert all(e["receipted"] for e in entries)
    tool_of = {d["call_id"]: d["tool"] for d in decisions(entries)}
    assert len(tool_of) == 1000
    got = collections.Counter((tool_of[o["call_id"]], o["status"]) for o in outcomes(entries))
    assert got == expected

    out = witness.verify(state, tmp_path, vkey)
    assert "PASS" in out, out
    assert f"coverage: {AGENT}: 2 declared tools are not recorded: ask_human, escalate" in out, out
    assert f"coverage: {AGENT}: 1 recorded tool is not in the declared tool list: fetch" in out, out


def test_a_decision_is_in_the_chain_before_the_function_runs_even_after_kill_9(local_agent: Path) -> None:
    program = textwrap.dedent(
        f"""
        import sys, time, tally
        agent = tally.Agent({AGENT!r})

        @agent.tool
        def transfer(amount: int) -> None:
            print("running", flush=True)
            time.sleep(60)

        transfer(125)
        """
    )
    p = subprocess.Popen([sys.executable, "-c", program], env=clean_env(local_agent), stdout=subprocess.PIPE, text=True)
    try:
        assert p.stdout is not None
        assert p.stdout.readline().strip() == "running"
        p.send_signal(signal.SIGKILL)
        assert p.wait(timeout=30) == -signal.SIGKILL
    finally:
        p.kill()
    entries = chain(local_agent)
    check_links(entries)
    assert [d["tool"] for d in decisions(entries)] == ["transfer"]
    assert outcomes(entries) == []


def test_a_program_that_never_closes_exits_promptly_with_its_records(local_agent: Path) -> None:
    program = textwrap.dedent(
        f"""
        import tally
        agent = tally.Agent({AGENT!r})
        agent.tool(lambda: 1, name="one")()
        agent.note("bye")
        """
    )
    done = subprocess.run([sys.executable, "-c", program], env=clean_env(local_agent), capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    kinds = [e["record"]["kind"] for e in chain(local_agent)]
    assert kinds == ["decision", "outcome", "note"]


def test_unserialisable_arguments_are_refused_before_the_function_runs(local_agent: Path) -> None:
    agent = tally.Agent(AGENT, state_dir=local_agent)
    ran = []

    @agent.tool
    def store(blob: object) -> None:
        ran.append(blob)

    with pytest.raises(tally.BadContent, match="the arguments of tool 'store'") as e:
        store(object())
    assert e.value.code == "bad_content"
    with pytest.raises(tally.BadContent, match="arguments"):
        store(float("nan"))
    with pytest.raises(tally.BadContent, match="arguments"):
        store(2**60)  # beyond what JSON holds exactly
    assert ran == []

    @agent.tool
    def opaque() -> object:
        return object()

    with pytest.raises(tally.BadContent, match="the result of tool 'opaque'") as r:
        opaque()
    assert type(r.value.result) is object  # the result is not lost
    agent.close()
    entries = chain(local_agent)
    assert [d["tool"] for d in decisions(entries)] == ["opaque"]
    [o] = outcomes(entries)
    assert o["status"] == "ok" and "output_hash" not in o


def test_a_missing_agent_and_a_missing_key_name_where_they_looked(local_agent: Path, tmp_path: Path) -> None:
    with pytest.raises(tally.AgentNotFound, match=str(tmp_path / "nowhere")) as e:
        tally.Agent(AGENT, state_dir=tmp_path / "nowhere")
    assert e.value.code == "agent_not_found"
    assert isinstance(e.value, tally.TallyError)
    keys = [p for p in local_agent.rglob("*") if p.is_file() and "key" in p.name]
    assert keys, list(local_agent.rglob("*"))
    for k in keys:
        k.unlink()
    with pytest.raises(tally.AgentNotFound, match=str(local_agent)):
        tally.Agent(AGENT, state_dir=local_agent)


def test_strict_against_a_witness_that_refuses_does_not_run_the_call(state: Path, witness: Witness) -> None:
    # Pinned to the witness, never added to it: the witness refuses its records.
    run_tally(state, "agent", "init", AGENT)
    run_tally(state, "agent", "init", AGENT, "--witness", witness.url, "--api-key", witness.api_key)
    agent = tally.Agent(AGENT, state_dir=state, strict=True, strict_timeout=5)
    ran = []

    @agent.tool
    def pay(amount: int) -> None:
        ran.append(amount)

    with pytest.raises(tally.NoReceipt) as e:
        pay(5)
    assert e.value.code == "no_receipt"
    assert "agent_not_allowed" in str(e.value), e.value  # the witness's own reason
    assert ran == []
    with pytest.raises(tally.NoReceipt):
        agent.sync(timeout=5)
    agent.close()
    entries = chain(state)
    assert [d["tool"] for d in decisions(entries)] == ["pay"]
    assert [o["status"] for o in outcomes(entries)] == ["not_run"]


def test_strict_waits_for_the_receipt_then_runs(state: Path, witness: Witness) -> None:
    witness.register(state)
    agent = tally.Agent(AGENT, state_dir=state)
    seen = []

    @agent.tool(strict=True)
    def pay(amount: int) -> int:
        seen.append(agent.status()["store"]["receipted"])
        return amount

    async def main() -> int:
        async with agent.call("approve", {"amount": 3}, strict=True) as c:
            c.outcome("approved")
        return 0

    assert pay(5) == 5
    assert seen == [1]  # the decision had its receipt before the body ran
    asyncio.run(main())
    agent.sync(timeout=60)
    agent.close()


def test_call_blocks_notes_and_exceptions_propagate_unchanged(local_agent: Path) -> None:
    with tally.Agent(AGENT, state_dir=local_agent) as agent:
        with agent.call("refund", {"claim": 7}) as call:
            call.outcome({"refunded": 7})
        assert call.call_id
        err = KeyError("gone")
        with pytest.raises(KeyError) as e:
            with agent.call("refund", {"claim": 8}):
                raise err
        assert e.value is err
        assert agent.note("end of day") == 4
    entries = chain(local_agent)
    assert [e["record"]["kind"] for e in entries] == ["decision", "outcome", "decision", "outcome", "note"]
    assert [o["status"] for o in outcomes(entries)] == ["ok", "error"]
    with pytest.raises(tally.Closed):
        agent.note("after close")


def test_a_forked_child_records_through_its_own_writer(local_agent: Path) -> None:
    agent = tally.Agent(AGENT, state_dir=local_agent)

    @agent.tool
    def work(who: str) -> str:
        return who

    work("parent")
    pid = os.fork()
    if pid == 0:  # the child: exits without running pytest's teardown
        code = 1
        try:
            work("child")
            agent.close()
            code = 0
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    work("parent again")
    agent.close()
    entries = chain(local_agent)
    check_links(entries)
    assert len(decisions(entries)) == 3 and len(outcomes(entries)) == 3


def test_tally_record_writes_beside_the_program(state: Path, tmp_path: Path, witness: Witness) -> None:
    vkey = witness.register(state)
    agent = tally.Agent(AGENT, state_dir=state)

    @agent.tool
    def lookup(i: int) -> int:
        return i

    stop = threading.Event()

    def program() -> None:
        i = 0
        while not stop.is_set() or i < 50:
            lookup(i)
            i += 1

    th = threading.Thread(target=program)
    th.start()
    for i in range(5):
        d = run_tally(state, "record", "decision", "--agent", AGENT, "--tool", "script", "--input", json.dumps({"i": i}), "--no-sync")
        call_id = json.loads(d.stdout)["call_id"]
        run_tally(state, "record", "outcome", "--agent", AGENT, "--call-id", call_id, "--status", "ok", "--no-sync")
    stop.set()
    th.join()
    agent.sync(timeout=120)
    agent.close()
    entries = chain(state)
    check_links(entries)
    tools = collections.Counter(d["tool"] for d in decisions(entries))
    assert tools["script"] == 5 and tools["lookup"] >= 50
    assert len(outcomes(entries)) == len(decisions(entries))
    assert "PASS" in witness.verify(state, tmp_path, vkey)


def test_a_forked_child_records_after_the_parent_closed(local_agent: Path) -> None:
    # The parent owned the chain when it forked; the child inherits its
    # open files but must still become the owner once the parent is gone.
    agent = tally.Agent(AGENT, state_dir=local_agent)
    work = agent.tool(lambda who: who, name="work")
    work("parent")
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            os.read(r, 1)
            work("child")
            agent.close()
            code = 0
        finally:
            os._exit(code)
    agent.close()
    os.write(w, b"x")
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    entries = chain(local_agent)
    check_links(entries)
    assert len(decisions(entries)) == 2 and len(outcomes(entries)) == 2
