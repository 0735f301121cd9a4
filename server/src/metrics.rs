//! Prometheus metrics at `/metrics`, and the middleware that counts every
//! request by route and status.

use std::time::Instant;

use axum::extract::{MatchedPath, Request, State};
use axum::http::{header, Method};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use metrics_exporter_prometheus::{PrometheusBuilder, PrometheusHandle};

use crate::app::SharedState;

/// Installs the process-wide recorder (once; later calls reuse it).
pub fn recorder() -> anyhow::Result<PrometheusHandle> {
    static HANDLE: std::sync::OnceLock<PrometheusHandle> = std::sync::OnceLock::new();
    if let Some(h) = HANDLE.get() {
        return Ok(h.clone());
    }
    let handle = PrometheusBuilder::new().install_recorder()?;
    metrics::describe_counter!(
        "symtrace_http_requests_total",
        "HTTP requests by route and status"
    );
    metrics::describe_histogram!(
        "symtrace_http_request_duration_seconds",
        "HTTP request latency"
    );
    metrics::describe_counter!(
        "symtrace_debuginfod_requests_total",
        "debuginfod lookups by artifact and result"
    );
    metrics::describe_counter!(
        "symtrace_upstream_fetches_total",
        "federated fetches by result"
    );
    metrics::describe_counter!("symtrace_uploads_total", "uploads by kind and result");
    metrics::describe_counter!("symtrace_upload_bytes_total", "bytes received by uploads");
    metrics::describe_counter!(
        "symtrace_object_store_requests_total",
        "requests to the object store (S3, GCS, Azure or the local directory) by operation"
    );
    metrics::describe_counter!(
        "symtrace_ingest_truncated_stacks_total",
        "stacks deeper than SYMTRACE_MAX_STACK_DEPTH, cut to their leaf-most frames at ingest"
    );
    Ok(HANDLE.get_or_init(|| handle).clone())
}

pub async fn track(request: Request, next: Next) -> Response {
    let route = request
        .extensions()
        .get::<MatchedPath>()
        .map(|p| p.as_str().to_owned())
        .unwrap_or_else(|| "unmatched".to_owned());
    // A fixed set: hyper accepts any token as a method, and every label value
    // is a series kept forever.
    let method: &'static str = match *request.method() {
        Method::GET => "GET",
        Method::HEAD => "HEAD",
        Method::PUT => "PUT",
        Method::POST => "POST",
        Method::DELETE => "DELETE",
        _ => "other",
    };
    let start = Instant::now();
    let response = next.run(request).await;
    let status = response.status().as_u16().to_string();
    metrics::counter!("symtrace_http_requests_total", "route" => route.clone(), "method" => method, "status" => status)
        .increment(1);
    metrics::histogram!("symtrace_http_request_duration_seconds", "route" => route)
        .record(start.elapsed().as_secs_f64());
    response
}

pub async fn render(State(state): State<SharedState>) -> impl IntoResponse {
    let mut text = state.metrics.render();
    text.push_str("# HELP symtrace_ready 1 when the server serves requests\n# TYPE symtrace_ready gauge\nsymtrace_ready 1\n");
    process_metrics(&mut text);
    ([(header::CONTENT_TYPE, "text/plain; version=0.0.4")], text)
}

/// The standard Prometheus process metrics (CPU seconds, resident memory,
/// start time), read from `/proc/self` at scrape time. Absent off Linux.
fn process_metrics(text: &mut String) {
    use std::fmt::Write;
    let Ok(stat) = std::fs::read_to_string("/proc/self/stat") else {
        return;
    };
    // Fields after the parenthesised command name, which may hold spaces.
    let Some(fields) = stat
        .rsplit_once(')')
        .map(|(_, rest)| rest.split_whitespace().collect::<Vec<_>>())
    else {
        return;
    };
    // SAFETY: sysconf has no preconditions.
    let (ticks, page) = unsafe {
        (
            libc::sysconf(libc::_SC_CLK_TCK),
            libc::sysconf(libc::_SC_PAGESIZE),
        )
    };
    let field = |i: usize| fields.get(i).and_then(|v| v.parse::<u64>().ok());
    // utime, stime are fields 14 and 15 of stat(5); rss is 24 (pages).
    if let (Some(utime), Some(stime), Some(rss)) = (field(11), field(12), field(21)) {
        let cpu = (utime + stime) as f64 / ticks.max(1) as f64;
        let _ = write!(
            text,
            "# HELP process_cpu_seconds_total Total user and system CPU time spent in seconds.\n\
             # TYPE process_cpu_seconds_total counter\nprocess_cpu_seconds_total {cpu}\n\
             # HELP process_resident_memory_bytes Resident memory size in bytes.\n\
             # TYPE process_resident_memory_bytes gauge\nprocess_resident_memory_bytes {}\n",
            rss * page.max(1) as u64
        );
    }
}
