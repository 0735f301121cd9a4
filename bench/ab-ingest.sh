#!/usr/bin/env bash
# Ingest throughput of two server builds, interleaved (A B A B …) so that
# the machine's drift falls on both: each round starts one build's
# symtrace-server pinned to CPU 1 on a fresh data directory and loads it
# for 20 s from CPU 0 with 4 connections of 1 MB exports.
#
#   bench/ab-ingest.sh DIR_A DIR_B [rounds]
#
# Each DIR holds a release symtrace-server; the loadtest is this tree's.
set -euo pipefail
cd "$(dirname "$0")/.."
A=$1 B=$2 ROUNDS=${3:-2}
cargo build --release -q -p symtrace-loadtest
LOAD=$PWD/target/release/symtrace-loadtest
for round in $(seq "$ROUNDS"); do
  for dir in "$A" "$B"; do
    data=$(mktemp -d)
    taskset -c 1 "$dir/symtrace-server" --data-dir "$data" --http-addr 127.0.0.1:18902 \
      --grpc-addr 127.0.0.1:14917 >/dev/null 2>&1 &
    pid=$!
    for _ in $(seq 100); do curl -sf http://127.0.0.1:18902/readyz >/dev/null && break; sleep 0.1; done
    line=$(taskset -c 0 "$LOAD" otlp --url http://127.0.0.1:18902 --size medium --duration 20s \
      --connections 4 | grep -E '^otlp |^events/s' | tr -s ' ' | tr '\n' ' ')
    echo "round $round $dir: $line"
    kill "$pid"; wait "$pid" 2>/dev/null || true
    rm -rf "$data"
  done
done
