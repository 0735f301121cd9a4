#!/usr/bin/env bash
# Splits the debug info off every ELF binary in BIN_DIR with our own
# uploader: a throwaway symtrace-server (SQLite + a temporary directory,
# loopback only) receives the debug info, and `symtrace-upload --strip`
# rewrites each binary in place without its DWARF, with a .gnu_debuglink —
# only once its debug info is stored. `--require-frame-pointers` fails the
# run when a binary lost its frame pointers (a RUSTFLAGS that overrode
# .cargo/config.toml, say). The throwaway server and what it stored are
# discarded: publish the unstripped copies to the real server separately
# (the image's `symbols` stage, `docker compose run publish-symbols`).
#
#   deploy/docker/split-debug.sh BIN_DIR
#
# The server and uploader run are BIN_DIR/symtrace-server and
# BIN_DIR/symtrace-upload unless SPLIT_SERVER_BIN / SPLIT_UPLOAD_BIN name
# others; they are copied first, so the files being rewritten are never the
# running ones. Used by deploy/docker/Dockerfile and runnable as is in CI.
set -euo pipefail

if [ $# -ne 1 ] || [ ! -d "$1" ]; then
  echo "usage: $0 BIN_DIR" >&2
  exit 2
fi
BIN_DIR=$1
SERVER_BIN=${SPLIT_SERVER_BIN:-$BIN_DIR/symtrace-server}
UPLOAD_BIN=${SPLIT_UPLOAD_BIN:-$BIN_DIR/symtrace-upload}

# Nothing from the caller's environment may point the throwaway server or the
# uploader somewhere real (a database, a bucket, a token).
while IFS= read -r var; do unset "$var"; done < <(compgen -e | grep -E '^(SYMTRACE_|AWS_)' || true)
export NO_COLOR=1

W=$(mktemp -d "${TMPDIR:-/tmp}/symtrace-split.XXXXXX")
SERVER_PID=
cleanup() {
  if [ -n "$SERVER_PID" ]; then
    kill "$SERVER_PID" 2>/dev/null || true
    wait "$SERVER_PID" 2>/dev/null || true
  fi
  rm -rf "$W"
}
trap cleanup EXIT

mkdir -p "$W/tools"
cp "$SERVER_BIN" "$W/tools/symtrace-server"
cp "$UPLOAD_BIN" "$W/tools/symtrace-upload"

"$W/tools/symtrace-server" --data-dir "$W/data" --http-addr 127.0.0.1:0 --grpc-addr 127.0.0.1:0 \
  --compaction-interval 0 --ready-file "$W/ready.json" > "$W/server.log" 2>&1 &
SERVER_PID=$!
for _ in $(seq 300); do
  [ -s "$W/ready.json" ] && break
  kill -0 "$SERVER_PID" 2>/dev/null || { cat "$W/server.log" >&2; echo "split-debug: the server exited" >&2; exit 1; }
  sleep 0.1
done
HTTP_ADDR=$(sed -n 's/.*"http":"\([^"]*\)".*/\1/p' "$W/ready.json" 2>/dev/null)
URL=${HTTP_ADDR:+http://$HTTP_ADDR}
if [ -z "$URL" ]; then
  cat "$W/server.log" >&2
  echo "split-debug: the server did not start" >&2
  exit 1
fi

"$W/tools/symtrace-upload" --server "$URL" --strip --require-frame-pointers --no-sources "$BIN_DIR"

# What --strip promises, checked where binutils is at hand.
if command -v readelf >/dev/null 2>&1; then
  status=0
  while IFS= read -r -d '' f; do
    [ "$(head -c 4 "$f" | od -An -c | tr -d ' ')" = '177ELF' ] || continue
    sections=$(readelf -S -W "$f")
    if grep -q ' \.debug_info ' <<<"$sections"; then
      echo "split-debug: $f still has .debug_info" >&2
      status=1
    elif grep -q ' \.gnu_debuglink ' <<<"$sections"; then
      echo "split-debug: $(basename "$f"): debug info split off (.gnu_debuglink)"
    else
      echo "split-debug: $(basename "$f"): had no DWARF"
    fi
  done < <(find "$BIN_DIR" -type f -perm -u+x -print0)
  exit "$status"
fi
