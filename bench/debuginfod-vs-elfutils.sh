#!/usr/bin/env bash
# Serves the same files from elfutils' `debuginfod -F DIR` and from
# symtrace-server (release build, SQLite + local directory) and loads both
# with wrk on loopback: a small debug file, a 10 MB executable, and a miss.
#
#   bench/debuginfod-vs-elfutils.sh [DURATION_SECONDS] [ROUNDS]
#
# Each case is run ROUNDS times (default 3), alternating the two servers, and
# the median of each is reported: on 2 shared cores single runs vary by ±10%.
#
# Needs: debuginfod, wrk, gcc, binutils (scripts/test-services.sh installs them).
set -euo pipefail
cd "$(dirname "$0")/.."
DURATION=${1:-8}
ROUNDS=${2:-3}
W=$(mktemp -d /tmp/symtrace-bench.XXXXXX)
trap 'kill $(jobs -p) 2>/dev/null || true; rm -rf "$W"' EXIT
ELF_PORT=18002 SYM_PORT=18003

cargo build --release -q -p symtrace-server
mkdir -p "$W/src" "$W/F"
cat > "$W/src/hello.c" <<'C'
#include <stdio.h>
static int add(int a, int b) { return a + b; }
int main(int argc, char **argv) { printf("%d\n", add(argc, 41)); return 0; }
C
( cd "$W/src"
  gcc -g -O0 -Wl,--build-id -o hello hello.c
  objcopy --only-keep-debug hello hello.debug
  strip --strip-debug -o hello.stripped hello
  gcc -O2 -DBIG -Wl,--build-id -o big hello.c
  head -c $((10 * 1024 * 1024 - 16000)) /dev/urandom > payload.bin
  objcopy --add-section .payload=payload.bin --set-section-flags .payload=readonly big big.exe )
SMALL=$(readelf -n "$W/src/hello" | awk '/Build ID/{print $3}')
BIG=$(readelf -n "$W/src/big.exe" | awk '/Build ID/{print $3}')
MISS=$(printf 'ab%.0s' $(seq 20))
cp "$W/src/hello.stripped" "$W/F/hello"; cp "$W/src/hello.debug" "$W/F/hello.debug"; cp "$W/src/big.exe" "$W/F/big"

debuginfod -F -p $ELF_PORT -d "$W/elfutils.sqlite" -t0 -g0 "$W/F" > "$W/elfutils.log" 2>&1 &
./target/release/symtrace-server --http-addr 127.0.0.1:$SYM_PORT --data-dir "$W/symtrace" > "$W/symtrace.log" 2>&1 &
for _ in $(seq 100); do
  curl -sf -o /dev/null "http://127.0.0.1:$ELF_PORT/buildid/$BIG/executable" \
    && curl -sf -o /dev/null "http://127.0.0.1:$ELF_PORT/buildid/$SMALL/debuginfo" \
    && curl -sf -o /dev/null "http://127.0.0.1:$SYM_PORT/healthz" && break
  sleep 0.2
done
curl -sf -o /dev/null -T "$W/src/hello.debug" "http://127.0.0.1:$SYM_PORT/api/v1/debuginfo/$SMALL/debuginfo"
curl -sf -o /dev/null -T "$W/src/hello.stripped" "http://127.0.0.1:$SYM_PORT/api/v1/debuginfo/$SMALL/executable"
curl -sf -o /dev/null -T "$W/src/big.exe" "http://127.0.0.1:$SYM_PORT/api/v1/debuginfo/$BIG/executable"

for port in $ELF_PORT $SYM_PORT; do
  cmp <(curl -s "http://127.0.0.1:$port/buildid/$BIG/executable") "$W/src/big.exe"
  test "$(curl -s -o /dev/null -w '%{http_code}' "http://127.0.0.1:$port/buildid/$MISS/debuginfo")" = 404
done
SIZE_SMALL=$(stat -c %s "$W/src/hello.debug"); SIZE_BIG=$(stat -c %s "$W/src/big.exe")

median() { sort -g | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'; }
ms() { awk '{v=$1; if (v ~ /us$/) {sub(/us$/,"",v); v/=1000} else if (v ~ /ms$/) {sub(/ms$/,"",v)} else if (v ~ /s$/) {sub(/s$/,"",v); v*=1000}; printf "%.2f\n", v}'; }
one() { # port path expect -> "rps mbps p50ms p99ms"
  local out; out=$(wrk -t2 -c32 -d"${DURATION}s" --latency "http://127.0.0.1:$1$2")
  if grep -q 'Non-2xx' <<<"$out" && [ "$3" = ok ]; then echo "unexpected errors: $out" >&2; exit 1; fi
  local rps p50 p99 bytes
  rps=$(awk '/Requests\/sec/{print $2}' <<<"$out")
  bytes=$(awk '/Transfer\/sec/{v=$2; u=v; sub(/[0-9.]+/,"",u); sub(/[A-Za-z]+$/,"",v); m=(u=="GB")?1024:(u=="MB")?1:(u=="KB")?1/1024:1/1048576; printf "%.1f", v*m}' <<<"$out")
  p50=$(awk '$1=="50%"{print $2}' <<<"$out" | ms)
  p99=$(awk '$1=="99%"{print $2}' <<<"$out" | ms)
  echo "$rps $bytes $p50 $p99"
}
echo "wrk -t2 -c32 -d${DURATION}s, median of $ROUNDS alternating rounds, $(nproc) cores; elfutils $(debuginfod --version 2>&1 | head -1 | awk '{print $NF}')"
echo "| request | server | req/s | MiB/s | p50 ms | p99 ms |"
echo "|---|---|---:|---:|---:|---:|"
for case in "/buildid/$SMALL/debuginfo:ok:debuginfo ${SIZE_SMALL} B" \
            "/buildid/$BIG/executable:ok:executable ${SIZE_BIG} B" \
            "/buildid/$MISS/debuginfo:miss:miss (404)"; do
  IFS=: read -r path expect label <<<"$case"
  : > "$W/elfutils.runs"; : > "$W/symtrace.runs"
  for _ in $(seq "$ROUNDS"); do
    one $ELF_PORT "$path" "$expect" >> "$W/elfutils.runs"
    one $SYM_PORT "$path" "$expect" >> "$W/symtrace.runs"
  done
  for server in elfutils symtrace; do
    cols=""
    for c in 1 2 3 4; do cols="$cols | $(awk -v c=$c '{print $c}' "$W/$server.runs" | median)"; done
    echo "| $label | $server$cols |"
  done
done
