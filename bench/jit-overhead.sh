#!/usr/bin/env bash
# symtrace-agent overhead with a Node.js service whose perf map holds about
# 100,000 entries (issue #24; see docs/BENCHMARKS.md). The service
# (bench/workload/jit_bench.js, node --perf-basic-prof
# --interpreted-frames-native-stack) compiles 50,000 small functions at
# start (two perf-map lines each) and serves GET /work (executeHeavyTask →
# innerLoop, ~5 ms of CPU) to `wrk -t1 -c2`. Two runs, one after another:
# the agent off, then the agent at 97 Hz exporting every 10 s to a local
# server (started after the service; its first samples of the JIT code
# read the whole map, a one-off cost shown by the stats line of that
# interval, during 15 s of load before the measured run). For each:
# requests/s; for the agent over the measured run: its CPU (schedstat, all
# threads) and the BPF programs' run time (kernel.bpf_stats, from its
# --stats lines) as a share of the machine, its RSS, and its jit counters.
#
#   bench/jit-overhead.sh [seconds per run]   (default 60; as root)
set -euo pipefail
cd "$(dirname "$0")/.."
SECS=${1:-60}
cargo build --release -q -p symtrace-agent -p symtrace-server
BIN=$PWD/target/release
W=$(mktemp -d /tmp/symtrace-jit-bench.XXXXXX)
trap 'kill $(jobs -p) 2>/dev/null || true; wait 2>/dev/null || true; rm -rf "$W"' EXIT
NCPU=$(nproc)
# On-CPU time of every thread of a process, ms (schedstat: nanoseconds).
cpu_ms() { cat /proc/$1/task/*/schedstat | awk '{s += $1} END {print s / 1e6}'; }
rss_mb() { awk '/VmRSS/ {printf "%.1f", $2 / 1024}' "/proc/$1/status"; }

"$BIN/symtrace-server" --data-dir "$W/data" --http-addr 127.0.0.1:18934 \
  --grpc-addr 127.0.0.1:14934 > "$W/server.log" 2>&1 &
for _ in $(seq 100); do curl -sf http://127.0.0.1:18934/readyz >/dev/null && break; sleep 0.1; done

node --perf-basic-prof --interpreted-frames-native-stack bench/workload/jit_bench.js 50000 18935 \
  > "$W/node.out" 2>&1 &
NODE=$!
for _ in $(seq 300); do grep -q ready "$W/node.out" 2>/dev/null && break; sleep 0.1; done
echo "node $(node --version), perf map: $(wc -l < /tmp/perf-$NODE.map) entries, $(du -k /tmp/perf-$NODE.map | cut -f1) KiB"
URL=http://127.0.0.1:18935/work
wrk -t1 -c2 -d3s "$URL" > /dev/null   # warm-up

echo "== agent off (${SECS}s)"
wrk -t1 -c2 -d"${SECS}s" "$URL" | awk '/Requests\/sec/ {print "requests/s", $2}'

echo "== agent at 97 Hz (${SECS}s)"
"$BIN/symtrace-agent" --server http://127.0.0.1:14934 --frequency 97 --interval 10s --stats \
  > "$W/agent.out" 2> "$W/agent.err" &
AGENT=$!
sleep 2
wrk -t1 -c2 -d15s "$URL" > /dev/null   # the agent reads the map
a0=$(cpu_ms $AGENT); t0=$(date +%s.%N)
wrk -t1 -c2 -d"${SECS}s" "$URL" | awk '/Requests\/sec/ {print "requests/s", $2}'
a1=$(cpu_ms $AGENT); t1=$(date +%s.%N)
echo "agent RSS $(rss_mb $AGENT) MiB"
awk -v a0="$a0" -v a1="$a1" -v t0="$t0" -v t1="$t1" -v n="$NCPU" \
  'BEGIN {printf "agent CPU %.1f ms over %.1f s = %.3f%% of the machine (%d CPUs)\n", a1 - a0, t1 - t0, 100 * (a1 - a0) / ((t1 - t0) * 1000 * n), n}'
echo "the agent's stats lines (every 10 s; the first holds start-up and the first read of the map):"
grep "stats:" "$W/agent.out" | sed 's/.*\(jit:[^|]*\).*\(agent CPU.*\)/  \1| \2/'
kill -INT $AGENT; wait $AGENT || true
sleep 1
curl -s "http://127.0.0.1:18934/api/v1/flamegraph?service=node&format=folded&from=now-1h&to=now" > "$W/folded.txt"
awk '{n = $NF; total += n} /executeHeavyTask/ {named += n} END {printf "samples %d, under executeHeavyTask %d (%.1f%%)\n", total, named, 100 * named / (total ? total : 1)}' "$W/folded.txt"
echo "heaviest stacks:"; sort -k2 -t' ' -rn "$W/folded.txt" | awk '{print $NF, $0}' | sort -rn | head -3 | cut -c1-400 || true
kill $NODE; rm -f "/tmp/perf-$NODE.map"
