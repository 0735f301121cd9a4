#!/usr/bin/env bash
# Dogfooding: publish our own binaries (this build's symtrace-server and
# symtrace-upload and symtrace-agent, frame pointers kept by .cargo/config.toml) with our own
# uploader to a throwaway server, through the frame-pointer gate, and fetch
# the debug info back with elfutils' debuginfod-find.
#
#   scripts/dogfood.sh [debug|release]     (default: debug, what the tests built)
set -euo pipefail
cd "$(dirname "$0")/.."
PROFILE=${1:-debug}
if [ "$PROFILE" = release ]; then cargo build --release -q -p symtrace-server -p symtrace-upload -p symtrace-agent; else cargo build -q -p symtrace-server -p symtrace-upload -p symtrace-agent; fi
BIN=target/$PROFILE
W=$(mktemp -d /tmp/symtrace-dogfood.XXXXXX)
trap 'kill $(jobs -p) 2>/dev/null || true; rm -rf "$W"' EXIT
mkdir -p "$W/publish"
cp "$BIN/symtrace-server" "$BIN/symtrace-upload" "$BIN/symtrace-agent" "$W/publish/"
"$BIN/symtrace-server" --http-addr 127.0.0.1:0 --grpc-addr 127.0.0.1:0 --data-dir "$W/data" \
  --ready-file "$W/ready.json" > "$W/server.log" 2>&1 &
for _ in $(seq 100); do [ -s "$W/ready.json" ] && break; sleep 0.1; done
[ -s "$W/ready.json" ] || { echo "dogfood: the server did not start"; cat "$W/server.log"; exit 1; }
URL=http://$(sed -n 's/.*"http":"\([^"]*\)".*/\1/p' "$W/ready.json")
"$BIN/symtrace-upload" --server "$URL" --require-frame-pointers --no-sources "$W/publish"
for exe in "$W"/publish/*; do
  id=$(readelf -n "$exe" | awk '/Build ID/{print $3}')
  DEBUGINFOD_URLS=$URL DEBUGINFOD_CACHE_PATH=$W/cache debuginfod-find debuginfo "$id" > /dev/null
  echo "dogfood: $(basename "$exe") $id: debuginfo served"
done
# The images' build step, outside Docker: our uploader splits the debug info
# off copies of the binaries (through a throwaway server) and strips them.
mkdir -p "$W/strip"
cp "$BIN/symtrace-server" "$BIN/symtrace-upload" "$BIN/symtrace-agent" "$W/strip/"
deploy/docker/split-debug.sh "$W/strip"
