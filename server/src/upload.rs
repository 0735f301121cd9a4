//! The upload API that `symtrace-upload` (and any CI script) calls:
//!
//! - `PUT /api/v1/debuginfo/{build_id}/{executable|debuginfo}[?file=PATH]`
//! - `PUT /api/v1/debuginfo/{build_id}/source/{path}`: one source file
//! - `PUT /api/v1/debuginfo/{build_id}/sources`: a tar bundle of sources
//! - `POST /api/v1/debuginfo/missing`: which of these files does the server lack?
//! - `GET /api/v1/debuginfo[?build_id=&kind=&file=&limit=&offset=]`, `GET …/{build_id}`
//! - `DELETE /api/v1/debuginfo/{build_id}[/{kind}]` (admin)
//!
//! Bodies may be sent with `Content-Encoding: zstd` or `gzip`. Every body is
//! spooled and validated before anything becomes visible.

use std::net::SocketAddr;
use std::path::PathBuf;

use axum::body::Body;
use axum::extract::{ConnectInfo, DefaultBodyLimit, Path, Query, State};
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post, put};
use axum::{Json, Router};
use futures::StreamExt;
use serde::{Deserialize, Serialize};
use serde_json::json;
use symtrace_elf::BuildId;
use tokio::sync::SemaphorePermit;
use tower_http::decompression::RequestDecompressionLayer;

use crate::app::SharedState;
use crate::auth::{Scope, Tenants};
use crate::error::{ApiError, ApiResult};
use crate::store::model::{ArtifactKind, ListFilter};
use crate::store::spool::{spool, SpoolError, Spooled};
use crate::store::{Error as StoreError, Origin, Publisher, UploadStatus};
use crate::zerocopy::PeerAddr;

/// Most entries a `missing` request may ask about.
const MAX_MISSING_ITEMS: usize = symtrace_wire::missing::MAX_ITEMS;
/// Most claims a `missing` request may make (each costs a few database
/// round trips; an agent sends at most 256).
const MAX_CLAIMS: usize = 1024;
/// Most members a source bundle may hold.
const MAX_BUNDLE_ENTRIES: usize = 100_000;

pub fn routes() -> Router<SharedState> {
    Router::new()
        .route("/api/v1/debuginfo", get(list))
        .route("/api/v1/debuginfo/missing", post(missing))
        .route(
            "/api/v1/debuginfo/{build_id}",
            get(details).delete(delete_all),
        )
        .route(
            "/api/v1/debuginfo/{build_id}/{kind}",
            put(upload).delete(delete_kind),
        )
        .route(
            "/api/v1/debuginfo/{build_id}/source/{*path}",
            put(upload_source),
        )
        .layer(RequestDecompressionLayer::new())
        .layer(DefaultBodyLimit::max(64 << 20))
}

#[derive(Deserialize)]
struct UploadQuery {
    /// The file's path on the build machine, served as X-DEBUGINFOD-FILE
    /// and matched by /metadata.
    file: Option<String>,
    /// `agent`: published by an agent from what it found on a host (see
    /// `store::Origin::Agent`). A CI token or a trusted client may say so
    /// of its upload; an agent token's uploads are agents' whatever is said.
    origin: Option<String>,
    /// For an agent's debug file (a symbol-table extract): the SHA-256 of
    /// the file it was taken from.
    content_sha256: Option<String>,
}

fn upload_slot(state: &SharedState) -> ApiResult<SemaphorePermit<'_>> {
    state.upload_slots.try_acquire().map_err(|_| {
        ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "busy",
            "too many uploads in progress; retry shortly",
        )
    })
}

/// Receives a body into the spool. A body over the limit — declared by
/// `Content-Length` or found while reading — is refused with 413; what the
/// client is still sending is read and discarded for a moment first (up to
/// [`DRAIN_BYTES`]), so that the client sees the answer instead of a reset
/// connection.
async fn receive(state: &SharedState, headers: &HeaderMap, body: Body) -> ApiResult<Spooled> {
    let limit = state.config.max_upload_bytes;
    let mut stream = body.into_data_stream();
    let declared = headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    if let Some(n) = declared.filter(|n| *n > limit) {
        drain(&mut stream).await;
        return Err(ApiError::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            "too_large",
            format!("body of {n} bytes is larger than the limit of {limit} bytes"),
        ));
    }
    match spool(&mut stream, state.store.spool_dir(), limit).await {
        Ok(spooled) => {
            metrics::counter!("symtrace_upload_bytes_total").increment(spooled.size);
            Ok(spooled)
        }
        Err(e @ SpoolError::TooLarge { .. }) => {
            drain(&mut stream).await;
            Err(e.into())
        }
        Err(e) => Err(e.into()),
    }
}

/// Most bytes read and discarded after refusing a body.
const DRAIN_BYTES: usize = 16 << 20;

async fn drain(stream: &mut axum::body::BodyDataStream) {
    let discard = async {
        let mut read = 0usize;
        while let Some(Ok(chunk)) = stream.next().await {
            read += chunk.len();
            if read > DRAIN_BYTES {
                break;
            }
        }
    };
    let _ = tokio::time::timeout(std::time::Duration::from_secs(2), discard).await;
}

fn status_code(status: UploadStatus) -> StatusCode {
    match status {
        UploadStatus::Created => StatusCode::CREATED,
        UploadStatus::Unchanged | UploadStatus::Superseded => StatusCode::OK,
    }
}

async fn upload(
    State(state): State<SharedState>,
    ConnectInfo(PeerAddr(peer)): ConnectInfo<PeerAddr>,
    headers: HeaderMap,
    Path((build_id, kind)): Path<(String, String)>,
    Query(query): Query<UploadQuery>,
    body: Body,
) -> ApiResult<Response> {
    // Agents publish too: the origin comes from the token's scope.
    let caller = state.auth.caller(&headers, peer, Scope::Agent)?;
    let says_agent = match query.origin.as_deref() {
        None | Some("upload") => false,
        Some("agent") => true,
        Some(other) => {
            return Err(ApiError::bad_request(format!(
                "unknown origin {other:?}: use agent, or leave it out"
            )))
        }
    };
    let agent = caller.publishes_as_agent(says_agent);
    let build_id: BuildId = build_id.parse()?;
    if kind == "sources" {
        if agent {
            return Err(agents_publish_binaries_only());
        }
        let (owner, bound) = publisher_of(&caller.tenants, &headers)?;
        let publisher = Publisher {
            owner: &owner,
            bound,
        };
        return upload_bundle(state, headers, build_id, body, publisher).await;
    }
    let kind = ArtifactKind::parse(&kind).ok_or_else(|| {
        ApiError::bad_request(format!(
            "unknown kind {kind:?}: use executable, debuginfo, sources (a tar bundle) or source/PATH"
        ))
    })?;
    let (owner, bound) = if agent {
        (String::new(), false)
    } else {
        publisher_of(&caller.tenants, &headers)?
    };
    let publisher = Publisher {
        owner: &owner,
        bound,
    };
    let content = query.content_sha256.as_deref();
    let origin = if agent {
        Origin::Agent { content }
    } else {
        Origin::Upload
    };
    if agent {
        // An agent's bytes come out of its token's quota: what is declared
        // before reading, what was sent otherwise.
        if let Some(n) = declared_length(&headers) {
            state.quotas.agent_bytes.take(&caller.id, n)?;
        }
    }
    let _slot = upload_slot(&state)?;
    let spooled = receive(&state, &headers, body).await?;
    if agent && declared_length(&headers).is_none() {
        state.quotas.agent_bytes.take(&caller.id, spooled.size)?;
    }
    let outcome = state
        .store
        .ingest_artifact(
            &build_id,
            kind,
            &spooled,
            query.file.as_deref(),
            origin,
            publisher,
        )
        .await;
    if agent && outcome.is_ok() {
        let content = match kind {
            ArtifactKind::Executable => Some(spooled.sha256.as_str()),
            ArtifactKind::Debuginfo => content,
        };
        crate::claims::done(&state.store, build_id.as_str(), content).await;
    }
    let origin = origin.as_str();
    let label = match &outcome {
        Ok(o) => match o.status {
            UploadStatus::Created => "created",
            UploadStatus::Unchanged => "unchanged",
            UploadStatus::Superseded => "superseded",
        },
        Err(StoreError::Rejected(_)) => "rejected",
        Err(StoreError::Conflict(_)) => "conflict",
        Err(_) => "error",
    };
    metrics::counter!("symtrace_uploads_total", "kind" => kind.as_str(), "result" => label, "origin" => origin)
        .increment(1);
    let outcome = outcome?;
    Ok((status_code(outcome.status), Json(outcome)).into_response())
}

async fn upload_source(
    State(state): State<SharedState>,
    ConnectInfo(PeerAddr(peer)): ConnectInfo<PeerAddr>,
    headers: HeaderMap,
    Path((build_id, path)): Path<(String, String)>,
    body: Body,
) -> ApiResult<Response> {
    let caller = state.auth.caller(&headers, peer, Scope::Agent)?;
    if caller.scope == Some(Scope::Agent) {
        return Err(agents_publish_binaries_only());
    }
    let (owner, bound) = publisher_of(&caller.tenants, &headers)?;
    let build_id: BuildId = build_id.parse()?;
    let _slot = upload_slot(&state)?;
    let spooled = receive(&state, &headers, body).await?;
    let path = format!("/{path}");
    let publisher = Publisher {
        owner: &owner,
        bound,
    };
    let status = state
        .store
        .ingest_source(&build_id, &path, &spooled, false, publisher)
        .await?;
    metrics::counter!("symtrace_uploads_total", "kind" => "source", "result" => "ok").increment(1);
    let body = json!({
        "status": status,
        "build_id": build_id.as_str(),
        "path": symtrace_elf::canonical_path(&path),
        "sha256": spooled.sha256,
        "size": spooled.size,
    });
    Ok((status_code(status), Json(body)).into_response())
}

#[derive(Serialize)]
struct BundleReport {
    build_id: String,
    stored: Vec<String>,
    unchanged: Vec<String>,
    rejected: Vec<Rejected>,
}

#[derive(Serialize)]
struct Rejected {
    path: String,
    reason: String,
}

/// A tar member extracted to the spool directory.
struct Member {
    path: String,
    file: Spooled,
}

async fn upload_bundle(
    state: SharedState,
    headers: HeaderMap,
    build_id: BuildId,
    body: Body,
    publisher: Publisher<'_>,
) -> ApiResult<Response> {
    let _slot = upload_slot(&state)?;
    let bundle = receive(&state, &headers, body).await?;
    let dir: PathBuf = state.store.spool_dir().to_owned();
    let limit = state.config.max_upload_bytes;
    let bundle_path = bundle.path.to_path_buf();
    let (members, mut rejected) =
        tokio::task::spawn_blocking(move || extract_bundle(&bundle_path, &dir, limit))
            .await
            .map_err(|e| ApiError::internal(e.to_string()))??;
    let mut report = BundleReport {
        build_id: build_id.to_string(),
        stored: Vec::new(),
        unchanged: Vec::new(),
        rejected: Vec::new(),
    };
    for member in members {
        match state
            .store
            .ingest_source(&build_id, &member.path, &member.file, false, publisher)
            .await
        {
            Ok(UploadStatus::Unchanged) => report.unchanged.push(member.path),
            Ok(_) => report.stored.push(member.path),
            Err(StoreError::Rejected(reason) | StoreError::Conflict(reason)) => {
                rejected.push(Rejected {
                    path: member.path,
                    reason,
                })
            }
            Err(e) => return Err(e.into()),
        }
    }
    report.rejected = rejected;
    metrics::counter!("symtrace_uploads_total", "kind" => "sources", "result" => "ok").increment(1);
    let status = if report.stored.is_empty() {
        StatusCode::OK
    } else {
        StatusCode::CREATED
    };
    Ok((status, Json(report)).into_response())
}

/// Reads a tar bundle ([`symtrace_elf::read_bundle`]), each member into a
/// file of its own in the spool directory.
fn extract_bundle(
    bundle: &std::path::Path,
    dir: &std::path::Path,
    limit: u64,
) -> ApiResult<(Vec<Member>, Vec<Rejected>)> {
    use symtrace_elf::BundleError;
    let file = std::fs::File::open(bundle).map_err(|e| ApiError::internal(e.to_string()))?;
    let read = symtrace_elf::read_bundle(file, MAX_BUNDLE_ENTRIES, limit, |path, member| {
        let mut temp = tempfile::Builder::new()
            .prefix("bundle-")
            .tempfile_in(dir)?;
        let copied = std::io::copy(member, temp.as_file_mut())?;
        Ok(((path.to_owned(), temp), copied))
    });
    let (kept, rejected) = read.map_err(|e| match e {
        BundleError::Invalid(_) => ApiError::new(
            StatusCode::UNPROCESSABLE_ENTITY,
            "invalid_content",
            e.to_string(),
        ),
        BundleError::TooManyMembers(_) | BundleError::MemberTooLarge(_) => {
            ApiError::new(StatusCode::PAYLOAD_TOO_LARGE, "too_large", e.to_string())
        }
        other => ApiError::internal(other.to_string()),
    })?;
    let mut members = Vec::with_capacity(kept.len());
    for (path, temp) in kept {
        let temp_path = temp.into_temp_path();
        let (sha256, size) = symtrace_elf::content_hash_file(&temp_path)
            .map_err(|e| ApiError::internal(e.to_string()))?;
        members.push(Member {
            path,
            file: Spooled {
                path: temp_path,
                sha256,
                size,
            },
        });
    }
    let rejected = rejected
        .into_iter()
        .map(|r| Rejected {
            path: r.path,
            reason: r.reason,
        })
        .collect();
    Ok((members, rejected))
}

async fn missing(
    State(state): State<SharedState>,
    ConnectInfo(PeerAddr(peer)): ConnectInfo<PeerAddr>,
    headers: HeaderMap,
    Json(request): Json<symtrace_wire::missing::MissingRequest>,
) -> ApiResult<Response> {
    let caller = state.auth.caller(&headers, peer, Scope::Agent)?;
    let agent_token = caller.scope == Some(Scope::Agent);
    let (owner, bound) = publisher_of(&caller.tenants, &headers)?;
    if request.items.len() > MAX_MISSING_ITEMS {
        return Err(ApiError::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            "too_large",
            format!("at most {MAX_MISSING_ITEMS} items per request"),
        ));
    }
    let claims = request.items.iter().filter(|i| i.claim.is_some()).count();
    if claims > MAX_CLAIMS {
        return Err(ApiError::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            "too_large",
            format!("at most {MAX_CLAIMS} claims per request, not {claims}"),
        ));
    }
    if agent_token && claims < request.items.len() {
        return Err(ApiError::new(
            StatusCode::FORBIDDEN,
            "forbidden",
            "an agent token asks only for claims (every item names its `claim`)",
        ));
    }
    for (i, item) in request.items.iter().enumerate() {
        let what = |m: String| ApiError::bad_request(format!("item {i}: {m}"));
        if item.claim.is_some() {
            crate::claims::validate(item).map_err(what)?;
            continue;
        }
        item.build_id
            .parse::<BuildId>()
            .map_err(|e| what(e.to_string()))?;
        if !matches!(item.kind.as_str(), "executable" | "debuginfo" | "source") {
            return Err(what(format!("unknown kind {:?}", item.kind)));
        }
        if item.sha256.len() != 64 || !item.sha256.bytes().all(|b| b.is_ascii_hexdigit()) {
            return Err(what("sha256 must be 64 hex digits".into()));
        }
        if item.kind == "source" && !item.path.as_deref().is_some_and(|p| p.starts_with('/')) {
            return Err(what("a source item needs an absolute path".into()));
        }
    }
    if claims > 0 {
        state.quotas.claims.take(&caller.id, claims as u64)?;
    }
    let total = request.items.len();
    let bound_owner = bound.then_some(owner.as_str());
    let missing =
        crate::claims::answer(&state.store, request.items, &caller.id, bound_owner).await?;
    Ok(Json(symtrace_wire::missing::MissingAnswer { total, missing }).into_response())
}

async fn list(
    State(state): State<SharedState>,
    ConnectInfo(PeerAddr(peer)): ConnectInfo<PeerAddr>,
    headers: HeaderMap,
    Query(filter): Query<ListFilter>,
) -> ApiResult<Response> {
    let tenants = state.auth.check(&headers, peer, Scope::Read)?;
    let mut filter = filter;
    filter.owners = match tenants {
        Tenants::All => None,
        Tenants::Only(list) => Some(list),
    };
    let artifacts = state.store.list(&filter).await?;
    Ok(Json(json!({ "artifacts": artifacts })).into_response())
}

async fn details(
    State(state): State<SharedState>,
    ConnectInfo(PeerAddr(peer)): ConnectInfo<PeerAddr>,
    headers: HeaderMap,
    Path(build_id): Path<String>,
) -> ApiResult<Response> {
    let tenants = state.auth.check(&headers, peer, Scope::Read)?;
    let build_id: BuildId = build_id.parse()?;
    match state
        .store
        .details(&build_id, |owner| tenants.sees(owner))
        .await?
    {
        Some(details) => Ok(Json(details).into_response()),
        None => Err(ApiError::not_found(format!(
            "nothing stored for build-ID {build_id}"
        ))),
    }
}

/// Who publishes an upload: a token bound to tenants publishes for the one
/// it names (or its only one) and may replace only its own files; a token
/// of every tenant (or a trusted loopback client) publishes for the tenant
/// it names, else for every tenant (shared).
fn publisher_of(tenants: &Tenants, headers: &HeaderMap) -> Result<(String, bool), ApiError> {
    Ok(match tenants {
        Tenants::Only(_) => (crate::tenant::resolve(tenants, headers)?, true),
        Tenants::All if headers.contains_key(crate::tenant::HEADER) => {
            (crate::tenant::resolve(tenants, headers)?, false)
        }
        Tenants::All => (String::new(), false),
    })
}

fn agents_publish_binaries_only() -> ApiError {
    ApiError::new(
        StatusCode::FORBIDDEN,
        "forbidden",
        "an agent token publishes executables and debug files only, as an agent's: sources \
         come from CI (an upload token)",
    )
}

fn declared_length(headers: &HeaderMap) -> Option<u64> {
    headers
        .get(header::CONTENT_LENGTH)?
        .to_str()
        .ok()?
        .parse()
        .ok()
}

async fn delete_all(
    State(state): State<SharedState>,
    ConnectInfo(PeerAddr(peer)): ConnectInfo<PeerAddr>,
    headers: HeaderMap,
    Path(build_id): Path<String>,
) -> ApiResult<Response> {
    delete(state, peer, headers, build_id, None).await
}

async fn delete_kind(
    State(state): State<SharedState>,
    ConnectInfo(PeerAddr(peer)): ConnectInfo<PeerAddr>,
    headers: HeaderMap,
    Path((build_id, kind)): Path<(String, String)>,
) -> ApiResult<Response> {
    let kind = ArtifactKind::parse(&kind).ok_or_else(|| {
        ApiError::bad_request(format!(
            "unknown kind {kind:?}: use executable or debuginfo"
        ))
    })?;
    delete(state, peer, headers, build_id, Some(kind)).await
}

async fn delete(
    state: SharedState,
    peer: SocketAddr,
    headers: HeaderMap,
    build_id: String,
    kind: Option<ArtifactKind>,
) -> ApiResult<Response> {
    let tenants = state.auth.check(&headers, peer, Scope::Admin)?;
    let build_id: BuildId = build_id.parse()?;
    if let Tenants::Only(_) = &tenants {
        // A bound admin token deletes only what its tenants published.
        let foreign = state
            .store
            .foreign_owner(&build_id, kind, |owner| tenants.allows(owner))
            .await?;
        if let Some(owner) = foreign {
            return Err(StoreError::Conflict(format!(
                "build-ID {build_id} holds files published by {}; a token bound to tenants deletes only its tenants' files",
                if owner.is_empty() { "every tenant (shared)".to_owned() } else { format!("tenant {owner:?}") }
            ))
            .into());
        }
    }
    let removed = state.store.delete(&build_id, kind).await?;
    if removed == 0 {
        return Err(ApiError::not_found(format!(
            "nothing stored for build-ID {build_id}"
        )));
    }
    tracing::info!(build_id = %build_id, kind = kind.map(|k| k.as_str()), removed, "deleted");
    Ok(Json(json!({ "build_id": build_id.as_str(), "removed": removed })).into_response())
}
