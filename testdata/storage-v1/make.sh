#!/usr/bin/env bash
# Makes a storage fixture: a data folder written by an older tally release,
# with real records posted through `tally serve`, and a pack exported from
# it before any migration. testdata/storage-v1/ (layout 1),
# testdata/storage-v2/ (layout 2) and testdata/storage-v3/ (layout 3) were
# all made with it:
#
#   bash testdata/storage-v1/make.sh /path/to/old/tally                       # into storage-v1/
#   bash testdata/storage-v1/make.sh /path/to/old/tally testdata/storage-v2   # into storage-v2/
#   bash testdata/storage-v1/make.sh /path/to/old/tally testdata/storage-v3   # into storage-v3/
#
# The binary must be a build of the release with that layout (see each
# folder's README.md for the commit it was made with). Not deterministic:
# keys, nonces and times are fresh on every run, so rerunning it replaces
# the fixture.
set -euo pipefail
TALLY=$(realpath "$1")
OUT=$(realpath "${2:-$(dirname "$0")}")
WORK=$(mktemp -d)
trap 'kill $SERVE 2>/dev/null || true; rm -rf "$WORK"' EXIT
cd "$WORK"
"$TALLY" serve --data-dir "$WORK/data" --listen 127.0.0.1:0 --rate-limit 0 >serve.out 2>serve.err &
SERVE=$!
for _ in $(seq 100); do grep -q "listening on" serve.out 2>/dev/null && break; sleep 0.2; done
URL=$(sed -n 's/^tally: listening on \([^ ]*\).*/\1/p' serve.out)
KEY=$(sed -n 's/^ *API key *//p' serve.out | head -1)
VKEY=$(sed -n 's/^ *witness key *//p' serve.out | head -1)
export TALLY_WITNESS_URL=$URL TALLY_API_KEY=$KEY
for agent in claims-bot billing-bot; do
  "$TALLY" agent init $agent --witness "$URL" --api-key "$KEY" >init-$agent.out
  PK=$(grep -o 'public-key [A-Za-z0-9+/=]*' init-$agent.out | head -1 | cut -d' ' -f2)
  "$TALLY" agent add $agent --public-key "$PK" >/dev/null
done
# One record per request, each waiting for its receipt: one group commit each.
for i in 1 2 3; do
  "$TALLY" record decision --agent claims-bot --tool refund --call-id c$i --input "{\"claim\":\"C-$i\"}" --wait-receipt >/dev/null
  "$TALLY" record outcome --agent claims-bot --call-id c$i --status ok --output "{\"refunded\":$i}" --wait-receipt >/dev/null
done
# A backlog synced at once: several records of two agents per group commit.
for i in $(seq 1 12); do
  "$TALLY" record note "billing note $i" --agent billing-bot --no-sync >/dev/null
  "$TALLY" record note "claims note $i" --agent claims-bot --no-sync >/dev/null
done
"$TALLY" agent sync billing-bot >/dev/null &
"$TALLY" agent sync claims-bot >/dev/null
wait %2 2>/dev/null || true
"$TALLY" record note "last" --agent billing-bot --wait-receipt >/dev/null
"$TALLY" export --agent claims-bot --agent billing-bot -o pack.jsonl
"$TALLY" keys export -o agent-keys.json
kill -TERM $SERVE; wait $SERVE || true
rm -f "$WORK/data/serve.lock"
rm -rf "$OUT/data" && cp -r "$WORK/data" "$OUT/data"
cp pack.jsonl agent-keys.json "$OUT/"
echo "$VKEY" >"$OUT/witness.vkey"
echo "$KEY" >"$OUT/api.key"
"$TALLY" verify "$OUT/pack.jsonl" --agent-keys "$OUT/agent-keys.json" --witness-key "$VKEY" | tail -1
ls -la "$OUT/data"
