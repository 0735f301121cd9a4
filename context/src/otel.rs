//! The `opentelemetry` crate's active context, published.

use opentelemetry::trace::TraceContextExt;
use opentelemetry::Context;

use crate::record::Ids;
use crate::thread;

/// The IDs of a context's span (inactive without a valid span).
pub fn ids_of(cx: &Context) -> Ids {
    let span = cx.span();
    let sc = span.span_context();
    if !sc.is_valid() {
        return Ids::default();
    }
    Ids::new(
        sc.trace_id().to_bytes(),
        sc.span_id().to_bytes(),
        sc.trace_flags().to_u8(),
    )
}

/// Publishes the thread's current OpenTelemetry context.
#[inline]
pub fn publish_current() {
    let ids = Context::map_current(ids_of);
    thread::set(&ids);
}

/// Attaches `cx` as the current OpenTelemetry context and publishes it;
/// dropping the guard detaches it and restores what was published before.
pub fn attach(cx: Context) -> AttachGuard {
    let published = thread::enter(ids_of(&cx));
    AttachGuard {
        _otel: cx.attach(),
        _published: published,
    }
}

/// See [`attach`]. Fields drop in order: OpenTelemetry's guard first.
pub struct AttachGuard {
    _otel: opentelemetry::ContextGuard,
    _published: thread::Guard,
}

#[cfg(test)]
mod tests {
    use super::*;
    use opentelemetry::trace::{SpanContext, SpanId, TraceFlags, TraceId, TraceState};

    #[test]
    fn attach_publishes_and_restores() {
        let sc = SpanContext::new(
            TraceId::from_bytes([9; 16]),
            SpanId::from_bytes([8; 8]),
            TraceFlags::SAMPLED,
            false,
            TraceState::default(),
        );
        {
            let _g = attach(Context::new().with_remote_span_context(sc));
            assert_eq!(thread::current(), Ids::new([9; 16], [8; 8], 1));
            publish_current();
            assert_eq!(thread::current(), Ids::new([9; 16], [8; 8], 1));
        }
        assert!(!thread::current().active);
        publish_current();
        assert!(!thread::current().active, "no span: nothing published");
    }
}
