#!/usr/bin/env bash
# OTLP profiles ingest: end-to-end throughput of one server core vs the
# physical limit (gunzip + prost decode of the same payloads on that core),
# and storage cost per event before and after compaction.
#
#   bench/ingest.sh [medium|large] [seconds]
#
# The server runs pinned to CPU 1 with SQLite + a local directory (the
# embedded defaults, fsync on every export); the load generator runs on CPU 0.
set -euo pipefail
cd "$(dirname "$0")/.."
SIZE=${1:-medium}
SECS=${2:-20}
cargo build --release -q -p symtrace-server -p symtrace-loadtest
BIN=target/release
DATA=$(mktemp -d)
trap 'kill $SERVER 2>/dev/null || true; rm -rf "$DATA"' EXIT

echo "== decode baseline (gunzip + prost decode), CPU 1, $SIZE"
taskset -c 1 $BIN/symtrace-loadtest decode-baseline --size "$SIZE" --duration 10s | head -1

echo "== ingest through symtrace-server on CPU 1, $SIZE, ${SECS}s, 4 connections"
taskset -c 1 $BIN/symtrace-server --data-dir "$DATA" --http-addr 127.0.0.1:18902 \
  --grpc-addr 127.0.0.1:14917 --compaction-interval 0 >"$DATA/server.log" 2>&1 &
SERVER=$!
for _ in $(seq 100); do curl -sf http://127.0.0.1:18902/readyz >/dev/null && break; sleep 0.1; done
taskset -c 0 $BIN/symtrace-loadtest otlp --url http://127.0.0.1:18902 --size "$SIZE" \
  --duration "${SECS}s" --connections 4 | grep -v '^{'
CPU=$(awk '{print ($14+$15)/100}' /proc/$SERVER/stat)
echo "server CPU seconds  $CPU"

stats() {
  sqlite3 "$DATA/symtrace.db" "SELECT level, count(*), sum(size), sum(points), \
    printf('%.2f', 1.0*sum(size)/sum(points)) FROM profile_segments GROUP BY level" |
    awk -F'|' '{printf "level %s: %s segments, %s bytes, %s events, %s B/event\n", $1,$2,$3,$4,$5}'
}
echo "== storage as ingested"; stats
kill $SERVER; wait $SERVER 2>/dev/null || true
echo "== compacting (window 1h)"
$BIN/symtrace-server --data-dir "$DATA" --http-addr 127.0.0.1:18902 --grpc-addr 127.0.0.1:14917 \
  --compaction-interval 1 --compaction-window 3600 --compaction-delay 0 >>"$DATA/server.log" 2>&1 &
SERVER=$!
# Windows close on the hour: compact everything by pretending it is later.
for _ in $(seq 600); do
  left=$(sqlite3 "$DATA/symtrace.db" "SELECT count(*) FROM profile_segments WHERE level = 0 \
    AND start_ns < (strftime('%s','now') / 3600) * 3600 * 1000000000")
  [ "$left" = 0 ] && break; sleep 1
done
stats
