//! Off-CPU waits between their two records: a recorded switch-out (the
//! thread's stacks and context, resolved at once, while the process and its
//! mappings are surely there) waits here for the switch-in that says how
//! long the thread was away. Bounded like the BPF side's map: a switch-out
//! whose thread never runs again (it exited) goes when the map is full
//! (oldest first) — its wait has no end to report.

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;

use crate::process::{ProcessInfo, UserFrame};
use crate::record::TraceCtx;
use crate::unwind::Cut;

/// A recorded switch-out, its stacks resolved.
pub struct Waiting {
    pub process: Arc<ProcessInfo>,
    pub thread_name: String,
    /// The switch-out time (`bpf_ktime_get_boot_ns`).
    pub start_ns: u64,
    pub user: Vec<UserFrame>,
    pub cut: Option<Cut>,
    /// Kernel frames, leaf first: call-site addresses.
    pub kernel: Vec<u64>,
    pub trace: TraceCtx,
}

/// Waiting threads by thread ID.
pub struct Waits {
    by_tid: HashMap<u32, Waiting>,
    /// Arrival order, to drop the oldest when full (stale entries are
    /// skipped: a tid that ended and waited again is queued twice).
    order: VecDeque<(u32, u64)>,
    max: usize,
    /// Waits dropped unfinished (full), and ends with no start (their start
    /// was dropped, or came from before the agent started).
    pub dropped: u64,
    pub unmatched: u64,
}

impl Waits {
    pub fn new(max: usize) -> Self {
        Self {
            by_tid: HashMap::new(),
            order: VecDeque::new(),
            max: max.max(1),
            dropped: 0,
            unmatched: 0,
        }
    }

    /// A thread left the CPU; a wait of the same thread still open (its end
    /// was lost) is replaced.
    pub fn start(&mut self, tid: u32, waiting: Waiting) {
        while self.by_tid.len() >= self.max && !self.by_tid.contains_key(&tid) {
            let Some((old, start)) = self.order.pop_front() else {
                break;
            };
            if self.by_tid.get(&old).is_some_and(|w| w.start_ns == start) {
                self.by_tid.remove(&old);
                self.dropped += 1;
            }
        }
        self.order.push_back((tid, waiting.start_ns));
        if self.by_tid.insert(tid, waiting).is_some() {
            self.dropped += 1;
        }
        // Stale queue entries are dropped as they reach the front; keep the
        // queue from outgrowing the map by much.
        if self.order.len() > 2 * self.max {
            let by_tid = &self.by_tid;
            self.order
                .retain(|(t, s)| by_tid.get(t).is_some_and(|w| w.start_ns == *s));
        }
    }

    /// The thread ran again: its wait, if its start is the one recorded.
    pub fn end(&mut self, tid: u32, start_ns: u64) -> Option<Waiting> {
        match self.by_tid.get(&tid) {
            Some(w) if w.start_ns == start_ns => self.by_tid.remove(&tid),
            _ => {
                self.unmatched += 1;
                None
            }
        }
    }

    pub fn len(&self) -> usize {
        self.by_tid.len()
    }
}

/// Whether a kernel function is the tracing machinery a switch-out's stack
/// was taken from (the BPF program, the tracepoint's glue): such leaf
/// frames are left out of the thread's stack.
pub fn is_tracing_frame(name: &str) -> bool {
    name.starts_with("bpf_") || name.starts_with("__bpf_") || name.starts_with("__traceiter_")
}

/// A wait of `duration_ns` recorded with probability `p`, as the value it
/// stands for (every wait it represents): unbiased when summed.
pub fn scaled(duration_ns: u64, p: f64) -> i64 {
    if p <= 0.0 {
        return 0;
    }
    (duration_ns as f64 / p.min(1.0))
        .round()
        .min(i64::MAX as f64) as i64
}

#[cfg(test)]
mod tests {
    use super::*;

    fn waiting(start_ns: u64) -> Waiting {
        Waiting {
            process: Arc::new(ProcessInfo::default()),
            thread_name: "t".into(),
            start_ns,
            user: Vec::new(),
            cut: None,
            kernel: Vec::new(),
            trace: TraceCtx::default(),
        }
    }

    #[test]
    fn a_wait_ends_once_at_its_own_start_and_the_oldest_go_when_full() {
        let mut w = Waits::new(2);
        w.start(1, waiting(10));
        w.start(2, waiting(20));
        assert!(w.end(1, 11).is_none(), "another start: not this wait");
        assert_eq!(w.end(1, 10).map(|x| x.start_ns), Some(10));
        assert!(w.end(1, 10).is_none(), "ended once");
        assert_eq!(w.unmatched, 2);
        w.start(3, waiting(30));
        w.start(4, waiting(40)); // full: thread 2's wait goes
        assert_eq!((w.len(), w.dropped), (2, 1));
        assert!(w.end(2, 20).is_none());
        assert!(w.end(4, 40).is_some());
        // A thread's new start replaces its open one.
        w.start(3, waiting(35));
        assert!(w.end(3, 30).is_none());
        assert!(w.end(3, 35).is_some());
    }

    #[test]
    fn the_tracing_glue_is_recognized() {
        for name in [
            "bpf_prog_d03993a20cb04d03_on_switch",
            "bpf_trace_run4",
            "__bpf_trace_sched_switch",
            "__traceiter_sched_switch",
        ] {
            assert!(is_tracing_frame(name), "{name}");
        }
        for name in ["__schedule", "schedule", "do_nanosleep", "futex_wait"] {
            assert!(!is_tracing_frame(name), "{name}");
        }
    }

    #[test]
    fn waits_are_scaled_by_their_probability() {
        assert_eq!(scaled(1_000, 1.0), 1_000);
        assert_eq!(scaled(1_000, 0.25), 4_000);
        assert_eq!(scaled(1_000, 0.0), 0);
        assert_eq!(scaled(u64::MAX, 1e-9), i64::MAX);
    }
}
