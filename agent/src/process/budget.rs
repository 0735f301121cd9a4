//! Fairness: each process pays for the agent's work on it out of a budget
//! of its own, so that one process — however many files, mappings,
//! `dlopen`s or JIT records it makes — degrades only its own profile.
//!
//! A [`Bucket`] refills at a rate up to a burst. Every process has one for
//! the sampler thread's work on it (its CPU time resolving the process's
//! stacks and reading its maps and JIT files — CPU, not wall time, so a
//! busy machine does not make a process look expensive: [`WORK_RATE`] of
//! a CPU, [`WORK_BURST`] at once; its waits for jobs are bounded apart),
//! and one for its link-map changes
//! ([`LINK_MAP_RATE`] a second). A process over its work budget still has
//! its samples resolved from what is known already (cached mappings and
//! files), but nothing new is read for it until the budget refills; each
//! such refusal is counted by cause ([`Contained`]).

use std::time::{Duration, Instant};

/// The share of one CPU's time a process may cost the sampler thread,
/// over time.
pub const WORK_RATE: f64 = 0.02;
/// What it may cost at once (its first read: maps, identity, new files).
pub const WORK_BURST: Duration = Duration::from_millis(500);
/// Link-map changes (dlopen, dlclose) handled per second per process, and
/// at once; the others wait for the next token (coalesced: one read
/// serves every change before it).
pub const LINK_MAP_RATE: f64 = 10.0;
pub const LINK_MAP_BURST: f64 = 20.0;

/// A token bucket: `tokens` refill at `rate` a second up to `burst`.
#[derive(Debug, Clone, Copy)]
pub struct Bucket {
    tokens: f64,
    rate: f64,
    burst: f64,
    refilled: Instant,
}

impl Bucket {
    pub fn new(rate: f64, burst: f64, now: Instant) -> Self {
        Bucket {
            tokens: burst,
            rate,
            burst,
            refilled: now,
        }
    }

    /// A bucket of time: `share` of a CPU, `burst` at once.
    pub fn of_time(share: f64, burst: Duration, now: Instant) -> Self {
        Bucket::new(share, burst.as_secs_f64(), now)
    }

    fn refill(&mut self, now: Instant) {
        let earned = now.saturating_duration_since(self.refilled).as_secs_f64() * self.rate;
        self.tokens = (self.tokens + earned).min(self.burst);
        self.refilled = now;
    }

    /// Whether anything is left (the work may run; it is charged after).
    pub fn has(&mut self, now: Instant) -> bool {
        self.refill(now);
        self.tokens > 0.0
    }

    /// Takes one token if there is one.
    pub fn take(&mut self, now: Instant) -> bool {
        self.refill(now);
        if self.tokens >= 1.0 {
            self.tokens -= 1.0;
            true
        } else {
            false
        }
    }

    /// Charges `amount` (may go below zero: the debt is paid by waiting).
    pub fn charge(&mut self, amount: f64) {
        self.tokens -= amount;
    }

    /// Charges the CPU time this thread spent since its CPU clock read
    /// `start` (`jobs::thread_cpu`): CPU, not wall time, which a busy
    /// machine that preempts the thread, or a slow job it waits for,
    /// inflates (waits are bounded apart: each, and all together).
    pub fn charge_cpu_since(&mut self, start: Duration) {
        self.charge_time(crate::jobs::thread_cpu().saturating_sub(start));
    }

    /// Charges time spent.
    pub fn charge_time(&mut self, spent: Duration) {
        self.charge(spent.as_secs_f64());
    }

    /// When a token will be there again.
    pub fn next_token(&self) -> Instant {
        self.when_above(1.0)
    }

    /// When anything will be left again (see [`Self::has`]).
    pub fn next_positive(&self) -> Instant {
        self.when_above(f64::MIN_POSITIVE)
    }

    fn when_above(&self, level: f64) -> Instant {
        let missing = (level - self.tokens).max(0.0);
        self.refilled + Duration::from_secs_f64(missing / self.rate.max(1e-9))
    }
}

/// What the budgets and bounds refused, by cause (the stats line's
/// `contained` segment, and `/metrics`).
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Contained {
    /// Work not done for a process over its work budget.
    pub over_budget: u64,
    /// Maps reads that reached a bound (mappings left out).
    pub maps_truncated: u64,
    /// Maps re-reads not done: the process read its maps too often.
    pub maps_rereads_refused: u64,
    /// Link-map changes handled later than they came (over the rate).
    pub link_maps_deferred: u64,
    /// Processes forgotten to stay within the bound on tracked processes.
    pub processes_evicted: u64,
    /// Ring-buffer records whose handling panicked (the process's state
    /// was dropped; the thread went on).
    pub record_panics: u64,
    /// Return addresses accepted without the check of their call
    /// instruction (its read was refused or did not answer in time).
    pub unchecked_returns: u64,
}

impl Contained {
    /// (name, value) pairs, in a stable order.
    pub fn pairs(&self) -> [(&'static str, u64); 7] {
        [
            ("over_budget", self.over_budget),
            ("maps_truncated", self.maps_truncated),
            ("maps_rereads_refused", self.maps_rereads_refused),
            ("link_maps_deferred", self.link_maps_deferred),
            ("processes_evicted", self.processes_evicted),
            ("record_panics", self.record_panics),
            ("unchecked_returns", self.unchecked_returns),
        ]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_bucket_refills_up_to_its_burst() {
        let t0 = Instant::now();
        let mut b = Bucket::new(10.0, 2.0, t0);
        assert!(b.take(t0) && b.take(t0));
        assert!(!b.take(t0));
        assert!(b.next_token() <= t0 + Duration::from_millis(101));
        assert!(b.take(t0 + Duration::from_millis(100)));
        assert!(b.take(t0 + Duration::from_secs(60)));
        assert!(b.take(t0 + Duration::from_secs(60)));
        assert!(
            !b.take(t0 + Duration::from_secs(60)),
            "no more than the burst"
        );

        let mut time = Bucket::of_time(0.02, Duration::from_millis(100), t0);
        assert!(time.has(t0));
        time.charge_time(Duration::from_millis(300));
        assert!(!time.has(t0 + Duration::from_secs(1)), "in debt");
        // 200 ms of debt at 2%: 10 s to pay.
        assert!(time.next_positive() >= t0 + Duration::from_secs(10));
        assert!(time.has(t0 + Duration::from_millis(10_100)));
    }
}
