#!/usr/bin/env bash
# Runs every cargo-fuzz target of fuzz/ for a bounded time, starting from
# the committed corpus fuzz/corpus/TARGET (read only: what the fuzzer finds
# goes to a scratch directory). A crash, a leak, a timeout or an input over
# the memory limit fails the run; its input is left in fuzz/artifacts/TARGET/
# (turn it into a regression test). Needs the nightly toolchain; installs
# cargo-fuzz if it is missing.
#
# The runs are deterministic (a fixed seed and a number of inputs, with the
# time as a cap only), so CI explores exactly what a developer's run of the
# same command did: a new crash is found by someone's exploration on
# purpose, not by CI at random.
#
#   scripts/fuzz.sh [seconds cap per target] [inputs per target]   (default 60, 50000)
set -euo pipefail
cd "$(dirname "$0")/../fuzz"
SECS=${1:-60}
RUNS=${2:-50000}
export PATH="$HOME/.cargo/bin:$PATH"
if ! command -v cargo-fuzz >/dev/null 2>&1; then
  echo "fuzz: installing cargo-fuzz" >&2
  cargo install cargo-fuzz@0.13.2 --locked >&2
fi
cargo +nightly fuzz build
for target in $(cargo +nightly fuzz list); do
  work=$(mktemp -d)
  echo "== fuzz $target ($RUNS inputs, at most ${SECS}s)"
  log="$work.log"
  set +e
  cargo +nightly fuzz run "$target" "$work" "corpus/$target" -- \
    -seed=1 -runs="$RUNS" -max_total_time="$SECS" -max_len=65536 -rss_limit_mb=2048 -timeout=10 \
    -print_final_stats=1 \
    >"$log" 2>&1
  status=$?
  set -e
  grep -E '^stat::(number_of_executed_units|peak_rss_mb)|^Done|ERROR|SUMMARY|panicked|crash-|leak-|timeout-|oom-' "$log" || true
  [ "$status" -eq 0 ] || grep -v "^\s*\[[0-9]" "$log" | tail -60 | cut -c1-400
  rm -f "$log"
  rm -rf "$work"
  if [ "$status" -ne 0 ]; then
    echo "fuzz: $target failed (input in fuzz/artifacts/$target/)"
    exit "$status"
  fi
done
echo "fuzz: every target ran $RUNS inputs (or ${SECS}s) without a failure"
