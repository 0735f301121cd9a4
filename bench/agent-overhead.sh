#!/usr/bin/env bash
# symtrace-agent overhead on a busy machine (see docs/BENCHMARKS.md): every
# CPU runs a spinning thread (the agent's C test workload), the agent samples
# at 19 Hz and then at 97 Hz and exports to a local server every 10 s. From
# the agent's own --stats lines (steady-state intervals only; the first one
# holds start-up): its CPU (user+sys) and the BPF programs' run time
# (kernel.bpf_stats), each as a share of the machine's CPU. Then the same
# machine under `perf record -F 97 -g -a` for comparison: perf's own CPU and
# the data it writes.
#
# With SYMTRACE_BENCH_BASE_AGENT=PATH (another build of symtrace-agent, e.g.
# the previous commit's), each frequency runs base, this build, this build,
# base, one after another in the same run, so the two are compared side by
# side on the same machine state; the script prints both and their ratio.
#
#   bench/agent-overhead.sh [seconds per run]     (default 60; as root)
set -euo pipefail
cd "$(dirname "$0")/.."
SECS=${1:-60}
cargo build --release -q -p symtrace-agent -p symtrace-server
BIN=$PWD/target/release
BASE=${SYMTRACE_BENCH_BASE_AGENT:-}
W=$(mktemp -d /tmp/symtrace-agent-bench.XXXXXX)
trap 'kill $(jobs -p) 2>/dev/null || true; wait 2>/dev/null || true; rm -rf "$W"' EXIT
NCPU=$(nproc)
# On-CPU time in ms at nanosecond resolution (schedstat), not clock ticks.
cpu_ms() { awk '{print $1 / 1e6}' "/proc/$1/schedstat"; }
rss_mb() { awk '/VmRSS/ {printf "%.1f", $2 / 1024}' "/proc/$1/status"; }

clang-19 -O1 -g -fno-omit-frame-pointer -mno-omit-leaf-frame-pointer \
  -fno-optimize-sibling-calls -pthread agent/tests/workload/cpu_split.c -o "$W/busy"
for _ in $(seq $(( (NCPU + 1) / 2 ))); do "$W/busy" 1000000 1000000 >/dev/null & done

"$BIN/symtrace-server" --data-dir "$W/data" --http-addr 127.0.0.1:18904 \
  --grpc-addr 127.0.0.1:14919 > "$W/server.log" 2>&1 &
for _ in $(seq 100); do curl -sf http://127.0.0.1:18904/readyz >/dev/null && break; sleep 0.1; done

echo "machine: $NCPU CPUs, all busy; $SECS s per run"
# One run of agent binary $1 at $2 Hz, labelled $3: prints the averages of
# its steady intervals; appends "label hz together%" to $W/results.
run_agent() {
  local bin=$1 hz=$2 label=$3 out="$W/agent-$3-$2.out" err="$W/agent-$3-$2.err"
  "$bin" --server http://127.0.0.1:14919 --frequency "$hz" --interval 10s \
    --stats > "$out" 2> "$err" &
  local A=$!
  for _ in $(seq 300); do grep -q "sampling " "$err" && break; sleep 0.1; done
  sleep "$SECS"
  local rss; rss=$(rss_mb $A)
  kill -INT $A; wait $A || true
  # Steady intervals: every stats line but the first.
  grep '^stats:' "$out" | tail -n +2 | awk -v hz="$hz" -v rss="$rss" -v label="$label" -v res="$W/results" '
    { n++
      match($0, /samples [0-9.]+\/s/); s += substr($0, RSTART + 8, RLENGTH - 10)
      match($0, /= [0-9.]+% of machine/); a += substr($0, RSTART + 2, RLENGTH - 14)
      match($0, /BPF [0-9.]+ ms over [0-9]+ runs = [0-9.]+%/); x = substr($0, RSTART, RLENGTH)
      sub(/.*= /, "", x); sub(/%/, "", x); b += x
      cfi = "-"; if (match($0, /CFI cache [0-9]+ files [0-9]+ KiB/)) cfi = substr($0, RSTART + 10, RLENGTH - 10) }
    END { printf "%-5s %3d Hz: %5.1f samples/s | agent CPU %.4f%% + BPF %.4f%% = %.4f%% of the machine | RSS %s MB | CFI %s (%d intervals)\n",
                 label, hz, s / n, a / n, b / n, (a + b) / n, rss, cfi, n
          printf "%s %d %.6f\n", label, hz, (a + b) / n >> res }'
  grep '^total:' "$out" | sed 's/^/    /' | cut -c1-400
}

for hz in 19 97; do
  if [ -n "$BASE" ]; then
    run_agent "$BASE" "$hz" base
    run_agent "$BIN/symtrace-agent" "$hz" new
    run_agent "$BIN/symtrace-agent" "$hz" new
    run_agent "$BASE" "$hz" base
    awk -v hz="$hz" '$2 == hz { sum[$1] += $3; n[$1]++ }
      END { b = sum["base"] / n["base"]; x = sum["new"] / n["new"]
            printf "%d Hz side by side: base %.4f%%, new %.4f%% of the machine: new/base = %.2f\n", hz, b, x, x / b }' "$W/results"
  else
    run_agent "$BIN/symtrace-agent" "$hz" agent
  fi
done

perf record -F 97 -g -a -o "$W/perf.data" -- sleep $((SECS + 5)) > "$W/perf.log" 2>&1 &
P=$!
sleep 2
c0=$(cpu_ms "$P"); sleep "$SECS"; c1=$(cpu_ms "$P"); rss=$(rss_mb "$P")
wait "$P"
size=$(du -m "$W/perf.data" | cut -f1)
awk -v c0="$c0" -v c1="$c1" -v n="$NCPU" -v s="$SECS" -v rss="$rss" -v size="$size" 'BEGIN {
  printf "perf record -F 97 -g -a: perf CPU %.4f%% of the machine (%.1f ms) | RSS %s MB | %s MB written\n", 100 * (c1 - c0) / 1000 / (n * s), c1 - c0, rss, size }'
