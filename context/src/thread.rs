//! This thread's published trace context: one record per thread, published
//! through the `otel_thread_ctx_v1` slot on first use, then changed in place.
//! No allocation, syscall or lock on any of these paths.

use std::cell::UnsafeCell;
use std::marker::PhantomData;

use crate::record::{Ids, Record};
use crate::tls;

thread_local! {
    // Const-initialized and without Drop: lives in the thread's static TLS
    // block, at a fixed address for the thread's whole life.
    static RECORD: UnsafeCell<Record> = const { UnsafeCell::new(Record::empty()) };
}

#[inline]
fn with_record<R>(f: impl FnOnce(&mut Record) -> R) -> R {
    RECORD.with(|cell| {
        let record = cell.get();
        let slot = tls::slot();
        // SAFETY: `slot` and `record` are this thread's; the record outlives
        // every reader of this thread (readers interrupt the thread, so they
        // never run while `f` does). `f` is not reentrant: nothing here
        // calls back into `with_record`.
        unsafe {
            if *slot != record {
                *slot = record;
            }
            f(&mut *record)
        }
    })
}

impl Ids {
    /// The IDs of a span (active unless either ID is all zeroes).
    pub fn new(trace_id: [u8; 16], span_id: [u8; 8], trace_flags: u8) -> Ids {
        Ids {
            trace_id,
            span_id,
            trace_flags,
            active: trace_id != [0; 16] && span_id != [0; 8],
        }
    }
}

/// Restores the previous context when dropped. Not `Send`: a context
/// belongs to the thread it was entered on.
#[must_use = "the context is left when the guard drops"]
pub struct Guard {
    previous: Ids,
    _thread_bound: PhantomData<*const ()>,
}

/// Publishes `ids` as this thread's context until the guard drops; nested
/// guards restore in reverse order. Attributes set meanwhile are cleared.
#[inline]
pub fn enter(ids: Ids) -> Guard {
    let mut guard = Guard {
        previous: Ids::default(),
        _thread_bound: PhantomData,
    };
    // Written in place rather than returned through `LocalKey::with`'s
    // Result: that move costs store-forwarding stalls (a third of the time).
    replace(&ids, &mut guard.previous);
    guard
}

/// Publishes `ids` and writes what was published before into `previous`
/// (the C ABI's enter; `enter` without the guard).
#[inline]
pub(crate) fn replace(ids: &Ids, previous: &mut Ids) {
    with_record(|r| {
        *previous = r.ids();
        r.set(ids);
    });
}

/// Publishes `ids` and returns what was published before (for bindings
/// that keep the previous context themselves, like the Node.js addon).
#[inline]
pub fn swap(ids: &Ids) -> Ids {
    let mut previous = Ids::default();
    replace(ids, &mut previous);
    previous
}

impl Drop for Guard {
    #[inline]
    fn drop(&mut self) {
        let previous = self.previous;
        with_record(|r| r.set(&previous));
    }
}

/// Publishes `ids` with no guard (integrations that track the current span
/// themselves, like the tracing layer).
#[inline]
pub fn set(ids: &Ids) {
    with_record(|r| r.set(ids));
}

/// This thread's published context.
pub fn current() -> Ids {
    with_record(|r| r.ids())
}

/// Sets the current context's attributes (see [`Record::set_attributes`]).
pub fn set_attributes(attributes: &[(u8, &str)]) -> bool {
    with_record(|r| r.set_attributes(attributes))
}

/// The address this thread's `otel_thread_ctx_v1` slot points to (null
/// before the first use on this thread): for tests and diagnostics.
pub fn published_record() -> *const u8 {
    // SAFETY: reading this thread's own slot.
    unsafe { (*tls::slot()).cast_const().cast() }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ids(n: u8) -> Ids {
        Ids::new([n; 16], [n; 8], 1)
    }

    #[test]
    fn guards_nest_and_restore() {
        assert!(!current().active);
        {
            let _a = enter(ids(1));
            assert_eq!(current(), ids(1));
            {
                let _b = enter(ids(2));
                assert_eq!(current(), ids(2));
            }
            assert_eq!(current(), ids(1));
        }
        assert!(!current().active);
        // The slot points at this thread's record, whose bytes are the OTEP's.
        let _c = enter(ids(7));
        let record = published_record();
        assert!(!record.is_null());
        // SAFETY: the record is this thread's, 640 bytes.
        let bytes = unsafe { std::slice::from_raw_parts(record, 28) };
        assert_eq!(&bytes[..16], &[7; 16]);
        assert_eq!(&bytes[16..24], &[7; 8]);
        assert_eq!((bytes[24], bytes[25]), (1, 1));
    }

    #[test]
    fn each_thread_has_its_own_record() {
        let _main = enter(ids(3));
        let here = published_record() as usize;
        let there = std::thread::spawn(|| {
            assert!(
                published_record().is_null(),
                "a new thread starts unpublished"
            );
            let _g = enter(ids(4));
            assert_eq!(current(), ids(4));
            published_record() as usize
        })
        .join()
        .unwrap();
        assert_ne!(here, there);
        assert_eq!(current(), ids(3));
    }

    #[test]
    fn zero_ids_are_no_span() {
        assert!(!Ids::new([0; 16], [1; 8], 1).active);
        assert!(!Ids::new([1; 16], [0; 8], 1).active);
        let _g = enter(Ids::new([1; 16], [0; 8], 0));
        let record = published_record();
        // SAFETY: this thread's record.
        assert_eq!(unsafe { *record.add(24) }, 0, "valid stays 0");
    }
}
