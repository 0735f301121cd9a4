//! Arbitrary bytes as a symbol index: opening validates, lookups never
//! panic.
#![no_main]

use libfuzzer_sys::fuzz_target;
use symtrace_symbolize::SymbolIndex;

fuzz_target!(|data: &[u8]| {
    if let Ok(index) = SymbolIndex::new(data.to_vec()) {
        let mut frames = Vec::new();
        for address in [0u64, 1, 0x1000, 0x401000, u64::MAX] {
            let _ = index.lookup(address, &mut frames);
        }
    }
});
