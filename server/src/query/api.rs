//! The query API (documented in `openapi.json`, served at
//! `/api/v1/openapi.json`): services, profile types and labels of a time
//! range; flamegraphs in five formats; diffs; a trace's spans.

use std::collections::{BTreeMap, BTreeSet, HashMap};

use axum::extract::{ConnectInfo, Path, Query, State};
use axum::http::{header, HeaderMap};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::{Json, Router};
use serde_json::{json, Value};

use symtrace_profiles::answer::Answer;
use symtrace_profiles::selection::{self as params, RawSelection, Selection};

use super::{render, traces, QueryError};
use crate::app::SharedState;
use crate::error::ApiError;
use crate::zerocopy::PeerAddr;

pub fn routes() -> Router<SharedState> {
    Router::new()
        .route("/api/v1/openapi.json", get(openapi))
        .route("/api/v1/services", get(services))
        .route("/api/v1/profile-types", get(profile_types))
        .route("/api/v1/labels", get(labels))
        .route("/api/v1/labels/{name}/values", get(label_values))
        .route("/api/v1/flamegraph", get(flamegraph))
        .route("/api/v1/diff", get(diff))
        .route("/api/v1/traces/{trace_id}", get(trace))
}

pub const OPENAPI: &str = include_str!("openapi.json");

async fn openapi() -> Response {
    ([(header::CONTENT_TYPE, "application/json")], OPENAPI).into_response()
}

type Params = HashMap<String, String>;

/// Refuses parameters the endpoint does not know (a typo would otherwise
/// silently widen the query).
fn known(params: &Params, allowed: &[&str]) -> Result<(), ApiError> {
    let mut unknown: Vec<&str> = params
        .keys()
        .map(String::as_str)
        .filter(|k| !allowed.contains(k))
        .collect();
    if unknown.is_empty() {
        return Ok(());
    }
    unknown.sort_unstable();
    Err(ApiError::bad_request(format!(
        "unknown query parameter(s) {}; this endpoint takes {}",
        unknown.join(", "),
        allowed.join(", ")
    )))
}

fn selection(params: &Params, prefix: &str, tenant: &str) -> Result<Selection, ApiError> {
    // A prefixed parameter (diff sides) overrides the shared one.
    let get = |name: &str| {
        params
            .get(&format!("{prefix}{name}"))
            .or_else(|| params.get(name))
            .map(String::as_str)
    };
    RawSelection {
        service: get("service"),
        profile_type: get("type"),
        from: get("from"),
        to: get("to"),
        selector: get("selector"),
        trace_id: get("trace_id"),
        span_id: get("span_id"),
        gauge: get("gauge"),
    }
    .parse(tenant)
    .map_err(|e| {
        if prefix.is_empty() {
            ApiError::from(e)
        } else {
            ApiError::bad_request(format!("{}: {e}", prefix.trim_end_matches('_')))
        }
    })
}

const SELECTION: &[&str] = &[
    "service", "type", "from", "to", "selector", "trace_id", "span_id", "gauge",
];

async fn series(
    state: &SharedState,
    params: &Params,
    tenant: &str,
) -> Result<Vec<crate::store::model::SeriesInfo>, ApiError> {
    let sel = selection(params, "", tenant)?;
    Ok(state.engine.series(&sel).await?)
}

async fn services(
    State(state): State<SharedState>,
    ConnectInfo(PeerAddr(peer)): ConnectInfo<PeerAddr>,
    headers: HeaderMap,
    Query(params): Query<Params>,
) -> Result<Json<Value>, ApiError> {
    let tenant = crate::tenant::reader(&state.auth, &headers, peer)?;
    known(&params, &["from", "to"])?;
    let mut by_service: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for row in series(&state, &params, &tenant).await? {
        by_service
            .entry(row.service)
            .or_default()
            .insert(row.profile_type);
    }
    let services: Vec<Value> = by_service
        .into_iter()
        .map(|(name, types)| json!({"name": name, "profile_types": types}))
        .collect();
    Ok(Json(json!({ "services": services })))
}

async fn profile_types(
    State(state): State<SharedState>,
    ConnectInfo(PeerAddr(peer)): ConnectInfo<PeerAddr>,
    headers: HeaderMap,
    Query(params): Query<Params>,
) -> Result<Json<Value>, ApiError> {
    let tenant = crate::tenant::reader(&state.auth, &headers, peer)?;
    known(&params, &["service", "from", "to"])?;
    let types: BTreeSet<String> = series(&state, &params, &tenant)
        .await?
        .into_iter()
        .map(|r| r.profile_type)
        .collect();
    Ok(Json(json!({ "profile_types": types })))
}

/// Label names → values from the index; `None` when some segment had too
/// many values of the name to index them (SYMTRACE_MAX_LABEL_VALUES).
async fn label_index(
    state: &SharedState,
    params: &Params,
    tenant: &str,
) -> Result<BTreeMap<String, Option<BTreeSet<String>>>, ApiError> {
    let sel = selection(params, "", tenant)?;
    Ok(state.engine.labels(&sel).await?.0)
}

async fn labels(
    State(state): State<SharedState>,
    ConnectInfo(PeerAddr(peer)): ConnectInfo<PeerAddr>,
    headers: HeaderMap,
    Query(params): Query<Params>,
) -> Result<Json<Value>, ApiError> {
    let tenant = crate::tenant::reader(&state.auth, &headers, peer)?;
    known(&params, &["service", "type", "from", "to"])?;
    let labels: Vec<Value> = label_index(&state, &params, &tenant)
        .await?
        .into_iter()
        .map(|(name, values)| {
            json!({
                "name": name,
                "values": values.as_ref().map(BTreeSet::len),
                "complete": values.is_some(),
            })
        })
        .collect();
    Ok(Json(json!({ "labels": labels })))
}

async fn label_values(
    State(state): State<SharedState>,
    ConnectInfo(PeerAddr(peer)): ConnectInfo<PeerAddr>,
    headers: HeaderMap,
    Path(name): Path<String>,
    Query(params): Query<Params>,
) -> Result<Json<Value>, ApiError> {
    let tenant = crate::tenant::reader(&state.auth, &headers, peer)?;
    known(&params, &["service", "type", "from", "to"])?;
    let mut index = label_index(&state, &params, &tenant).await?;
    let values = index.remove(&name);
    Ok(Json(json!({
        "name": name,
        "values": values.clone().flatten().unwrap_or_default(),
        "complete": !matches!(values, Some(None)),
    })))
}

async fn flamegraph(
    State(state): State<SharedState>,
    ConnectInfo(PeerAddr(peer)): ConnectInfo<PeerAddr>,
    headers: HeaderMap,
    Query(params): Query<Params>,
) -> Result<Response, ApiError> {
    let tenant = crate::tenant::reader(&state.auth, &headers, peer)?;
    let _slot = state.concurrency.queries.take()?;
    let mut allowed = SELECTION.to_vec();
    allowed.extend(["max_nodes", "format"]);
    known(&params, &allowed)?;
    let (format, max_nodes) = output(&params, &["json", "flamebearer", "folded", "pprof", "svg"])?;
    let sel = selection(&params, "", &tenant)?;
    let from = crate::debuginfod::forwarding(&headers, peer);
    let sides = [sel];
    let answer = super::run(&state.engine, &sides, &from).await?;
    blocking(&state, answer, move |answer| {
        render::flamegraph(answer, &sides, &format, max_nodes)
    })
    .await
}

/// `format` (one of `formats`, the first is the default) and `max_nodes`.
fn output(params: &Params, formats: &[&str]) -> Result<(String, usize), ApiError> {
    let format = params.get("format").map_or(formats[0], String::as_str);
    if !formats.contains(&format) {
        return Err(ApiError::bad_request(format!(
            "format {format:?} is not one of {}",
            formats.join(", ")
        )));
    }
    let max_nodes = params::parse_max_nodes(params.get("max_nodes").map(String::as_str))?;
    Ok((format.to_owned(), max_nodes))
}

/// Rendering is CPU work (a tree of up to millions of nodes): it runs on
/// the engine's CPU pool, not on the workers that serve requests.
async fn blocking(
    state: &SharedState,
    answer: Answer,
    render: impl FnOnce(&Answer) -> Result<Response, ApiError> + Send + 'static,
) -> Result<Response, ApiError> {
    let (response, answer) = state
        .engine
        .on_cpu("rendering", move || (render(&answer), answer))
        .await?;
    // Freeing millions of entries takes tens of milliseconds: not on the
    // response's time.
    let engine = state.clone();
    tokio::spawn(async move { engine.engine.on_cpu("freeing", move || drop(answer)).await });
    response
}

async fn diff(
    State(state): State<SharedState>,
    ConnectInfo(PeerAddr(peer)): ConnectInfo<PeerAddr>,
    headers: HeaderMap,
    Query(params): Query<Params>,
) -> Result<Response, ApiError> {
    let tenant = crate::tenant::reader(&state.auth, &headers, peer)?;
    let _slot = state.concurrency.queries.take()?;
    let mut allowed: Vec<String> = Vec::new();
    for p in SELECTION {
        allowed.push(p.to_string());
        allowed.push(format!("baseline_{p}"));
        allowed.push(format!("comparison_{p}"));
    }
    allowed.extend(["max_nodes".into(), "format".into()]);
    let allowed: Vec<&str> = allowed.iter().map(String::as_str).collect();
    known(&params, &allowed)?;
    let (format, max_nodes) = output(&params, &["json", "svg"])?;
    let sides = [
        selection(&params, "baseline_", &tenant)?,
        selection(&params, "comparison_", &tenant)?,
    ];
    if sides[0].profile_type != sides[1].profile_type {
        return Err(ApiError::bad_request(
            "baseline and comparison must have the same profile type",
        ));
    }
    let from = crate::debuginfod::forwarding(&headers, peer);
    let answer = super::run(&state.engine, &sides, &from).await?;
    blocking(&state, answer, move |answer| {
        render::diff(answer, &sides, &format, max_nodes)
    })
    .await
}

async fn trace(
    State(state): State<SharedState>,
    ConnectInfo(PeerAddr(peer)): ConnectInfo<PeerAddr>,
    headers: HeaderMap,
    Path(trace_id): Path<String>,
) -> Result<Json<Value>, ApiError> {
    let tenant = crate::tenant::reader(&state.auth, &headers, peer)?;
    let _slot = state.concurrency.queries.take()?;
    let id = params::parse_trace_id(&trace_id)?;
    let out = tokio::time::timeout(
        state.engine.limits.timeout,
        traces::trace(&state.engine, &tenant, id),
    )
    .await
    .map_err(|_| QueryError::Timeout(state.engine.limits.timeout))??;
    Ok(Json(out))
}

#[cfg(test)]
mod tests {
    #[test]
    fn openapi_documents_every_query_route() {
        let doc: serde_json::Value = serde_json::from_str(super::OPENAPI).unwrap();
        assert!(doc["openapi"].as_str().unwrap().starts_with("3."));
        let paths = doc["paths"].as_object().unwrap();
        // Every route of this module (axum's `{name}` is OpenAPI's too).
        let source = include_str!("api.rs");
        let routes: Vec<&str> = source
            .lines()
            .filter_map(|l| l.trim().strip_prefix(".route(\""))
            .filter_map(|l| l.split('"').next())
            .collect();
        assert_eq!(routes.len(), 8, "{routes:?}");
        for route in routes {
            assert!(paths.contains_key(route), "{route} is not in openapi.json");
            let get = &paths[route]["get"];
            assert!(get["summary"].is_string(), "{route} has no summary");
            assert!(get["responses"]["200"].is_object(), "{route}: no 200");
        }
    }
}
