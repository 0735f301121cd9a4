//! Detaching uprobes off the sampler thread. Closing one perf-event uprobe
//! waits for RCU grace periods in the kernel, under a lock all of them
//! share (`perf_uprobe_destroy`: ~0.1 s each here, one after another
//! whatever the number of threads), so detaching the 512 probe sites one
//! user may hold took the sampler thread 50 s — profiling stopped for the
//! whole host each time a process's probe libraries went away. Links to
//! detach go to a reaper thread instead. A probe's slot comes back only
//! once its link is gone (a slot a live uprobe uses is never handed out
//! again), so what is being detached stays counted against its owner.
//! (A uprobe-multi link would detach a file's sites in one grace period;
//! aya does not attach those yet.)

use std::sync::mpsc::{self, Receiver, Sender};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;

/// Drops links on a thread of its own; hands back the slots they held.
pub struct Reaper<T: Send + 'static> {
    tx: Option<Sender<(T, u32)>>,
    reaped: Arc<Mutex<Vec<u32>>>,
    thread: Option<JoinHandle<()>>,
}

impl<T: Send + 'static> Reaper<T> {
    pub fn new() -> Self {
        let (tx, rx) = mpsc::channel();
        let reaped = Arc::new(Mutex::new(Vec::new()));
        let out = reaped.clone();
        let thread = std::thread::Builder::new()
            .name("reaper".into())
            .spawn(move || reap_all(rx, &out))
            .ok();
        Reaper {
            tx: thread.is_some().then_some(tx),
            reaped,
            thread,
        }
    }

    /// Drops `link` (which held `slot`) in the background.
    pub fn reap(&self, link: T, slot: u32) {
        let unsent = match &self.tx {
            Some(tx) => tx.send((link, slot)).err().map(|e| e.0),
            None => Some((link, slot)),
        };
        // No reaper thread: dropped here, as before.
        if let Some((link, slot)) = unsent {
            drop(link);
            lock(&self.reaped).push(slot);
        }
    }

    /// The slots whose links are gone since the last call.
    pub fn reaped(&self) -> Vec<u32> {
        std::mem::take(&mut *lock(&self.reaped))
    }

    /// Waits until every link handed over is dropped.
    pub fn finish(mut self) {
        self.tx = None;
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

impl<T: Send + 'static> Default for Reaper<T> {
    fn default() -> Self {
        Self::new()
    }
}

fn lock<V>(m: &Mutex<V>) -> std::sync::MutexGuard<'_, V> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// The reaper thread: drops each link, then gives its slot back.
fn reap_all<T: Send>(rx: Receiver<(T, u32)>, reaped: &Mutex<Vec<u32>>) {
    while let Ok((link, slot)) = rx.recv() {
        drop(link);
        lock(reaped).push(slot);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slots_come_back_once_their_links_are_gone() {
        let dropped = Arc::new(Mutex::new(Vec::new()));
        struct Link(u32, Arc<Mutex<Vec<u32>>>);
        impl Drop for Link {
            fn drop(&mut self) {
                lock(&self.1).push(self.0);
            }
        }
        let reaper = Reaper::new();
        for slot in 0..100 {
            reaper.reap(Link(slot, dropped.clone()), slot);
        }
        let mut seen = Vec::new();
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
        while seen.len() < 100 {
            let back = reaper.reaped();
            // Every slot handed back belongs to a link already dropped.
            let gone = lock(&dropped).clone();
            assert!(back.iter().all(|s| gone.contains(s)), "{back:?} {gone:?}");
            seen.extend(back);
            assert!(std::time::Instant::now() < deadline, "{seen:?}");
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
        seen.sort_unstable();
        assert_eq!(seen, (0..100).collect::<Vec<_>>());
        reaper.reap(Link(100, dropped.clone()), 100);
        reaper.finish();
        assert!(lock(&dropped).contains(&100), "finish waits for the last");
    }
}
