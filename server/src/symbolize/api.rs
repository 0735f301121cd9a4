//! `POST /api/v1/symbolize`: addresses of one or several build-IDs to
//! frames. Every build-ID and every address gets an explicit status; see
//! docs/api.md for the shapes.

use axum::body::Bytes;
use axum::extract::{ConnectInfo, DefaultBodyLimit, State};
use axum::http::{HeaderMap, StatusCode};
use axum::routing::post;
use axum::{Json, Router};
use serde::{Deserialize, Serialize};
use symtrace_elf::BuildId;
use symtrace_profiles::resolved::BuildIdStatus;
use symtrace_symbolize::{Frame, Miss};

use super::{Answer, Outcome, SymbolizeError, Tier};
use crate::app::SharedState;
use crate::auth::Scope;
use crate::error::{ApiError, ApiResult};
use crate::zerocopy::PeerAddr;

/// Most build-IDs in one batch.
const MAX_BUILD_IDS: usize = 1000;
/// Largest request body (100,000 addresses as hex strings fit in ~2 MB).
const MAX_BODY: usize = 32 << 20;

pub fn routes() -> Router<SharedState> {
    Router::new()
        .route("/api/v1/symbolize", post(symbolize))
        .layer(DefaultBodyLimit::max(MAX_BODY))
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct SymbolizeRequest {
    build_id: Option<String>,
    /// The SHA-256 of the file the addresses are in, when known: a file an
    /// agent published from that very content may name them (never one of
    /// another content).
    content_sha256: Option<String>,
    addresses: Option<Vec<AddressValue>>,
    requests: Option<Vec<BuildIdRequest>>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct BuildIdRequest {
    build_id: String,
    #[serde(default)]
    content_sha256: Option<String>,
    addresses: Vec<AddressValue>,
}

/// A number, or a hex string with or without `0x`.
#[derive(Debug, Deserialize)]
#[serde(untagged)]
enum AddressValue {
    Number(u64),
    Text(String),
}

#[derive(Debug, Serialize)]
pub struct SymbolizeResponse {
    pub results: Vec<BuildIdResult>,
}

#[derive(Debug, Serialize)]
pub struct BuildIdResult {
    pub build_id: String,
    /// `ok` (DWARF), `symbols_only`, `no_symbols` or `unknown_build_id`.
    pub status: &'static str,
    /// `index` or `dwarf` (answered while the index was being built).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tier: Option<&'static str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
    pub addresses: Vec<AddressResult>,
}

#[derive(Debug, Serialize)]
pub struct AddressResult {
    pub address: String,
    /// `found`, `outside_functions`, `no_symbols` or `unknown_build_id`.
    pub status: &'static str,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub source: Option<&'static str>,
    pub frames: Vec<FrameOut>,
}

#[derive(Debug, Serialize)]
pub struct FrameOut {
    pub function: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub linkage_name: Option<String>,
    pub file: Option<String>,
    pub line: Option<u32>,
    pub column: Option<u32>,
    /// Inlined into the next frame.
    pub inlined: bool,
}

async fn symbolize(
    State(state): State<SharedState>,
    ConnectInfo(PeerAddr(peer)): ConnectInfo<PeerAddr>,
    headers: HeaderMap,
    body: Bytes,
) -> ApiResult<Json<SymbolizeResponse>> {
    state.auth.check(&headers, peer, Scope::Read)?;
    let _slot = state.concurrency.symbolize.take()?;
    let request: SymbolizeRequest = serde_json::from_slice(&body).map_err(|e| {
        ApiError::bad_request(format!(
            "invalid symbolize request: {e}; send {{\"build_id\": \"…\", \"addresses\": [\"0x…\", …]}} \
             or {{\"requests\": [{{\"build_id\": …, \"addresses\": […]}}, …]}}"
        ))
    })?;
    let items = match request {
        SymbolizeRequest {
            build_id: Some(build_id),
            content_sha256,
            addresses: Some(addresses),
            requests: None,
        } => vec![BuildIdRequest {
            build_id,
            content_sha256,
            addresses,
        }],
        SymbolizeRequest {
            build_id: None,
            content_sha256: None,
            addresses: None,
            requests: Some(requests),
        } => requests,
        _ => {
            return Err(ApiError::bad_request(
                "give either build_id with addresses, or requests: [{build_id, addresses}, …]",
            ))
        }
    };
    if items.len() > MAX_BUILD_IDS {
        return Err(ApiError::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            "too_many_build_ids",
            format!(
                "{} build-IDs in one request; at most {MAX_BUILD_IDS}",
                items.len()
            ),
        ));
    }
    let total: usize = items.iter().map(|i| i.addresses.len()).sum();
    let max = state.config.max_symbolize_addresses;
    if total > max {
        return Err(ApiError::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            "too_many_addresses",
            format!("{total} addresses in one request; at most {max} (SYMTRACE_MAX_SYMBOLIZE_ADDRESSES)"),
        ));
    }
    let mut parsed = Vec::with_capacity(items.len());
    for item in items {
        let build_id: BuildId = item.build_id.parse()?;
        if let Some(c) = &item.content_sha256 {
            if !crate::store::is_sha256_hex(c) {
                return Err(ApiError::bad_request(
                    "content_sha256 is 64 lowercase hex digits",
                ));
            }
        }
        let addresses = item
            .addresses
            .iter()
            .enumerate()
            .map(|(i, a)| {
                parse_address(a).ok_or_else(|| {
                    ApiError::bad_request(format!(
                    "address {i} of build-ID {build_id} ({a:?}) is not a number or a hex string"
                ))
                })
            })
            .collect::<Result<Vec<u64>, ApiError>>()?;
        parsed.push((build_id, item.content_sha256, addresses));
    }
    let from = crate::debuginfod::forwarding(&headers, peer);
    let service = state.symbolizer.clone();
    let results =
        futures::future::try_join_all(parsed.into_iter().map(|(build_id, content, addresses)| {
            let service = service.clone();
            let from = from.clone();
            async move {
                let outcome = service
                    .symbolize(&build_id, content.as_deref(), addresses.clone(), &from)
                    .await
                    .map_err(into_api_error)?;
                Ok::<_, ApiError>(render(build_id.as_str(), &addresses, outcome))
            }
        }))
        .await?;
    Ok(Json(SymbolizeResponse { results }))
}

fn parse_address(value: &AddressValue) -> Option<u64> {
    match value {
        AddressValue::Number(n) => Some(*n),
        AddressValue::Text(t) => {
            let t = t.trim();
            let hex = t
                .strip_prefix("0x")
                .or_else(|| t.strip_prefix("0X"))
                .unwrap_or(t);
            u64::from_str_radix(hex, 16).ok()
        }
    }
}

fn into_api_error(e: SymbolizeError) -> ApiError {
    match e {
        SymbolizeError::Symbolize(e) => ApiError::new(
            StatusCode::UNPROCESSABLE_ENTITY,
            "unusable_debug_file",
            format!("the stored file cannot be symbolized from: {e}"),
        ),
        SymbolizeError::Busy(e) => e.into(),
        SymbolizeError::Store(e) => e.into(),
        other => ApiError::internal(other.to_string()),
    }
}

pub fn render(build_id: &str, addresses: &[u64], outcome: Outcome) -> BuildIdResult {
    match outcome {
        Outcome::Unknown => BuildIdResult {
            build_id: build_id.to_owned(),
            status: BuildIdStatus::UnknownBuildId.as_str(),
            tier: None,
            message: Some(
                "no debuginfo or executable for this build-ID, here or on the upstream servers"
                    .into(),
            ),
            addresses: addresses
                .iter()
                .map(|&a| AddressResult {
                    address: format!("{a:#x}"),
                    status: "unknown_build_id",
                    source: None,
                    frames: Vec::new(),
                })
                .collect(),
        },
        Outcome::Answered {
            tier,
            best,
            answers,
        } => {
            let status = super::status_of(best);
            let message = match status {
                BuildIdStatus::SymbolsOnly => {
                    Some("only a symbol table: function names without files or lines".into())
                }
                BuildIdStatus::NoSymbols => {
                    Some("the stored files have neither DWARF nor a symbol table".into())
                }
                _ => None,
            };
            let status = status.as_str();
            BuildIdResult {
                build_id: build_id.to_owned(),
                status,
                tier: Some(match tier {
                    Tier::Index => "index",
                    Tier::Dwarf => "dwarf",
                }),
                message,
                addresses: addresses
                    .iter()
                    .zip(answers)
                    .map(|(&a, answer)| address_result(a, answer))
                    .collect(),
            }
        }
    }
}

fn address_result(address: u64, answer: Answer) -> AddressResult {
    let address = format!("{address:#x}");
    match answer {
        Ok((source, frames)) => {
            let last = frames.len().saturating_sub(1);
            AddressResult {
                address,
                status: "found",
                source: Some(source.as_str()),
                frames: frames
                    .into_iter()
                    .enumerate()
                    .map(|(i, f)| frame_out(f, i < last))
                    .collect(),
            }
        }
        Err(miss) => AddressResult {
            address,
            status: match miss {
                Miss::NoSymbols => "no_symbols",
                _ => "outside_functions",
            },
            source: None,
            frames: Vec::new(),
        },
    }
}

fn frame_out(f: Frame, inlined: bool) -> FrameOut {
    FrameOut {
        function: f.function,
        linkage_name: f.linkage_name,
        file: f.file,
        line: (f.line != 0).then_some(f.line),
        column: (f.column != 0).then_some(f.column),
        inlined,
    }
}
