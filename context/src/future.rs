//! Contexts that follow a future, not a thread: the context is entered at
//! every poll and left when the poll returns, so tasks interleaved on one
//! worker thread each publish their own span while they run.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

use crate::record::Ids;
use crate::thread;

/// A future that runs in a trace context (see [`FutureExt::in_trace_context`]).
pub struct InTraceContext<F> {
    inner: F,
    ids: Ids,
}

impl<F: Future> Future for InTraceContext<F> {
    type Output = F::Output;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<F::Output> {
        // SAFETY: `inner` is structurally pinned: never moved out of `self`.
        let this = unsafe { self.get_unchecked_mut() };
        let _guard = thread::enter(this.ids);
        // SAFETY: see above.
        unsafe { Pin::new_unchecked(&mut this.inner) }.poll(cx)
    }
}

/// Runs any future in a trace context; implemented for every [`Future`].
pub trait FutureExt: Future + Sized {
    /// Runs this future with `ids` published on whatever thread polls it.
    fn in_trace_context(self, ids: Ids) -> InTraceContext<Self> {
        InTraceContext { inner: self, ids }
    }
}

impl<F: Future> FutureExt for F {}

#[cfg(test)]
mod tests {
    use super::*;
    use std::task::Waker;

    /// A future that records the published context at each poll and is
    /// pending `n` times.
    struct Probe {
        seen: Vec<Ids>,
        pending: usize,
    }

    impl Future for Probe {
        type Output = Vec<Ids>;
        fn poll(mut self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<Vec<Ids>> {
            self.seen.push(thread::current());
            if self.pending == 0 {
                return Poll::Ready(std::mem::take(&mut self.seen));
            }
            self.pending -= 1;
            Poll::Pending
        }
    }

    #[test]
    fn interleaved_futures_publish_their_own_context() {
        let (a, b) = (Ids::new([1; 16], [1; 8], 1), Ids::new([2; 16], [2; 8], 1));
        let mut fa = Box::pin(
            Probe {
                seen: vec![],
                pending: 2,
            }
            .in_trace_context(a),
        );
        let mut fb = Box::pin(
            Probe {
                seen: vec![],
                pending: 2,
            }
            .in_trace_context(b),
        );
        let mut cx = Context::from_waker(Waker::noop());
        let (mut ra, mut rb) = (None, None);
        while ra.is_none() || rb.is_none() {
            if ra.is_none() {
                if let Poll::Ready(v) = fa.as_mut().poll(&mut cx) {
                    ra = Some(v);
                }
                assert!(!thread::current().active, "left after the poll");
            }
            if rb.is_none() {
                if let Poll::Ready(v) = fb.as_mut().poll(&mut cx) {
                    rb = Some(v);
                }
            }
        }
        assert_eq!(ra.unwrap(), vec![a; 3]);
        assert_eq!(rb.unwrap(), vec![b; 3]);
    }
}
