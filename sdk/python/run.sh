#!/usr/bin/env bash
# The Python SDK's tests (sdk/python/README.md "Tests"): builds the `tally`
# binary, makes a venv, installs the package from this folder (maturin over
# PyO3, a debug build: release builds are for bench.py) and the pinned test
# requirements (requirements-test.txt: pytest, the MCP Python SDK and the
# frameworks the adapters are tested with), and runs pytest against the
# real `tally serve`, `tally verify` and `tally record`.
# Run from anywhere: bash sdk/python/run.sh [pytest args]
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
root="$(cd "$here/../.." && pwd)"

cargo build --quiet --locked -p tally --manifest-path "$root/Cargo.toml"
export TALLY_BIN="${CARGO_TARGET_DIR:-$root/target}/debug/tally"

venv="${TALLY_SDK_VENV:-$here/.venv}"
if [ ! -x "$venv/bin/python" ]; then
  python3 -m venv "$venv"
fi
"$venv/bin/pip" install --quiet --disable-pip-version-check -r "$here/requirements-test.txt"
# maturin (pinned in requirements-test.txt) from the venv: no isolated build
# environment to download; `pip install ./sdk/python` alone makes one.
PATH="$venv/bin:$PATH" MATURIN_PEP517_ARGS="--profile dev --locked" \
  "$venv/bin/pip" install --quiet --disable-pip-version-check --no-build-isolation --force-reinstall --no-deps "$here"

# From tests/, so `import tally` finds the installed package, not ./tally.
cd "$here/tests"
# pytest's exit status is the script's: 5 ("no tests collected") fails too.
exec "$venv/bin/python" -m pytest -q -p no:cacheprovider "$@"
