//! A pool of long-lived threads for CPU-bound work that must not run on the
//! async workers (ingest's decoding, normalization and encoding), one per
//! CPU this process may use, fed in arrival order.
//!
//! Why not tokio's blocking pool: it starts a thread per concurrent task,
//! so four exports in flight on one core were four threads time-slicing
//! the core, each with its own cold caches and allocator heap, and memory
//! allocated on one thread was freed on another. The same code ran ~1.4×
//! slower in the server than in a loop on one thread
//! (`symtrace-loadtest pipeline`, docs/BENCHMARKS.md). Here a job runs to
//! its end on a thread that ran the previous ones, and waits in the queue
//! rather than competing for the CPU. Nothing that waits on I/O belongs
//! here (fsync, the database, the object store).

use std::sync::mpsc;
use std::sync::{Arc, Mutex};

type Job = Box<dyn FnOnce() + Send + 'static>;

/// The pool; cloning it shares its threads.
#[derive(Clone)]
pub struct CpuPool {
    queue: mpsc::Sender<Job>,
}

/// The job did not finish: it panicked (logged; the pool goes on) or the
/// pool is gone.
#[derive(Debug, thiserror::Error)]
#[error("{what} did not finish (a panic, logged)")]
pub struct Panicked {
    what: &'static str,
}

impl CpuPool {
    /// A pool of `threads` threads (at least one) named `name-N`.
    pub fn new(name: &str, threads: usize) -> std::io::Result<Self> {
        Self::spawn(name, threads, 0)
    }

    /// A pool for work nobody waits on (a background build): its threads
    /// run `nice` steps nicer than the process, so that beside work a request waits for they
    /// take the CPU it leaves. Threads the jobs start inherit it.
    pub fn background(name: &str, threads: usize, nice: i32) -> std::io::Result<Self> {
        Self::spawn(name, threads, nice)
    }

    fn spawn(name: &str, threads: usize, nice: i32) -> std::io::Result<Self> {
        let (queue, jobs) = mpsc::channel::<Job>();
        let jobs = Arc::new(Mutex::new(jobs));
        for i in 0..threads.max(1) {
            let jobs = jobs.clone();
            std::thread::Builder::new()
                .name(format!("{name}-{i}"))
                .spawn(move || {
                    if nice != 0 {
                        // SAFETY: no memory is passed; on Linux `who` 0 is
                        // the calling thread. Relative to the process's.
                        let now = unsafe { libc::getpriority(libc::PRIO_PROCESS, 0) };
                        let to = now.saturating_add(nice).min(19);
                        if unsafe { libc::setpriority(libc::PRIO_PROCESS, 0, to) } != 0 {
                            tracing::warn!(
                                nice,
                                "the background pool's thread keeps its priority: {}",
                                std::io::Error::last_os_error()
                            );
                        }
                    }
                    loop {
                        // The lock is held only to take the next job.
                        let job = jobs.lock().expect("cpu pool queue").recv();
                        match job {
                            Ok(job) => job(),
                            Err(_) => return, // every sender is gone
                        }
                    }
                })?;
        }
        Ok(Self { queue })
    }

    /// A pool with one thread per CPU this process may run on.
    pub fn per_cpu(name: &str) -> std::io::Result<Self> {
        let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
        Self::new(name, cpus)
    }

    /// Runs `f` on the pool and waits for its result. The queue holds what
    /// callers bound: ingest moves its slot (a permit of
    /// `SYMTRACE_MAX_CONCURRENT_EXPORTS`) into the job, so a caller that
    /// gives up does not free a slot while its work is still queued, and
    /// the job is skipped when its caller is gone.
    pub async fn run<T: Send + 'static>(
        &self,
        what: &'static str,
        f: impl FnOnce() -> T + Send + 'static,
    ) -> Result<T, Panicked> {
        let (done, result) = tokio::sync::oneshot::channel();
        let job: Job = Box::new(move || {
            if done.is_closed() {
                // Its caller went away (a client that disconnected, a
                // deadline) while it waited: nothing to compute.
                return;
            }
            let outcome = std::panic::catch_unwind(std::panic::AssertUnwindSafe(f));
            if outcome.is_err() {
                tracing::error!(what, "a job of the CPU pool panicked");
            }
            // The caller may have gone (a client that disconnected).
            let _ = done.send(outcome.ok());
        });
        if self.queue.send(job).is_err() {
            return Err(Panicked { what });
        }
        match result.await {
            Ok(Some(value)) => Ok(value),
            _ => Err(Panicked { what }),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_background_pool_runs_its_jobs_at_its_nice_value() {
        let pool = CpuPool::background("test-bg", 1, 7).unwrap();
        // SAFETY: no memory is passed; `who` 0 is the calling thread.
        let here = unsafe { libc::getpriority(libc::PRIO_PROCESS, 0) };
        let there = pool
            .run("nice", || unsafe {
                libc::getpriority(libc::PRIO_PROCESS, 0)
            })
            .await
            .unwrap();
        assert_eq!(there, (here + 7).min(19));
        let plain = CpuPool::new("test-plain", 1).unwrap();
        let there = plain
            .run("nice", || unsafe {
                libc::getpriority(libc::PRIO_PROCESS, 0)
            })
            .await
            .unwrap();
        assert_eq!(there, here);
    }

    #[tokio::test]
    async fn jobs_run_in_order_on_the_pool_and_a_panic_is_an_error() {
        let pool = CpuPool::new("test", 1).unwrap();
        let here = std::thread::current().id();
        let there = pool
            .run("id", || std::thread::current().id())
            .await
            .unwrap();
        assert_ne!(here, there);
        // One thread: the same one every time.
        assert_eq!(
            pool.run("id", || std::thread::current().id())
                .await
                .unwrap(),
            there
        );
        let err = pool.run("boom", || panic!("boom")).await.unwrap_err();
        assert_eq!(err.to_string(), "boom did not finish (a panic, logged)");
        assert_eq!(pool.run("after", || 7).await.unwrap(), 7);
        // A job whose caller is gone is skipped.
        let ran = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let (block, unblock) = std::sync::mpsc::channel::<()>();
        let (started, running) = tokio::sync::oneshot::channel::<()>();
        let blocker = pool.clone();
        let first = tokio::spawn(async move {
            blocker
                .run("blocker", move || {
                    let _ = started.send(());
                    unblock.recv().ok()
                })
                .await
        });
        running.await.unwrap();
        let flag = ran.clone();
        let second = pool.run("abandoned", move || {
            flag.store(true, std::sync::atomic::Ordering::SeqCst)
        });
        tokio::time::timeout(std::time::Duration::from_millis(50), second)
            .await
            .expect_err("queued behind the blocker: dropped unfinished");
        block.send(()).unwrap();
        first.await.unwrap().unwrap();
        assert_eq!(pool.run("after", || 8).await.unwrap(), 8);
        assert!(!ran.load(std::sync::atomic::Ordering::SeqCst));
    }
}
