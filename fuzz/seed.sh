#!/usr/bin/env bash
# Regenerates the committed seed corpus under fuzz/corpus/TARGET: OTLP
# exports (protobuf and JSON) and segments from symtrace-profiles'
# fuzz_seeds example, small ELF files built by gcc (with DWARF, with
# zlib-compressed DWARF, stripped), a symbol index built from one, and a
# source bundle. Run from anywhere; needs gcc, objcopy and tar.
set -euo pipefail
cd "$(dirname "$0")/.."
C=$PWD/fuzz/corpus
rm -rf "$C"
mkdir -p "$C"/{elf_inspect,elf_split,index_build,index_open,source_bundle}
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
du -sh "$C"
