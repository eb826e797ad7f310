#!/usr/bin/env bash
# Browser tests of the console (docs/console.md): headless Debian chromium driven by
# playwright-core against the real `tally` binary, with records from the CLI
# and from the real `tally gateway` in front of
# @modelcontextprotocol/server-everything (both pinned in package-lock.json).
# Screenshots of each page go to target/console-screenshots/; report.test.mjs
# renders `tally report` and prints it to PDF (read back with pdftotext, from
# poppler-utils), into target/report-screenshots/.
# Run from anywhere: bash tests/e2e/console/run.sh
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
root="$(cd "$here/../../.." && pwd)"

if [ ! -x "${CHROMIUM:-/usr/bin/chromium}" ]; then
  # Debian's chromium; `npx playwright install` cannot download browsers here.
  if [ "$(id -u)" = 0 ] && command -v apt-get > /dev/null; then
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium > /dev/null
  else
    echo "chromium is missing: apt-get install chromium (or set CHROMIUM)" >&2
    exit 2
  fi
fi

if ! command -v pdftotext > /dev/null; then
  if [ "$(id -u)" = 0 ] && command -v apt-get > /dev/null; then
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq poppler-utils > /dev/null
  else
    echo "pdftotext is missing: apt-get install poppler-utils" >&2
    exit 2
  fi
fi

cargo build --quiet --locked -p tally --manifest-path "$root/Cargo.toml"
export TALLY_BIN="${CARGO_TARGET_DIR:-$root/target}/debug/tally"

cd "$here"
npm ci --silent --no-audit --no-fund
exec node --test --test-concurrency=1 console.test.mjs report.test.mjs
