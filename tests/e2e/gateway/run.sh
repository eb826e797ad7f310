#!/usr/bin/env bash
# End-to-end tests of `tally gateway` with real parts from the registries:
# the official MCP Python SDK (pinned in requirements.txt) as the client and
# @modelcontextprotocol/server-everything (pinned in package-lock.json) as
# the server, over stdio (test_gateway.py) and over Streamable HTTP
# (test_gateway_http.py, which also starts `tally serve` and runs
# `tally verify`), three gateways of one agent at once (test_multi.py), and
# action tools' outcomes from their structured results (test_actions.py,
# with a small server of its own, mail_server.py).
# Run from anywhere: bash tests/e2e/gateway/run.sh [pytest args]
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
root="$(cd "$here/../../.." && pwd)"

cargo build --quiet --locked -p tally --manifest-path "$root/Cargo.toml"
export TALLY_BIN="${CARGO_TARGET_DIR:-$root/target}/debug/tally"

venv="${TALLY_E2E_VENV:-$here/.venv}"
if [ ! -x "$venv/bin/python" ]; then
  python3 -m venv "$venv"
fi
"$venv/bin/pip" install --quiet --disable-pip-version-check -r "$here/requirements.txt"

(cd "$here" && npm ci --silent --no-audit --no-fund)
export SERVER_EVERYTHING="$here/node_modules/@modelcontextprotocol/server-everything/dist/index.js"

cd "$here"
exec "$venv/bin/python" -m pytest -q -p no:cacheprovider "$@" test_gateway.py test_newcomer.py test_gateway_http.py test_multi.py test_actions.py test_toolcheck.py
