#!/usr/bin/env bash
# Cost of memory allocation profiling to a service (issue #23; see
# docs/BENCHMARKS.md): the example HTTP service (axum + tracing +
# tracing-opentelemetry, allocating through SampledAllocator) under wrk,
# with the agent running (its defaults: memory profiling on, 19 Hz CPU
# sampling) in both arms: sampling off (OTEL_MEMORY_SAMPLING_INTERVAL=0: no
# probe fires, the allocator's countdown still runs) against the default
# rate (512 KiB). The arms alternate ROUNDS times, who goes first
# alternating too. Per run: requests/s, the service's CPU per request, the
# agent's CPU over the run, the allocations the agent recorded, and the
# extra CPU (service + agent) per request of the default rate against
# sampling off, as a share of the service's own CPU per request.
#
#   bench/memory-overhead.sh [seconds per run] [rounds]    (default 10 s, 6; as root)
set -euo pipefail
cd "$(dirname "$0")/.."
SECS=${1:-10}
ROUNDS=${2:-6}
command -v wrk >/dev/null || { echo "wrk is needed (apt-get install wrk)"; exit 1; }
cargo build --release -q -p symtrace-context --examples
cargo build --release -q -p symtrace-agent -p symtrace-server
BIN=$PWD/target/release
W=$(mktemp -d /tmp/symtrace-mem-bench.XXXXXX)
trap 'kill $(jobs -p) 2>/dev/null || true; wait 2>/dev/null || true; rm -rf "$W"' EXIT
PATH_Q='/work?alpha_ms=0&beta_ms=0'
# On-CPU time in ms at nanosecond resolution (schedstat).
cpu_ms() { awk '{print $1 / 1e6}' "/proc/$1/schedstat"; }
# Every thread's: schedstat of the process is its main thread only.
proc_cpu_ms() { cat /proc/"$1"/task/*/schedstat | awk '{s += $1} END {print s / 1e6}'; }

"$BIN/symtrace-server" --data-dir "$W/data" --http-addr 127.0.0.1:18924 \
  --grpc-addr 127.0.0.1:14924 > "$W/server.log" 2>&1 &
for _ in $(seq 100); do curl -sf http://127.0.0.1:18924/readyz >/dev/null && break; sleep 0.1; done
"$BIN/symtrace-agent" --server http://127.0.0.1:14924 --interval 10s --stats \
  > "$W/agent.out" 2> "$W/agent.err" &
AGENT=$!
for _ in $(seq 200); do grep -q "running processes in" "$W/agent.err" && break; sleep 0.1; done
allocs() { grep -o 'sampled allocations [0-9]*' "$W/agent.out" | tail -1 | awk '{print $3}'; }

run() { # run INTERVAL -> "req/s svc-µs/req agent-ms allocs-recorded"
  OTEL_MEMORY_SAMPLING_INTERVAL=$1 "$BIN/examples/http_service" 127.0.0.1:18925 bench > "$W/svc.log" 2>&1 &
  local svc=$!
  for _ in $(seq 100); do curl -sf "http://127.0.0.1:18925/noop" >/dev/null && break; sleep 0.05; done
  sleep 1.5 # the agent attaches to a new process's probes within a second
  wrk -t2 -c16 -d2s "http://127.0.0.1:18925$PATH_Q" > /dev/null   # warm-up
  local s0 s1 a0 a1 n0 n1
  s0=$(proc_cpu_ms $svc); a0=$(proc_cpu_ms $AGENT); n0=$(allocs)
  wrk -t2 -c16 -d"${SECS}s" "http://127.0.0.1:18925$PATH_Q" > "$W/wrk.txt"
  s1=$(proc_cpu_ms $svc); a1=$(proc_cpu_ms $AGENT)
  kill $svc; wait $svc 2>/dev/null || true
  sleep 10.5 # one stats line after the run
  n1=$(allocs)
  awk -v s0="$s0" -v s1="$s1" -v a0="$a0" -v a1="$a1" -v n0="${n0:-0}" -v n1="${n1:-0}" \
    '/^ +[0-9]+ requests in/ {n=$1} /Requests\/sec/ {r=$2}
     END {printf "%s %.3f %.1f %d %.3f\n", r, (s1 - s0) * 1000 / n, a1 - a0, n1 - n0, ((s1 - s0) + (a1 - a0)) * 1000 / n}' "$W/wrk.txt"
}

echo "GET $PATH_Q, wrk -t2 -c16, ${SECS}s per run; agent at its defaults in both arms"
echo "columns: req/s, service CPU µs/request, agent CPU ms over the run, allocations recorded, service+agent µs/request"
declare -A total count
for i in $(seq "$ROUNDS"); do
  order="0 524288"; [ $((i % 2)) -eq 0 ] && order="524288 0"
  for interval in $order; do
    line=$(run "$interval")
    printf "round %d, interval %-6s: %s\n" "$i" "$interval" "$line"
    total[$interval]=$(awk -v a="${total[$interval]:-0}" -v b="$(echo "$line" | awk '{print $5}')" 'BEGIN {print a + b}')
    count[$interval]=$(( ${count[$interval]:-0} + 1 ))
  done
done
off=$(awk -v t="${total[0]}" -v n="${count[0]}" 'BEGIN {print t / n}')
on=$(awk -v t="${total[524288]}" -v n="${count[524288]}" 'BEGIN {print t / n}')
awk -v off="$off" -v on="$on" 'BEGIN {printf "mean service+agent CPU per request: sampling off %.3f µs, default rate %.3f µs: %+.2f%%\n", off, on, 100 * (on - off) / off}'
grep "stats:" "$W/agent.out" | tail -1 | grep -o "memory:[^|]*"
