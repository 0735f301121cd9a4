//! Arbitrary bytes as an uploaded source bundle (tar): members are bounded
//! in number and size, `..` paths and non-files are rejected, garbage is an
//! error, never a panic.
#![no_main]

use libfuzzer_sys::fuzz_target;
use symtrace_elf::read_bundle;

fuzz_target!(|data: &[u8]| {
    let max_bytes = 4096;
    if let Ok((kept, _rejected)) = read_bundle(data, 64, max_bytes, |path, member| {
        let n = std::io::copy(member, &mut std::io::sink())?;
        Ok((path.to_owned(), n))
    }) {
        assert!(kept.len() <= 64);
        for path in kept {
            assert!(path.starts_with('/'), "{path}");
            assert!(!path.split('/').any(|s| s == ".."), "{path}");
        }
    }
});
