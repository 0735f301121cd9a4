//! Integration tests: real binaries built by gcc, clang, rustc, objcopy and
//! dwz; answers compared with llvm-symbolizer-19.

mod agreement;
mod bad_input;
mod sources;
mod support;
