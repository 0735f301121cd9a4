//! `GET /api/v1/profiles/samples`: the stored samples of a selection, raw
//! (`symtrace_service::query::samples`).

use axum::extract::{ConnectInfo, Query, State};
use axum::http::HeaderMap;
use axum::routing::get;
use axum::{Json, Router};
use serde_json::Value;

use crate::app::SharedState;
use crate::error::ApiError;
use crate::query::samples::SamplesQuery;
use crate::zerocopy::PeerAddr;

pub fn routes() -> Router<SharedState> {
    Router::new().route("/api/v1/profiles/samples", get(samples))
}

async fn samples(
    State(state): State<SharedState>,
    ConnectInfo(PeerAddr(peer)): ConnectInfo<PeerAddr>,
    headers: HeaderMap,
    Query(q): Query<SamplesQuery>,
) -> Result<Json<Value>, ApiError> {
    let tenant = crate::tenant::reader(&state.auth, &headers, peer)?;
    let _slot = state.concurrency.queries.take()?;
    Ok(Json(
        crate::query::samples::samples(&state.engine, tenant, q).await?,
    ))
}
