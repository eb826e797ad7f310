"""The Python SDK's figures for docs/benchmarks.md ("Python SDK"), in one run:

- the time a wrapped call adds (decision + outcome, not strict) to the bare
  function, p50 and p99;
- the same two records through `tally record` processes (decision, then
  outcome, `--no-sync`);
- Agent Receipts' Python SDK (`obsigna`) making one signed, chained receipt
  per call, if it is installed (its in-process path: its daemon is not on
  PyPI);
- recorded calls per second from one thread and from 8 threads.

The agent has no witness: what is measured is recording, not syncing.
Run with a release build (docs/benchmarks.md gives the command):

    TALLY_BIN=target/release/tally python sdk/python/bench.py
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

# The installed package, not the source folder beside this script (which
# has no built native module).
sys.path = [p for p in sys.path if Path(p or ".").resolve() != Path(__file__).resolve().parent]
import tally  # noqa: E402

TALLY = os.environ.get("TALLY_BIN", "target/release/tally")
CALLS = int(os.environ.get("BENCH_CALLS", "20000"))
RECORD_CALLS = int(os.environ.get("BENCH_RECORD_CALLS", "100"))


def percentile(samples: list[float], p: float) -> float:
    s = sorted(samples)
    return s[min(len(s) - 1, int(len(s) * p))]


def timed(fn, n: int) -> list[float]:
    out = []
    for i in range(n):
        t = time.perf_counter_ns()
        fn(i)
        out.append((time.perf_counter_ns() - t) / 1000)
    return out


def bare(i: int) -> dict:
    return {"claim": i, "open": True}


def main() -> None:
    tmp = Path(tempfile.mkdtemp(prefix="tally-bench-"))
    state = tmp / "state"
    env = dict(os.environ, TALLY_STATE_DIR=str(state))
    env.pop("TALLY_WITNESS_URL", None)
    env.pop("TALLY_API_KEY", None)
    subprocess.run([TALLY, "agent", "init", "bench"], env=env, check=True, capture_output=True)

    agent = tally.Agent("bench", state_dir=state)
    wrapped = agent.tool(name="lookup")(bare)
    timed(wrapped, 2000)  # warm-up
    timed(bare, 2000)
    # Interleaved blocks, so both see the same machine.
    b: list[float] = []
    w: list[float] = []
    for _ in range(10):
        b += timed(bare, CALLS // 10)
        w += timed(wrapped, CALLS // 10)
    rows = [
        ("bare function", statistics.median(b), percentile(b, 0.99), None),
        ("wrapped (tally SDK), added", statistics.median(w) - statistics.median(b), percentile(w, 0.99) - percentile(b, 0.99), None),
    ]

    # Throughput: recorded calls per second.
    t = time.perf_counter()
    for i in range(CALLS):
        wrapped(i)
    one = CALLS / (time.perf_counter() - t)

    def worker(k: int) -> None:
        for i in range(k, CALLS, 8):
            wrapped(i)

    threads = [threading.Thread(target=worker, args=(k,)) for k in range(8)]
    t = time.perf_counter()
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    eight = CALLS / (time.perf_counter() - t)
    agent.close()

    # The same two records through `tally record` processes.
    r = []
    for i in range(RECORD_CALLS):
        t0 = time.perf_counter_ns()
        d = subprocess.run(
            [TALLY, "record", "decision", "--agent", "bench", "--tool", "lookup", "--input", json.dumps({"i": i}), "--no-sync"],
            env=env, check=True, capture_output=True, text=True,
        )
        call_id = json.loads(d.stdout)["call_id"]
        subprocess.run(
            [TALLY, "record", "outcome", "--agent", "bench", "--call-id", call_id, "--status", "ok",
             "--output", json.dumps(bare(i)), "--no-sync"],
            env=env, check=True, capture_output=True,
        )
        r.append((time.perf_counter_ns() - t0) / 1000)
    rows.append(("tally record x2 (processes)", statistics.median(r), percentile(r, 0.99), None))

    try:
        o = obsigna_samples()
        rows.append(("obsigna receipt per call, added", statistics.median(o) - statistics.median(b), percentile(o, 0.99) - percentile(b, 0.99), None))
    except ImportError:
        rows.append(("obsigna: not installed", float("nan"), float("nan"), None))

    print(f"python {sys.version.split()[0]}, {os.cpu_count()} cores, {CALLS} calls ({RECORD_CALLS} through tally record)")
    print(f"{'':40} {'p50 µs':>10} {'p99 µs':>10}")
    for name, p50, p99, _ in rows:
        print(f"{name:40} {p50:10.1f} {p99:10.1f}")
    print(f"recorded calls/s, 1 thread: {one:,.0f}")
    print(f"recorded calls/s, 8 threads: {eight:,.0f}")


def obsigna_samples() -> list[float]:
    """One signed receipt per call, chained to the one before (obsigna's
    in-process path: create, sign, hash; nothing is written)."""
    from obsigna import (
        ActionInput,
        Chain,
        CreateReceiptInput,
        Issuer,
        Outcome,
        Principal,
        create_receipt,
        generate_key_pair,
        hash_receipt,
        sign_receipt,
    )

    keys = generate_key_pair()
    prev: list[str | None] = [None]

    def receipted(i: int) -> dict:
        result = bare(i)
        unsigned = create_receipt(
            CreateReceiptInput(
                issuer=Issuer(id="did:agent:bench"),
                principal=Principal(id="did:user:bench"),
                action=ActionInput(type="data.api.read", risk_level="low"),
                outcome=Outcome(status="success"),
                chain=Chain(sequence=i + 1, previous_receipt_hash=prev[0], chain_id="chain_bench"),
            )
        )
        receipt = sign_receipt(unsigned, keys.private_key, "did:agent:bench#key-1")
        prev[0] = hash_receipt(receipt)
        return result

    n = max(1000, CALLS // 4)
    timed(receipted, 200)
    return timed(receipted, n)


if __name__ == "__main__":
    main()
