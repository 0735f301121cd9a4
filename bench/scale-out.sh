#!/usr/bin/env bash
# Scale-out check: N symtrace-server replicas on one PostgreSQL and one S3
# bucket, all on loopback and started here (a PostgreSQL cluster of its own
# with pg_stat_statements, and s3s-fs).
#
#   1. ingest throughput through one replica, then through all N
#      (symtrace-loadtest otlp, round-robin over the replicas);
#   2. what each request costs the database and the bucket: statements
#      (pg_stat_statements) and object-store requests (the servers'
#      symtrace_object_store_requests_total) per export, per upload, per
#      debuginfod hit and miss, per flamegraph;
#   3. `symtrace-loadtest mixed --failover --verify` through all replicas,
#      one replica killed (SIGKILL) halfway: every export and upload that
#      was acknowledged must then be readable through the survivors.
#
# Fails (exit 1) when step 3 finds acknowledged data missing or a request
# failed that no replica could answer. Throughput is reported, not judged.
#
#   bench/scale-out.sh [REPLICAS=2] [SECONDS=20]
#   PROFILE=release bench/scale-out.sh 2 30     (for the figures in docs/)
set -euo pipefail
cd "$(dirname "$0")/.."
REPLICAS=${1:-2}
SECONDS_PER_RUN=${2:-20}
PROFILE=${PROFILE:-debug}
[ "$REPLICAS" -ge 2 ] || { echo "scale-out: at least 2 replicas" >&2; exit 2; }

eval "$(scripts/test-services.sh)"   # PostgreSQL binaries, s3s-fs
if [ "$PROFILE" = release ]; then
  cargo build --release -q -p symtrace-server -p symtrace-loadtest
else
  cargo build -q -p symtrace-server -p symtrace-loadtest
fi
BIN=$PWD/target/$PROFILE
LOADTEST=$BIN/symtrace-loadtest

W=$(mktemp -d /tmp/symtrace-scale.XXXXXX)
chmod 755 "$W"
PG_BIN=$(ls -d /usr/lib/postgresql/*/bin | sort -V | tail -1)
PG_PORT=${SCALE_PG_PORT:-15433}
S3_PORT=${SCALE_S3_PORT:-19015}
PIDS=()
cleanup() {
  for p in "${PIDS[@]}"; do kill -9 "$p" 2>/dev/null || true; wait "$p" 2>/dev/null || true; done
  su postgres -c "$PG_BIN/pg_ctl -D $W/pg -m immediate stop" >/dev/null 2>&1 || true
  rm -rf "$W"
}
trap cleanup EXIT
log() { echo "scale-out: $*" >&2; }

# PostgreSQL: a cluster of our own, so statements can be counted.
mkdir -p "$W/pg" && chown postgres "$W/pg"
su postgres -c "$PG_BIN/initdb -D $W/pg -A trust -U postgres" >/dev/null
su postgres -c "$PG_BIN/pg_ctl -D $W/pg -l $W/pg/server.log -w start -o \"-p $PG_PORT -k $W/pg -c listen_addresses='' -c shared_preload_libraries=pg_stat_statements -c max_connections=200\"" >/dev/null
PSQL=(psql -h "$W/pg" -p "$PG_PORT" -U postgres -qAt)
"${PSQL[@]}" -d postgres -c "CREATE DATABASE symtrace" -c "CREATE EXTENSION pg_stat_statements"
"${PSQL[@]}" -d symtrace -c "CREATE EXTENSION pg_stat_statements"
DATABASE_URL="postgres://postgres@localhost/symtrace?host=$W/pg&port=$PG_PORT"

# S3: s3s-fs of our own (run from /: it resolves paths against its cwd).
mkdir -p "$W/s3/scale"
(cd / && exec s3s-fs --host 127.0.0.1 --port "$S3_PORT" --access-key AK --secret-key SK "$W/s3" \
  > "$W/s3.log" 2>&1 < /dev/null) &
PIDS+=($!)
for _ in $(seq 50); do curl -s -o /dev/null "http://127.0.0.1:$S3_PORT/" && break; sleep 0.2; done

export AWS_ACCESS_KEY_ID=AK AWS_SECRET_ACCESS_KEY=SK AWS_ENDPOINT_URL=http://127.0.0.1:$S3_PORT \
  AWS_ALLOW_HTTP=true AWS_REGION=us-east-1
URLS=()
start_replica() {
  local i=$1 port=$((18810 + $1))
  "$BIN/symtrace-server" --http-addr "127.0.0.1:$port" --grpc-addr "127.0.0.1:$((18910 + i))" \
    --data-dir "$W/replica$i" --database-url "$DATABASE_URL" --storage-url s3://scale/symtrace \
    > "$W/replica$i.log" 2>&1 &
  PIDS+=($!)
  eval "REPLICA_PID_$i=$!"
  for _ in $(seq 200); do curl -sf -o /dev/null "http://127.0.0.1:$port/readyz" && break; sleep 0.1; done
  curl -sf -o /dev/null "http://127.0.0.1:$port/readyz" || { cat "$W/replica$i.log" >&2; exit 1; }
  URLS+=("http://127.0.0.1:$port")
}
url_args() { for u in "$@"; do printf -- '--url %s ' "$u"; done; }
statements() { "${PSQL[@]}" -d symtrace -c "SELECT coalesce(sum(calls), 0) FROM pg_stat_statements s JOIN pg_database d ON d.oid = s.dbid WHERE d.datname = 'symtrace'"; }
s3_requests() {
  local total=0
  for u in "${URLS[@]}"; do
    n=$(curl -sf "$u/metrics" | awk '/^symtrace_object_store_requests_total/ {s += $2} END {print s + 0}' || echo 0)
    total=$(awk -v a="$total" -v b="$n" 'BEGIN {print a + b}')
  done
  echo "$total"
}
reset_counts() { "${PSQL[@]}" -d symtrace -c "SELECT pg_stat_statements_reset()" >/dev/null; S3_BEFORE=$(s3_requests); }
# per REQUESTS: statements and object-store requests since reset_counts, per request
per() { local st s3; st=$(statements); s3=$(s3_requests)
  awk -v st="$st" -v s3="$s3" -v b="$S3_BEFORE" -v n="$1" 'BEGIN {printf "%.2f %.2f", st / n, (s3 - b) / n}'; }
json_field() { python3 -c "import json,sys; d=json.load(open(sys.argv[1])); print(eval(sys.argv[2]))" "$@"; }

start_replica 1
log "1 replica: otlp for ${SECONDS_PER_RUN}s"
# shellcheck disable=SC2046
"$LOADTEST" otlp $(url_args "${URLS[@]}") --duration "${SECONDS_PER_RUN}s" --connections 4 --json "$W/one.json" > "$W/one.txt"
for i in $(seq 2 "$REPLICAS"); do start_replica "$i"; done
reset_counts
WAL_BEFORE=$("${PSQL[@]}" -d symtrace -c "SELECT pg_current_wal_lsn()")
DB_BEFORE=$("${PSQL[@]}" -d symtrace -c "SELECT pg_database_size('symtrace')")
log "$REPLICAS replicas: otlp for ${SECONDS_PER_RUN}s"
# shellcheck disable=SC2046
"$LOADTEST" otlp $(url_args "${URLS[@]}") --duration "${SECONDS_PER_RUN}s" --connections 4 --json "$W/all.json" > "$W/all.txt"
EXPORTS=$(json_field "$W/all.json" "d['figures']['exports ok']")
read -r PG_EXPORT S3_EXPORT <<< "$(per "$EXPORTS")"
# What an export writes to PostgreSQL: WAL bytes and table growth.
WAL_EXPORT=$("${PSQL[@]}" -d symtrace -c "SELECT round(pg_wal_lsn_diff(pg_current_wal_lsn(), '$WAL_BEFORE') / $EXPORTS)")
DB_EXPORT=$("${PSQL[@]}" -d symtrace -c "SELECT round((pg_database_size('symtrace') - $DB_BEFORE) / $EXPORTS.0)")

log "per-request load: uploads, hits, misses, flamegraphs"
ELF=/usr/bin/ls
reset_counts
# shellcheck disable=SC2046
"$LOADTEST" debuginfod $(url_args "${URLS[@]}") --elf "$ELF" --files 50 --seed 11 --duration 0s > "$W/upload.txt"
read -r PG_UPLOAD S3_UPLOAD <<< "$(per 50)"
for kind in hit miss; do
  ratio=0; [ $kind = miss ] && ratio=1
  reset_counts
  # shellcheck disable=SC2046
  "$LOADTEST" debuginfod $(url_args "${URLS[@]}") --elf "$ELF" --files 50 --seed 11 --skip-upload \
    --miss-ratio $ratio --duration 5s --connections 2 --json "$W/$kind.json" > "$W/$kind.txt"
  n=$(json_field "$W/$kind.json" "[o for o in d['ops'] if o['op'] == '$kind'][0]['ok']")
  read -r pg s3 <<< "$(per "$n")"
  eval "PG_$kind=$pg; S3_$kind=$s3"
done
reset_counts
# One service's last minute: every export of that minute holds it.
"$LOADTEST" query --url "${URLS[0]}" --query 'service=service-3&from=now-1m&to=now' --iterations 4 > "$W/query.txt"
read -r PG_QUERY S3_QUERY <<< "$(per 5)"

log "mixed through $REPLICAS replicas with failover and verification; replica 2 killed at $((SECONDS_PER_RUN / 2))s"
# shellcheck disable=SC2046
"$LOADTEST" mixed $(url_args "${URLS[@]}") --failover --verify --duration "${SECONDS_PER_RUN}s" \
  --files 20 --json "$W/mixed.json" > "$W/mixed.txt" 2>&1 &
MIXED=$!
sleep $((SECONDS_PER_RUN / 2))
kill -9 "$REPLICA_PID_2"
wait "$REPLICA_PID_2" 2>/dev/null || true
log "killed replica 2 (pid $REPLICA_PID_2)"
set +e
wait $MIXED
MIXED_STATUS=$?
set -e

ONE=$(json_field "$W/one.json" "round(d['figures']['events/s'])")
ALL=$(json_field "$W/all.json" "round(d['figures']['events/s'])")
cat <<EOF

== scale-out: $REPLICAS replicas on PostgreSQL + S3 (s3s-fs), $PROFILE build, $(nproc) cores shared
ingest, 1 replica          $ONE events/s  (p99 $(json_field "$W/one.json" "d['ops'][0]['latency_ms']['p99']") ms)
ingest, $REPLICAS replicas         $ALL events/s  (p99 $(json_field "$W/all.json" "d['ops'][0]['latency_ms']['p99']") ms), $(awk -v a="$ALL" -v b="$ONE" 'BEGIN {printf "%.1f%%", 100 * a / b}') of one replica

per request                PostgreSQL statements   object-store requests
  export (~1 MB)           $PG_EXPORT                    $S3_EXPORT     (PostgreSQL: $WAL_EXPORT B of WAL, $DB_EXPORT B of tables)
  upload (executable)      $PG_UPLOAD                    $S3_UPLOAD
  debuginfod hit           $PG_hit                    $S3_hit
  debuginfod miss          $PG_miss                    $S3_miss
  flamegraph (1 service)   $PG_QUERY                    $S3_QUERY

mixed with replica 2 killed halfway (exit $MIXED_STATUS):
EOF
grep -v '^{' "$W/mixed.txt"
python3 - "$W" "$REPLICAS" "$ONE" "$ALL" "$MIXED_STATUS" <<PY > target/scale-out.json
import json, sys
w, replicas, one, all_, status = sys.argv[1], int(sys.argv[2]), float(sys.argv[3]), float(sys.argv[4]), int(sys.argv[5])
print(json.dumps({
    "replicas": replicas, "one_replica_events_per_second": one, "all_replicas_events_per_second": all_,
    "ratio": all_ / one,
    "per_request": {
        "export": {"statements": $PG_EXPORT, "object_store": $S3_EXPORT, "wal_bytes": $WAL_EXPORT, "table_bytes": $DB_EXPORT},
        "upload": {"statements": $PG_UPLOAD, "object_store": $S3_UPLOAD},
        "debuginfod_hit": {"statements": $PG_hit, "object_store": $S3_hit},
        "debuginfod_miss": {"statements": $PG_miss, "object_store": $S3_miss},
        "flamegraph": {"statements": $PG_QUERY, "object_store": $S3_QUERY},
    },
    "mixed_with_a_replica_killed": json.load(open(w + "/mixed.json")) if status in (0, 1) else None,
    "mixed_exit": status,
}, indent=1))
PY
if [ "$MIXED_STATUS" -ne 0 ]; then
  log "FAILED: acknowledged data missing or requests no replica answered (see above)"
  for i in $(seq 1 "$REPLICAS"); do echo "--- replica $i log (tail)"; tail -5 "$W/replica$i.log"; done >&2
  exit 1
fi
log "passed: nothing acknowledged was lost (target/scale-out.json)"
