//! `SampledAllocator` as this test binary's global allocator: what Rust
//! programs do through it stays correct, sampled blocks carry their header
//! at the default interval, and the `otel_memory` probes of a program built
//! with it are real USDT notes whose weights add up to the bytes allocated
//! (read with bpftrace, as root).

use std::alloc::System;
use std::collections::HashMap;
use std::process::Command;

use symtrace_alloc::{header, SampledAllocator};
use symtrace_testkit as kit;
use symtrace_testkit::agent::bpf_test;

mod common;

#[global_allocator]
static ALLOC: SampledAllocator<System> = SampledAllocator::new(System);

#[repr(align(64))]
struct Line([u8; 64]);

#[repr(align(4096))]
struct Page([u8; 4096]);

#[test]
fn collections_stay_correct_and_sampled_blocks_carry_their_header() {
    let mut sampled = 0;
    let mut blocks = 0;
    // ~1 GiB through growing vectors: thousands of sample points.
    for round in 0..2000u32 {
        let mut v: Vec<u32> = Vec::new();
        for i in 0..(round % 64) * 1024 {
            v.push(i ^ round);
        }
        blocks += 1;
        if v.capacity() > 0 {
            sampled += usize::from(unsafe { header::is_sampled(v.as_ptr() as *const u8) });
        }
        assert!(v.iter().enumerate().all(|(i, x)| *x == i as u32 ^ round));
        v.truncate(v.len() / 3);
        v.shrink_to_fit();
        assert!(v.iter().enumerate().all(|(i, x)| *x == i as u32 ^ round));
        let zeros = vec![0u8; (round as usize % 97) * 4099];
        assert!(zeros.iter().all(|b| *b == 0));
        let lines: Vec<Line> = (0..round % 50).map(|_| Line([round as u8; 64])).collect();
        assert_eq!(lines.as_ptr() as usize % 64, 0);
        assert!(lines.iter().all(|l| l.0[63] == round as u8));
        let pages: Vec<Page> = (0..round % 9).map(|_| Page([7; 4096])).collect();
        assert_eq!(pages.as_ptr() as usize % 4096, 0);
        assert!(pages.iter().all(|p| p.0[4095] == 7));
    }
    let mut map: HashMap<String, Vec<u64>> = HashMap::new();
    for i in 0..50_000u64 {
        map.entry(format!("key {}", i % 5000)).or_default().push(i);
    }
    assert_eq!(map.len(), 5000);
    assert!(map.values().all(|v| v.len() == 10));
    assert!(sampled > 10, "{sampled} of {blocks} vectors sampled");
    assert!(sampled < blocks, "{sampled} of {blocks}");
}

#[test]
fn a_program_built_with_it_fires_the_probes_with_unbiased_weights() {
    let bin = kit::target_dir().join("examples/big_small");
    assert!(
        bin.exists(),
        "{} (cargo test builds the examples)",
        bin.display()
    );
    let notes =
        String::from_utf8(kit::run(Command::new("readelf").arg("-n").arg(&bin)).stdout).unwrap();
    assert_eq!(notes.matches("Provider: otel_memory").count(), 2, "{notes}");
    assert!(notes.contains("Name: alloc") && notes.contains("Name: free"));
    common::check_parsed_probes(&bin, &notes);

    let Some(_one) = bpf_test(&["bpftrace"]) else {
        return;
    };
    common::check_weights(
        &bin,
        &bin,
        &[("OTEL_MEMORY_SAMPLING_INTERVAL", "65536")],
        &["big", "small"],
    );
}
