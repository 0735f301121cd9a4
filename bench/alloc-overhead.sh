#!/usr/bin/env bash
# What symtrace-alloc adds to an allocation that is not sampled (issue #23:
# at most 3 ns per call over the plain allocator), both sides in one run:
#  1. the LD_PRELOAD library: bench/workload/malloc_loop.c (64-byte malloc +
#     free, 100 M pairs) plain, under the library at the default interval
#     (512 KiB: one sample per 8,192 pairs) and with sampling off, one after
#     another, ROUNDS times (pinned to CPU 1);
#  2. SampledAllocator<System> against System: the criterion bench
#     `cargo bench -p symtrace-alloc --bench alloc_free`.
#   bench/alloc-overhead.sh [rounds]   (default 3)
set -euo pipefail
cd "$(dirname "$0")/.."
ROUNDS=${1:-3}
W=$(mktemp -d)
trap 'rm -rf "$W"' EXIT
make -s -C alloc/preload O="$W" CC=${CC:-clang-19}
${CC:-clang-19} -O2 bench/workload/malloc_loop.c -o "$W/malloc_loop"
LIB="$W/libsymtrace_alloc_preload.so"
pin="taskset -c 1"
echo "== the LD_PRELOAD library: 64-byte malloc + free, 100 M pairs, CPU 1"
for r in $(seq 1 "$ROUNDS"); do
  plain=$($pin "$W/malloc_loop" | awk '{print $1}')
  lib=$(LD_PRELOAD=$LIB $pin "$W/malloc_loop" | awk '{print $1}')
  off=$(LD_PRELOAD=$LIB OTEL_MEMORY_SAMPLING_INTERVAL=0 $pin "$W/malloc_loop" | awk '{print $1}')
  awk -v r="$r" -v p="$plain" -v l="$lib" -v o="$off" 'BEGIN {
    printf "round %d: glibc %.2f ns, library %.2f ns (+%.2f ns per pair, +%.2f per call), sampling off %.2f ns (+%.2f per pair)\n",
      r, p, l, l - p, (l - p) / 2, o, o - p }'
done
echo "== SampledAllocator<System> vs System (criterion)"
cargo bench -q -p symtrace-alloc --bench alloc_free -- --noplot 2>&1 | grep -E "^64-byte|time:" || true
