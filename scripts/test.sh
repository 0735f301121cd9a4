#!/usr/bin/env bash
# The whole test suite, on a fresh Debian 12 machine as root: installs and
# starts what the tests need (scripts/test-services.sh: elfutils'
# debuginfod-find and debuginfod, gdb, PostgreSQL, s3s-fs, compilers), then
# runs every test of every crate against them — all of them, past any
# failure (--no-fail-fast), the exit status non-zero if anything failed.
# Under CI=true a missing tool fails the run instead of skipping tests.
# Ends with one line "tests: N passed, M failed, K skipped; B test
# binaries, F failed" (also kept in target/test-summary.txt); a binary that
# died before its summary (a crash, a signal) counts as failed.
set -euo pipefail
cd "$(dirname "$0")/.."
eval "$(scripts/test-services.sh)"
mkdir -p target
log=target/test-output.txt
skips=target/test-skips.txt
rm -f "$skips"
# The Node.js addon (a cdylib: `cargo test` builds no library of a crate
# that has only a cdylib) for the Node.js tests of context/node and agent/.
cargo build --locked -p symtrace-context-node
# keep-memlock (testkit), which the OpenTelemetry eBPF profiler's tests run
# it under (see testkit/src/bin/keep-memlock.rs).
cargo build --locked -p symtrace-testkit --bin keep-memlock
set +e
cargo test --workspace --locked --no-fail-fast "$@" 2>&1 | tee "$log"
status=${PIPESTATUS[0]}
set -e
passed=$(awk '/^test result:/ {s += $4} END {print s + 0}' "$log")
failed=$(awk '/^test result:/ {s += $6} END {print s + 0}' "$log")
binaries=$(grep -cE '^ +(Running|Doc-tests) ' "$log" || true)
results=$(grep -c '^test result:' "$log" || true)
failed_binaries=$(( $(grep -c '^test result: FAILED' "$log" || true) + binaries - results ))
skipped=0
if [ -f "$skips" ]; then
  skipped=$(cut -f1 "$skips" | sort -u | wc -l)
  echo "skipped (test, why):"
  sort -u "$skips" | sed 's/^/  /'
fi
passed=$((passed - skipped))
echo "tests: $passed passed, $failed failed, $skipped skipped; $binaries test binaries, $failed_binaries failed" \
  | tee target/test-summary.txt
if [ "$status" -eq 0 ] && [ "$failed_binaries" -ne 0 ]; then
  status=1
fi
exit "$status"
