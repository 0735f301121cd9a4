//! Wiring: the shared state and the router.

use std::sync::Arc;

use axum::extract::State;
use axum::http::StatusCode;
use axum::response::IntoResponse;
use axum::routing::get;
use axum::{Json, Router};
use metrics_exporter_prometheus::PrometheusHandle;
use serde_json::json;
use tokio::sync::Semaphore;
use tower_http::catch_panic::CatchPanicLayer;
use tower_http::trace::TraceLayer;

use crate::auth::Auth;
use crate::config::Config;
use crate::error::ApiError;
use crate::federation::Federation;
use crate::store::SymbolStore;

pub struct AppState {
    pub config: Config,
    pub store: Arc<SymbolStore>,
    pub auth: Auth,
    pub federation: Option<Arc<Federation>>,
    pub metrics: PrometheusHandle,
    pub upload_slots: Semaphore,
    pub symbolizer: Arc<crate::symbolize::SymbolizeService>,
    pub profiles: Arc<crate::profiles::store::ProfileStore>,
    /// The query engine (flamegraphs, diffs, traces, samples).
    pub engine: crate::query::Engine,
    pub ingest: crate::ingest::Ingest,
    pub concurrency: crate::limits::Concurrency,
    /// Per-token quotas of claims and agents' upload bytes.
    pub quotas: crate::quota::Quotas,
}

pub type SharedState = Arc<AppState>;

pub fn router(state: SharedState) -> Router {
    Router::new()
        .merge(crate::debuginfod::routes())
        .merge(crate::upload::routes())
        .merge(crate::symbolize::api::routes())
        .merge(crate::ingest::http::routes())
        .merge(crate::profiles::api::routes())
        .merge(crate::query::api::routes())
        .merge(crate::ui::routes())
        .route("/healthz", get(|| async { "ok" }))
        .route("/readyz", get(ready))
        .route("/metrics", get(crate::metrics::render))
        .fallback(|| async { ApiError::not_found("no such endpoint") })
        .layer(axum::middleware::from_fn(crate::metrics::track))
        .layer(TraceLayer::new_for_http())
        .layer(CatchPanicLayer::new())
        .with_state(state)
}

async fn ready(State(state): State<SharedState>) -> impl IntoResponse {
    let health = state.store.health().await;
    let (db, blobs) = (health.database, health.objects);
    let body = json!({
        "database": db.as_ref().map(|_| "ok".to_owned()).unwrap_or_else(|e| e.to_string()),
        "objects": blobs.as_ref().map(|_| "ok".to_owned()).unwrap_or_else(|e| e.to_string()),
    });
    let status = if db.is_ok() && blobs.is_ok() {
        StatusCode::OK
    } else {
        StatusCode::SERVICE_UNAVAILABLE
    };
    (status, Json(body))
}
