#!/usr/bin/env bash
# What @symtrace/context costs a Node.js service (issue #26), in one run:
# the JS microbenchmark of enter + exit (target < 150 ns) and of with()
# through the context manager, then the example service's throughput with
# the package's context manager vs OpenTelemetry's plain one (target: within
# 2%), for small requests (FAST_WORK=20000: ~0.16 ms each) and for requests
# of about a millisecond (FAST_WORK=200000).
#
#   bench/node-context.sh [ROUNDS [DURATION [CLIENTS]]]
#
# Needs node and the OpenTelemetry JS SDK under NODE_PATH
# (scripts/test-services.sh installs them in /opt/symtrace-node).
set -euo pipefail
cd "$(dirname "$0")/.."
export NODE_PATH=${NODE_PATH:-/opt/symtrace-node/node_modules}
cargo build --release -p symtrace-context-node >&2
export SYMTRACE_CONTEXT_ADDON=$PWD/target/release/libsymtrace_context_node.so
echo "== $(git rev-parse --short HEAD)$(git diff --quiet || echo ' + changes'), $(date -u +%F)"
echo "== node bench/node-context/microbench.js"
node bench/node-context/microbench.js
for work in 20000 200000; do
  echo "== FAST_WORK=$work node bench/node-context/throughput.js $*"
  FAST_WORK=$work node bench/node-context/throughput.js "$@"
done
