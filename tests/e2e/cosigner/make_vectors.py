"""Writes the cosignature/v1 vectors of testdata/cosignature/ (one case per
file), independently of tally's code: c2sp.py and Python `cryptography`,
from the c2sp.org/tlog-cosignature text. Ed25519 is deterministic, so the
output is the same on every run; run.sh regenerates the files and fails on
any difference.

    python make_vectors.py OUT_DIR
"""

import hashlib
import json
import sys
from pathlib import Path

import c2sp

SOURCE = (
    "made by tests/e2e/cosigner/make_vectors.py (Python, `cryptography` Ed25519) "
    "from the c2sp.org/tlog-cosignature text, not by tally's code"
)

# The checkpoint of the tlog-cosignature and tlog-witness examples.
SPEC_BODY = "example.com/behind-the-sofa\n20852163\nCsUYapGGPo4dkMgIAUqom/Xajj7h2fB2MPA3j2jxq2I=\n"

CASES = [
    (
        "v1-spec-example",
        "the checkpoint of the specification's example, cosigned at the example's time",
        "witness.example.com/w1",
        1679315147,
        SPEC_BODY,
    ),
    (
        "v1-extension-lines",
        "a checkpoint with two extension lines: the signed message includes them",
        "cosigner.example/c1",
        1800000000,
        c2sp.checkpoint_body(
            "tally.local/log",
            42,
            hashlib.sha256(b"tally vector root").digest(),
            ("ext one", "ext two"),
        ),
    ),
    (
        "v1-max-timestamp",
        "the largest timestamp allowed, 2^63 - 1, in decimal on the time line",
        "cosigner.example/c2",
        2**63 - 1,
        c2sp.checkpoint_body("tally.local/log", 0, hashlib.sha256(b"").digest()),
    ),
]


def main() -> None:
    out = Path(sys.argv[1])
    out.mkdir(parents=True, exist_ok=True)
    for file, description, name, timestamp, body in CASES:
        seed = hashlib.sha256(f"tally cosignature vector {file}".encode()).digest()
        public = c2sp.public_bytes(c2sp.Ed25519PrivateKey.from_private_bytes(seed))
        line = c2sp.cosignature_line(name, seed, timestamp, body)
        case = {
            "description": description,
            "source": SOURCE,
            "cosigner_name": name,
            "cosigner_seed": seed.hex(),
            "cosigner_vkey": c2sp.vkey(name, 0x04, public),
            "timestamp": timestamp,
            "checkpoint_body": body,
            "signed_message": c2sp.cosignature_message(timestamp, body).decode(),
            "signature_line": line,
        }
        assert c2sp.verify_cosignature_line(line, case["cosigner_vkey"], body) == timestamp
        (out / f"{file}.json").write_text(json.dumps(case, indent=2, ensure_ascii=False) + "\n")


if __name__ == "__main__":
    main()
