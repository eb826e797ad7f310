#!/usr/bin/env bash
# Tests of the TypeScript SDK (tally-agent) with node's test runner, against
# the real `tally serve` and `tally verify`, with the frameworks' own pinned
# packages and test models (package-lock.json). Run from anywhere:
# bash sdk/typescript/run.sh [node --test args]
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
root="$(cd "$here/../.." && pwd)"

cargo build --quiet --locked -p tally -p tally-node --manifest-path "$root/Cargo.toml"
export TALLY_BIN="${CARGO_TARGET_DIR:-$root/target}/debug/tally"

cd "$here"
# --ignore-scripts: the install script would build the release addon; the
# tests load the debug build made just above.
npm ci --silent --no-audit --no-fund --ignore-scripts
TALLY_NODE_PROFILE=debug node build.js
# TAP whatever the terminal: .ci/run counts its `# pass N` / `# fail N` lines.
exec node --test --test-reporter=tap "$@" test/*.test.js
