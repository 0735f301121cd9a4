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
# The mixed runs' fleet has 200 services, 40 in each export (a host's
# share), so a one-service flamegraph selects a 200th of the fleet; each
# export carries a trace of its own, and the trace lookups ask for recent
# ones. Each run uses a tenant of its own. LOAD_BACKEND=postgres runs the
# server on PostgreSQL + S3 instead of the embedded defaults (those of
# scripts/test-services.sh, a database and a bucket prefix per run).
#
#   [SYMTRACE_BENCH_BIN=DIR] [LOAD_BACKEND=embedded|postgres] [LOAD_RUNS='otlp mixed mixed-queries'] \
#     bench/load.sh [SECONDS=60]
set -euo pipefail
cd "$(dirname "$0")/.."
SECONDS_PER_RUN=${1:-60}
cargo build --release -q -p symtrace-server -p symtrace-loadtest
BIN=$PWD/target/release
# SYMTRACE_BENCH_BIN: a directory with another symtrace-server (an older
# build, to compare in one session; the load generator stays this tree's).
SERVER_BIN=${SYMTRACE_BENCH_BIN:-$BIN}
W=$(mktemp -d /tmp/symtrace-load.XXXXXX)
trap 'kill $(jobs -p) 2>/dev/null || true; rm -rf "$W"' EXIT
URL=http://127.0.0.1:18920

BACKEND=${LOAD_BACKEND:-embedded}
if [ "$BACKEND" = postgres ]; then
  eval "$(scripts/test-services.sh)"
  export AWS_ACCESS_KEY_ID=$SYMTRACE_TEST_S3_ACCESS_KEY AWS_SECRET_ACCESS_KEY=$SYMTRACE_TEST_S3_SECRET_KEY \
    AWS_ENDPOINT_URL=$SYMTRACE_TEST_S3_ENDPOINT AWS_ALLOW_HTTP=true AWS_REGION=us-east-1
fi

run() {
  local name=$1; shift
  rm -rf "$W/data"
  if [ "$BACKEND" = postgres ]; then
    local db="load_${name//-/_}_$$"
    psql "$SYMTRACE_TEST_POSTGRES_URL" -qAtc "CREATE DATABASE $db"
    export SYMTRACE_DATABASE_URL=${SYMTRACE_TEST_POSTGRES_URL/\/postgres\?/\/$db?}
    export SYMTRACE_STORAGE_URL="s3://$SYMTRACE_TEST_S3_BUCKET/$db"
  fi
  "$SERVER_BIN/symtrace-server" --http-addr 127.0.0.1:18920 --grpc-addr 127.0.0.1:18921 --data-dir "$W/data" \
    > "$W/server.log" 2>&1 &
  local pid=$!
  for _ in $(seq 100); do curl -sf -o /dev/null "$URL/readyz" && break; sleep 0.1; done
  echo "== $name"
  "$BIN/symtrace-loadtest" "$@" --url "$URL" --duration "${SECONDS_PER_RUN}s" \
    --tenant "load-$name-$$" --json "target/load-$name.json" | grep -v '^{'
  kill "$pid"; wait "$pid" 2>/dev/null || true
  echo
}
RUNS=${LOAD_RUNS:-otlp mixed mixed-queries}
for r in $RUNS; do
  case $r in
    otlp) run otlp otlp --connections 2 ;;
    mixed) run mixed mixed --otlp-connections 2 --debuginfod-rate 50 --query-interval 10s \
      --services 200 --verify ;;
    mixed-queries) run mixed-queries mixed --otlp-connections 2 --debuginfod-rate 50 \
      --query-interval 1s --services 200 --verify ;;
    *) echo "unknown run $r"; exit 1 ;;
  esac
done
