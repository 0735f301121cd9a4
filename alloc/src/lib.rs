//! # symtrace-alloc
//!
//! Memory allocation profiling the OpenTelemetry way
//! (`design-docs/00003-memory-profiling` of the OpenTelemetry eBPF
//! profiler): the process samples its own allocations — a Poisson process
//! over allocated bytes, one sample per [`sampler::DEFAULT_INTERVAL`]
//! (512 KiB) on average — and fires two USDT probes that an eBPF profiler
//! (symtrace-agent) attaches to:
//!
//! - `otel_memory:alloc(ptr, size, weight)` on a sampled allocation, where
//!   `weight = crossed sample points × interval` is the bytes it stands for;
//! - `otel_memory:free(ptr)` when a sampled allocation is freed (only
//!   those: the profiler keeps them as live for the in-use profiles).
//!
//! The probes are SystemTap SDT notes (`.note.stapsdt`; `readelf -n`,
//! `bpftrace -l 'usdt:BINARY:otel_memory:*'`): a `nop` each in the code,
//! reached only on the sampled path.
//!
//! The unsampled path is a thread-local countdown — a subtraction and a
//! branch, no lock, no syscall — plus, on free, one 8-byte load before the
//! pointer ([`header`]).
//!
//! ```no_run
//! use symtrace_alloc::SampledAllocator;
//! #[global_allocator]
//! static ALLOC: SampledAllocator<std::alloc::System> =
//!     SampledAllocator::new(std::alloc::System);
//! ```
//!
//! C and C++ programs that cannot be rebuilt get the same through an
//! `LD_PRELOAD` library (`alloc/preload/`, docs/memory.md).
//!
//! The interval is read once from [`INTERVAL_ENV`]
//! (`OTEL_MEMORY_SAMPLING_INTERVAL`, bytes; `0` turns sampling off).

pub mod header;
pub mod sampler;

use std::alloc::{GlobalAlloc, Layout};
use std::cell::Cell;
use std::sync::atomic::{AtomicU64, Ordering};

use sampler::Countdown;

/// The environment variable that sets the mean bytes between samples
/// (decimal; `0` turns sampling off; default 524288).
pub const INTERVAL_ENV: &str = "OTEL_MEMORY_SAMPLING_INTERVAL";

/// The interval in use: 0 not read yet, `u64::MAX` sampling off.
static INTERVAL: AtomicU64 = AtomicU64::new(0);

/// Mixed into each thread's seed, so threads never share a sequence.
static SEEDS: AtomicU64 = AtomicU64::new(0);

thread_local! {
    static COUNTDOWN: Cell<Countdown> = const { Cell::new(Countdown::UNSEEDED) };
}

/// The mean bytes between samples, or `None` when sampling is off. Read
/// from [`INTERVAL_ENV`] the first time (with `getenv`, which does not
/// allocate: this runs inside the allocator).
pub fn interval() -> Option<u64> {
    let mut v = INTERVAL.load(Ordering::Relaxed);
    if v == 0 {
        // SAFETY: getenv's result is a NUL-terminated string or null, read
        // at once (nothing here changes the environment).
        let value = unsafe {
            let p = libc::getenv(c"OTEL_MEMORY_SAMPLING_INTERVAL".as_ptr());
            (!p.is_null()).then(|| std::ffi::CStr::from_ptr(p).to_bytes())
        };
        v = sampler::parse_interval(value).unwrap_or(u64::MAX);
        INTERVAL.store(v, Ordering::Relaxed);
    }
    (v != u64::MAX).then_some(v)
}

/// How many sample points this thread's allocation of `size` bytes
/// crosses (0: not sampled). The fast path is the countdown alone.
#[inline(always)]
fn sample(size: usize) -> u64 {
    COUNTDOWN.with(|cell| {
        let mut c = cell.get();
        if c.take(size).is_none() {
            cell.set(c);
            return 0;
        }
        let points = slow(&mut c, size);
        cell.set(c);
        points
    })
}

#[cold]
#[inline(never)]
fn slow(c: &mut Countdown, size: usize) -> u64 {
    match interval() {
        Some(interval) => {
            let seed = SEEDS.fetch_add(1, Ordering::Relaxed) ^ (c as *const _ as u64);
            c.crossed(size, interval, seed)
        }
        None => {
            *c = Countdown {
                left: i64::MAX,
                rng: 1,
            };
            0
        }
    }
}

/// Fires `otel_memory:alloc`: one probe site per program.
#[inline(never)]
fn fire_alloc(ptr: *mut u8, size: usize, weight: u64) {
    probe::probe!(otel_memory, alloc, ptr as usize, size, weight);
}

/// Fires `otel_memory:free`: one probe site per program.
#[inline(never)]
fn fire_free(ptr: *mut u8) {
    probe::probe!(otel_memory, free, ptr as usize);
}

/// A [`GlobalAlloc`] that samples what it allocates through `A` (the
/// system allocator, jemalloc, mimalloc, …) and fires the `otel_memory`
/// probes for the sampled allocations; see the crate documentation.
pub struct SampledAllocator<A> {
    inner: A,
}

impl<A> SampledAllocator<A> {
    /// Wraps `inner`.
    pub const fn new(inner: A) -> Self {
        SampledAllocator { inner }
    }

    /// The wrapped allocator.
    pub fn inner(&self) -> &A {
        &self.inner
    }
}

/// The inner block of a sampled allocation: the user's bytes plus the
/// header's slack, aligned at least to 16. `None` when it has no header
/// (page-sized alignment) or its size overflows.
fn inner_layout(layout: Layout) -> Option<Layout> {
    let slack = header::slack(layout.align())?;
    let size = layout.size().checked_add(slack)?;
    Layout::from_size_align(size, layout.align().max(16)).ok()
}

impl<A: GlobalAlloc> SampledAllocator<A> {
    #[cold]
    #[inline(never)]
    unsafe fn alloc_sampled(&self, layout: Layout, points: u64, zeroed: bool) -> *mut u8 {
        let weight = sampler::weight(points, interval().unwrap_or(0));
        let get = |l| {
            if zeroed {
                self.inner.alloc_zeroed(l)
            } else {
                self.inner.alloc(l)
            }
        };
        let Some(with_header) = inner_layout(layout) else {
            // No header: counted as allocated, never as in use.
            let ptr = get(layout);
            if !ptr.is_null() {
                fire_alloc(ptr, layout.size(), weight);
                fire_free(ptr);
            }
            return ptr;
        };
        let raw = get(with_header);
        if raw.is_null() {
            return raw;
        }
        let offset = header::place(raw as usize, layout.align()).expect("a header fits");
        let ptr = header::write(raw, offset);
        fire_alloc(ptr, layout.size(), weight);
        ptr
    }

    #[cold]
    #[inline(never)]
    unsafe fn dealloc_sampled(&self, ptr: *mut u8, layout: Layout) {
        fire_free(ptr);
        let raw = header::take(ptr);
        let with_header = inner_layout(layout).expect("a sampled block has a header");
        self.inner.dealloc(raw, with_header);
    }
}

// SAFETY: every block is the inner allocator's, given back with the layout
// it was allocated with (a sampled one with its header's, recomputed from
// the caller's layout), and sampled user pointers keep the caller's
// alignment (header::place).
unsafe impl<A: GlobalAlloc> GlobalAlloc for SampledAllocator<A> {
    #[inline]
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        match sample(layout.size()) {
            0 => self.inner.alloc(layout),
            points => self.alloc_sampled(layout, points, false),
        }
    }

    #[inline]
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        match sample(layout.size()) {
            0 => self.inner.alloc_zeroed(layout),
            points => self.alloc_sampled(layout, points, true),
        }
    }

    #[inline]
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        if header::is_sampled(ptr) {
            self.dealloc_sampled(ptr, layout)
        } else {
            self.inner.dealloc(ptr, layout)
        }
    }

    #[inline]
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        // SAFETY: the caller guarantees new_size is valid for the alignment.
        let new_layout = Layout::from_size_align_unchecked(new_size, layout.align());
        let sampled = header::is_sampled(ptr);
        let points = if sampled { 0 } else { sample(new_size) };
        if !sampled && points == 0 {
            return self.inner.realloc(ptr, layout, new_size);
        }
        // A sampled block moves (its header stays with its inner block), and
        // a block that becomes sampled moves into one with a header: a
        // realloc is then a free and an allocation.
        let new = if sampled {
            self.alloc(new_layout)
        } else {
            self.alloc_sampled(new_layout, points, false)
        };
        if !new.is_null() {
            std::ptr::copy_nonoverlapping(ptr, new, layout.size().min(new_size));
            self.dealloc(ptr, layout);
        }
        new
    }
}
