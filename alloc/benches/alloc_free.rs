//! What the sampler adds to an allocation that is not sampled: a tight
//! loop of 64-byte malloc + free through the system allocator, plain and
//! wrapped in `SampledAllocator` at the default interval (one sample per
//! 512 KiB: one in 8,192 of these), both in one run.
//!
//! `cargo bench -p symtrace-alloc --bench alloc_free`

// criterion_group! generates an undocumented `pub fn benches`.
#![allow(missing_docs)]

use std::alloc::{GlobalAlloc, Layout, System};
use std::hint::black_box;

use criterion::{criterion_group, criterion_main, Criterion};
use symtrace_alloc::SampledAllocator;

static SAMPLED: SampledAllocator<System> = SampledAllocator::new(System);

fn alloc_free(c: &mut Criterion) {
    let layout = Layout::from_size_align(64, 8).unwrap();
    let mut group = c.benchmark_group("64-byte alloc + free");
    group.bench_function("System", |b| {
        b.iter(|| unsafe {
            let p = System.alloc(black_box(layout));
            System.dealloc(black_box(p), layout);
        })
    });
    group.bench_function("SampledAllocator<System>", |b| {
        b.iter(|| unsafe {
            let p = SAMPLED.alloc(black_box(layout));
            SAMPLED.dealloc(black_box(p), layout);
        })
    });
    group.finish();
}

criterion_group!(benches, alloc_free);
criterion_main!(benches);
