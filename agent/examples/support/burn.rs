//! Shared by the agent's example workloads: burning an exact amount of the
//! calling thread's CPU time (CLOCK_THREAD_CPUTIME_ID, not wall time).

use std::hint::black_box;
use std::time::Duration;

/// The calling thread's CPU time so far.
pub fn thread_cpu() -> Duration {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes the timespec it is given.
    unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    Duration::new(ts.tv_sec as u64, ts.tv_nsec as u32)
}

#[inline(never)]
fn spin(sink: &mut u64) {
    for i in 0..100_000u64 {
        *sink = black_box(sink.wrapping_add(i));
    }
}

/// Spins until this thread has used `budget` of CPU time; returns what it
/// used. Inlined, so the sampled frame is the caller's own function.
#[inline(always)]
pub fn burn(budget: Duration) -> Duration {
    let start = thread_cpu();
    let mut sink = 0;
    while thread_cpu() - start < budget {
        spin(&mut sink);
    }
    thread_cpu() - start
}
