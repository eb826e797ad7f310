"""Benchmark (not a test): latency a tools/call gains through `tally gateway`.

Drives server-everything over raw JSON-RPC, once directly and once through
the gateway, in alternating rounds of the same run, and prints p50/p99 of
the round trip for each and the difference. Over stdio (default) the
messages are newline-delimited; with --http the server runs in its
Streamable HTTP mode and each message is an HTTP POST on one keep-alive
connection (the answer an SSE stream), the gateway started with --upstream.
Usage:

    python bench.py --tally target/release/tally --server .../dist/index.js [--calls 2000] [--rounds 4] [--http]
"""

import argparse
import http.client
import json
import os
import socket
import statistics
import subprocess
import tempfile
import time
from urllib.parse import urlsplit


def percentile(xs, p):
    xs = sorted(xs)
    k = max(0, min(len(xs) - 1, int(round(p / 100 * (len(xs) - 1)))))
    return xs[k]


class Timed:
    """Sequential echo calls, each timed as the client sees it."""

    def timed_calls(self, n):
        out = []
        for i in range(n):
            t0 = time.perf_counter_ns()
            r = self.request("tools/call", {"name": "echo", "arguments": {"message": f"m{i}"}})
            out.append((time.perf_counter_ns() - t0) / 1e6)
            assert "result" in r, r
        return out


class Session(Timed):
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

    def close(self):
        self.p.stdin.close()
        self.p.wait(timeout=30)


def cpu_ms(pid):
    """CPU time (user + system) a live process has used so far, in ms."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) * 1000 / os.sysconf("SC_CLK_TCK")


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_port(port, timeout=60):
    deadline = time.time() + timeout
    while time.time() < deadline:
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.05)
    raise RuntimeError(f"nothing listens on {port}")


class HttpSession(Timed):
    """One MCP session over Streamable HTTP on one keep-alive connection."""

    def __init__(self, url):
        u = urlsplit(url)
        self.path = u.path
        self.conn = http.client.HTTPConnection(u.hostname, u.port, timeout=30)
        self.conn.connect()
        self.conn.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.headers = {"content-type": "application/json", "accept": "application/json, text/event-stream"}
        self.next_id = 0
        init = self.request("initialize", {"protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "bench", "version": "1"}})
        assert "result" in init, init
        self.headers["mcp-protocol-version"] = "2025-11-25"
        self.post({"jsonrpc": "2.0", "method": "notifications/initialized"})
        self.request("tools/list", {})

    def post(self, msg):
        self.conn.request("POST", self.path, body=json.dumps(msg), headers=self.headers)
        resp = self.conn.getresponse()
        body = resp.read()
        sid = resp.getheader("mcp-session-id")
        if sid:
            self.headers["mcp-session-id"] = sid
        if resp.status >= 400:
            raise RuntimeError(f"HTTP {resp.status}: {body[:200]!r}")
        return resp.getheader("content-type", ""), body

    def request(self, method, params):
        self.next_id += 1
        rid = self.next_id
        ctype, body = self.post({"jsonrpc": "2.0", "id": rid, "method": method, "params": params})
        if ctype.startswith("application/json"):
            return json.loads(body)
        for line in body.decode().splitlines():
            if line.startswith("data:") and line[5:].strip():
                msg = json.loads(line[5:])
                if msg.get("id") == rid and "method" not in msg:
                    return msg
        raise RuntimeError(f"no answer to {method} in {body[:200]!r}")

    def close(self):
        try:
            self.conn.request("DELETE", self.path, headers=self.headers)
            self.conn.getresponse().read()
        finally:
            self.conn.close()



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
    ap.add_argument("--http", action="store_true", help="Streamable HTTP: server-everything streamableHttp, gateway --upstream")
    ap.add_argument("--witness-pid", type=int, help="the witness's process id: print its CPU time per call")
    ap.add_argument("--member", action="store_true",
                    help="first start an idle gateway of the same agent, which holds the chain (and syncs), so the "
                         "measured gateway is a member that hands its records over writer.sock")
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
    direct, through = [], []
    per_round = args.calls // args.rounds
    gateway_cpu = 0.0
    witness_cpu = cpu_ms(args.witness_pid) if args.witness_pid else None
    holder = None
    if args.member:
        holder = subprocess.Popen([args.tally, "gateway", "--agent", agent, "--name-prefix", "holder.", "--",
                                   "node", args.server, "stdio"], env=env, stdin=subprocess.PIPE,
                                  stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        sock = os.path.join(state, "agents", agent, "writer.sock")
        deadline = time.time() + 30
        while not os.path.exists(sock):
            assert time.time() < deadline, "the holder gateway did not start"
            time.sleep(0.05)
    if args.http:
        server_port, gateway_port = free_port(), free_port()
        server_p = subprocess.Popen(["node", args.server, "streamableHttp"], env=dict(env, PORT=str(server_port)),
                                    stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        wait_port(server_port)
        upstream = f"http://127.0.0.1:{server_port}/mcp"
        gateway_p = subprocess.Popen([args.tally, "gateway", "--agent", agent, *args.extra.split(), "--upstream", upstream,
                                      "--listen", f"127.0.0.1:{gateway_port}"], env=env,
                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        wait_port(gateway_port)
        try:
            for _ in range(args.rounds):
                for url, sink in ((upstream, direct), (f"http://127.0.0.1:{gateway_port}/mcp", through)):
                    s = HttpSession(url)
                    s.timed_calls(args.warmup)
                    sink.extend(s.timed_calls(per_round))
                    s.close()
        finally:
            gateway_cpu += cpu_ms(gateway_p.pid)
            gateway_p.terminate()
            gateway_p.wait(timeout=60)
            server_p.kill()
            server_p.wait(timeout=30)
    else:
        server = ["node", args.server, "stdio"]
        gateway = [args.tally, "gateway", "--agent", agent, *args.extra.split(), "--", *server]
        for _ in range(args.rounds):
            for cmd, sink in ((server, direct), (gateway, through)):
                s = Session(cmd, env)
                s.timed_calls(args.warmup)
                sink.extend(s.timed_calls(per_round))
                if cmd is gateway:
                    gateway_cpu += cpu_ms(s.p.pid)
                s.close()

    calls = args.rounds * (args.warmup + per_round)
    cpu = [f"measured gateway {gateway_cpu / calls:.3f}"]
    if holder is not None:
        cpu.append(f"holder gateway {cpu_ms(holder.pid) / calls:.3f}")
    if witness_cpu is not None:
        cpu.append(f"witness {(cpu_ms(args.witness_pid) - witness_cpu) / calls:.3f}")
    if holder is not None:
        holder.stdin.close()
        holder.wait(timeout=60)

    def row(name, xs):
        return f"| {name} | {len(xs)} | {percentile(xs, 50):.3f} | {percentile(xs, 99):.3f} | {statistics.mean(xs):.3f} |"

    print("| path | calls | p50 ms | p99 ms | mean ms |")
    print("|---|---|---|---|---|")
    print(row("direct", direct))
    print(row(("through tally gateway --upstream " if args.http else "through tally gateway ") + args.extra, through))
    print(
        f"| added | | {percentile(through, 50) - percentile(direct, 50):.3f} | "
        f"{percentile(through, 99) - percentile(direct, 99):.3f} | {statistics.mean(through) - statistics.mean(direct):.3f} |"
    )
    print(f"CPU ms per call through the gateway: {', '.join(cpu)}")


if __name__ == "__main__":
    main()
