#!/usr/bin/env bash
# The agent's content hash (issue #37; docs/BENCHMARKS.md): the SHA-256 of a
# sampled file, which binds what an agent publishes of it to exactly that
# content. A C program padded to SIZE_MB MiB (a section no segment loads, so
# the process stays small) runs as PROCS processes at once, each spinning,
# under the release agent at 97 Hz; the agent's debug log says for each
# hash it computed the file, its bytes and the time it took. Printed: how
# many times the file was hashed (once per file, not per process, is the
# promise), the time per MiB, and `sha256sum` on the same file (coreutils,
# the same page-cache state) beside it.
#
#   bench/content-hash.sh [SIZE_MB] [PROCS]     (default 256 4; as root)
set -euo pipefail
cd "$(dirname "$0")/.."
SIZE_MB=${1:-256}
PROCS=${2:-4}
cargo build --release -q -p symtrace-agent -p symtrace-server
BIN=$PWD/target/release
W=$(mktemp -d /tmp/symtrace-hash-bench.XXXXXX)
trap 'kill $(jobs -p) 2>/dev/null || true; wait 2>/dev/null || true; rm -rf "$W"' EXIT

cat > "$W/spin.c" <<'EOF'
#include <stdlib.h>
#include <time.h>
static volatile unsigned long sink;
int main(int argc, char **argv)
{
	double secs = argc > 1 ? atof(argv[1]) : 5;
	struct timespec start, now;
	clock_gettime(CLOCK_MONOTONIC, &start);
	do {
		for (int i = 0; i < 1000000; i++)
			sink += i;
		clock_gettime(CLOCK_MONOTONIC, &now);
	} while (now.tv_sec - start.tv_sec + (now.tv_nsec - start.tv_nsec) / 1e9 < secs);
	return 0;
}
EOF
gcc -O1 -fno-omit-frame-pointer -g -o "$W/spin.small" "$W/spin.c"
head -c "$((SIZE_MB << 20))" /dev/urandom > "$W/pad"
objcopy --add-section .bench_pad="$W/pad" --set-section-flags .bench_pad=noload,readonly \
  "$W/spin.small" "$W/padded"
rm "$W/pad"
BYTES=$(stat -c %s "$W/padded")

"$BIN/symtrace-server" --data-dir "$W/data" --http-addr 127.0.0.1:18914 \
  --grpc-addr 127.0.0.1:14929 > "$W/server.log" 2>&1 &
for _ in $(seq 100); do curl -sf http://127.0.0.1:18914/readyz >/dev/null && break; sleep 0.1; done
RUST_LOG=info,symtrace_agent::files=debug NO_COLOR=1 "$BIN/symtrace-agent" \
  --server http://127.0.0.1:14929 --frequency 97 --interval 2s --no-upload-binaries \
  > "$W/agent.out" 2> "$W/agent.log" &
AGENT=$!
for _ in $(seq 300); do grep -q "running processes in" "$W/agent.log" && break; sleep 0.1; done

# The same file (one inode) in PROCS processes at once, started apart.
for _ in $(seq "$PROCS"); do
  "$W/padded" 4 &
  sleep 0.5
done
wait $(jobs -p | grep -v "^$AGENT$" | grep -v "^$(pgrep -f "$W/data" | head -1)$") 2>/dev/null || true
sleep 3
kill -INT "$AGENT"; wait "$AGENT" || true

LINES=$(grep "content hash" "$W/agent.log" | grep "path=$W/padded" || true)
COUNT=$(printf '%s\n' "$LINES" | grep -c "content hash" || true)
US=$(printf '%s\n' "$LINES" | sed -n 's/.*elapsed_us=\([0-9]*\).*/\1/p' | head -1)
# coreutils on the same file, same page cache.
T0=$(date +%s%N); sha256sum "$W/padded" > /dev/null; T1=$(date +%s%N)
awk -v b="$BYTES" -v us="${US:-0}" -v n="$COUNT" -v p="$PROCS" -v cu="$(( (T1 - T0) / 1000 ))" 'BEGIN {
  mib = b / 1048576
  printf "file: %.1f MiB, run by %d processes at once; hashed %d time(s)\n", mib, p, n
  if (us > 0) printf "agent:     %.3f ms per MiB (%.0f MiB/s; %.1f ms for the file)\n", us / 1000 / mib, mib / (us / 1e6), us / 1000
  printf "sha256sum: %.3f ms per MiB (%.0f MiB/s)\n", cu / 1000 / mib, mib / (cu / 1e6)
}'
[ "$COUNT" = 1 ] || { echo "expected one hash of the file, got $COUNT:"; printf '%s\n' "$LINES"; exit 1; }
