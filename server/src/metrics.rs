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
    ([(header::CONTENT_TYPE, "text/plain; version=0.0.4")], text)
}
