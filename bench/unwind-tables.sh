#!/usr/bin/env bash
# Building the agent's unwind tables (issue #40: "table build time per MB
# of .eh_frame"): `symtrace-agent unwind-table` (release build) over the
# distribution's libc, libstdc++ and zlib, node, and the agent itself —
# each file's .eh_frame size, the table's ranges, rules and bytes, its
# build time and that time per MiB of .eh_frame, and how much of the
# file's code keeps a frame pointer. Needs no privileges.
#
#   bench/unwind-tables.sh [FILE…]
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build --release -q --locked -p symtrace-agent
files=("$@")
if [ ${#files[@]} -eq 0 ]; then
  for f in /lib/x86_64-linux-gnu/libc.so.6 /usr/lib/x86_64-linux-gnu/libstdc++.so.6 \
    /lib/x86_64-linux-gnu/libz.so.1 "$(readlink -f "$(command -v node || true)")" \
    target/release/symtrace-agent; do
    [ -f "$f" ] && files+=("$f")
  done
fi
# The first build in a process also pays the process's own cold start
# (page faults of its code, the allocator's first arenas: ~50 ms): the
# first file is built once more first, and that line is marked.
target/release/symtrace-agent unwind-table "${files[0]}" "${files[@]}" | sed '1s/^/(cold start) /'
