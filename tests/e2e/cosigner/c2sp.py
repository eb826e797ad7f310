"""An independent implementation of the C2SP pieces a cosigner speaks,
written from the specifications, not from tally's code:

- c2sp.org/signed-note: Ed25519 note keys (type 0x01), vkeys, note signing;
- c2sp.org/tlog-checkpoint: checkpoint bodies;
- c2sp.org/tlog-cosignature: Ed25519 cosignatures (type 0x04,
  "cosignature/v1"), their key ids, signed message and signature lines;
- c2sp.org/tlog-witness: the add-checkpoint request body;
- RFC 6962 section 2.1: Merkle tree hashes and consistency proofs
  (SUBPROOF), computed naively from the leaves.

Only the standard library and `cryptography` (Ed25519) are used.
"""

from __future__ import annotations

import base64
import hashlib
import struct

from cryptography.hazmat.primitives.asymmetric.ed25519 import (
    Ed25519PrivateKey,
    Ed25519PublicKey,
)
from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat

EM_DASH = "\u2014"


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


def public_bytes(key: Ed25519PrivateKey) -> bytes:
    return key.public_key().public_bytes(Encoding.Raw, PublicFormat.Raw)


def key_id(name: str, alg: int, public: bytes) -> bytes:
    """signed-note: SHA-256(name || 0x0A || type || public key)[:4]."""
    return hashlib.sha256(name.encode() + b"\n" + bytes([alg]) + public).digest()[:4]


def vkey(name: str, alg: int, public: bytes) -> str:
    """signed-note verifier key: name+hex(key id)+base64(type || key)."""
    return f"{name}+{key_id(name, alg, public).hex()}+{b64(bytes([alg]) + public)}"


def parse_vkey(text: str, alg: int) -> tuple[str, bytes]:
    name, hexid, key = text.split("+", 2)
    raw = base64.b64decode(key, validate=True)
    assert len(raw) == 33 and raw[0] == alg, text
    public = raw[1:]
    assert key_id(name, alg, public).hex() == hexid, text
    return name, public


# --- RFC 6962 section 2.1 -------------------------------------------------


def leaf_hash(data: bytes) -> bytes:
    return hashlib.sha256(b"\x00" + data).digest()


def node_hash(left: bytes, right: bytes) -> bytes:
    return hashlib.sha256(b"\x01" + left + right).digest()


def _split(n: int) -> int:
    """The largest power of two smaller than n (n > 1)."""
    k = 1
    while k * 2 < n:
        k *= 2
    return k


def mth(leaves: list[bytes]) -> bytes:
    """MTH(D[n]) over leaf hashes."""
    n = len(leaves)
    if n == 0:
        return hashlib.sha256(b"").digest()
    if n == 1:
        return leaves[0]
    k = _split(n)
    return node_hash(mth(leaves[:k]), mth(leaves[k:]))


def _subproof(m: int, leaves: list[bytes], whole: bool) -> list[bytes]:
    n = len(leaves)
    if m == n:
        return [] if whole else [mth(leaves)]
    k = _split(n)
    if m <= k:
        return _subproof(m, leaves[:k], whole) + [mth(leaves[k:])]
    return _subproof(m - k, leaves[k:], False) + [mth(leaves[:k])]


def consistency_proof(m: int, leaves: list[bytes]) -> list[bytes]:
    """PROOF(m, D[n]) of RFC 6962 section 2.1.2 (empty for m = 0 or m = n)."""
    if m == 0 or m == len(leaves):
        return []
    return _subproof(m, leaves, True)


# --- checkpoints and notes -------------------------------------------------


def checkpoint_body(origin: str, size: int, root: bytes, extensions: tuple[str, ...] = ()) -> str:
    return f"{origin}\n{size}\n{b64(root)}\n" + "".join(e + "\n" for e in extensions)


class NoteKey:
    """A log's Ed25519 note key (signature type 0x01)."""

    def __init__(self, name: str, seed: bytes):
        self.name = name
        self.key = Ed25519PrivateKey.from_private_bytes(seed)
        self.public = public_bytes(self.key)
        self.id = key_id(name, 0x01, self.public)

    def vkey(self) -> str:
        return vkey(self.name, 0x01, self.public)

    def signature_line(self, text: str) -> str:
        sig = self.key.sign(text.encode())
        return f"{EM_DASH} {self.name} {b64(self.id + sig)}\n"

    def sign(self, text: str) -> str:
        """A signed note: text, an empty line, one signature line."""
        return text + "\n" + self.signature_line(text)


def cosignature_message(timestamp: int, body: str) -> bytes:
    """tlog-cosignature, "Ed25519 signed message": two lines, then the body."""
    return f"cosignature/v1\ntime {timestamp}\n".encode() + body.encode()


def cosignature_line(name: str, seed: bytes, timestamp: int, body: str) -> str:
    """A cosignature/v1 line: key id || u64 big-endian timestamp || Ed25519."""
    key = Ed25519PrivateKey.from_private_bytes(seed)
    kid = key_id(name, 0x04, public_bytes(key))
    sig = key.sign(cosignature_message(timestamp, body))
    return f"{EM_DASH} {name} {b64(kid + struct.pack('>Q', timestamp) + sig)}\n"


def verify_cosignature_line(line: str, cosigner_vkey: str, body: str) -> int:
    """Checks a cosignature line against a cosigner vkey and a checkpoint
    body; returns its timestamp. Raises on any mismatch."""
    name, public = parse_vkey(cosigner_vkey, 0x04)
    assert line.endswith("\n") and line.count("\n") == 1, repr(line)
    prefix = f"{EM_DASH} {name} "
    assert line.startswith(prefix), repr(line)
    raw = base64.b64decode(line[len(prefix) : -1], validate=True)
    assert len(raw) == 4 + 8 + 64, len(raw)
    assert raw[:4] == key_id(name, 0x04, public)
    (timestamp,) = struct.unpack(">Q", raw[4:12])
    Ed25519PublicKey.from_public_bytes(public).verify(raw[12:], cosignature_message(timestamp, body))
    return timestamp


def add_checkpoint_body(old: int, proof: list[bytes], note: str) -> bytes:
    """tlog-witness add-checkpoint: old size line, proof lines, empty line, note."""
    return (f"old {old}\n" + "".join(b64(h) + "\n" for h in proof) + "\n" + note).encode()
