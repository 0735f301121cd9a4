//! Per-file and per-process work, contained: everything the agent does with
//! what a process controls — opening and parsing its files, reading its
//! memory and its environment — runs here, on worker threads, never on the
//! sampler thread, so that a hostile process can neither crash nor stall
//! the agent:
//!
//! - a panic inside a job (a parser meeting bytes it did not expect) is
//!   caught, counted, and becomes that job's error — the thread goes on;
//! - jobs the sampler waits for (a file's facts, code bytes, a process's
//!   identity) run on their own worker, never behind the long ones (a
//!   file's content hash), which have another ([`Lane`]);
//! - the sampler waits for a job only a short while (see [`Waiting`]); a
//!   job that takes longer finishes in the background, and its answer is
//!   taken when it comes;
//! - a job that runs past [`HUNG_AFTER`] (a read from a FUSE file whose
//!   daemon never answers, a page fault on such a file) is given up: its
//!   waiters get [`JobError::Hung`], its worker is abandoned (it exits when
//!   the call returns, if ever) and replaced — up to [`MAX_ABANDONED`]
//!   workers in the agent's life — and what it was about (the process, the
//!   device) is reported to the caller so that no more work of that kind
//!   is queued ([`Pool::take_hung`]).

use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

/// A job running longer than this is hung.
pub const HUNG_AFTER: Duration = Duration::from_secs(10);
/// Workers abandoned to hung jobs, at most, over the agent's life (each is
/// a thread blocked in the kernel); beyond it hung workers are not
/// replaced.
pub const MAX_ABANDONED: usize = 32;
/// Jobs waiting for a worker, at most: beyond it new ones are refused.
const MAX_QUEUED: usize = 4096;

/// Why a job gave no answer.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum JobError {
    #[error("the job panicked: {0}")]
    Panicked(String),
    #[error("the job ran longer than {HUNG_AFTER:?} and was given up")]
    Hung,
    #[error("too many jobs queued")]
    Refused,
}

/// Which workers run a job.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Lane {
    /// Short jobs the sampler thread may wait for.
    Urgent,
    /// Long jobs nothing waits for (content hashes).
    Background,
    /// A process's identity (a few procfs reads): a worker of its own, so
    /// that a new process is named by its service, not its executable,
    /// however many file jobs wait — on a busy host they take seconds, and
    /// a short-lived process could be gone before its read ran.
    Identity,
}

/// What a job is about: whose work it is, for the budgets and for the
/// reports of hung jobs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct About {
    pub pid: u32,
    /// The device of the file it reads (0: none or unknown).
    pub dev: u64,
}

/// One answer, set once (by the worker, or by the watchdog when the job
/// hangs), read by whoever holds the ticket.
struct Slot<T> {
    value: Mutex<Option<Result<T, JobError>>>,
    ready: Condvar,
}

impl<T> Slot<T> {
    fn set(&self, value: Result<T, JobError>) {
        let mut v = self.value.lock().unwrap_or_else(|e| e.into_inner());
        if v.is_none() {
            *v = Some(value);
            self.ready.notify_all();
        }
    }
}

/// A queued or running job's answer, to come.
pub struct Ticket<T> {
    slot: Arc<Slot<T>>,
}

impl<T> Ticket<T> {
    /// A ticket whose job failed already.
    #[cfg(test)]
    pub fn failed(e: JobError) -> Self {
        Ticket {
            slot: Arc::new(Slot {
                value: Mutex::new(Some(Err(e))),
                ready: Condvar::new(),
            }),
        }
    }

    /// A ticket whose answer is already there (work done in place).
    pub fn ready(value: T) -> Self {
        Ticket {
            slot: Arc::new(Slot {
                value: Mutex::new(Some(Ok(value))),
                ready: Condvar::new(),
            }),
        }
    }

    /// The answer if there is one within `timeout` (`None`: not yet).
    pub fn wait(&self, timeout: Duration) -> Option<Result<T, JobError>> {
        if !timeout.is_zero() {
            self.wait_ready(Instant::now() + timeout);
        }
        self.slot
            .value
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .take()
    }

    /// Whether the answer is there (it stays for whoever takes it).
    pub fn is_done(&self) -> bool {
        self.slot
            .value
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .is_some()
    }

    /// The answer if it is there now.
    pub fn try_take(&self) -> Option<Result<T, JobError>> {
        self.wait(Duration::ZERO)
    }

    /// Waits until the answer is there, at most until `deadline`, leaving
    /// it for whoever takes it; whether it is.
    pub fn wait_ready(&self, deadline: Instant) -> bool {
        let mut v = self.slot.value.lock().unwrap_or_else(|e| e.into_inner());
        loop {
            if v.is_some() {
                return true;
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return false;
            }
            v = self
                .slot
                .ready
                .wait_timeout(v, left)
                .unwrap_or_else(|e| e.into_inner())
                .0;
        }
    }
}

/// A job as the workers see it: runs, and sets its slot (or on a panic,
/// the slot's error) itself.
struct Task {
    about: About,
    run: Box<dyn FnOnce() + Send>,
    /// Sets the slot to an error (`Hung`, `Panicked`).
    give_up: Box<dyn Fn(JobError) + Send + Sync>,
}

struct Running {
    about: About,
    started: Instant,
    give_up: Arc<dyn Fn(JobError) + Send + Sync>,
}

struct Worker {
    lane: Lane,
    running: Option<Running>,
    abandoned: bool,
}

struct State {
    urgent: VecDeque<Task>,
    background: VecDeque<Task>,
    identity: VecDeque<Task>,
    workers: Vec<Worker>,
    abandoned: usize,
    /// Hung jobs not yet reported to the caller.
    hung: Vec<About>,
    closed: bool,
}

/// Counts of what jobs did, for the stats line.
#[derive(Debug, Default)]
pub struct JobCounters {
    pub run: AtomicU64,
    pub panicked: AtomicU64,
    pub hung: AtomicU64,
    pub refused: AtomicU64,
}

/// A snapshot of [`JobCounters`].
#[derive(Debug, Default, Clone, Copy)]
pub struct JobStats {
    pub run: u64,
    pub panicked: u64,
    pub hung: u64,
    pub refused: u64,
    pub abandoned: usize,
}

struct Inner {
    state: Mutex<State>,
    work: Condvar,
    counters: JobCounters,
}

/// The workers.
#[derive(Clone)]
pub struct Pool {
    inner: Arc<Inner>,
}

impl Pool {
    /// `workers` threads for urgent jobs, one for background ones, one for
    /// identities, and a watchdog that gives up hung jobs.
    pub fn new(workers: usize) -> Pool {
        let inner = Arc::new(Inner {
            state: Mutex::new(State {
                urgent: VecDeque::new(),
                background: VecDeque::new(),
                identity: VecDeque::new(),
                workers: Vec::new(),
                abandoned: 0,
                hung: Vec::new(),
                closed: false,
            }),
            work: Condvar::new(),
            counters: JobCounters::default(),
        });
        let pool = Pool { inner };
        for _ in 0..workers.max(1) {
            pool.spawn_worker(Lane::Urgent);
        }
        pool.spawn_worker(Lane::Background);
        pool.spawn_worker(Lane::Identity);
        let weak = Arc::downgrade(&pool.inner);
        let _ = std::thread::Builder::new()
            .name("jobs-watchdog".into())
            .spawn(move || loop {
                std::thread::sleep(Duration::from_millis(500));
                let Some(inner) = weak.upgrade() else { return };
                if !(Pool { inner }).watch(Instant::now()) {
                    return;
                }
            });
        pool
    }

    fn spawn_worker(&self, lane: Lane) {
        let index = {
            let mut s = self.lock();
            s.workers.push(Worker {
                lane,
                running: None,
                abandoned: false,
            });
            s.workers.len() - 1
        };
        let inner = self.inner.clone();
        let spawned = std::thread::Builder::new()
            .name(format!("jobs-{index}"))
            .spawn(move || work(&inner, index));
        if let Err(e) = spawned {
            tracing::error!("cannot start a job worker: {e}");
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.inner.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Queues `job` (about `about`); its answer comes through the ticket.
    /// A panic in it is caught: the answer is then `Panicked`.
    pub fn submit<T: Send + 'static>(
        &self,
        about: About,
        job: impl FnOnce() -> T + Send + 'static,
    ) -> Ticket<T> {
        self.enqueue(Lane::Urgent, false, about, job)
    }

    /// [`Self::submit`] in a lane, ahead of its jobs queued when `first`.
    pub fn submit_in_order<T: Send + 'static>(
        &self,
        lane: Lane,
        first: bool,
        about: About,
        job: impl FnOnce() -> T + Send + 'static,
    ) -> Ticket<T> {
        self.enqueue(lane, first, about, job)
    }

    fn enqueue<T: Send + 'static>(
        &self,
        lane: Lane,
        first: bool,
        about: About,
        job: impl FnOnce() -> T + Send + 'static,
    ) -> Ticket<T> {
        let slot = Arc::new(Slot {
            value: Mutex::new(None),
            ready: Condvar::new(),
        });
        let ticket = Ticket { slot: slot.clone() };
        let mut s = self.lock();
        let queued = s.urgent.len() + s.background.len() + s.identity.len();
        if queued >= MAX_QUEUED || s.closed {
            drop(s);
            self.inner.counters.refused.fetch_add(1, Relaxed);
            slot.set(Err(JobError::Refused));
            return ticket;
        }
        let for_give_up = slot.clone();
        let queue = match lane {
            Lane::Urgent => &mut s.urgent,
            Lane::Background => &mut s.background,
            Lane::Identity => &mut s.identity,
        };
        let task = Task {
            about,
            run: Box::new(move || {
                let answer = job();
                slot.set(Ok(answer));
            }),
            give_up: Box::new(move |e| for_give_up.set(Err(e))),
        };
        if first {
            queue.push_front(task);
        } else {
            queue.push_back(task);
        }
        drop(s);
        // Every worker wakes and the one of the lane takes it.
        self.inner.work.notify_all();
        ticket
    }

    /// Runs `job` and waits up to `wait` for it: its answer, or `None`
    /// when it panicked, hung or is still running (then its answer is
    /// dropped when it comes).
    pub fn run<T: Send + 'static>(
        &self,
        about: About,
        wait: Duration,
        job: impl FnOnce() -> T + Send + 'static,
    ) -> Option<T> {
        self.submit(about, job).wait(wait)?.ok()
    }

    /// Urgent jobs waiting for a worker.
    pub fn urgent_queued(&self) -> usize {
        self.lock().urgent.len()
    }

    /// Hung jobs since the last call: what they were about.
    pub fn take_hung(&self) -> Vec<About> {
        std::mem::take(&mut self.lock().hung)
    }

    pub fn stats(&self) -> JobStats {
        let c = &self.inner.counters;
        JobStats {
            run: c.run.load(Relaxed),
            panicked: c.panicked.load(Relaxed),
            hung: c.hung.load(Relaxed),
            refused: c.refused.load(Relaxed),
            abandoned: self.lock().abandoned,
        }
    }

    /// Gives up the jobs running past `HUNG_AFTER`; false once the pool is
    /// closed.
    fn watch(&self, now: Instant) -> bool {
        let mut s = self.lock();
        if s.closed {
            return false;
        }
        let mut replace = Vec::new();
        let mut given_up = Vec::new();
        let State {
            workers,
            abandoned,
            hung,
            ..
        } = &mut *s;
        for w in workers.iter_mut().filter(|w| !w.abandoned) {
            let Some(r) = &w.running else { continue };
            if now.duration_since(r.started) < HUNG_AFTER {
                continue;
            }
            w.abandoned = true;
            *abandoned += 1;
            hung.push(r.about);
            given_up.push(r.give_up.clone());
            tracing::warn!(
                pid = r.about.pid,
                dev = r.about.dev,
                "a job ran longer than {HUNG_AFTER:?}: given up, its worker abandoned"
            );
            if *abandoned <= MAX_ABANDONED {
                replace.push(w.lane);
            }
        }
        drop(s);
        for give_up in given_up {
            self.inner.counters.hung.fetch_add(1, Relaxed);
            give_up(JobError::Hung);
        }
        for lane in replace {
            self.spawn_worker(lane);
        }
        true
    }

    /// Stops the workers once the queue is empty (the agent is stopping).
    pub fn close(&self) {
        self.lock().closed = true;
        self.inner.work.notify_all();
    }
}

fn work(inner: &Inner, index: usize) {
    loop {
        let task = {
            let mut s = inner.state.lock().unwrap_or_else(|e| e.into_inner());
            loop {
                if s.workers[index].abandoned {
                    return;
                }
                let next = match s.workers[index].lane {
                    Lane::Urgent => s.urgent.pop_front(),
                    Lane::Background => s.background.pop_front(),
                    Lane::Identity => s.identity.pop_front(),
                };
                if let Some(t) = next {
                    break t;
                }
                if s.closed {
                    return;
                }
                s = inner.work.wait(s).unwrap_or_else(|e| e.into_inner());
            }
        };
        let Task {
            about,
            run,
            give_up,
        } = task;
        let give_up: Arc<dyn Fn(JobError) + Send + Sync> = Arc::from(give_up);
        {
            let mut s = inner.state.lock().unwrap_or_else(|e| e.into_inner());
            s.workers[index].running = Some(Running {
                about,
                started: Instant::now(),
                give_up: give_up.clone(),
            });
        }
        let outcome = std::panic::catch_unwind(std::panic::AssertUnwindSafe(run));
        inner.counters.run.fetch_add(1, Relaxed);
        if let Err(panic) = outcome {
            inner.counters.panicked.fetch_add(1, Relaxed);
            let message = panic_message(panic.as_ref());
            tracing::warn!(
                pid = about.pid,
                dev = about.dev,
                "a job panicked (contained: its process or file is skipped): {message}"
            );
            // The slot is still empty: `run` sets it only on return.
            give_up(JobError::Panicked(message));
        }
        let mut s = inner.state.lock().unwrap_or_else(|e| e.into_inner());
        s.workers[index].running = None;
        if s.workers[index].abandoned {
            return; // replaced; its late answer was dropped (the slot was set)
        }
    }
}

/// This thread's CPU time so far (`CLOCK_THREAD_CPUTIME_ID`).
pub fn thread_cpu() -> Duration {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes the timespec it is given.
    unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    Duration::new(
        u64::try_from(ts.tv_sec).unwrap_or(0),
        u32::try_from(ts.tv_nsec).unwrap_or(0).min(999_999_999),
    )
}

/// The text of a panic's payload.
pub fn panic_message(panic: &(dyn std::any::Any + Send)) -> String {
    panic
        .downcast_ref::<&str>()
        .map(|s| (*s).to_owned())
        .or_else(|| panic.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "a panic without a message".to_owned())
}

/// How long the sampler thread may wait for jobs: each wait at most
/// `per_job`, and all waits together at most `share` of the time (a token
/// bucket refilled as time passes, holding at most `burst`); the rest of
/// the time jobs run in the background and their answers are taken later.
pub struct Waiting {
    per_job: Duration,
    share: f64,
    burst: Duration,
    tokens: Duration,
    refilled: Instant,
    /// Waits cut short because the budget was spent.
    pub cut: u64,
}

impl Waiting {
    pub fn new(per_job: Duration, share: f64, burst: Duration) -> Self {
        Waiting {
            per_job,
            share,
            burst,
            tokens: burst,
            refilled: Instant::now(),
            cut: 0,
        }
    }

    /// How long the next wait may last.
    pub fn allowance(&mut self, now: Instant) -> Duration {
        let earned = now.duration_since(self.refilled).mul_f64(self.share);
        self.refilled = now;
        self.tokens = (self.tokens + earned).min(self.burst);
        let allowed = self.tokens.min(self.per_job);
        if allowed < self.per_job {
            self.cut += 1;
        }
        allowed
    }

    /// Charges a wait that lasted `waited`.
    pub fn spent(&mut self, waited: Duration) {
        self.tokens = self.tokens.saturating_sub(waited);
    }

    /// Waits for `ticket` within the allowance; charges what it took.
    pub fn wait<T>(&mut self, ticket: &Ticket<T>) -> Option<Result<T, JobError>> {
        self.wait_at_most(ticket, self.per_job)
    }

    /// Waits for `ticket` within the allowance and at most `cap`.
    pub fn wait_at_most<T>(
        &mut self,
        ticket: &Ticket<T>,
        cap: Duration,
    ) -> Option<Result<T, JobError>> {
        let started = Instant::now();
        let allowed = self.allowance(started).min(cap);
        let answer = ticket.wait(allowed);
        self.spent(started.elapsed());
        answer
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn answers_panics_and_refusals() {
        let pool = Pool::new(2);
        let t = pool.submit(About::default(), || 6 * 7);
        assert_eq!(t.wait(Duration::from_secs(10)), Some(Ok(42)));
        let t = pool.submit(About { pid: 7, dev: 1 }, || -> u32 {
            let v: Vec<u8> = Vec::new();
            v[3] as u32 // index out of bounds: a parser's bug
        });
        let answer = t.wait(Duration::from_secs(10));
        assert!(
            matches!(&answer, Some(Err(JobError::Panicked(m))) if m.contains("out of bounds")),
            "{answer:?}"
        );
        assert_eq!(pool.stats().panicked, 1);
        // The worker survived it.
        assert_eq!(
            pool.run(About::default(), Duration::from_secs(10), || "ok"),
            Some("ok")
        );
    }

    #[test]
    fn a_slow_job_is_waited_for_only_a_while_and_answers_later() {
        let pool = Pool::new(1);
        let (tx, rx) = std::sync::mpsc::channel::<()>();
        let t = pool.submit(About::default(), move || {
            rx.recv().unwrap();
            1
        });
        assert_eq!(t.wait(Duration::from_millis(20)), None);
        tx.send(()).unwrap();
        assert_eq!(t.wait(Duration::from_secs(10)), Some(Ok(1)));
    }

    #[test]
    fn an_identity_read_runs_while_every_urgent_worker_is_busy() {
        let pool = Pool::new(1);
        let (tx, rx) = std::sync::mpsc::channel::<()>();
        let busy = pool.submit(About::default(), move || rx.recv().is_ok());
        let queued = pool.submit(About::default(), || 1);
        let identity = pool.submit_in_order(Lane::Identity, false, About::default(), || 2);
        assert_eq!(identity.wait(Duration::from_secs(10)), Some(Ok(2)));
        assert!(!queued.is_done());
        tx.send(()).unwrap();
        assert_eq!(busy.wait(Duration::from_secs(10)), Some(Ok(true)));
        assert_eq!(queued.wait(Duration::from_secs(10)), Some(Ok(1)));
    }

    #[test]
    fn a_hung_job_is_given_up_and_its_worker_replaced() {
        let pool = Pool::new(1);
        let (tx, rx) = std::sync::mpsc::channel::<()>();
        let (started_tx, started) = std::sync::mpsc::channel::<()>();
        let stuck = pool.submit(About { pid: 9, dev: 3 }, move || {
            started_tx.send(()).unwrap();
            let _ = rx.recv(); // until the test ends
        });
        started.recv().unwrap();
        // The watchdog, with the clock moved past the bound.
        assert!(pool.watch(Instant::now() + HUNG_AFTER + Duration::from_secs(1)));
        assert_eq!(
            stuck.wait(Duration::from_secs(10)),
            Some(Err(JobError::Hung))
        );
        assert_eq!(pool.take_hung(), vec![About { pid: 9, dev: 3 }]);
        assert_eq!(pool.stats().abandoned, 1);
        // A new worker took its place.
        assert_eq!(
            pool.run(About::default(), Duration::from_secs(10), || 5),
            Some(5)
        );
        drop(tx);
    }

    #[test]
    fn waiting_is_bounded_by_its_share_of_time() {
        let mut w = Waiting::new(Duration::from_millis(100), 0.1, Duration::from_millis(300));
        let t0 = Instant::now();
        assert_eq!(w.allowance(t0), Duration::from_millis(100));
        w.spent(Duration::from_millis(280));
        // 20 ms left; 100 ms later 10 ms more.
        assert_eq!(w.allowance(t0), Duration::from_millis(20));
        assert_eq!(
            w.allowance(t0 + Duration::from_millis(100)),
            Duration::from_millis(30)
        );
        assert_eq!(w.cut, 2);
        // Refilled up to the burst, never beyond.
        assert_eq!(
            w.allowance(t0 + Duration::from_secs(100)),
            Duration::from_millis(100)
        );
    }
}
