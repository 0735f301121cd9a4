#!/usr/bin/env bash
# Cost of publishing trace contexts to an application (see
# docs/BENCHMARKS.md): the example HTTP service (axum + tracing +
# tracing-opentelemetry, 3 spans per /work request) under wrk, with
# symtrace-context's TraceContextLayer and without it (SYMTRACE_CONTEXT=off),
# alternating ROUNDS times, who goes first alternating too, so the machine's
# drift hits both alike. Then the
# per-call cost from criterion.
#
#   bench/context-overhead.sh [seconds per run] [rounds]    (default 10 s, 6)
set -euo pipefail
cd "$(dirname "$0")/.."
SECS=${1:-10}
ROUNDS=${2:-6}
command -v wrk >/dev/null || { echo "wrk is needed (apt-get install wrk)"; exit 1; }
cargo build --release -q -p symtrace-context --examples
BIN=$PWD/target/release/examples/http_service
W=$(mktemp -d /tmp/symtrace-ctx-bench.XXXXXX)
trap 'kill $(jobs -p) 2>/dev/null || true; rm -rf "$W"' EXIT
PATH_Q='/work?alpha_ms=0&beta_ms=0'

TCK=$(getconf CLK_TCK)
cpu_ms() { awk -v t="$TCK" '{print ($14 + $15) * 1000 / t}' "/proc/$1/stat"; }

run() { # run on|off -> "req/s p50 p99 service-CPU-µs-per-request"
  SYMTRACE_CONTEXT=$1 "$BIN" 127.0.0.1:18911 bench > "$W/svc.log" 2>&1 &
  local svc=$!
  for _ in $(seq 100); do curl -sf "http://127.0.0.1:18911/noop" >/dev/null && break; sleep 0.05; done
  wrk -t2 -c16 -d2s --latency "http://127.0.0.1:18911$PATH_Q" > /dev/null   # warm-up
  local c0 c1
  c0=$(cpu_ms $svc)
  wrk -t2 -c16 -d"${SECS}s" --latency "http://127.0.0.1:18911$PATH_Q" > "$W/wrk.txt"
  c1=$(cpu_ms $svc)
  kill $svc; wait $svc 2>/dev/null || true
  awk -v c0="$c0" -v c1="$c1" '/^ +[0-9]+ requests in/ {n=$1} /Requests\/sec/ {r=$2} /^ +50%/ {p50=$2} /^ +99%/ {p99=$2}
    END {printf "%s %s %s %.2f\n", r, p50, p99, (c1 - c0) * 1000 / n}' "$W/wrk.txt"
}

echo "GET $PATH_Q (3 spans per request), wrk -t2 -c16, ${SECS}s per run"
for i in $(seq "$ROUNDS"); do
  order="off on"; [ $((i % 2)) -eq 0 ] && order="on off"   # alternate who goes first
  for mode in $order; do
    printf "round %d, context %-3s: req/s p50 p99 cpu-µs/req = %s\n" "$i" "$mode" "$(run $mode)"
  done
done

echo "per call (criterion):"
cargo bench -q -p symtrace-context --bench enter_exit 2>/dev/null | grep -B1 'time:' | grep -v '^--' 
