//! Corrupt input: clear errors, no panic, bounded work.

use std::process::Command;

use object::{Object, ObjectSection};
use symtrace_symbolize::{index, DwarfSymbolizer, Error, Inputs, SymbolIndex};
use symtrace_testkit::{have, run};

use crate::support::{sample_addresses, FIXTURES};

/// Every answer path on possibly corrupt input: may fail, must not panic.
fn exercise(data: &[u8], addresses: &[u64]) {
    let inputs = Inputs::new(data);
    if let Ok(symbolizer) = DwarfSymbolizer::new(&inputs) {
        let _ = symbolizer.symbolize(addresses);
    }
    if let Ok(bytes) = index::build(&inputs) {
        let index = SymbolIndex::new(bytes).expect("an index we built opens");
        let mut frames = Vec::new();
        for &a in addresses {
            let _ = index.lookup(a, &mut frames);
        }
    }
}

#[test]
fn corrupt_dwarf_never_panics() {
    if !have("g++") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let bin = dir.path().join("heavy");
    run(Command::new("g++")
        .args(["-O1", "-g", "-o"])
        .arg(&bin)
        .arg(format!("{FIXTURES}/heavy.cpp")));
    let original = std::fs::read(&bin).unwrap();
    let addresses = sample_addresses(&bin, 500, 7);
    let sections: Vec<(String, u64, u64)> = {
        let obj = object::File::parse(&*original).unwrap();
        obj.sections()
            .filter(|s| s.name().is_ok_and(|n| n.starts_with(".debug_")))
            .filter_map(|s| {
                let (offset, size) = s.file_range()?;
                Some((s.name().unwrap().to_owned(), offset, size))
            })
            .collect()
    };
    assert!(sections.iter().any(|s| s.0 == ".debug_info"));

    // Truncated sections: the tail of each DWARF section zeroed.
    for (name, offset, size) in &sections {
        let mut data = original.clone();
        let cut = (*offset + size / 2) as usize..(*offset + size) as usize;
        data[cut].fill(0);
        eprintln!("truncated {name}");
        exercise(&data, &addresses);
    }
    // Bad offsets, bad forms, cycles: seeded random byte mutations.
    let mut state = 0x9e37_79b9_7f4a_7c15u64;
    let mut next = || {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        state
    };
    for round in 0..150 {
        let mut data = original.clone();
        let (_, offset, size) = &sections[round % sections.len()];
        for _ in 0..1 + next() % 16 {
            let at = (*offset + next() % size.max(&1)) as usize;
            data[at] = next() as u8;
        }
        exercise(&data, &addresses);
    }
}

#[test]
fn unreadable_files_and_indexes_are_clear_errors() {
    assert!(matches!(
        DwarfSymbolizer::new(&Inputs::new(b"not an ELF file")),
        Err(Error::Elf(_))
    ));
    assert!(matches!(
        index::build(&Inputs::new(&[0x7f, b'E', b'L', b'F'])),
        Err(Error::Elf(_))
    ));
    let err = SymbolIndex::new(b"STSYMIDX".to_vec())
        .unwrap_err()
        .to_string();
    assert!(err.contains("shorter than the header"), "{err}");
    let err = SymbolIndex::new(vec![0u8; 200]).unwrap_err().to_string();
    assert!(err.contains("bad magic"), "{err}");
}

#[test]
fn a_corrupt_index_is_refused_when_opened() {
    let own = std::fs::read(std::env::current_exe().unwrap()).unwrap();
    let good = index::build(&Inputs::new(&own)).unwrap();
    let index = SymbolIndex::new(good.clone()).unwrap();
    assert!(index.best_source().is_some());
    // Truncation, another version, and random damage after the header.
    assert!(SymbolIndex::new(good[..good.len() / 2].to_vec()).is_err());
    let mut other_version = good.clone();
    other_version[8] = 99;
    let err = SymbolIndex::new(other_version).unwrap_err().to_string();
    assert!(err.contains("version 99"), "{err}");
    let mut state = 12345u64;
    for _ in 0..200 {
        let mut data = good.clone();
        state = state
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        let at = 72 + (state >> 16) as usize % (data.len() - 72);
        data[at] ^= 0xff;
        if let Ok(index) = SymbolIndex::new(data) {
            let mut frames = Vec::new();
            for a in (0..4096u64).map(|i| i * 977) {
                let _ = index.lookup(a, &mut frames);
            }
        }
    }
}

#[test]
fn absurd_batches_are_refused() {
    let own = std::fs::read(std::env::current_exe().unwrap()).unwrap();
    let symbolizer = DwarfSymbolizer::new(&Inputs::new(&own)).unwrap();
    let too_many = vec![0u64; symtrace_symbolize::MAX_BATCH + 1];
    assert!(matches!(
        symbolizer.symbolize(&too_many),
        Err(Error::BatchTooLarge(_))
    ));
}

/// `ch_size` of the Elf64_Chdr of `section` (little-endian, at offset 8 of
/// the section's bytes) set to `size`.
fn claim(data: &[u8], section: &str, size: u64) -> Vec<u8> {
    let file = object::File::parse(data).unwrap();
    assert!(file.is_64() && file.is_little_endian());
    let s = file.section_by_name(section).unwrap();
    assert_ne!(
        s.compressed_file_range().unwrap().format,
        object::CompressionFormat::None,
        "{section} is not compressed"
    );
    let start = s.file_range().unwrap().0 as usize;
    let mut out = data.to_vec();
    out[start + 8..start + 16].copy_from_slice(&size.to_le_bytes());
    out
}

/// The error both tiers give for `inputs`, which must fail to decompress
/// `.debug_info` with a message containing `needle`.
fn assert_decompression_refused(inputs: &Inputs<'_>, needle: &str) {
    let errors = [
        DwarfSymbolizer::new(inputs).map(|_| ()).unwrap_err(),
        index::build(inputs).map(|_| ()).unwrap_err(),
    ];
    for err in errors {
        match &err {
            Error::Decompression(symtrace_elf::Error::Decompression { section, .. }) => {
                assert_eq!(section, ".debug_info", "{err}")
            }
            other => panic!("expected a decompression error, got {other:?}"),
        }
        let text = err.to_string();
        assert!(text.starts_with("section .debug_info: "), "{text}");
        assert!(text.contains(needle), "{text:?} should mention {needle:?}");
    }
}

/// A stored file whose compressed `.debug_info` lies about its size (1 TiB,
/// or more than the stream holds) or is larger than the budget: both tiers
/// return an error naming the section, and never allocate what it claims.
#[test]
fn compressed_sections_over_the_budget_are_clear_errors() {
    if !have("gcc") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let c = dir.path().join("z.c");
    std::fs::write(
        &c,
        "#include <stdio.h>\nstatic int twice(int x) { return 2 * x; }\n\
         int main(int argc, char **argv) { printf(\"%d\\n\", twice(argc)); return 0; }\n",
    )
    .unwrap();
    let zlib = dir.path().join("zlib");
    run(Command::new("gcc")
        .args(["-O0", "-g", "-gz=zlib", "-o"])
        .arg(&zlib)
        .arg(&c));
    let mut cases = vec![("zlib", std::fs::read(&zlib).unwrap())];
    // Debian 12's gcc has no -gz=zstd and its objcopy leaves sections
    // uncompressed: llvm-objcopy makes the zstd case.
    match ["llvm-objcopy-19", "llvm-objcopy"]
        .into_iter()
        .find(|t| have(t))
    {
        Some(tool) => {
            // From an uncompressed build: llvm-objcopy keeps zlib sections.
            let plain = dir.path().join("plain");
            run(Command::new("gcc")
                .args(["-O0", "-g", "-o"])
                .arg(&plain)
                .arg(&c));
            let zstd = dir.path().join("zstd");
            run(Command::new(tool)
                .arg("--compress-debug-sections=zstd")
                .arg(&plain)
                .arg(&zstd));
            cases.push(("zstd", std::fs::read(&zstd).unwrap()));
        }
        None => assert!(
            std::env::var("CI").is_err(),
            "llvm-objcopy is required in CI"
        ),
    }
    for (what, good) in &cases {
        // The honest file symbolizes.
        let symbolizer = DwarfSymbolizer::new(&Inputs::new(good)).unwrap();
        assert_eq!(
            symbolizer.best_source(),
            Some(symtrace_symbolize::Source::Dwarf)
        );
        index::build(&Inputs::new(good)).unwrap();
        let real = {
            let file = object::File::parse(&**good).unwrap();
            let range = file
                .section_by_name(".debug_info")
                .unwrap()
                .compressed_file_range()
                .unwrap();
            assert_eq!(
                range.format,
                if *what == "zlib" {
                    object::CompressionFormat::Zlib
                } else {
                    object::CompressionFormat::Zstandard
                }
            );
            range.uncompressed_size
        };

        // 1 TiB claimed: refused before allocating, under the default budget.
        let bad = claim(good, ".debug_info", 1 << 40);
        assert_decompression_refused(
            &Inputs::new(&bad),
            &format!(
                "claims 1099511627776 uncompressed bytes ({what}), over the 4294967296-byte budget"
            ),
        );
        // A budget smaller than what the honest file really inflates to.
        assert_decompression_refused(
            &Inputs::new(good).with_max_decompressed_bytes(real - 1),
            &format!("claims {real} uncompressed bytes ({what}), over the"),
        );
        // A claim the stream does not fill, and one it overruns.
        let bad = claim(good, ".debug_info", real + 100);
        assert_decompression_refused(
            &Inputs::new(&bad),
            &format!("stream ends after {real} of the {} bytes", real + 100),
        );
        let bad = claim(good, ".debug_info", real - 1);
        assert_decompression_refused(&Inputs::new(&bad), "stream inflates to more than");
    }
}
