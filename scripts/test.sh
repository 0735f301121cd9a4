#!/usr/bin/env bash
# The whole test suite, on a fresh Debian 12 machine as root: installs and
# starts what the tests need (scripts/test-services.sh: elfutils'
# debuginfod-find and debuginfod, gdb, PostgreSQL, s3s-fs), then runs every
# test of every crate against them. Under CI=true a missing tool fails the
# run instead of skipping tests.
set -euo pipefail
cd "$(dirname "$0")/.."
eval "$(scripts/test-services.sh)"
cargo test --workspace --locked "$@"
