#!/usr/bin/env bash
# One replica under production-shaped load (issue #9's first target): a
# release symtrace-server with the embedded defaults (SQLite + a local
# directory, fsync per export) and symtrace-loadtest sharing this machine's
# cores, unpinned. Three runs, each on a fresh server:
#   1. otlp alone (1 MB gzip exports, 2 connections);
#   2. mixed: the same exports + debuginfod clients (50 requests/s: 20%
#      misses, 2% uploads) + a flamegraph or trace query every 10 s;
#   3. mixed with a query every second (the query cost made visible).
# Prints each run's table (the JSON summaries are kept in target/load-*.json).
#
#   bench/load.sh [SECONDS=60]
set -euo pipefail
cd "$(dirname "$0")/.."
SECONDS_PER_RUN=${1:-60}
cargo build --release -q -p symtrace-server -p symtrace-loadtest
BIN=$PWD/target/release
W=$(mktemp -d /tmp/symtrace-load.XXXXXX)
trap 'kill $(jobs -p) 2>/dev/null || true; rm -rf "$W"' EXIT
URL=http://127.0.0.1:18920

run() {
  local name=$1; shift
  rm -rf "$W/data"
  "$BIN/symtrace-server" --http-addr 127.0.0.1:18920 --grpc-addr 127.0.0.1:18921 --data-dir "$W/data" \
    > "$W/server.log" 2>&1 &
  local pid=$!
  for _ in $(seq 100); do curl -sf -o /dev/null "$URL/readyz" && break; sleep 0.1; done
  echo "== $name"
  "$BIN/symtrace-loadtest" "$@" --url "$URL" --duration "${SECONDS_PER_RUN}s" --json "target/load-$name.json" | grep -v '^{'
  kill "$pid"; wait "$pid" 2>/dev/null || true
  echo
}
run otlp otlp --connections 2
run mixed mixed --otlp-connections 2 --debuginfod-rate 50 --query-interval 10s --verify
run mixed-queries mixed --otlp-connections 2 --debuginfod-rate 50 --query-interval 1s --verify
