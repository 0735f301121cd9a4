//! The memory profile workload in Rust, under `SampledAllocator` (the C one
//! is `tests/c/memory_workload.c`; same shape, same output). Waits for a
//! line on stdin, then: thread "big" runs `big_alloc` (768 MiB allocated
//! and freed in sizes of 16 B .. 1 MiB), thread "small" `small_alloc` (256
//! MiB, 3:1); `leaky` keeps 64 MiB live; `span_alloc` allocates and frees
//! 128 MiB inside span A (published with symtrace-context's guard). Prints
//! `big N`, `small N`, `leaky N`, `span A TRACE SPAN N`, `ready`, then
//! lingers `argv[1]` seconds (default 3) with the leaked blocks live.

use std::alloc::System;
use std::hint::black_box;
use std::io::BufRead;
use std::time::Duration;

use symtrace_alloc::SampledAllocator;

#[global_allocator]
static ALLOC: SampledAllocator<System> = SampledAllocator::new(System);

fn next(x: &mut u64) -> u64 {
    *x ^= *x << 13;
    *x ^= *x >> 7;
    *x ^= *x << 17;
    *x
}

/// Allocates and frees `total` bytes, pausing every 8 MiB so a profiler's
/// ring buffer is never flooded.
fn churn(total: u64, mut x: u64) -> u64 {
    let (mut done, mut paced) = (0, 0);
    while done < total {
        let size = 16usize << (next(&mut x) % 17);
        let v: Vec<u8> = Vec::with_capacity(size);
        black_box(&v);
        drop(v);
        done += size as u64;
        if done - paced >= 8 << 20 {
            paced = done;
            std::thread::sleep(Duration::from_millis(2));
        }
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

#[inline(never)]
fn span_alloc() -> u64 {
    churn(128 << 20, 31)
}

/// Keeps `total` bytes live, in blocks of 4 KiB .. 256 KiB.
#[inline(never)]
fn leaky(total: u64, keep: &mut Vec<Vec<u8>>) -> u64 {
    let (mut done, mut x) = (0u64, 47u64);
    while done < total {
        let size = (4096u64 << (next(&mut x) % 7)).min(total - done) as usize;
        keep.push(black_box(vec![1u8; size]));
        done += size as u64;
    }
    done
}

fn random<const N: usize>() -> [u8; N] {
    let mut b = [0u8; N];
    std::io::Read::read_exact(&mut std::fs::File::open("/dev/urandom").unwrap(), &mut b).unwrap();
    b
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

fn main() {
    let linger: u64 = std::env::args()
        .nth(1)
        .and_then(|a| a.parse().ok())
        .unwrap_or(3);
    let mut line = String::new();
    std::io::stdin().lock().read_line(&mut line).unwrap();
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
    let mut keep = Vec::new();
    println!("leaky {}", leaky(64 << 20, &mut keep));
    let (trace, span) = (random::<16>(), random::<8>());
    let in_span = {
        let _guard = symtrace_context::enter(symtrace_context::Ids::new(trace, span, 1));
        span_alloc()
    };
    println!("span A {} {} {in_span}", hex(&trace), hex(&span));
    println!("ready");
    std::thread::sleep(Duration::from_secs(linger));
    black_box(&keep);
}
