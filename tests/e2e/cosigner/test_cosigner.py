"""The answers of `tally cosigner serve` checked by a client written from
the C2SP specifications (c2sp.py), not by tally's own client: a log made
here in Python (its own Ed25519 note key and RFC 6962 tree) submits
checkpoints to the real binary over HTTP and checks every answer of
c2sp.org/tlog-witness add-checkpoint, and each cosignature byte for byte
against c2sp.org/tlog-cosignature. Run through run.sh.
"""

from __future__ import annotations

import hashlib
import http.client
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

import c2sp

TALLY = os.environ.get("TALLY_BIN", str(Path(__file__).resolve().parents[3] / "target/debug/tally"))
ORIGIN = "python.example/log"
COSIGNER = "cosigner.example/py"


class Log:
    """A C2SP log: leaves, an Ed25519 note key named after the origin."""

    def __init__(self, seed: bytes, origin: str = ORIGIN):
        self.origin = origin
        self.key = c2sp.NoteKey(origin, seed)
        self.leaves: list[bytes] = []

    def grow(self, n: int, tag: str = "leaf") -> None:
        for _ in range(n):
            self.leaves.append(c2sp.leaf_hash(f"{tag} {len(self.leaves)}".encode()))

    def body(self) -> str:
        return c2sp.checkpoint_body(self.origin, len(self.leaves), c2sp.mth(self.leaves))

    def note(self) -> str:
        return self.key.sign(self.body())

    def request(self, old: int) -> bytes:
        return c2sp.add_checkpoint_body(old, c2sp.consistency_proof(old, self.leaves), self.note())


def tally(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([TALLY, *args], capture_output=True, text=True, timeout=120)


class Cosigner:
    """A real `tally cosigner serve`, on a free loopback port."""

    def __init__(self, data: Path, log_vkeys: list[tuple[str, str]]):
        out = tally("cosigner", "init", "--name", COSIGNER, "--data-dir", str(data))
        assert out.returncode == 0, out.stderr
        self.vkey = next(
            line.split()[-1] for line in out.stdout.splitlines() if line.strip().startswith("cosigner key")
        )
        for origin, vkey in log_vkeys:
            out = tally("cosigner", "add-log", "--data-dir", str(data), "--origin", origin, "--key", vkey)
            assert out.returncode == 0, out.stderr
        # The seed, to recompute the expected line independently.
        skey = (data / "cosigner.key").read_text().strip()
        name, _, b64key = skey.removeprefix("PRIVATE+KEY+").split("+", 2)
        assert name == COSIGNER
        raw = c2sp.base64.b64decode(b64key)
        assert raw[0] == 0x04
        self.seed = raw[1:]
        self.proc = subprocess.Popen(
            [TALLY, "cosigner", "serve", "--data-dir", str(data), "--listen", "127.0.0.1:0"],
            stdout=subprocess.PIPE,
            text=True,
        )
        line = self.proc.stdout.readline()
        assert line.startswith("tally cosigner: listening on http://"), line
        self.host, port = line.split("http://")[1].split()[0].split(":")
        self.port = int(port)

    def request(self, method: str, path: str, body: bytes | None = None, headers=None):
        conn = http.client.HTTPConnection(self.host, self.port, timeout=30)
        conn.request(method, path, body=body, headers=headers or {})
        resp = conn.getresponse()
        data = resp.read()
        conn.close()
        return resp.status, resp.getheader("Content-Type"), data

    def add(self, body: bytes):
        return self.request("POST", "/add-checkpoint", body)

    def stop(self):
        self.proc.terminate()
        self.proc.wait(timeout=30)


@pytest.fixture
def setup(tmp_path):
    log = Log(hashlib.sha256(b"python log key").digest())
    cosigner = Cosigner(tmp_path / "cosigner", [(ORIGIN, log.key.vkey())])
    yield log, cosigner
    cosigner.stop()


def expect_cosignature(cosigner: Cosigner, log: Log, status, ctype, data) -> int:
    assert status == 200, data
    assert ctype == "text/plain; charset=utf-8"
    line = data.decode()
    timestamp = c2sp.verify_cosignature_line(line, cosigner.vkey, log.body())
    assert timestamp > 0
    assert abs(timestamp - time.time()) < 300
    # Byte for byte what the specification gives for this key and time.
    assert line == c2sp.cosignature_line(COSIGNER, cosigner.seed, timestamp, log.body())
    return timestamp


def test_cosigns_a_growing_log_and_answers_409_with_its_size(setup):
    log, cosigner = setup
    log.grow(5)
    first = expect_cosignature(cosigner, log, *cosigner.add(log.request(0)))
    # The same checkpoint again (old size = its size, same root).
    expect_cosignature(cosigner, log, *cosigner.add(log.request(5)))
    for grow_by in (1, 2, 250, 7):
        old = len(log.leaves)
        log.grow(grow_by)
        later = expect_cosignature(cosigner, log, *cosigner.add(log.request(old)))
        assert later >= first
    size = len(log.leaves)
    for wrong_old in (0, 5, size - 1):
        status, ctype, data = cosigner.add(log.request(wrong_old))
        assert (status, ctype, data) == (409, "text/x.tlog.size", f"{size}\n".encode())


def test_monitoring_route_serves_the_cosigned_checkpoint(setup):
    log, cosigner = setup
    path = f"/{hashlib.sha256(ORIGIN.encode()).hexdigest()}/checkpoint"
    status, _, _ = cosigner.request("GET", path)
    assert status == 404
    log.grow(3)
    status, _, line = cosigner.add(log.request(0))
    assert status == 200
    status, ctype, data = cosigner.request("GET", path)
    assert status == 200 and ctype.startswith("text/plain")
    assert data.decode() == log.note() + line.decode()


def test_unknown_origin_404_and_untrusted_or_bad_signatures_403(setup):
    log, cosigner = setup
    log.grow(4)
    other = Log(hashlib.sha256(b"another").digest(), origin="other.example/log")
    other.grow(4)
    status, _, data = cosigner.add(other.request(0))
    assert status == 404, data
    assert data.startswith(b"unknown_origin: ")

    # The right origin, signed by a key the cosigner does not trust.
    impostor = Log(hashlib.sha256(b"impostor").digest())
    impostor.leaves = list(log.leaves)
    status, _, data = cosigner.add(impostor.request(0))
    assert status == 403, data
    assert data.startswith(b"not_signed: ")

    # A line with the trusted key's name and id whose signature fails.
    good = log.key.signature_line(log.body())
    raw = bytearray(c2sp.base64.b64decode(good.split()[-1]))
    raw[-1] ^= 0x01
    broken = f"{c2sp.EM_DASH} {ORIGIN} {c2sp.b64(bytes(raw))}\n"
    status, _, data = cosigner.add(f"old 0\n\n{log.body()}\n{broken}".encode())
    assert status == 403, data
    assert data.startswith(b"bad_signature: ")
    # Nothing was cosigned by any of these.
    status, _, data = cosigner.add(log.request(0))
    assert status == 200, data


def test_422_for_proofs_that_do_not_hold(setup):
    log, cosigner = setup
    log.grow(10)
    assert cosigner.add(log.request(0))[0] == 200
    log.grow(6)

    proof = c2sp.consistency_proof(10, log.leaves)
    bad = [proof[0], hashlib.sha256(b"wrong").digest(), *proof[2:]]
    status, _, data = cosigner.add(c2sp.add_checkpoint_body(10, bad, log.note()))
    assert status == 422, data
    status, _, data = cosigner.add(c2sp.add_checkpoint_body(10, proof[:-1], log.note()))
    assert status == 422, data
    status, _, data = cosigner.add(c2sp.add_checkpoint_body(10, [], log.note()))
    assert status == 422, data

    # Same size as held, different root: a fork.
    fork = Log(hashlib.sha256(b"python log key").digest())
    fork.grow(10, tag="fork")
    status, _, data = cosigner.add(fork.request(10))
    assert status == 422, data

    # The state did not move: the honest proof still works.
    expect_cosignature(cosigner, log, *cosigner.add(log.request(10)))


def test_422_for_the_empty_tree_rules(tmp_path):
    log = Log(hashlib.sha256(b"python log key").digest())
    cosigner = Cosigner(tmp_path / "c", [(ORIGIN, log.key.vkey())])
    try:
        wrong_empty = log.key.sign(c2sp.checkpoint_body(ORIGIN, 0, hashlib.sha256(b"x").digest()))
        status, _, data = cosigner.add(c2sp.add_checkpoint_body(0, [], wrong_empty))
        assert status == 422, data
        log.grow(3)
        # From old size 0 the proof must be empty.
        status, _, data = cosigner.add(c2sp.add_checkpoint_body(0, [bytes(32)], log.note()))
        assert status == 422, data
        expect_cosignature(cosigner, log, *cosigner.add(log.request(0)))
    finally:
        cosigner.stop()


def test_malformed_bodies_400_and_oversized_413(setup):
    log, cosigner = setup
    log.grow(2)
    note = log.note()
    proof_line = c2sp.b64(bytes(32)) + "\n"
    for body in [
        b"",
        b"old 0\n",
        f"old 00\n\n{note}".encode(),
        f"old -1\n\n{note}".encode(),
        f"old 0 \n\n{note}".encode(),
        f"new 0\n\n{note}".encode(),
        f"old 0\nnot-base64\n\n{note}".encode(),
        f"old 0\n{c2sp.b64(bytes(31))}\n\n{note}".encode(),
        f"old 1\n{proof_line * 64}\n{note}".encode(),
        f"old 3\n\n{note}".encode(),  # old size above the checkpoint's
        f"old 0\n\n{log.body()}".encode(),  # no signatures
        # Validly signed, but not a checkpoint (a size with a leading zero).
        ("old 0\n\n" + log.key.sign(f"{ORIGIN}\n02\n{c2sp.b64(bytes(32))}\n")).encode(),
        b"old 0\n\n\xff\xfe\n\n",
    ]:
        status, ctype, data = cosigner.add(body)
        assert status == 400, (body, data)
        assert ctype == "text/plain; charset=utf-8"
        assert data.endswith(b"\n") and b": " in data, data

    status, _, data = cosigner.add(b"x" * 20_000)
    assert status == 413, data
    # Declared too large by Content-Length: refused before the body is read.
    status, _, data = cosigner.request(
        "POST", "/add-checkpoint", b"x" * 20_000, headers={"Content-Length": "20000"}
    )
    assert status == 413, data

    status, _, _ = cosigner.request("GET", "/add-checkpoint")
    assert status == 405
    status, _, _ = cosigner.request("GET", "/nowhere")
    assert status == 404
    # After all of that, the cosigner still cosigns.
    expect_cosignature(cosigner, log, *cosigner.add(log.request(0)))


def test_vectors_are_what_the_generator_makes(tmp_path):
    """testdata/cosignature is exactly what make_vectors.py writes."""
    here = Path(__file__).resolve().parent
    out = tmp_path / "vectors"
    subprocess.run([sys.executable, str(here / "make_vectors.py"), str(out)], check=True, cwd=here)
    committed = here.parents[2] / "testdata" / "cosignature"
    for made in sorted(out.iterdir()):
        assert made.read_bytes() == (committed / made.name).read_bytes(), made.name
    assert {p.name for p in out.iterdir()} == {p.name for p in committed.glob("*.json")}
