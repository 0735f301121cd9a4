//! Arbitrary bytes as an ELF file to split (the uploader's
//! `--only-keep-debug` and strip): never a panic; what is written is a
//! file the inspector reads.
#![no_main]

use libfuzzer_sys::fuzz_target;
use symtrace_elf::{inspect, only_keep_debug, strip_debug};

fuzz_target!(|data: &[u8]| {
    let mut debug = Vec::new();
    if only_keep_debug(data, &mut debug).is_ok() {
        let _ = inspect(&debug);
    }
    let mut stripped = Vec::new();
    if strip_debug(data, "x.debug", 0x1234_5678, &mut stripped).is_ok() {
        let _ = inspect(&stripped);
    }
});
