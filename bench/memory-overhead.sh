#!/usr/bin/env bash
# Cost of memory allocation profiling to a service (issue #23; see
# docs/BENCHMARKS.md): the example HTTP service (axum + tracing +
# tracing-opentelemetry, allocating through SampledAllocator) under wrk,
# with the agent running (its defaults: memory profiling on, 19 Hz CPU
# sampling, --stats) in both arms: sampling off (OTEL_MEMORY_SAMPLING_
# INTERVAL=0: no probe fires, the allocator's countdown still runs) against
# the default rate (512 KiB). The arms alternate ROUNDS times, who goes
# first alternating too. Per run: requests/s, the service's CPU per
# request, the agent's CPU over the run, the allocations it recorded, the
# memory BPF program's run time (the kernel's accounting), and service +
# agent CPU per request.
#
# On this 2-vCPU VM the service's CPU per request moves ±4% from run to
# run, more than the effect, so the script also adds up what a sampled
# allocation costs, each part measured on its own:
#  - in the service's threads: the BPF program's run time per sampled
#    allocation (alloc + free, from the runs above), and the two uprobe
#    traps around it (from bench/workload/malloc_loop.c under the
#    LD_PRELOAD library at a 128 KiB interval, one sample per 2,048
#    64-byte pairs, with an agent attached against none, less that run's
#    BPF time);
#  - in the agent: its extra CPU per record (default-rate runs against
#    sampling-off runs above);
# times the sampled allocations per request, against the service's CPU
# per request.
#
# `startup` measures what keeping a probe file attached costs (issue #38:
# the agent attaches at start to the preload library it is told of, and
# keeps files attached when no process maps them, so processes are covered
# from their first allocation): the start of a short process under the
# preload library (exec to exit, RUNS runs of `true`) with no agent, with an
# agent without memory profiling (--no-memory: what any agent costs an
# exec), and with an agent that has the library attached (named at start);
# and the agent's own start with the library named and not.
#
#   bench/memory-overhead.sh [seconds per run] [rounds]    (default 10 s, 6; as root)
#   bench/memory-overhead.sh startup [runs]                (default 2000)
set -euo pipefail
cd "$(dirname "$0")/.."
if [ "${1:-}" = startup ]; then
  RUNS=${2:-2000}
  cargo build --release -q -p symtrace-agent -p symtrace-server
  BIN=$PWD/target/release
  W=$(mktemp -d /tmp/symtrace-mem-start.XXXXXX)
  trap 'kill $(jobs -p) 2>/dev/null || true; wait 2>/dev/null || true; rm -rf "$W"' EXIT
  mkdir "$W/lib"
  make -s -C alloc/preload O="$W/lib" CC=clang-19
  LIB="$W/lib/libsymtrace_alloc_preload.so"
  "$BIN/symtrace-server" --data-dir "$W/data" --http-addr 127.0.0.1:18926 \
    --grpc-addr 127.0.0.1:14926 > "$W/server.log" 2>&1 &
  for _ in $(seq 100); do curl -sf http://127.0.0.1:18926/readyz >/dev/null && break; sleep 0.1; done
  # µs per start of `true` under the library, over RUNS runs.
  starts() {
    python3 - "$LIB" "$RUNS" <<'PY'
import os, subprocess, sys, time
lib, runs = sys.argv[1], int(sys.argv[2])
env = dict(os.environ, LD_PRELOAD=lib)
t = time.perf_counter()
for _ in range(runs):
    subprocess.run(["/bin/true"], env=env, check=True)
print(f"{(time.perf_counter() - t) / runs * 1e6:.1f}")
PY
  }
  # Starts an agent (extra flags: $@); READY is how long until it said it
  # read the running processes (ms).
  agent() {
    local t0 t1
    t0=$(date +%s%N)
    NO_COLOR=1 "$BIN/symtrace-agent" --server http://127.0.0.1:14926 --interval 10s --no-upload-binaries "$@" \
      > "$W/agent.out" 2> "$W/agent.err" &
    AGENT=$!
    for _ in $(seq 600); do grep -q "running processes in" "$W/agent.err" && break; sleep 0.01; done
    t1=$(date +%s%N)
    READY=$(( (t1 - t0) / 1000000 ))
  }
  echo "start of /bin/true under the preload library, µs per run over $RUNS runs"
  for r in 1 2 3; do
    none=$(starts)
    agent --no-memory; no_memory=$(starts); kill $AGENT; wait $AGENT 2>/dev/null || true
    agent; ready_plain=$READY; kill $AGENT; wait $AGENT 2>/dev/null || true
    agent --memory-probe-files "$W/lib"; ready_named=$READY
    grep -q "otel_memory probes attached.*named=true" "$W/agent.err" || { echo "not attached"; exit 1; }
    attached=$(starts)
    kill $AGENT; wait $AGENT 2>/dev/null || true
    echo "round $r: no agent $none µs, agent without memory profiling $no_memory µs, library attached $attached µs; agent ready in $ready_plain ms, with the library named $ready_named ms"
  done
  exit 0
fi
SECS=${1:-10}
ROUNDS=${2:-6}
command -v wrk >/dev/null || { echo "wrk is needed (apt-get install wrk)"; exit 1; }
cargo build --release -q -p symtrace-context --examples
cargo build --release -q -p symtrace-agent -p symtrace-server
BIN=$PWD/target/release
W=$(mktemp -d /tmp/symtrace-mem-bench.XXXXXX)
trap 'kill $(jobs -p) 2>/dev/null || true; wait 2>/dev/null || true; rm -rf "$W"' EXIT
PATH_Q='/work?alpha_ms=0&beta_ms=0'
# Every thread's on-CPU time in ms (schedstat, nanosecond resolution).
proc_cpu_ms() { cat /proc/"$1"/task/*/schedstat | awk '{s += $1} END {print s / 1e6}'; }
# The memory BPF program's run time (ns) and runs (BPF stats are on while
# an agent runs with --stats).
bpf_usdt() {
  bpftool prog show name on_usdt -j 2>/dev/null | python3 -c '
import json, sys
p = json.load(sys.stdin)
p = p[0] if isinstance(p, list) else p
print(p.get("run_time_ns", 0), p.get("run_cnt", 0))'
}

"$BIN/symtrace-server" --data-dir "$W/data" --http-addr 127.0.0.1:18924 \
  --grpc-addr 127.0.0.1:14924 > "$W/server.log" 2>&1 &
for _ in $(seq 100); do curl -sf http://127.0.0.1:18924/readyz >/dev/null && break; sleep 0.1; done
"$BIN/symtrace-agent" --server http://127.0.0.1:14924 --interval 10s --stats \
  > "$W/agent.out" 2> "$W/agent.err" &
AGENT=$!
for _ in $(seq 200); do grep -q "running processes in" "$W/agent.err" && break; sleep 0.1; done
allocs() { grep -o 'sampled allocations [0-9]*' "$W/agent.out" | tail -1 | awk '{print $3}'; }

run() { # run INTERVAL -> "req/s svc-µs/req agent-ms records bpf-ms svc+agent-µs/req requests"
  OTEL_MEMORY_SAMPLING_INTERVAL=$1 "$BIN/examples/http_service" 127.0.0.1:18925 bench > "$W/svc.log" 2>&1 &
  local svc=$!
  for _ in $(seq 100); do curl -sf "http://127.0.0.1:18925/noop" >/dev/null && break; sleep 0.05; done
  sleep 1.5 # the agent attaches to a new process's probes within a second
  wrk -t2 -c16 -d2s "http://127.0.0.1:18925$PATH_Q" > /dev/null   # warm-up
  local s0 s1 a0 a1 n0 n1 b0 b1
  s0=$(proc_cpu_ms $svc); a0=$(proc_cpu_ms $AGENT); n0=$(allocs); b0=$(bpf_usdt)
  wrk -t2 -c16 -d"${SECS}s" "http://127.0.0.1:18925$PATH_Q" > "$W/wrk.txt"
  s1=$(proc_cpu_ms $svc); a1=$(proc_cpu_ms $AGENT); b1=$(bpf_usdt)
  kill $svc; wait $svc 2>/dev/null || true
  sleep 10.5 # one stats line after the run
  n1=$(allocs)
  awk -v s0="$s0" -v s1="$s1" -v a0="$a0" -v a1="$a1" -v n0="${n0:-0}" -v n1="${n1:-0}" \
    -v b0="${b0%% *}" -v b1="${b1%% *}" \
    '/^ +[0-9]+ requests in/ {n=$1} /Requests\/sec/ {r=$2}
     END {printf "%s %.3f %.1f %d %.1f %.3f %d\n", r, (s1 - s0) * 1000 / n, a1 - a0, n1 - n0,
          (b1 - b0) / 1e6, ((s1 - s0) + (a1 - a0)) * 1000 / n, n}' "$W/wrk.txt"
}

echo "GET $PATH_Q, wrk -t2 -c16, ${SECS}s per run; the agent at its defaults in both arms"
echo "columns: req/s, service CPU µs/request, agent CPU ms, allocations recorded, memory BPF ms, service+agent µs/request"
: > "$W/runs"
for i in $(seq "$ROUNDS"); do
  order="0 524288"; [ $((i % 2)) -eq 0 ] && order="524288 0"
  for interval in $order; do
    line=$(run "$interval")
    printf "round %d, interval %-6s: %s\n" "$i" "$interval" "$(echo "$line" | cut -d' ' -f1-6)"
    echo "$interval $line" >> "$W/runs"
  done
done
# Means per arm; per default-rate record: the agent's extra CPU and the BPF
# program's time, both in µs; sampled allocations per request.
read -r OFF ON AGENT_PER_RECORD BPF_PER_SAMPLE PER_REQ < <(awk '
  $1 == 0 {off += $7; offn++; aoff += $4}
  $1 != 0 {on += $7; onn++; aon += $4; rec += $5; bpf += $6; req += $8}
  END {print off / offn, on / onn, (aon / onn - aoff / offn) * 1000 / (rec / onn), bpf * 1000 / rec, rec / req}' "$W/runs")
awk -v off="$OFF" -v on="$ON" 'BEGIN {printf "mean service+agent CPU per request: sampling off %.3f µs, default rate %.3f µs: %+.2f%%\n", off, on, 100 * (on - off) / off}'
grep "stats:" "$W/agent.out" | tail -1 | grep -o "memory:[^|]*"
kill $AGENT; wait $AGENT 2>/dev/null || true

echo "== the uprobe traps (malloc_loop: 300 M 64-byte pairs, 128 KiB interval, one sample per 2,048 pairs, CPU 1)"
make -s -C alloc/preload O="$W" CC=clang-19
clang-19 -O2 bench/workload/malloc_loop.c -o "$W/malloc_loop"
LIB="$W/libsymtrace_alloc_preload.so"
loop() { LD_PRELOAD=$LIB OTEL_MEMORY_SAMPLING_INTERVAL=131072 taskset -c 1 "$W/malloc_loop" 300000000 | awk '{print $1}'; }
start_agent2() {
  "$BIN/symtrace-agent" --server http://127.0.0.1:14924 --interval 2s --stats --memory-max-rate 0 \
    > "$W/agent2.out" 2> "$W/agent2.err" &
  AGENT2=$!
  for _ in $(seq 200); do grep -q "running processes in" "$W/agent2.err" && break; sleep 0.1; done
  LD_PRELOAD=$LIB sleep 3600 &   # maps the library: the agent attaches to it
  HOLDER=$!
  for _ in $(seq 100); do grep -q "probes attached.*libsymtrace_alloc_preload" "$W/agent2.err" && break; sleep 0.1; done
}
TRAPS=0
for r in 1 2 3; do
  without=$(loop)
  start_agent2
  b0=$(bpf_usdt)
  with=$(loop)
  b1=$(bpf_usdt)
  kill $HOLDER $AGENT2; wait $HOLDER $AGENT2 2>/dev/null || true
  line=$(awk -v w="$with" -v o="$without" -v b0="${b0%% *}" -v b1="${b1%% *}" 'BEGIN {
    samples = 300000000 / 2048; total = (w - o) * 2048; bpf = (b1 - b0) / samples
    printf "%.0f %.0f %.0f", total, bpf, total - bpf }')
  read -r total bpf traps <<< "$line"
  echo "round $r: no agent $without ns per pair, attached $with: $total ns per sampled allocation, of which BPF $bpf ns, the traps $traps ns"
  TRAPS=$(awk -v a="$TRAPS" -v b="$traps" 'BEGIN {print a + b / 3}')
done
awk -v off="$OFF" -v per="$PER_REQ" -v bpf="$BPF_PER_SAMPLE" -v traps="$TRAPS" -v agent="$AGENT_PER_RECORD" 'BEGIN {
  sample = bpf + traps / 1000 + agent
  printf "per sampled allocation: BPF %.2f µs (in the service, alloc + free) + traps %.2f µs + agent %.2f µs = %.2f µs\n", bpf, traps / 1000, agent, sample
  printf "per request: %.4f sampled allocations x %.2f µs = %.3f µs, %.2f%% of the CPU per request with sampling off (%.3f µs)\n",
    per, sample, per * sample, 100 * per * sample / off, off }'
