//! A small HTTP service that publishes its spans for the profiler: axum +
//! tracing + tracing-opentelemetry, with `TraceContextLayer` and the process
//! context. Each request's spans burn a measured amount of their thread's
//! CPU time in functions of their own, so a profile can be checked span by
//! span.
//!
//! ```sh
//! cargo run -p symtrace-context --example http_service -- 127.0.0.1:8080 [SERVICE_NAME]
//! curl 'http://127.0.0.1:8080/work?alpha_ms=300&beta_ms=100'
//! curl 'http://127.0.0.1:8080/interleave?ms=200'
//! ```
//!
//! `GET /work?alpha_ms=A&beta_ms=B[&sleep_ms=S]`: span `alpha` runs
//! `alpha_work` for A ms of CPU, then span `beta` runs `beta_work` for B ms
//! and, given S, blocks its thread for S ms in `blocking_call` (as a
//! synchronous client or a lock would: the span's waiting time, which the
//! agent's off-CPU profile sees).
//! `GET /interleave?ms=N`: spans `x` and `y` run `x_work` and `y_work` in 1 ms
//! slices, yielding in between, interleaved on one thread.
//! `GET /noop`: nothing (for latency benchmarks).
//! Answers JSON with the trace ID, each span's ID and its CPU time.
//! The service name (in the process context) is the second argument, else
//! `OTEL_SERVICE_NAME`, else `context-demo`. `SYMTRACE_CONTEXT=off` leaves
//! `TraceContextLayer` out (benchmark baseline).
//!
//! It allocates through symtrace-alloc's `SampledAllocator` (memory
//! profiles: one sample per 512 KiB allocated on average,
//! `OTEL_MEMORY_SAMPLING_INTERVAL=0` turns sampling off).

use std::collections::HashMap;
use std::time::Duration;

use axum::extract::Query;
use axum::routing::get;
use axum::{Json, Router};
use opentelemetry::trace::{TraceContextExt, TracerProvider as _};
use serde_json::{json, Value};
use tracing::{info_span, Instrument, Span};
use tracing_opentelemetry::OpenTelemetrySpanExt;
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;

#[global_allocator]
static ALLOC: symtrace_alloc::SampledAllocator<std::alloc::System> =
    symtrace_alloc::SampledAllocator::new(std::alloc::System);

fn thread_cpu() -> Duration {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes the timespec it is given.
    unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    Duration::new(ts.tv_sec as u64, ts.tv_nsec as u32)
}

#[inline(never)]
fn spin() {
    let mut x = 0u64;
    for i in 0..20_000u64 {
        x = std::hint::black_box(x.wrapping_add(i));
    }
}

fn burn(budget: Duration) -> Duration {
    let start = thread_cpu();
    while thread_cpu() - start < budget {
        spin();
    }
    thread_cpu() - start
}

#[inline(never)]
fn alpha_work(budget: Duration) -> Duration {
    burn(budget)
}

#[inline(never)]
fn beta_work(budget: Duration) -> Duration {
    burn(budget)
}

/// Blocks the thread for `d` (a synchronous call inside a span); returns
/// how long it was away from the CPU: wall time minus its CPU time.
#[inline(never)]
fn blocking_call(d: Duration) -> Duration {
    let (wall, cpu) = (std::time::Instant::now(), thread_cpu());
    std::thread::sleep(d);
    wall.elapsed().saturating_sub(thread_cpu() - cpu)
}

#[inline(never)]
fn x_work(budget: Duration) -> Duration {
    burn(budget)
}

#[inline(never)]
fn y_work(budget: Duration) -> Duration {
    burn(budget)
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn span_id(span: &Span) -> String {
    hex(&span.context().span().span_context().span_id().to_bytes())
}

fn trace_id(span: &Span) -> String {
    hex(&span.context().span().span_context().trace_id().to_bytes())
}

fn ms(q: &HashMap<String, String>, key: &str) -> Duration {
    Duration::from_millis(q.get(key).and_then(|v| v.parse().ok()).unwrap_or(0))
}

async fn work(Query(q): Query<HashMap<String, String>>) -> Json<Value> {
    let request = info_span!("request");
    let trace = trace_id(&request);
    async move {
        let alpha = info_span!("alpha");
        let alpha_cpu = alpha.in_scope(|| alpha_work(ms(&q, "alpha_ms")));
        let beta = info_span!("beta");
        let (beta_cpu, beta_waited) = beta.in_scope(|| {
            let cpu = beta_work(ms(&q, "beta_ms"));
            // Blocking on purpose (the worker thread waits, in the span).
            let sleep = ms(&q, "sleep_ms");
            let waited = if sleep.is_zero() {
                Duration::ZERO
            } else {
                blocking_call(sleep)
            };
            (cpu, waited)
        });
        Json(json!({
            "trace_id": trace,
            "spans": {
                "alpha": {"span_id": span_id(&alpha), "cpu_ns": alpha_cpu.as_nanos() as u64},
                "beta": {
                    "span_id": span_id(&beta),
                    "cpu_ns": beta_cpu.as_nanos() as u64,
                    "off_cpu_ns": beta_waited.as_nanos() as u64,
                },
            }
        }))
    }
    .instrument(request.clone())
    .await
}

/// Burns `total` of CPU in 1 ms slices of `f`, yielding between slices.
async fn sliced(f: fn(Duration) -> Duration, total: Duration) -> Duration {
    let mut used = Duration::ZERO;
    while used < total {
        used += f(Duration::from_millis(1));
        tokio::task::yield_now().await;
    }
    used
}

async fn interleave(Query(q): Query<HashMap<String, String>>) -> Json<Value> {
    let request = info_span!("interleave");
    let trace = trace_id(&request);
    let total = ms(&q, "ms");
    let (x, y) = {
        let _in_request = request.enter();
        (info_span!("x"), info_span!("y"))
    };
    // One task polls both: they run interleaved on one thread.
    let (x_cpu, y_cpu) = tokio::join!(
        sliced(x_work, total).instrument(x.clone()),
        sliced(y_work, total).instrument(y.clone()),
    );
    Json(json!({
        "trace_id": trace,
        "spans": {
            "x": {"span_id": span_id(&x), "cpu_ns": x_cpu.as_nanos() as u64},
            "y": {"span_id": span_id(&y), "cpu_ns": y_cpu.as_nanos() as u64},
        }
    }))
}

fn main() -> std::io::Result<()> {
    let addr = std::env::args()
        .nth(1)
        .unwrap_or_else(|| "127.0.0.1:8080".into());
    let service = std::env::args()
        .nth(2)
        .or_else(|| std::env::var("OTEL_SERVICE_NAME").ok())
        .unwrap_or_else(|| "context-demo".into());
    symtrace_context::process::publish(&[("service.name", &service)], &[])?;

    let provider = opentelemetry_sdk::trace::SdkTracerProvider::builder().build();
    let otel = tracing_opentelemetry::layer().with_tracer(provider.tracer("http_service"));
    let publish = std::env::var("SYMTRACE_CONTEXT").as_deref() != Ok("off");
    let registry = tracing_subscriber::registry().with(otel);
    if publish {
        registry.with(symtrace_context::TraceContextLayer).init();
    } else {
        registry.init();
    }

    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?
        .block_on(async {
            let app = Router::new()
                .route("/work", get(work))
                .route("/interleave", get(interleave))
                .route("/noop", get(|| async { "ok" }));
            let listener = tokio::net::TcpListener::bind(&addr).await?;
            println!("listening on http://{}", listener.local_addr()?);
            axum::serve(listener, app).await
        })
}
