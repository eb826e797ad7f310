#!/usr/bin/env bash
# Ingest on PostgreSQL with one front and with two fronts, beside redb, and
# the CPU each process spends per record (docs/benchmarks.md, "Two fronts:
# where the CPU goes"). Runs as root: PostgreSQL (Debian's, from
# /usr/lib/postgresql/N/bin) runs as `nobody` in a folder under /var/tmp,
# removed at the end.
#
#   cargo build --release --locked -p tally -p tally-bench
#   bash bench/scripts/pg-fronts.sh            # env: T ROUNDS RECORDS PROFILE
#
# T: the folder of the release binaries (default target/release); ROUNDS
# (3) of RECORDS (16000) records each; PROFILE=1 loads pg_stat_statements
# and prints each PostgreSQL run's costliest statements.
# Per run it prints records/s, then microseconds of CPU per record: of each
# front (user + system, from /proc), of its sequencer thread, and of all of
# PostgreSQL's processes.
set -euo pipefail
cd "$(dirname "$0")/../.."
T=${T:-target/release}
ROUNDS=${ROUNDS:-3}
RECORDS=${RECORDS:-16000}
PROFILE=${PROFILE:-0}
PGBIN=$(ls -d /usr/lib/postgresql/*/bin | sort -V | tail -1)
W=$(mktemp -d /var/tmp/tally-pg-fronts.XXXX)
chmod 755 "$W"
chown nobody "$W"
PORT=${PORT:-55439}
preload=""
[ "$PROFILE" = 1 ] && preload=" -c shared_preload_libraries=pg_stat_statements"
su nobody -s /bin/sh -c "$PGBIN/initdb -D $W/data -A trust -U tally -E UTF8 --locale C >/dev/null"
su nobody -s /bin/sh -c "$PGBIN/pg_ctl -D $W/data -l $W/pg.log -o '-p $PORT -k $W -c listen_addresses=127.0.0.1 -c max_connections=300$preload' -w start >/dev/null"
cleanup() {
  kill $(jobs -p) 2> /dev/null || true
  su nobody -s /bin/sh -c "$PGBIN/pg_ctl -D $W/data -m fast stop" > /dev/null || true
  rm -rf "$W"
}
trap cleanup EXIT
psql() { command psql -q -h 127.0.0.1 -p "$PORT" -U tally "$@"; }
[ "$PROFILE" = 1 ] && psql -c "create extension pg_stat_statements" postgres
HZ=$(getconf CLK_TCK)
ticks() { awk '{print $14 + $15}' "/proc/$1/stat"; }
# The ticks of process $1's threads whose name starts with $2.
thread_ticks() {
  local s=0 t
  for t in /proc/"$1"/task/*; do
    case "$(cat "$t/comm")" in "$2"*) s=$((s + $(awk '{print $14 + $15}' "$t/stat"))) ;; esac
  done
  echo "$s"
}
pg_ticks() {
  local s=0 p
  for p in $(pgrep -u nobody postgres); do s=$((s + $(ticks "$p" 2> /dev/null || echo 0))); done
  echo "$s"
}
us() { awk -v t="$1" -v n="$2" -v hz="$HZ" 'BEGIN { printf "%.0f", t / hz * 1e6 / n }'; }
# Starts a front on data folder $1 and port $2; prints its pid.
start() {
  "$T/tally" serve --data-dir "$1" --store "postgres://tally@127.0.0.1:$PORT/$DB" \
    --listen "127.0.0.1:$2" --rate-limit 0 --max-in-flight 100000 --max-skew 86400 > "$1.out" 2>&1 &
  echo $!
  for _ in $(seq 150); do curl -s -o /dev/null "http://127.0.0.1:$2/" && return; sleep 0.2; done
  echo "the front on port $2 did not start:" >&2
  cat "$1.out" >&2
  return 1
}
bench() {
  "$T/tally-bench" ingest --records "$RECORDS" --agents 128 --concurrency 64 --verify-secs 1 "$@"
}
for r in $(seq "$ROUNDS"); do
  bench > "$W/redb.out" 2>&1
  echo "round $r redb (load $(cut -d' ' -f1 /proc/loadavg)): $(grep -o '[0-9,.]* records/s' "$W/redb.out" | head -1), $(grep -o 'raw: *[0-9]* [^/]*/s' "$W/redb.out" | head -1)"
  for mode in one two; do
    DB="r$r$mode"
    psql -c "create database $DB" postgres
    rm -rf "$W/A" "$W/B" "$W/A.out" "$W/B.out"
    A=$(start "$W/A" 7911)
    KEY=$(grep -o 'TALLY_API_KEY=[^ ]*' "$W/A.out" | head -1 | cut -d= -f2)
    witnesses=(--witness http://127.0.0.1:7911)
    B=""
    if [ "$mode" = two ]; then
      kill "$A"
      sleep 1
      cp -a "$W/A" "$W/B"
      A=$(start "$W/A" 7911)
      B=$(start "$W/B" 7912)
      witnesses+=(--witness http://127.0.0.1:7912)
    fi
    sleep 1
    [ "$PROFILE" = 1 ] && psql -c "select pg_stat_statements_reset()" postgres > /dev/null
    a0=$(ticks "$A") as0=$(thread_ticks "$A" tally-log-seq) p0=$(pg_ticks) b0=0
    [ -n "$B" ] && b0=$(ticks "$B")
    load=$(cut -d' ' -f1 /proc/loadavg)
    bench "${witnesses[@]}" --api-key "$KEY" > "$W/bench.out" 2>&1 || { cat "$W/bench.out"; exit 1; }
    a1=$(ticks "$A") as1=$(thread_ticks "$A" tally-log-seq) p1=$(pg_ticks) b1=0
    [ -n "$B" ] && b1=$(ticks "$B")
    n=$(grep -o '^ingest: *[0-9]*' "$W/bench.out" | grep -o '[0-9]*$')
    echo "round $r $mode front(s) (load $load): $(grep -o '[0-9,.]* records/s' "$W/bench.out" | head -1), $(grep -o '[0-9.]* records per commit' "$W/bench.out" | head -1);" \
      "CPU us per record: front A $(us $((a1 - a0)) "$n") (its sequencer thread $(us $((as1 - as0)) "$n")), front B $(us $((b1 - b0)) "$n"), PostgreSQL $(us $((p1 - p0)) "$n")"
    if [ "$PROFILE" = 1 ]; then
      psql -P pager=off -c "select calls, round(total_exec_time::numeric) as ms, rows,
          regexp_replace(left(query, 80), '\s+', ' ', 'g') as query from pg_stat_statements
          where dbid = (select oid from pg_database where datname = '$DB')
          order by total_exec_time desc limit 12" postgres
    fi
    kill "$A" $B 2> /dev/null || true
    sleep 1
  done
done
