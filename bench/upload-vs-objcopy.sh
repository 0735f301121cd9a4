#!/usr/bin/env bash
# Publishing a Rust binary with ~100 MB of DWARF (our own release
# symtrace-server, built with debug = "line-tables-only"): symtrace-upload vs
# `objcopy --only-keep-debug` + `curl` doing the same (debuginfo and
# executable), each into a fresh server. Reports wall time and peak RSS
# (GNU time), and the no-op re-run.
#
#   bench/upload-vs-objcopy.sh
#
# Needs: objcopy, curl, GNU time (/usr/bin/time).
set -euo pipefail
cd "$(dirname "$0")/.."
W=$(mktemp -d /tmp/symtrace-upbench.XXXXXX)
trap 'kill $(jobs -p) 2>/dev/null || true; rm -rf "$W"' EXIT
cargo build --release -q -p symtrace-server -p symtrace-upload
SERVER=./target/release/symtrace-server UPLOAD=./target/release/symtrace-upload
mkdir -p "$W/app"
cp "$SERVER" "$W/app/subject"
APP="$W/app/subject"
ID=$(readelf -n "$APP" | awk '/Build ID/{print $3}')
# Section sizes (hex column 6 once "[ N]" is normalised to "[N]").
sizes=$(readelf -SW "$APP" | sed 's/\[ */[/' | awk '$1 ~ /^\[[0-9]+\]$/ {print $2, $6}')
DWARF=$(awk '$1 ~ /^\.debug_/ {print $2}' <<<"$sizes" | while read -r h; do echo $((16#$h)); done | awk '{s+=$1} END {printf "%.1f", s/1048576}')
LARGEST=$(awk '{print $1, $2}' <<<"$sizes" | while read -r n h; do echo "$((16#$h)) $n"; done | sort -n | tail -1)

PORT=18020
start_server() { # -> sets URL to a fresh server
  PORT=$((PORT + 1))
  local dir="$W/s$PORT"
  "$SERVER" --http-addr "127.0.0.1:$PORT" --data-dir "$dir" > "$dir.log" 2>&1 &
  URL="http://127.0.0.1:$PORT"
  for _ in $(seq 100); do curl -sf -o /dev/null "$URL/healthz" && return; sleep 0.1; done
  echo "server did not start" >&2; exit 1
}
once() { # command... -> "seconds rss_mib"
  local t="$W/time"
  /usr/bin/time -f "%e %M" -o "$t" "$@" > /dev/null 2> "$W/err" || { cat "$W/err" >&2; exit 1; }
  awk '{printf "%s %.0f\n", $1, $2/1024}' "$t"
}
median() { sort -g | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'; }
report() { # label file-of-"seconds rss"
  printf '| %-50s | %6s s | %5s MiB |\n' "$1" "$(awk '{print $1}' "$2" | median)" "$(awk '{print $2}' "$2" | median)"
}
pair() {
  objcopy --only-keep-debug "$APP" "$W/subject.debug"
  curl -sf -o /dev/null -T "$W/subject.debug" "$URL/api/v1/debuginfo/$ID/debuginfo"
  curl -sf -o /dev/null -T "$APP" "$URL/api/v1/debuginfo/$ID/executable"
}
export -f pair
ROUNDS=${ROUNDS:-3}
echo "subject: $(stat -c %s "$APP") bytes, ${DWARF} MiB of DWARF, largest section ${LARGEST% *} B (${LARGEST#* }); $(nproc) cores; median of $ROUNDS rounds, a fresh server each"
echo "| what | wall | peak RSS |"
echo "|---|---:|---:|"
: > "$W/pair"; : > "$W/up"; : > "$W/noop"; : > "$W/zstd"; : > "$W/src"; : > "$W/srcnoop"
for _ in $(seq "$ROUNDS"); do
  start_server; export APP ID URL W; once bash -c pair >> "$W/pair"
  start_server; once "$UPLOAD" --server "$URL" --no-sources "$W/app" >> "$W/up"
  once "$UPLOAD" --server "$URL" --no-sources "$W/app" >> "$W/noop"
  start_server; once "$UPLOAD" --server "$URL" --no-sources --compression zstd "$W/app" >> "$W/zstd"
  start_server; once "$UPLOAD" --server "$URL" "$W/app" >> "$W/src"
  once "$UPLOAD" --server "$URL" "$W/app" >> "$W/srcnoop"
done
report "objcopy --only-keep-debug + curl (debuginfo, executable)" "$W/pair"
report "symtrace-upload --no-sources (loopback: uncompressed)" "$W/up"
report "symtrace-upload --no-sources, re-run (no-op)" "$W/noop"
report "symtrace-upload --no-sources --compression zstd" "$W/zstd"
report "symtrace-upload (with sources)" "$W/src"
report "symtrace-upload (with sources), re-run (no-op)" "$W/srcnoop"
