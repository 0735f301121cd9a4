//! Samples held back while the files their stack copy's walk needs are
//! read. A process's first samples, taken before the agent set its unwind
//! ranges, come with a copy of their stack (`struct stack_snapshot`),
//! walked in userspace by each file's CFI; when a file on the way is still
//! being read (its facts or its CFI: jobs the sampler thread waits for a
//! short while only), the walk would be cut there and the sample keep the
//! BPF walk's cut chain. Such a sample is held instead, and resolved again
//! at each drain until its files are read — at most [`HOLD_FOR`], at most
//! [`MAX_HELD`] samples (beyond either it is resolved as it is), and at
//! once when its process exits (its entry must still be there) or the
//! agent stops.

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use crate::record::{CpuSample, StackSnapshot};

/// Samples held at most (each with its copy: ~20 KiB).
pub const MAX_HELD: usize = 64;
/// How long a sample is held at most.
pub const HOLD_FOR: Duration = Duration::from_secs(2);

/// A held sample, with its copy.
pub struct HeldSample {
    pub sample: Box<CpuSample>,
    pub snapshot: StackSnapshot,
    /// Whether it may be held again (its time not up).
    pub may_hold: bool,
}

#[derive(Default)]
pub struct Held {
    items: VecDeque<(Instant, HeldSample)>,
}

impl Held {
    /// Whether another sample may be held.
    pub fn room(&self) -> bool {
        self.items.len() < MAX_HELD
    }

    /// Holds `sample` from `now`, or from `since` when it was held before.
    pub fn hold(
        &mut self,
        now: Instant,
        since: Option<Instant>,
        sample: Box<CpuSample>,
        snapshot: StackSnapshot,
    ) {
        let since = since.unwrap_or(now);
        self.items.push_back((
            since,
            HeldSample {
                sample,
                snapshot,
                may_hold: true,
            },
        ));
    }

    pub fn is_empty(&self) -> bool {
        self.items.is_empty()
    }

    /// Every held sample, to be resolved again at `now` (each with when
    /// it was first held, to hold it again with).
    pub fn take_all(&mut self, now: Instant) -> Vec<(Instant, HeldSample)> {
        self.items
            .drain(..)
            .map(|(since, mut h)| {
                h.may_hold = now.saturating_duration_since(since) < HOLD_FOR;
                (since, h)
            })
            .collect()
    }

    /// The held samples of process `pid` (it exited), none to be held
    /// again.
    pub fn take_process(&mut self, pid: u32) -> Vec<HeldSample> {
        let mut taken = Vec::new();
        self.items.retain_mut(|(_, h)| {
            if h.sample.pid != pid {
                return true;
            }
            taken.push(HeldSample {
                sample: h.sample.clone(),
                snapshot: std::mem::take(&mut h.snapshot),
                may_hold: false,
            });
            false
        });
        taken
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample(pid: u32) -> Box<CpuSample> {
        // SAFETY: CpuSample is plain old data (repr(C), integers and
        // arrays): all zeros is a value of it.
        let mut s: Box<CpuSample> = Box::new(unsafe { std::mem::zeroed() });
        s.pid = pid;
        s
    }

    #[test]
    fn holds_within_its_bounds_and_lets_go_by_time_and_exit() {
        let mut held = Held::default();
        let t0 = Instant::now();
        for i in 0..MAX_HELD as u32 {
            assert!(held.room());
            held.hold(t0, None, sample(i % 2), StackSnapshot::default());
        }
        assert!(!held.room(), "bounded at MAX_HELD");
        // Before its time is up, each may be held again.
        let all = held.take_all(t0 + HOLD_FOR / 2);
        assert_eq!(all.len(), MAX_HELD);
        assert!(all.iter().all(|(_, h)| h.may_hold));
        assert!(held.is_empty());
        for (since, h) in all {
            held.hold(t0 + HOLD_FOR / 2, Some(since), h.sample, h.snapshot);
        }
        // An exited process's samples go at once, not to be held again.
        let gone = held.take_process(1);
        assert_eq!(gone.len(), MAX_HELD / 2);
        assert!(gone.iter().all(|h| h.sample.pid == 1 && !h.may_hold));
        // Its time is from when it was first held, not from the last hold.
        let rest = held.take_all(t0 + HOLD_FOR);
        assert_eq!(rest.len(), MAX_HELD / 2);
        assert!(rest.iter().all(|(_, h)| h.sample.pid == 0 && !h.may_hold));
    }
}
