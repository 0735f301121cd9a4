//! # symtrace-context
//!
//! Publishes the trace and span each thread is working for, in the
//! OpenTelemetry formats an eBPF profiler reads without stopping the
//! application:
//!
//! - the **thread context** (OTEP 4947): an exported TLS pointer
//!   `otel_thread_ctx_v1` to a 640-byte record `trace_id[16] span_id[8]
//!   valid flags attrs_size attrs…` ([`record`]), changed in place — no
//!   syscall, lock or allocation per span switch;
//! - the **process context** (OTEP 4719): a mapping named `OTEL_CTX` with
//!   the resource (`service.name`, …) and the thread-context conventions
//!   ([`process::publish`]).
//!
//! Ways in: a guard ([`enter`]), a future wrapper that follows the task
//! across threads ([`FutureExt::in_trace_context`]), the `opentelemetry`
//! crate's active context ([`otel`], feature `opentelemetry`), `tracing`
//! spans through `tracing-opentelemetry` ([`TraceContextLayer`], feature
//! `tracing`), and a C ABI (`include/symtrace_ctx.h`).
//!
//! Executables must export the slot:
//! `-C link-arg=-Wl,--export-dynamic-symbol=otel_thread_ctx_v1` (see
//! `docs/trace-context.md`).

pub mod ffi;
mod future;
#[cfg(feature = "opentelemetry")]
pub mod otel;
pub mod process;
pub mod record;
mod thread;
mod tls;
#[cfg(feature = "tracing")]
mod tracing_layer;

pub use future::{FutureExt, InTraceContext};
pub use record::Ids;
pub use thread::{current, enter, published_record, set, set_attributes, swap, Guard};
#[cfg(feature = "tracing")]
pub use tracing_layer::TraceContextLayer;
