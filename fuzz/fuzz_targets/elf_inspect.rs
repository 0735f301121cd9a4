//! Arbitrary bytes as an uploaded ELF file: inspection (what the server
//! checks and ranks) and the DWARF-named source list must return, never
//! panic, and never decompress more than their budget.
#![no_main]

use libfuzzer_sys::fuzz_target;
use symtrace_elf::{inspect_with, source_files_with, Budget};

fuzz_target!(|data: &[u8]| {
    let mut budget = Budget::new(16 << 20);
    if inspect_with(data, &mut budget).is_ok() {
        let mut budget = Budget::new(16 << 20);
        let _ = source_files_with(data, &mut budget);
    }
});
