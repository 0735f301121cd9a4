//! Allocations at start-up (issue #38), the Rust twin of
//! `tests/c/startup_alloc.c`: from the first line of `main`,
//! `hold_at_start` keeps 64 blocks of 1 MiB live, then `churn` allocates
//! and frees 64 MiB in small blocks. Prints `held BYTES` and `ready`, then
//! sleeps LINGER seconds (the first argument, default 3) with the blocks
//! live, and exits.

use std::hint::black_box;
use std::time::Duration;

use symtrace_alloc::SampledAllocator;

#[global_allocator]
static ALLOC: SampledAllocator<std::alloc::System> = SampledAllocator::new(std::alloc::System);

const BLOCKS: usize = 64;
const BLOCK: usize = 1 << 20;

#[inline(never)]
fn hold_at_start(kept: &mut Vec<Vec<u8>>) -> usize {
    for _ in 0..BLOCKS {
        let mut block = Vec::with_capacity(BLOCK);
        block.resize(64, 1u8);
        kept.push(black_box(block));
    }
    BLOCKS * BLOCK
}

#[inline(never)]
fn churn() {
    for _ in 0..(64 << 20) / 4096 {
        black_box(vec![0u8; 4096]);
    }
}

fn main() {
    let mut kept = Vec::with_capacity(BLOCKS);
    let held = hold_at_start(&mut kept);
    churn();
    println!("held {held}\nready");
    let linger: u64 = std::env::args()
        .nth(1)
        .and_then(|a| a.parse().ok())
        .unwrap_or(3);
    std::thread::sleep(Duration::from_secs(linger));
    black_box(&kept);
}
