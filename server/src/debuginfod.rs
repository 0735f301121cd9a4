//! The debuginfod protocol, as elfutils clients (debuginfod-find, gdb, perf,
//! libdebuginfod) speak it: `GET`/`HEAD /buildid/ID/{debuginfo,executable}`,
//! `/buildid/ID/source/PATH`, `/buildid/ID/section/NAME`, and `/metadata`.
//!
//! Clients cache every error as "not found" for ten minutes, so a 404 is only
//! sent when the file truly is absent here and upstream, and a malformed
//! request gets a 400 that says what is wrong.

use std::net::SocketAddr;
use std::sync::Arc;

use axum::extract::{ConnectInfo, Path, Query, State};
use axum::http::{header, HeaderMap, Method};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::{Json, Router};
use serde::Deserialize;
use serde_json::{json, Value};
use symtrace_elf::BuildId;

use crate::app::SharedState;
use crate::auth::Scope;
use crate::error::{ApiError, ApiResult};
use crate::federation::{find_or_fetch, Forwarding, Wanted};
use crate::serve::{send, StoredFile};
use crate::store::model::{ArtifactKind, FileQuery, ServedArtifact};
use crate::store::Misses;
use crate::zerocopy::PeerAddr;

pub fn routes() -> Router<SharedState> {
    Router::new()
        .route("/buildid/{build_id}/{artifact}", get(artifact))
        .route("/buildid/{build_id}/source/{*path}", get(source))
        .route("/buildid/{build_id}/section/{name}", get(section))
        .route("/buildid/{build_id}", get(incomplete))
        .route("/buildid", get(incomplete))
        .route("/metadata", get(metadata))
}

pub(crate) fn forwarding(headers: &HeaderMap, peer: SocketAddr) -> Forwarding {
    let text = |name| {
        headers
            .get(name)
            .and_then(|v: &header::HeaderValue| v.to_str().ok())
            .map(str::to_owned)
    };
    Forwarding {
        forwarded_for: text("x-forwarded-for"),
        peer: peer.ip().to_string(),
        user_agent: text(header::USER_AGENT.as_str()),
    }
}

fn count(artifact: &'static str, result: &'static str) {
    metrics::counter!("symtrace_debuginfod_requests_total", "artifact" => artifact, "result" => result)
        .increment(1);
}

async fn incomplete() -> ApiError {
    ApiError::bad_request(
        "incomplete request: use /buildid/BUILDID/{debuginfo,executable,source/PATH,section/NAME}",
    )
}

/// The best stored candidate, asking upstream servers on a miss.
async fn find_artifact(
    state: &SharedState,
    build_id: &BuildId,
    kind: ArtifactKind,
    from: &Forwarding,
) -> ApiResult<Option<Arc<ServedArtifact>>> {
    let federation = state.federation.as_ref();
    Ok(find_or_fetch(
        &state.store,
        federation,
        build_id,
        kind,
        from,
        Misses::Recheck,
    )
    .await?)
}

async fn send_artifact(
    state: &SharedState,
    method: &Method,
    headers: &HeaderMap,
    found: &ServedArtifact,
    section: Option<(&str, u64, u64)>,
) -> ApiResult<Response> {
    let a = &found.artifact;
    let (offset, size, suffix) = match section {
        Some((name, offset, size)) => (offset, size, format!(":{name}")),
        None => (0, a.size as u64, String::new()),
    };
    let file = StoredFile {
        sha256: &a.sha256,
        offset,
        size,
        name: &a.file_name,
        modified_ms: a.created_at,
        etag_suffix: &suffix,
        public: !state.auth.reads_need_token(),
    };
    send(&state.store, method, headers, file).await
}

async fn artifact(
    State(state): State<SharedState>,
    ConnectInfo(PeerAddr(peer)): ConnectInfo<PeerAddr>,
    method: Method,
    headers: HeaderMap,
    Path((build_id, artifact)): Path<(String, String)>,
) -> ApiResult<Response> {
    state.auth.check(&headers, peer, Scope::Read)?;
    let build_id: BuildId = build_id.parse()?;
    let (kind, label) = match artifact.as_str() {
        "debuginfo" => (ArtifactKind::Debuginfo, "debuginfo"),
        "executable" => (ArtifactKind::Executable, "executable"),
        "source" => {
            return Err(ApiError::bad_request(
                "a source request needs a path: /buildid/BUILDID/source/ABSOLUTE/PATH",
            ))
        }
        "section" => {
            return Err(ApiError::bad_request("a section request needs a name: /buildid/BUILDID/section/NAME"))
        }
        other => {
            return Err(ApiError::bad_request(format!(
                "unknown artifact type {other:?}: use debuginfo, executable, source/PATH or section/NAME"
            )))
        }
    };
    match find_artifact(&state, &build_id, kind, &forwarding(&headers, peer)).await? {
        Some(found) => {
            count(label, "hit");
            send_artifact(&state, &method, &headers, &found, None).await
        }
        None => {
            count(label, "miss");
            Err(ApiError::not_found(format!(
                "no {label} for build-ID {build_id}"
            )))
        }
    }
}

async fn source(
    State(state): State<SharedState>,
    ConnectInfo(PeerAddr(peer)): ConnectInfo<PeerAddr>,
    method: Method,
    headers: HeaderMap,
    Path((build_id, path)): Path<(String, String)>,
) -> ApiResult<Response> {
    let tenants = state.auth.check(&headers, peer, Scope::Read)?;
    let build_id: BuildId = build_id.parse()?;
    if path.contains('\0') {
        return Err(ApiError::bad_request("source path contains a NUL byte"));
    }
    let path = symtrace_elf::canonical_path(&format!("/{path}"));
    let mut found = state.store.source(build_id.as_str(), &path).await?;
    // Another tenant's source is not there for this reader (and is not
    // fetched from upstream in its place).
    if let Some(theirs) = found.as_ref().filter(|s| !tenants.sees(&s.owner)) {
        tracing::debug!(build_id = %build_id, path = %theirs.path, "source of another tenant");
        count("source", "miss");
        return Err(ApiError::not_found(format!(
            "no source file {path:?} for build-ID {build_id}"
        )));
    }
    if found.is_none() {
        if let Some(federation) = &state.federation {
            let from = forwarding(&headers, peer);
            if federation
                .fetch(&build_id, Wanted::Source(path.clone()), from)
                .await?
            {
                // Another tenant's upload may have landed meanwhile (the
                // fetch then finds it stored): it is not this reader's.
                found = state
                    .store
                    .source(build_id.as_str(), &path)
                    .await?
                    .filter(|s| tenants.sees(&s.owner));
            }
        }
    }
    let Some(found) = found else {
        count("source", "miss");
        return Err(ApiError::not_found(format!(
            "no source file {path:?} for build-ID {build_id}"
        )));
    };
    count("source", "hit");
    let file = StoredFile {
        sha256: &found.sha256,
        offset: 0,
        size: found.size as u64,
        name: &found.path,
        modified_ms: found.created_at,
        etag_suffix: "",
        public: !state.auth.reads_need_token(),
    };
    send(&state.store, &method, &headers, file).await
}

async fn section(
    State(state): State<SharedState>,
    ConnectInfo(PeerAddr(peer)): ConnectInfo<PeerAddr>,
    method: Method,
    headers: HeaderMap,
    Path((build_id, name)): Path<(String, String)>,
) -> ApiResult<Response> {
    state.auth.check(&headers, peer, Scope::Read)?;
    let build_id: BuildId = build_id.parse()?;
    let from = forwarding(&headers, peer);
    // As elfutils: the debuginfo first, then the executable when the section
    // is missing there or has no contents (SHT_NOBITS).
    let mut any = false;
    for kind in [ArtifactKind::Debuginfo, ArtifactKind::Executable] {
        if let Some(found) = find_artifact(&state, &build_id, kind, &from).await? {
            any = true;
            if let Some((offset, size)) = found.section_range(&name) {
                count("section", "hit");
                return send_artifact(
                    &state,
                    &method,
                    &headers,
                    &found,
                    Some((&name, offset, size)),
                )
                .await;
            }
        }
    }
    count("section", "miss");
    Err(ApiError::not_found(if any {
        format!("build-ID {build_id} has no section {name:?} with contents")
    } else {
        format!("no debuginfo or executable for build-ID {build_id}")
    }))
}

#[derive(Deserialize)]
struct MetadataQuery {
    key: Option<String>,
    value: Option<String>,
}

/// `/metadata?key=file|glob|buildid&value=…` (elfutils 0.192+).
async fn metadata(
    State(state): State<SharedState>,
    ConnectInfo(PeerAddr(peer)): ConnectInfo<PeerAddr>,
    headers: HeaderMap,
    Query(q): Query<MetadataQuery>,
) -> ApiResult<Response> {
    let tenants = state.auth.check(&headers, peer, Scope::Read)?;
    let (Some(key), Some(value)) = (q.key, q.value) else {
        return Err(ApiError::bad_request(
            "/metadata needs key=file|glob|buildid and value=…",
        ));
    };
    const LIMIT: i64 = 10_000;
    let (query, pattern) = match key.as_str() {
        "file" => (FileQuery::Exact(value.clone()), None),
        "buildid" => (
            FileQuery::BuildId(value.parse::<BuildId>()?.to_string()),
            None,
        ),
        "glob" => {
            let pattern = glob::Pattern::new(&value)
                .map_err(|e| ApiError::bad_request(format!("bad glob {value:?}: {e}")))?;
            let literal: String = value
                .chars()
                .take_while(|c| !"*?[\\".contains(*c))
                .collect();
            (FileQuery::Prefix(literal), Some(pattern))
        }
        other => {
            return Err(ApiError::bad_request(format!(
                "unknown metadata key {other:?}: use file, glob or buildid"
            )))
        }
    };
    let options = glob::MatchOptions {
        require_literal_separator: true,
        ..Default::default()
    };
    let mut seen = std::collections::BTreeSet::new();
    let mut results: Vec<Value> = Vec::new();
    let rows = state.store.find_files(&query, LIMIT).await?;
    // Capped: say so rather than claim the answer is complete.
    let mut complete = (rows.len() as i64) < LIMIT;
    for a in rows {
        if pattern
            .as_ref()
            .is_some_and(|p| !p.matches_with(&a.file_name, options))
            || !tenants.sees(&a.owner)
        {
            continue;
        }
        if seen.insert((a.build_id.clone(), a.kind.clone(), a.file_name.clone())) {
            results.push(json!({ "type": a.kind, "buildid": a.build_id, "file": a.file_name }));
        }
    }
    if let Some(federation) = &state.federation {
        let from = forwarding(&headers, peer);
        if federation.may_forward(&from) {
            let upstream = federation_metadata(federation, &key, &value, &from).await;
            for item in upstream.results {
                let id = |k: &str| item.get(k).and_then(Value::as_str).unwrap_or("").to_owned();
                if seen.insert((id("buildid"), id("type"), id("file"))) {
                    results.push(item);
                }
            }
            complete &= upstream.complete;
        }
    }
    Ok(Json(json!({ "results": results, "complete": complete })).into_response())
}

struct UpstreamMetadata {
    results: Vec<Value>,
    complete: bool,
}

async fn federation_metadata(
    federation: &Arc<crate::federation::Federation>,
    key: &str,
    value: &str,
    from: &Forwarding,
) -> UpstreamMetadata {
    let forwarded_for = from.next_forwarded_for();
    let requests = federation.upstreams().iter().map(|base| {
        let request = federation
            .client()
            .get(format!("{base}/metadata"))
            .query(&[("key", key), ("value", value)])
            .header("x-forwarded-for", &forwarded_for);
        async move {
            let response = request.send().await.ok()?.error_for_status().ok()?;
            serde_json::from_slice::<Value>(&response.bytes().await.ok()?).ok()
        }
    });
    let mut out = UpstreamMetadata {
        results: Vec::new(),
        complete: true,
    };
    for answer in futures::future::join_all(requests).await {
        match answer {
            Some(v) => {
                if v.get("complete").and_then(Value::as_bool) == Some(false) {
                    out.complete = false;
                }
                if let Some(items) = v.get("results").and_then(Value::as_array) {
                    out.results.extend(items.iter().cloned());
                }
            }
            None => out.complete = false,
        }
    }
    out
}
