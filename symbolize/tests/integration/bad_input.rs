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
