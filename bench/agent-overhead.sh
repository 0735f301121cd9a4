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
# SYMTRACE_BENCH_FREQUENCIES="97" runs only the frequencies it lists.
#
# `switches` as the second argument measures the off-CPU sampler instead
# (issue #22): a context-switch-heavy workload (pairs of threads ping-ponging
# a byte over pipes, bench/workload/pingpong.c; 1 pair, or
# SYMTRACE_BENCH_PINGPONG_PAIRS; one pair switches ~100,000 times a second
# on 2 CPUs, two pairs ~1.7 million: each pair keeps to one CPU), run
# with no agent, then the agent with off-CPU off, then with off-CPU at its
# defaults (and the base agent, given SYMTRACE_BENCH_BASE_AGENT), one after
# another: each run's switches/s, the workload's round trips/s, and the
# agent's cost (its CPU and the BPF programs' run time, as a share of the
# machine). The BPF run time the kernel counts includes two clock reads per
# run of its own (run-time statistics are on only while measured): an empty
# program on the same tracepoint (bench/workload/empty_switch*.c, libbpf)
# runs beside the workload first, and each run's BPF time is also given
# less that floor per run. SYMTRACE_BENCH_OFF_CPU_PROBABILITIES="1e-9 0.01 …"
# adds a run per
# --off-cpu-probability listed (also as the span probability; 1e-9 leaves
# the program attached but recording next to nothing: its fixed cost per
# switch).
#
# SYMTRACE_BENCH_WORKLOAD=frameless runs code without frame pointers on
# every CPU instead (issue #40: plain gcc -O2 with a -fomit-frame-pointer
# vendor unit, Debian's libc qsort and zlib): the CFI walk's cost, and the
# unwind tables' memory.
#
#   bench/agent-overhead.sh [seconds per run] [busy|switches]   (default 60 busy; as root)
set -euo pipefail
cd "$(dirname "$0")/.."
SECS=${1:-60}
MODE=${2:-busy}
cargo build --release -q -p symtrace-agent -p symtrace-server
BIN=$PWD/target/release
BASE=${SYMTRACE_BENCH_BASE_AGENT:-}
W=$(mktemp -d /tmp/symtrace-agent-bench.XXXXXX)
trap 'kill $(jobs -p) 2>/dev/null || true; wait 2>/dev/null || true; rm -rf "$W"' EXIT
NCPU=$(nproc)
# On-CPU time in ms at nanosecond resolution (schedstat), not clock ticks.
cpu_ms() { awk '{print $1 / 1e6}' "/proc/$1/schedstat"; }
rss_mb() { awk '/VmRSS/ {printf "%.1f", $2 / 1024}' "/proc/$1/status"; }

"$BIN/symtrace-server" --data-dir "$W/data" --http-addr 127.0.0.1:18904 \
  --grpc-addr 127.0.0.1:14919 > "$W/server.log" 2>&1 &
for _ in $(seq 100); do curl -sf http://127.0.0.1:18904/readyz >/dev/null && break; sleep 0.1; done

if [ "$MODE" = switches ]; then
  clang-19 -O2 -pthread bench/workload/pingpong.c -o "$W/pingpong"
  [ -f /usr/include/bpf/libbpf.h ] || apt-get install -y -q libbpf-dev > /dev/null
  clang-19 -O2 -g -target bpf -D__TARGET_ARCH_x86 -c bench/workload/empty_switch.bpf.c \
    -o "$W/empty_switch.bpf.o"
  clang-19 -O2 bench/workload/empty_switch.c -lbpf -o "$W/empty_switch"
  ctxt() { awk '/^ctxt/ {print $2}' /proc/stat; }
  # One run: the workload for $SECS s beside agent binary $1 with flags $3…
  # (none: no agent), labelled $2.
  switch_run() {
    local bin=$1 label=$2; shift 2
    local A= out="$W/sw-$label.out"
    if [ -n "$bin" ]; then
      "$bin" --server http://127.0.0.1:14919 --interval 5s --stats "$@" > "$out" 2> "$W/sw-$label.err" &
      A=$!
      for _ in $(seq 300); do grep -q "running processes in" "$W/sw-$label.err" && break; sleep 0.1; done
    fi
    local c0; c0=$(ctxt)
    local trips; trips=$("$W/pingpong" "$SECS" "$PAIRS" | awk '{print $3}')
    local c1; c1=$(ctxt)
    local cost="agent off"
    if [ -n "$A" ]; then
      kill -INT "$A"; wait "$A" || true
      # Steady intervals (every stats line but the first, which holds
      # start-up): the agent's CPU and the BPF run time, as in busy mode.
      cost=$(grep '^stats:' "$out" | tail -n +2 | awk '
        { n++
          match($0, /= [0-9.]+% of machine/); a += substr($0, RSTART + 2, RLENGTH - 14)
          match($0, /BPF [0-9.]+ ms over [0-9]+ runs = [0-9.]+%/); x = substr($0, RSTART, RLENGTH)
          sub(/.*= /, "", x); sub(/%/, "", x); b += x
          match($0, /off-CPU waits [0-9]+ \([0-9.]+\/s\)/); w = substr($0, RSTART, RLENGTH)
          match($0, /BPF [0-9.]+ ms over [0-9]+ runs/); y = substr($0, RSTART + 4, RLENGTH - 9)
          split(y, f, " ms over "); ms += f[1]; runs += f[2] }
        END { c = b * (1 - runs * floor / (ms * 1e6)); if (c < 0) c = 0
              printf "agent CPU %.3f%% + BPF %.3f%% = %.3f%% of the machine; less the statistics floor: BPF %.3f%%, together %.3f%% (%d intervals; %s)",
                     a / n, b / n, (a + b) / n, c / n, (a + c) / n, n, w }' floor="$FLOOR")
    fi
    awk -v l="$label" -v c="$((c1 - c0))" -v s="$SECS" -v t="$trips" -v cost="$cost" 'BEGIN {
      printf "%-18s %8.0f switches/s | %7.0f round trips/s | %s\n", l, c / s, t, cost }'
  }
  PAIRS=${SYMTRACE_BENCH_PINGPONG_PAIRS:-1}
  echo "machine: $NCPU CPUs; context-switch-heavy workload ($PAIRS ping-pong pairs); $SECS s per run"
  switch_run "" "no agent"
  "$W/pingpong" "$SECS" "$PAIRS" > /dev/null &
  floor_line=$("$W/empty_switch" "$W/empty_switch.bpf.o" $((SECS - 2)))
  wait $!
  FLOOR=$(echo "$floor_line" | awk '{print $(NF - 3)}')
  echo "statistics floor, $floor_line"
  switch_run "$BIN/symtrace-agent" "off-CPU off" --off-cpu-probability 0 --off-cpu-span-probability 0
  switch_run "$BIN/symtrace-agent" "off-CPU defaults"
  for p in ${SYMTRACE_BENCH_OFF_CPU_PROBABILITIES:-}; do
    switch_run "$BIN/symtrace-agent" "off-CPU p=$p" --off-cpu-probability "$p" \
      --off-cpu-span-probability "$p"
  done
  [ -n "$BASE" ] && switch_run "$BASE" "base agent"
  switch_run "" "no agent, again"
  exit 0
fi

if [ "${SYMTRACE_BENCH_WORKLOAD:-}" = frameless ]; then
  # Code without frame pointers everywhere (issue #40): plain gcc -O2, a
  # vendor unit built -fomit-frame-pointer, Debian's libc qsort and zlib;
  # one process per CPU, in turn qsort, vendor, zlib.
  gcc -O2 -g -fomit-frame-pointer -c agent/tests/workload/cfi_vendor.c -o "$W/vendor.o"
  gcc -O2 -g agent/tests/workload/cfi_cases.c "$W/vendor.o" /lib/x86_64-linux-gnu/libz.so.1 \
    -o "$W/frameless"
  modes=(qsort vendor zlib)
  for i in $(seq "$NCPU"); do
    "$W/frameless" "${modes[$(( (i - 1) % 3 ))]}" 1000000 >/dev/null &
  done
  echo "workload: frameless (plain gcc -O2, vendor -fomit-frame-pointer, libc qsort, zlib)"
else
  clang-19 -O1 -g -fno-omit-frame-pointer -mno-omit-leaf-frame-pointer \
    -fno-optimize-sibling-calls -pthread agent/tests/workload/cpu_split.c -o "$W/busy"
  for _ in $(seq $(( (NCPU + 1) / 2 ))); do "$W/busy" 1000000 1000000 >/dev/null & done
fi

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
  # Steady intervals: every stats line but the first. Of those, the
  # quiet ones: no file met for the first time in it (the binaries read,
  # the content hashes and the unwind-table builds, all counted since
  # start, the same as at the line before): the agent's cost on a host
  # whose processes it knows, apart from the one-off work a new file
  # costs once (reading, hashing, its table), which falls in whichever
  # interval first samples the file (the bench's own 150 MB server
  # binary, hashed when first sampled, is most of it).
  grep '^stats:' "$out" | awk -v hz="$hz" -v rss="$rss" -v label="$label" -v res="$W/results" '
    { once = ""
      if (match($0, /binaries [0-9]+/)) once = once substr($0, RSTART, RLENGTH)
      if (match($0, /content hashes [0-9]+ /)) once = once substr($0, RSTART, RLENGTH)
      if (match($0, /builds [0-9]+ /)) once = once substr($0, RSTART, RLENGTH)
      quiet = NR > 1 && once == prev_once; prev_once = once
      if (NR == 1) next
      n++
      match($0, /samples [0-9.]+\/s/); s += substr($0, RSTART + 8, RLENGTH - 10)
      match($0, /= [0-9.]+% of machine/); ai = substr($0, RSTART + 2, RLENGTH - 14); a += ai
      match($0, /BPF [0-9.]+ ms over [0-9]+ runs = [0-9.]+%/); x = substr($0, RSTART, RLENGTH)
      sub(/.*= /, "", x); sub(/%/, "", x); b += x
      if (quiet) { qn++; qa += ai; qb += x }
      cfi = "-"; if (match($0, /CFI cache [0-9]+ files [0-9]+ KiB/)) cfi = substr($0, RSTART + 10, RLENGTH - 10)
      # Since start (agents before #37 have none): each file is hashed
      # once, so a run that meets a large binary pays its hash in one
      # interval.
      h = "-"; if (match($0, /content hashes [0-9]+ \([0-9.]+ MiB, [0-9.]+ ms CPU\)/)) h = substr($0, RSTART + 15, RLENGTH - 15)
      t = "-"; if (match($0, /frames stepped by frame pointer [0-9]+, by CFI [0-9]+(, rule lookups answered by the memo [0-9]+)?/)) t = substr($0, RSTART + 15, RLENGTH - 15)
      u = "-"; if (match($0, /files [0-9]+, rows [0-9]+, rules [0-9]+, [0-9]+ of [0-9]+ KiB/)) u = substr($0, RSTART, RLENGTH) }
    END { printf "%-5s %3d Hz: %5.1f samples/s | agent CPU %.4f%% + BPF %.4f%% = %.4f%% of the machine | RSS %s MB | CFI %s (%d intervals) | content hashes %s | frames %s | tables %s\n",
                 label, hz, s / n, a / n, b / n, (a + b) / n, rss, cfi, n, h, t, u
          if (qn) printf "      quiet intervals (no file met first): %d of %d: agent CPU %.4f%% + BPF %.4f%% = %.4f%% of the machine\n",
                 qn, n, qa / qn, qb / qn, (qa + qb) / qn
          else printf "      quiet intervals (no file met first): none of %d\n", n
          printf "%s %d %.6f %s\n", label, hz, (a + b) / n, qn ? sprintf("%.6f %d", (qa + qb) / qn, qn) : "- 0" >> res }'
  grep '^total:' "$out" | sed 's/^/    /' | cut -c1-400
}

for hz in ${SYMTRACE_BENCH_FREQUENCIES:-19 97}; do
  if [ -n "$BASE" ]; then
    run_agent "$BASE" "$hz" base
    run_agent "$BIN/symtrace-agent" "$hz" new
    run_agent "$BIN/symtrace-agent" "$hz" new
    run_agent "$BASE" "$hz" base
    # Quiet intervals: weighted by their number in each run.
    awk -v hz="$hz" '$2 == hz { sum[$1] += $3; n[$1]++; if ($5) { qs[$1] += $4 * $5; qn[$1] += $5 } }
      END { b = sum["base"] / n["base"]; x = sum["new"] / n["new"]
            printf "%d Hz side by side: base %.4f%%, new %.4f%% of the machine: new/base = %.2f\n", hz, b, x, x / b
            if (qn["base"] && qn["new"]) {
              b = qs["base"] / qn["base"]; x = qs["new"] / qn["new"]
              printf "%d Hz side by side, quiet intervals (%d base, %d new): base %.4f%%, new %.4f%% of the machine: new/base = %.2f\n",
                     hz, qn["base"], qn["new"], b, x, x / b }
            else printf "%d Hz side by side, quiet intervals: too few to compare\n", hz }' "$W/results"
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
