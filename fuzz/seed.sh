#!/usr/bin/env bash
# Regenerates the committed seed corpus under fuzz/corpus/TARGET: OTLP
# exports (protobuf and JSON) and segments from symtrace-profiles'
# fuzz_seeds example, small ELF files built by gcc (with DWARF, with
# zlib-compressed DWARF, stripped), a symbol index built from one, and a
# source bundle, and ELF files with USDT probes (<sys/sdt.h>). Run from
# anywhere; needs gcc, objcopy, tar and systemtap-sdt-dev.
set -euo pipefail
cd "$(dirname "$0")/.."
C=$PWD/fuzz/corpus
rm -rf "$C"
mkdir -p "$C"/{elf_inspect,elf_split,index_build,index_open,source_bundle,usdt_notes}
cargo run -q -p symtrace-profiles --example fuzz_seeds -- "$C"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
mkdir -p "$tmp/src"
printf 'static int f(int x){return x*3;}\nint g(int y){return f(y)+1;}\nint main(int c,char**v){(void)v;return g(c);}\n' > "$tmp/src/t.c"
gcc -O2 -g -o "$tmp/t-dwarf" "$tmp/src/t.c"
gcc -O0 -g -gz=zlib -o "$tmp/t-zlib" "$tmp/src/t.c"
gcc -O1 -s -o "$tmp/t-stripped" "$tmp/src/t.c"
objcopy --only-keep-debug "$tmp/t-dwarf" "$tmp/t-dwarf.debug"
for f in t-dwarf t-zlib t-stripped t-dwarf.debug; do
  cp "$tmp/$f" "$C/elf_inspect/"
  cp "$tmp/$f" "$C/elf_split/"
done
cp "$tmp/t-dwarf" "$tmp/t-zlib" "$C/index_build/"
cargo run -q -p symtrace-symbolize --example symbolize -- build "$tmp/t-dwarf" "$C/index_open/t-dwarf.idx" >/dev/null
(cd "$tmp" && printf '#define X 1\n' > src/t.h && tar cf "$C/source_bundle/two-files.tar" src/t.c src/t.h)
# USDT probes with register, memory and constant arguments; stripped, so
# they stay small.
printf '#include <sys/sdt.h>\nvoid f(void *p, unsigned long n, long w){STAP_PROBE3(otel_memory, alloc, p, n, w);}\nint main(int c, char **v){long x = c; f(v, c * 8UL, -x); STAP_PROBE1(otel_memory, free, v); STAP_PROBE2(t, k, 5, x); return 0;}\n' > "$tmp/src/sdt.c"
gcc -O2 -s -o "$C/usdt_notes/sdt-O2" "$tmp/src/sdt.c"
gcc -O0 -s -o "$C/usdt_notes/sdt-O0" "$tmp/src/sdt.c"
gcc -O2 -s -shared -fPIC -o "$C/usdt_notes/sdt.so" "$tmp/src/sdt.c"
du -sh "$C"
