"""Benchmark (not a test): latency a tools/call gains through `tally gateway`.

Drives server-everything over raw newline-delimited JSON-RPC, once directly
and once through the gateway, in alternating rounds of the same run, and
prints p50/p99 of the round trip for each and the difference. Usage:

    python bench.py --tally target/release/tally --server .../dist/index.js [--calls 2000] [--rounds 4]
"""

import argparse
import json
import os
import statistics
import subprocess
import tempfile
import time


def percentile(xs, p):
    xs = sorted(xs)
    k = max(0, min(len(xs) - 1, int(round(p / 100 * (len(xs) - 1)))))
    return xs[k]


class Session:
    def __init__(self, cmd, env):
        self.p = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, env=env)
        self.next_id = 0
        self.request("initialize", {"protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "bench", "version": "1"}})
        self.send({"jsonrpc": "2.0", "method": "notifications/initialized"})
        self.request("tools/list", {})

    def send(self, msg):
        self.p.stdin.write(json.dumps(msg).encode() + b"\n")
        self.p.stdin.flush()

    def request(self, method, params):
        self.next_id += 1
        rid = self.next_id
        self.send({"jsonrpc": "2.0", "id": rid, "method": method, "params": params})
        while True:
            line = self.p.stdout.readline()
            if not line:
                raise RuntimeError("server closed its output")
            msg = json.loads(line)
            if msg.get("id") == rid and "method" not in msg:
                return msg

    def timed_calls(self, n):
        out = []
        for i in range(n):
            t0 = time.perf_counter_ns()
            r = self.request("tools/call", {"name": "echo", "arguments": {"message": f"m{i}"}})
            out.append((time.perf_counter_ns() - t0) / 1e6)
            assert "result" in r, r
        return out

    def close(self):
        self.p.stdin.close()
        self.p.wait(timeout=30)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--tally", required=True)
    ap.add_argument("--server", required=True)
    ap.add_argument("--calls", type=int, default=2000)
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--warmup", type=int, default=200)
    ap.add_argument("--extra", default="", help="extra gateway flags, e.g. --strict")
    ap.add_argument("--witness", help="a running `tally serve` to sync to (registers the agent)")
    ap.add_argument("--api-key", help="the witness project's API key")
    args = ap.parse_args()

    state = tempfile.mkdtemp(prefix="tally-bench-")
    env = dict(os.environ, TALLY_STATE_DIR=state)
    subprocess.run([args.tally, "agent", "init", "bench"], env=env, check=True, capture_output=True)
    if args.witness:
        agent = f"bench-{os.getpid()}"
        subprocess.run([args.tally, "agent", "init", agent], env=env, check=True, capture_output=True, text=True)
        public_key = subprocess.run([args.tally, "agent", "init", agent], env=env, check=True, capture_output=True, text=True).stdout.split("public key:")[1].split()[0]
        subprocess.run([args.tally, "agent", "add", agent, "--public-key", public_key, "--witness", args.witness, "--api-key", args.api_key], env=env, check=True, capture_output=True)
        subprocess.run([args.tally, "agent", "init", agent, "--witness", args.witness, "--api-key", args.api_key], env=env, check=True, capture_output=True)
    else:
        agent = "bench"
    server = ["node", args.server, "stdio"]
    gateway = [args.tally, "gateway", "--agent", agent, *args.extra.split(), "--", *server]

    direct, through = [], []
    per_round = args.calls // args.rounds
    for _ in range(args.rounds):
        for cmd, sink in ((server, direct), (gateway, through)):
            s = Session(cmd, env)
            s.timed_calls(args.warmup)
            sink.extend(s.timed_calls(per_round))
            s.close()

    def row(name, xs):
        return f"| {name} | {len(xs)} | {percentile(xs, 50):.3f} | {percentile(xs, 99):.3f} | {statistics.mean(xs):.3f} |"

    print("| path | calls | p50 ms | p99 ms | mean ms |")
    print("|---|---|---|---|---|")
    print(row("direct", direct))
    print(row("through tally gateway " + args.extra, through))
    print(
        f"| added | | {percentile(through, 50) - percentile(direct, 50):.3f} | "
        f"{percentile(through, 99) - percentile(direct, 99):.3f} | {statistics.mean(through) - statistics.mean(direct):.3f} |"
    )


if __name__ == "__main__":
    main()
