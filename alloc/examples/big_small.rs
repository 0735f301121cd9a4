//! A Rust program under `SampledAllocator`: two threads allocate and free
//! in varied sizes (16 B .. 1 MiB), "big" 768 MiB in all and "small" 256
//! MiB (3:1), and print their bytes. The tests read its `otel_memory`
//! probes with bpftrace.

use std::alloc::System;
use std::hint::black_box;

use symtrace_alloc::SampledAllocator;

#[global_allocator]
static ALLOC: SampledAllocator<System> = SampledAllocator::new(System);

fn churn(total: u64, mut x: u64) -> u64 {
    let mut done = 0;
    while done < total {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        let size = 16usize << (x % 17);
        let v: Vec<u8> = Vec::with_capacity(size);
        black_box(&v);
        done += size as u64;
    }
    done
}

#[inline(never)]
fn big_alloc() -> u64 {
    churn(768 << 20, 11)
}

#[inline(never)]
fn small_alloc() -> u64 {
    churn(256 << 20, 23)
}

fn main() {
    let threads: Vec<_> = [("big", big_alloc as fn() -> u64), ("small", small_alloc)]
        .into_iter()
        .map(|(name, work)| {
            std::thread::Builder::new()
                .name(name.into())
                .spawn(move || println!("{name} {}", work()))
                .unwrap()
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
}
