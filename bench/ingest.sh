#!/usr/bin/env bash
# OTLP profiles ingest (see docs/BENCHMARKS.md):
#  1. the physical limit on one core: gunzip + prost decode of the payloads;
#  2. end-to-end ingest through symtrace-server pinned to that core
#     (4 connections: throughput; 1 connection: latency without queueing);
#  3. storage cost per event as ingested and after compaction, on distinct
#     exports, with random-nanosecond and with 19 Hz periodic timestamps,
#     and where the compacted bytes go, column by column.
#
#   bench/ingest.sh [medium|large] [seconds]
#
# SQLite + a local directory (the embedded defaults: fsync on every export).
set -euo pipefail
cd "$(dirname "$0")/.."
SIZE=${1:-medium}
SECS=${2:-20}
# SYMTRACE_BENCH_BIN: a directory with other symtrace-server and
# symtrace-loadtest binaries (an older build, to compare in one session).
if [ -n "${SYMTRACE_BENCH_BIN:-}" ]; then
  BIN=$SYMTRACE_BENCH_BIN
else
  cargo build --release -q -p symtrace-server -p symtrace-loadtest
  BIN=$PWD/target/release
fi
DATA=$(mktemp -d)
SERVER=
trap 'stop; rm -rf "$DATA"' EXIT

start() { # start DIR [extra server flags]: server pinned to CPU 1
  local dir=$1; shift
  taskset -c 1 "$BIN/symtrace-server" --data-dir "$dir" --http-addr 127.0.0.1:18902 \
    --grpc-addr 127.0.0.1:14917 "$@" >>"$dir.log" 2>&1 &
  SERVER=$!
  for _ in $(seq 100); do curl -sf http://127.0.0.1:18902/readyz >/dev/null && return; sleep 0.1; done
  echo "server did not start"; cat "$dir.log"; exit 1
}
stop() { [ -n "$SERVER" ] && kill "$SERVER" 2>/dev/null && wait "$SERVER" 2>/dev/null; SERVER=; true; }
load() { taskset -c 0 "$BIN/symtrace-loadtest" otlp --url http://127.0.0.1:18902 --size "$SIZE" "$@" | grep -v '^{'; }
stats() {
  sqlite3 "$1/symtrace.db" "SELECT level, count(*), sum(size), sum(points), \
    printf('%.2f', 1.0*sum(size)/sum(points)) FROM profile_segments GROUP BY level" |
    awk -F'|' '{printf "  level %s: %s segments, %s bytes, %s events, %s B/event\n", $1,$2,$3,$4,$5}'
}
compact() { # compact DIR (the data is 2 h old: its windows have closed)
  stop
  start "$1" --compaction-interval 1 --compaction-window 3600 --compaction-delay 0
  for _ in $(seq 300); do
    [ "$(sqlite3 "$1/symtrace.db" 'SELECT count(*) FROM profile_segments WHERE level = 0')" = 0 ] && break
    sleep 1
  done
  stop
}

echo "== 1. gunzip + prost decode on CPU 1 ($SIZE)"
taskset -c 1 "$BIN/symtrace-loadtest" decode-baseline --size "$SIZE" --duration 10s | head -1

echo "== 2a. ingest, server on CPU 1, 4 connections, ${SECS}s"
start "$DATA/a" --compaction-interval 0
load --duration "${SECS}s" --connections 4
echo "  server CPU seconds: $(awk '{print ($14+$15)/100}' /proc/$SERVER/stat)"
echo "== 2b. ingest, 1 connection (latency without queueing), 10s"
load --duration 10s --connections 1
stop

for ts in random periodic; do
  flag=; [ $ts = periodic ] && flag=--periodic
  echo "== 3. storage, 40 distinct exports, $ts timestamps"
  start "$DATA/$ts" --compaction-interval 0
  load --payloads 40 --max-exports 40 --connections 2 --duration 300s --ago 7200 $flag | grep -E 'raw B/event|exports ok'
  echo "  as ingested:"; stats "$DATA/$ts"
  compact "$DATA/$ts"
  echo "  compacted (1 h window):"; stats "$DATA/$ts"
  echo "  where the compacted bytes go (each group of columns compressed alone):"
  for sha in $(sqlite3 "$DATA/$ts/symtrace.db" "SELECT sha256 FROM profile_segments WHERE level = 1"); do
    "$BIN/symtrace-loadtest" segment-columns "$DATA/$ts/objects/blobs/${sha:0:2}/$sha" | sed 's/^/    /'
  done
done
