//! How much of each kind of work runs at once. Each kind has a fixed
//! number of slots; a request that finds them all taken is refused at once
//! (503 with `Retry-After`, or gRPC `UNAVAILABLE`), never queued: a queue
//! without a bound is memory an outsider controls, and one with a bound
//! only delays the same refusal.

use std::sync::Arc;

use tokio::sync::{OwnedSemaphorePermit, Semaphore};

/// The slots of one kind of work.
#[derive(Debug, Clone)]
pub struct Slots {
    what: &'static str,
    setting: &'static str,
    limit: usize,
    semaphore: Arc<Semaphore>,
}

/// All slots were taken.
#[derive(Debug, Clone, thiserror::Error)]
#[error("too many {what} in progress (at most {limit}, {setting}); retry shortly")]
pub struct Busy {
    pub what: &'static str,
    pub setting: &'static str,
    pub limit: usize,
}

impl Slots {
    pub fn new(what: &'static str, setting: &'static str, limit: usize) -> Self {
        let limit = limit.max(1);
        Self {
            what,
            setting,
            limit,
            semaphore: Arc::new(Semaphore::new(limit)),
        }
    }

    /// A slot, held until the permit is dropped; or [`Busy`].
    pub fn take(&self) -> Result<OwnedSemaphorePermit, Busy> {
        self.semaphore.clone().try_acquire_owned().map_err(|_| {
            metrics::counter!("symtrace_busy_refusals_total", "work" => self.what).increment(1);
            Busy {
                what: self.what,
                setting: self.setting,
                limit: self.limit,
            }
        })
    }
}

/// The slots of every kind of work a client can start.
#[derive(Debug, Clone)]
pub struct Concurrency {
    /// Flamegraphs, diffs, trace views and raw-sample reads.
    pub queries: Slots,
    /// `/api/v1/symbolize` requests.
    pub symbolize: Slots,
    /// OTLP exports being received, decoded and stored.
    pub ingest: Slots,
    /// Fetches from upstream debuginfod servers (coalesced ones share one).
    pub federation: Slots,
}

impl Concurrency {
    /// Slots for `queries`, `symbolize` requests, `ingest` exports and
    /// upstream fetches (`federation`) at once.
    pub fn new(queries: usize, symbolize: usize, ingest: usize, federation: usize) -> Self {
        Self {
            queries: Slots::new("queries", "SYMTRACE_MAX_CONCURRENT_QUERIES", queries),
            symbolize: Slots::new(
                "symbolize requests",
                "SYMTRACE_MAX_CONCURRENT_SYMBOLIZE",
                symbolize,
            ),
            ingest: Slots::new("OTLP exports", "SYMTRACE_MAX_CONCURRENT_EXPORTS", ingest),
            federation: Slots::new(
                "upstream fetches",
                "SYMTRACE_MAX_CONCURRENT_FETCHES",
                federation,
            ),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn refuses_when_full_and_frees_on_drop() {
        let slots = Slots::new("queries", "SYMTRACE_MAX_CONCURRENT_QUERIES", 2);
        let a = slots.take().unwrap();
        let _b = slots.take().unwrap();
        let busy = slots.take().unwrap_err();
        assert_eq!(
            busy.to_string(),
            "too many queries in progress (at most 2, SYMTRACE_MAX_CONCURRENT_QUERIES); retry shortly"
        );
        drop(a);
        assert!(slots.take().is_ok());
    }
}
