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
# On this 2-vCPU VM the service's CPU per request moves ±4% from run to
# run, more than the effect, so the script also measures the two costs a
# sampled allocation adds, each on its own: in the process (the uprobe trap
# and the BPF program, on its own thread), from bench/workload/
# malloc_loop.c under the LD_PRELOAD library at a 256 KiB interval (one
# sample per 4,096 pairs), with a second agent (--memory-max-rate 0)
# attached against none; and in the agent (its CPU per record, from the
# runs above). Their sum per request, against the service's CPU per
# request, is the figure the noise cannot hide.
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
ALLOC_SUM=0; REQ_SUM=0
for i in $(seq "$ROUNDS"); do
  order="0 524288"; [ $((i % 2)) -eq 0 ] && order="524288 0"
  for interval in $order; do
    line=$(run "$interval")
    printf "round %d, interval %-6s: %s\n" "$i" "$interval" "$line"
    total[$interval]=$(awk -v a="${total[$interval]:-0}" -v b="$(echo "$line" | awk '{print $5}')" 'BEGIN {print a + b}')
    count[$interval]=$(( ${count[$interval]:-0} + 1 ))
    if [ "$interval" != 0 ]; then
      ALLOC_SUM=$(awk -v a="$ALLOC_SUM" -v b="$(echo "$line" | awk '{print $4}')" 'BEGIN {print a + b}')
      REQ_SUM=$(awk -v a="$REQ_SUM" -v b="$(echo "$line" | awk -v s="$SECS" '{print $1 * s}')" 'BEGIN {print a + b}')
    fi
  done
done
off=$(awk -v t="${total[0]}" -v n="${count[0]}" 'BEGIN {print t / n}')
on=$(awk -v t="${total[524288]}" -v n="${count[524288]}" 'BEGIN {print t / n}')
awk -v off="$off" -v on="$on" 'BEGIN {printf "mean service+agent CPU per request: sampling off %.3f µs, default rate %.3f µs: %+.2f%%\n", off, on, 100 * (on - off) / off}'
grep "stats:" "$W/agent.out" | tail -1 | grep -o "memory:[^|]*"
ALLOCS_PER_REQ=$(awk -v a="$ALLOC_SUM" -v r="$REQ_SUM" 'BEGIN {print a / r}')

echo "== per sampled allocation (malloc_loop: 64-byte pairs, 256 KiB interval, one sample per 4,096 pairs, CPU 1)"
make -s -C alloc/preload O="$W" CC=clang-19
clang-19 -O2 bench/workload/malloc_loop.c -o "$W/malloc_loop"
LIB="$W/libsymtrace_alloc_preload.so"
kill $AGENT; wait $AGENT 2>/dev/null || true
loop() { LD_PRELOAD=$LIB OTEL_MEMORY_SAMPLING_INTERVAL=262144 taskset -c 1 "$W/malloc_loop" 200000000 | awk '{print $1}'; }
recorded2() { grep -o 'sampled allocations [0-9]*' "$W/agent2.out" | tail -1 | awk '{print $3}'; }
start_agent2() {
  "$BIN/symtrace-agent" --server http://127.0.0.1:14924 --interval 2s --stats --memory-max-rate 0 \
    > "$W/agent2.out" 2> "$W/agent2.err" &
  AGENT2=$!
  for _ in $(seq 200); do grep -q "running processes in" "$W/agent2.err" && break; sleep 0.1; done
  LD_PRELOAD=$LIB sleep 3600 &   # maps the library: the agent attaches to it
  HOLDER=$!
  for _ in $(seq 100); do grep -q "probes attached.*libsymtrace_alloc_preload" "$W/agent2.err" && break; sleep 0.1; done
}
per_sample_process=0; per_record_agent=0
for r in 1 2 3; do
  without=$(loop)
  start_agent2
  sleep 2.5; n0=$(recorded2); a0=$(proc_cpu_ms $AGENT2)
  with=$(loop)
  sleep 4.5; n1=$(recorded2); a1=$(proc_cpu_ms $AGENT2)
  kill $HOLDER $AGENT2; wait $HOLDER $AGENT2 2>/dev/null || true
  line=$(awk -v w="$with" -v o="$without" -v a0="$a0" -v a1="$a1" -v n0="${n0:-0}" -v n1="${n1:-0}" 'BEGIN {
    printf "%.0f %.2f %d", (w - o) * 4096, (a1 - a0) * 1000 / (n1 - n0), n1 - n0 }')
  echo "round $r: no agent $without ns per pair, attached $with: in the process $(echo "$line" | awk '{print $1}') ns per sampled allocation; in the agent $(echo "$line" | awk '{print $2}') µs per record ($(echo "$line" | awk '{print $3}') records)"
  per_sample_process=$(awk -v a="$per_sample_process" -v b="$(echo "$line" | awk '{print $1}')" 'BEGIN {print a + b / 3}')
  per_record_agent=$(awk -v a="$per_record_agent" -v b="$(echo "$line" | awk '{print $2}')" 'BEGIN {print a + b / 3}')
done
awk -v p="$per_sample_process" -v g="$per_record_agent" -v off="$off" -v allocs="$ALLOCS_PER_REQ" 'BEGIN {
  extra = allocs * (p / 1000 + g)
  printf "per request: %.4f sampled allocations x (%.2f µs in the process + %.2f µs in the agent) = %.3f µs, %.2f%% of the service+agent CPU per request with sampling off (%.3f µs)\n",
    allocs, p / 1000, g, extra, 100 * extra / off, off }'
