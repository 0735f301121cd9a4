//! Arbitrary bytes as an ELF file an agent reads for its USDT probes
//! (`.note.stapsdt`: any binary a host runs): the reader must return, never
//! panic, and bound what it keeps; what it returns must be consistent.
#![no_main]

use libfuzzer_sys::fuzz_target;
use symtrace_elf::usdt::{usdt_probes, MAX_PROBES};

fuzz_target!(|data: &[u8]| {
    if let Ok(probes) = usdt_probes(data) {
        assert!(probes.len() <= MAX_PROBES);
        for p in probes {
            if let Some(offset) = p.file_offset {
                assert!(offset < data.len() as u64, "{p:?}");
            }
            if let Ok(args) = &p.args {
                assert!(args.iter().all(|a| matches!(a.size, 1 | 2 | 4 | 8)));
            }
        }
    }
});
