#!/usr/bin/env bash
# End-to-end tests of `tally cosigner serve` with a client written from the
# C2SP specifications in Python (c2sp.py: the standard library and the
# pinned `cryptography`), against the real binary; and a check that
# testdata/cosignature is what make_vectors.py makes.
# Run from anywhere: bash tests/e2e/cosigner/run.sh [pytest args]
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
root="$(cd "$here/../../.." && pwd)"

cargo build --quiet --locked -p tally --manifest-path "$root/Cargo.toml"
export TALLY_BIN="${CARGO_TARGET_DIR:-$root/target}/debug/tally"

venv="${TALLY_E2E_COSIGNER_VENV:-$here/.venv}"
if [ ! -x "$venv/bin/python" ]; then
  python3 -m venv "$venv"
fi
"$venv/bin/pip" install --quiet --disable-pip-version-check -r "$here/requirements.txt"

cd "$here"
exec "$venv/bin/python" -m pytest -q -p no:cacheprovider "$@" test_cosigner.py
