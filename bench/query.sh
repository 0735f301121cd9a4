#!/usr/bin/env bash
# Flamegraph query latency (see docs/BENCHMARKS.md): one service, one hour,
# 1,000,000 samples over 50,000 distinct stacks and 20 build-IDs whose debug
# info is in the store — real ELF files (our release binaries and the
# largest build scripts under target/), uploaded as their own debuginfo, so
# every query really symbolizes. Measured:
#   a. the first query ever (symbol indexes built from DWARF meanwhile);
#   b. warm: N queries, as ingested (360 level-0 segments);
#   c. cold: a restarted server with the OS page cache dropped;
#   d. the same after compaction (one segment per hour window), cold and warm.
#
#   bench/query.sh [iterations]
#
# SQLite + a local directory; server and loadtest share the 2 cores.
set -euo pipefail
cd "$(dirname "$0")/.."
N=${1:-30}
# SYMTRACE_BENCH_BIN: a directory with other symtrace-server and
# symtrace-loadtest binaries (an older build, to compare in one session).
if [ -n "${SYMTRACE_BENCH_BIN:-}" ]; then
  BIN=$SYMTRACE_BENCH_BIN
else
  cargo build --release -q -p symtrace-server -p symtrace-loadtest
  BIN=$PWD/target/release
fi
DATA=$(mktemp -d)
URL=http://127.0.0.1:18903
Q='service=bench-svc&from=now-3h&to=now'
SERVER=
trap 'stop; rm -rf "$DATA"' EXIT

start() { # start [extra server flags]
  "$BIN/symtrace-server" --data-dir "$DATA/d" --http-addr 127.0.0.1:18903 \
    --grpc-addr 127.0.0.1:14918 "$@" >>"$DATA/server.log" 2>&1 &
  SERVER=$!
  for _ in $(seq 100); do curl -sf $URL/readyz >/dev/null && return; sleep 0.1; done
  echo "server did not start"; cat "$DATA/server.log"; exit 1
}
stop() { [ -n "$SERVER" ] && kill "$SERVER" 2>/dev/null && wait "$SERVER" 2>/dev/null; SERVER=; true; }
cold() { stop; sync; echo 3 > /proc/sys/vm/drop_caches 2>/dev/null || echo "  (page cache not dropped: not root)"; start "$@"; }
query() { "$BIN/symtrace-loadtest" query --url $URL --query "$Q" --iterations "$1" | grep -v '^{'; }
rss() { echo "  server peak RSS: $(awk '/VmHWM/{print $2/1024 " MiB"}' /proc/$SERVER/status)"; }
segments() {
  sqlite3 "$DATA/d/symtrace.db" "SELECT level, count(*), sum(size) FROM profile_segments GROUP BY level" |
    awk -F'|' '{printf "  level %s: %s segments, %.1f MB\n", $1, $2, $3/1e6}'
}

# 20 ELF files with distinct build-IDs, largest first.
mapfile -t ELF < <(
  # (this tree's release binaries, whichever BIN is measured: the same files
  # for every run)
  for f in target/release/symtrace-server target/release/symtrace-loadtest target/release/symtrace-upload \
           target/*/build/*/build-script-build; do
    [ -f "$f" ] || continue
    id=$(readelf -n "$f" 2>/dev/null | awk '/Build ID/{print $3}')
    [ -n "$id" ] && echo "$id $(stat -c %s "$f") $f"
  done | sort -u -k1,1 | sort -k2,2 -rn | head -20 | awk '{print $3}')
echo "== ELF files (${#ELF[@]}): $(du -cb "${ELF[@]}" | tail -1 | awk '{printf "%.0f MB", $1/1e6}')"

start --compaction-interval 0
echo "== seeding"
"$BIN/symtrace-loadtest" query-seed --url $URL --service bench-svc --upload --ago 7200 --elf "${ELF[@]}"
segments

echo "== a. first query ever (indexes built from DWARF meanwhile)"
query 0
for _ in $(seq 120); do
  built=$(curl -s $URL/metrics | awk '/^symtrace_symbol_index_builds_total\{result="ok"\}/{print $2}')
  [ "${built:-0}" -ge "${#ELF[@]}" ] && break
  sleep 1
done
echo "  symbol indexes built: ${built:-0}"

echo "== b. warm, as ingested"
query "$N"; rss
echo "== c. cold (restart, page cache dropped), as ingested"
cold --compaction-interval 0
query "$N"; rss

echo "== d. compacted"
stop
start --compaction-interval 1 --compaction-delay 0
for _ in $(seq 600); do
  [ "$(sqlite3 "$DATA/d/symtrace.db" 'SELECT count(*) FROM profile_segments WHERE level = 0')" = 0 ] && break
  sleep 1
done
segments
cold --compaction-interval 0
query "$N"; rss
