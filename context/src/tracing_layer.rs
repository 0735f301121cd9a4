//! A `tracing-subscriber` layer that keeps the published context equal to
//! the OpenTelemetry context `tracing-opentelemetry` activates: put it after
//! `tracing_opentelemetry::layer()`, which activates a span's context on
//! enter and restores the previous one on exit. Because an instrumented
//! future enters its span at every poll and exits when the poll returns,
//! the published span follows the task across tokio's worker threads.
//!
//! ```text
//! tracing_subscriber::registry()
//!     .with(tracing_opentelemetry::layer().with_tracer(tracer))
//!     .with(symtrace_context::TraceContextLayer)
//!     .init();
//! ```

use tracing::span::Id;
use tracing::Subscriber;
use tracing_subscriber::layer::Context;
use tracing_subscriber::Layer;

/// See the module documentation.
#[derive(Debug, Default, Clone, Copy)]
pub struct TraceContextLayer;

impl<S: Subscriber> Layer<S> for TraceContextLayer {
    fn on_enter(&self, _: &Id, _: Context<'_, S>) {
        crate::otel::publish_current();
    }

    fn on_exit(&self, _: &Id, _: Context<'_, S>) {
        crate::otel::publish_current();
    }
}
