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

start_server() { # port dir
  "$SERVER" --http-addr "127.0.0.1:$1" --data-dir "$2" > "$2.log" 2>&1 &
  for _ in $(seq 100); do curl -sf -o /dev/null "http://127.0.0.1:$1/healthz" && return; sleep 0.1; done
  echo "server did not start" >&2; exit 1
}
measure() { # label command...
  local t="$W/time.$RANDOM"
  /usr/bin/time -v -o "$t" "${@:2}" > /dev/null 2> "$W/err" || { cat "$W/err" >&2; exit 1; }
  local wall rss
  wall=$(awk -F': ' '/Elapsed \(wall clock\)/{print $2}' "$t")
  rss=$(awk -F': ' '/Maximum resident set size/{printf "%.0f", $2/1024}' "$t")
  printf '| %-52s | %10s | %8s MiB |\n' "$1" "$wall" "$rss"
}

echo "subject: $(stat -c %s "$APP") bytes, ${DWARF} MiB of DWARF, largest section ${LARGEST% *} B (${LARGEST#* }); $(nproc) cores"
echo "| what | wall (m:ss) | peak RSS |"
echo "|---|---:|---:|"
start_server 18021 "$W/s1"
measure "objcopy --only-keep-debug + curl (debuginfo, executable)" sh -c \
  "objcopy --only-keep-debug '$APP' '$W/subject.debug' && \
   curl -sf -o /dev/null -T '$W/subject.debug' http://127.0.0.1:18021/api/v1/debuginfo/$ID/debuginfo && \
   curl -sf -o /dev/null -T '$APP' http://127.0.0.1:18021/api/v1/debuginfo/$ID/executable"
start_server 18022 "$W/s2"
measure "symtrace-upload --no-sources" "$UPLOAD" --server http://127.0.0.1:18022 --no-sources "$W/app"
measure "symtrace-upload --no-sources, re-run (no-op)" "$UPLOAD" --server http://127.0.0.1:18022 --no-sources "$W/app"
start_server 18023 "$W/s3"
start_server 18024 "$W/s4"
measure "symtrace-upload --no-sources --compression zstd" "$UPLOAD" --server http://127.0.0.1:18024 --no-sources --compression zstd "$W/app"
measure "symtrace-upload (with sources)" "$UPLOAD" --server http://127.0.0.1:18023 "$W/app"
measure "symtrace-upload (with sources), re-run (no-op)" "$UPLOAD" --server http://127.0.0.1:18023 "$W/app"
echo
echo "sizes: objcopy debug file $(stat -c %s "$W/subject.debug") B;" \
  "served by symtrace-upload's server: $(curl -s -o /dev/null -w '%{size_download}' http://127.0.0.1:18022/buildid/$ID/debuginfo) B"
