//! Arbitrary bytes as an ELF file: building an index must not panic, and an
//! index it builds must open and answer lookups.
#![no_main]

use libfuzzer_sys::fuzz_target;
use symtrace_symbolize::{index, Inputs, SymbolIndex};

fuzz_target!(|data: &[u8]| {
    if let Ok(bytes) = index::build(&Inputs::new(data)) {
        let index = SymbolIndex::new(bytes).expect("a built index opens");
        let mut frames = Vec::new();
        for address in [0u64, 1, 0x1000, 0x401000, u64::MAX] {
            let _ = index.lookup(address, &mut frames);
        }
    }
});
