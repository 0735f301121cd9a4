#!/usr/bin/env bash
# Installs and starts what the test suite needs, on a fresh Debian 12 machine
# as root: the debuginfod clients (elfutils' debuginfod-find, gdb), binutils
# gcc, clang and dwz for fixtures, llvm-symbolizer-19 as the symbolizer
# reference, clang-19 + libbpf-dev for the agent's BPF program and capsh
# for its capability test, strace for the durability test (syscall order),
# PostgreSQL 15, s3s-fs as the S3-compatible server, and a Python
# venv with PyPI's opentelemetry-proto and grpcio as the independent OTLP client
# and kubernetes-validate for the manifests under deploy/kubernetes, Debian's
# docker-compose (1.29) to validate docker-compose.yml (`config` only, which
# needs no container engine; installed without the recommended docker.io),
# chromium + npm's playwright-core for the UI test, npm's pprof-format as the
# independent pprof reader, npm's OpenTelemetry JS SDK for the Node.js
# context package (context/node, linked there as @symtrace/context), and
# inferno's inferno-flamegraph, and the OpenTelemetry Collector and eBPF
# profiler built from the Go module proxy.
# Idempotent: what is installed or running already is left alone.
#
# Prints the environment the tests read (source it: `. <(scripts/test-services.sh)`
# or use scripts/test.sh, which does).
set -euo pipefail

S3_PORT=${SYMTRACE_TEST_S3_PORT:-9014}
S3_DIR=${SYMTRACE_TEST_S3_DIR:-/tmp/symtrace-s3}
S3_BUCKET=symtrace-test

log() { echo "test-services: $*" >&2; }

need_apt=()
for pair in debuginfod-find:debuginfod debuginfod-find:elfutils gdb:gdb objcopy:binutils gcc:gcc \
            pg_ctlcluster:postgresql psql:postgresql-client curl:curl wrk:wrk zstd:zstd clang:clang g++:g++ dwz:dwz \
            llvm-symbolizer-19:llvm-19 chromium:chromium node:nodejs npm:npm \
            clang-19:clang-19 capsh:libcap2-bin strace:strace \
            javac:openjdk-17-jdk-headless jcmd:openjdk-17-jdk-headless go:golang; do
  tool=${pair%%:*}; pkg=${pair#*:}
  command -v "$tool" >/dev/null 2>&1 || need_apt+=("$pkg")
done
# docker-compose validates docker-compose.yml (`config` needs no engine):
# without the recommended docker.io.
if ! command -v docker-compose >/dev/null 2>&1; then
  log "installing docker-compose"
  apt-get update -qq >&2
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends docker-compose >&2
fi
# The agent's BPF program is C compiled by clang-19 against libbpf's headers.
[ -f /usr/include/bpf/bpf_helpers.h ] || need_apt+=(libbpf-dev)
# symtrace-alloc's LD_PRELOAD library is C with <sys/sdt.h> USDT probes,
# built with make; its tests read the probes with bpftrace.
[ -f /usr/include/x86_64-linux-gnu/sys/sdt.h ] || need_apt+=(systemtap-sdt-dev)
command -v bpftrace >/dev/null 2>&1 || need_apt+=(bpftrace)
command -v make >/dev/null 2>&1 || need_apt+=(make)
# debuginfod (the server) is what the benchmark compares against.
command -v debuginfod >/dev/null 2>&1 || need_apt+=(debuginfod)
if [ ${#need_apt[@]} -gt 0 ]; then
  log "installing ${need_apt[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq >&2
  apt-get install -y -qq elfutils "${need_apt[@]}" >&2
fi

if ! command -v s3s-fs >/dev/null 2>&1; then
  log "installing s3s-fs (a few minutes on 2 cores)"
  cargo install s3s-fs@0.14.1 --locked --features binary >&2
fi
export PATH="$HOME/.cargo/bin:$PATH"

# The independent OTLP client: PyPI's opentelemetry-proto (>= 1.43 is the
# v1.10+ wire layout) and grpcio, in a venv of their own.
PY_VENV=${SYMTRACE_TEST_PYTHON_VENV:-/opt/symtrace-python}
if ! "$PY_VENV/bin/python" -c 'import grpc, kubernetes_validate, opentelemetry.proto.collector.profiles.v1development.profiles_service_pb2_grpc' >/dev/null 2>&1; then
  log "installing opentelemetry-proto, grpcio and kubernetes-validate into $PY_VENV"
  if ! python3 -m venv "$PY_VENV" >&2; then
    apt-get install -y -qq python3-venv >&2
    /usr/bin/python3 -m venv --clear "$PY_VENV" >&2
  fi
  "$PY_VENV/bin/pip" install -q 'opentelemetry-proto>=1.43,<2' 'grpcio>=1.60' 'kubernetes-validate>=1.31,<2' >&2
fi

# The UI test's browser (Debian's chromium, driven by npm's playwright-core)
# and npm's pprof-format (the independent pprof reader); inferno's
# inferno-flamegraph renders our folded output.
NODE_DIR=${SYMTRACE_TEST_NODE_DIR:-/opt/symtrace-node}
# The OpenTelemetry JS SDK for @symtrace/context's tests and example service
# (context/node, agent/tests/node_context.rs).
OTEL_JS='@opentelemetry/api@^1.9 @opentelemetry/sdk-trace-node@^2 @opentelemetry/context-async-hooks@^2 @opentelemetry/resources@^2'
if [ ! -d "$NODE_DIR/node_modules/playwright-core" ] || [ ! -d "$NODE_DIR/node_modules/pprof-format" ] \
  || [ ! -d "$NODE_DIR/node_modules/@opentelemetry/sdk-trace-node" ]; then
  log "installing playwright-core, pprof-format and OpenTelemetry JS into $NODE_DIR"
  mkdir -p "$NODE_DIR"
  # playwright-core after 1.49 needs Node >= 20 (Debian 12's own nodejs is 18).
  pw='playwright-core@^1.49'
  [ "$(node -p 'process.versions.node.split(".")[0]')" -ge 20 ] || pw='playwright-core@~1.49.1'
  (cd "$NODE_DIR" && { [ -f package.json ] || npm init -y >/dev/null; } && npm install --silent --no-audit --no-fund \
    "$pw" 'pprof-format@^2.1' $OTEL_JS >&2)
fi
# `require("@symtrace/context")` under NODE_PATH: this checkout's package.
mkdir -p "$NODE_DIR/node_modules/@symtrace"
ln -sfn "$(cd "$(dirname "$0")/.." && pwd)/context/node" "$NODE_DIR/node_modules/@symtrace/context"
if ! command -v inferno-flamegraph >/dev/null 2>&1; then
  log "installing inferno (a minute on 2 cores)"
  cargo install inferno@0.12.8 --locked >&2
fi

# The OpenTelemetry Collector (testkit/peers/otelcol: a minimal distribution
# of one release, go.mod and go.sum committed) and the OpenTelemetry eBPF
# profiler, built from the Go module proxy once per machine and kept under
# $PEERS_DIR by what they are built from (cold, with the module downloads:
# about 1.5 min for the Collector and 30 s for the profiler on 2 cores).
PEERS_DIR=${SYMTRACE_TEST_PEERS_DIR:-/opt/symtrace-peers}
REPO=$(cd "$(dirname "$0")/.." && pwd)
OTELCOL_ID=$(cat "$REPO"/testkit/peers/otelcol/{go.mod,go.sum,main.go} | sha256sum | cut -c1-16)
OTELCOL="$PEERS_DIR/otelcol-$OTELCOL_ID/symtrace-test-otelcol"
if [ ! -x "$OTELCOL" ]; then
  log "building the OpenTelemetry Collector (testkit/peers/otelcol)"
  mkdir -p "$(dirname "$OTELCOL")"
  (cd "$REPO/testkit/peers/otelcol" && CGO_ENABLED=0 go build -trimpath -o "$OTELCOL.tmp" . >&2)
  mv "$OTELCOL.tmp" "$OTELCOL"
fi
# The profiler through a module of ours that names it as a tool
# (testkit/peers/ebpf-profiler/go.mod): `go install …@version` asks the
# proxy for the module's version list, which it does not serve, and fails.
EBPF_ID=$(cat "$REPO"/testkit/peers/ebpf-profiler/{go.mod,go.sum} | sha256sum | cut -c1-16)
EBPF_PROFILER="$PEERS_DIR/ebpf-profiler-$EBPF_ID/ebpf-profiler"
if [ ! -x "$EBPF_PROFILER" ]; then
  log "building the OpenTelemetry eBPF profiler (testkit/peers/ebpf-profiler)"
  mkdir -p "$(dirname "$EBPF_PROFILER")"
  (cd "$REPO/testkit/peers/ebpf-profiler" && CGO_ENABLED=0 go build -trimpath -o "$EBPF_PROFILER.tmp" \
    go.opentelemetry.io/ebpf-profiler >&2)
  mv "$EBPF_PROFILER.tmp" "$EBPF_PROFILER"
fi

# tracefs: the eBPF profiler attaches its process-exit tracepoint through
# it, and these machines do not mount it.
if [ ! -e /sys/kernel/tracing/events ] && [ "$(id -u)" = 0 ]; then
  log "mounting tracefs on /sys/kernel/tracing"
  mount -t tracefs nodev /sys/kernel/tracing >&2 || log "tracefs could not be mounted"
fi

# PostgreSQL: the Debian cluster, started without systemd; root gets a superuser role.
PG_VERSION=$(ls /etc/postgresql 2>/dev/null | sort -n | tail -1)
if [ -z "$PG_VERSION" ]; then log "no PostgreSQL cluster found"; exit 1; fi
if ! pg_lsclusters -h | awk '{print $4}' | grep -q online; then
  log "starting PostgreSQL $PG_VERSION"
  pg_ctlcluster --skip-systemctl-redirect "$PG_VERSION" main start >&2
fi
for _ in $(seq 50); do su postgres -c "psql -qAtc 'select 1'" >/dev/null 2>&1 && break; sleep 0.2; done
su postgres -c "psql -qAtc \"select 1 from pg_roles where rolname='root'\"" | grep -q 1 \
  || su postgres -c "createuser -s root" >&2

# s3s-fs on loopback, with one bucket.
mkdir -p "$S3_DIR"
S3_DIR=$(cd "$S3_DIR" && pwd)
if ! curl -s -o /dev/null "http://127.0.0.1:$S3_PORT/"; then
  log "starting s3s-fs on 127.0.0.1:$S3_PORT"
  # From /: s3s-fs resolves paths against its working directory, which must
  # outlive it (a deleted checkout turns every request into a 500).
  (cd / && exec nohup s3s-fs --host 127.0.0.1 --port "$S3_PORT" --access-key AK --secret-key SK "$S3_DIR" \
    > /tmp/symtrace-s3s.log 2>&1 < /dev/null) &
  for _ in $(seq 50); do curl -s -o /dev/null "http://127.0.0.1:$S3_PORT/" && break; sleep 0.2; done
fi
mkdir -p "$S3_DIR/$S3_BUCKET"
curl -s -o /dev/null -X PUT -H 'x-amz-content-sha256: UNSIGNED-PAYLOAD' \
  --aws-sigv4 aws:amz:us-east-1:s3 --user AK:SK "http://127.0.0.1:$S3_PORT/$S3_BUCKET" || true

cat <<ENV
export SYMTRACE_TEST_POSTGRES_URL='postgres://root@localhost/postgres?host=/var/run/postgresql'
export SYMTRACE_TEST_NODE_MODULES='$NODE_DIR/node_modules'
export CHROMIUM=$(command -v chromium)
export SYMTRACE_TEST_S3_ENDPOINT='http://127.0.0.1:$S3_PORT'
export SYMTRACE_TEST_S3_BUCKET='$S3_BUCKET'
export SYMTRACE_TEST_S3_ACCESS_KEY=AK
export SYMTRACE_TEST_S3_SECRET_KEY=SK
export SYMTRACE_TEST_PYTHON='$PY_VENV/bin/python'
export SYMTRACE_TEST_OTELCOL='$OTELCOL'
export SYMTRACE_TEST_EBPF_PROFILER='$EBPF_PROFILER'
ENV
