//! OTLP profiles ingest: gRPC `ProfilesService/Export` and
//! `POST /v1development/profiles` (protobuf or OTLP/JSON), validated,
//! normalized and stored as one segment per request before the answer.

pub mod grpc;
pub mod http;
use symtrace_profiles::decode;
pub use symtrace_profiles::normalize;

use std::sync::Arc;

use symtrace_proto::collector::{
    ExportProfilesPartialSuccess, ExportProfilesServiceRequest, ExportProfilesServiceResponse,
};

use crate::profiles::store::{Content, ProfileStore, ProfileStoreError};

#[derive(Debug, thiserror::Error)]
pub enum IngestError {
    /// The request cannot be used at all (400 / INVALID_ARGUMENT).
    #[error("{0}")]
    Invalid(String),
    /// The request holds more than a limit allows (413 / RESOURCE_EXHAUSTED).
    #[error("{0}")]
    TooLarge(String),
    /// Storing failed; nothing was acknowledged (503 / UNAVAILABLE).
    #[error("storing the profiles failed: {0}")]
    Store(#[from] ProfileStoreError),
}

/// Decodes a protobuf request ([`symtrace_profiles::decode`]).
pub fn decode_protobuf(
    body: &[u8],
    max_elements: usize,
) -> Result<ExportProfilesServiceRequest, IngestError> {
    decode::decode_protobuf(body, max_elements).map_err(IngestError::from)
}

/// Decodes an OTLP/JSON request ([`symtrace_profiles::decode`]).
pub fn decode_json(
    body: &[u8],
    max_elements: usize,
) -> Result<ExportProfilesServiceRequest, IngestError> {
    decode::decode_json(body, max_elements).map_err(IngestError::from)
}

impl From<decode::DecodeError> for IngestError {
    fn from(e: decode::DecodeError) -> Self {
        match e {
            decode::DecodeError::TooManyElements { .. } => {
                metrics::counter!("symtrace_ingest_refused_total", "reason" => "elements")
                    .increment(1);
                IngestError::TooLarge(e.to_string())
            }
            e => IngestError::Invalid(e.to_string()),
        }
    }
}

/// Validates, normalizes and durably stores one request. The answer says
/// how many profiles were rejected and why.
pub async fn export(
    profiles: &Arc<ProfileStore>,
    limits: &normalize::Limits,
    tenant: &str,
    request: ExportProfilesServiceRequest,
) -> Result<ExportProfilesServiceResponse, IngestError> {
    if request.resource_profiles.is_empty() {
        return Ok(ExportProfilesServiceResponse::default());
    }
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or(0);
    let limits = *limits;
    let by_series = profiles.ingest_parts;
    let normalized = tokio::task::spawn_blocking(move || {
        if by_series {
            normalize::normalize_by_series(request, now, &limits).map(|n| n.map(Content::Parts))
        } else {
            normalize::normalize(request, now, &limits).map(|n| n.map(Content::Whole))
        }
    })
    .await
    .map_err(|e| IngestError::Invalid(format!("normalizing the request failed: {e}")))?
    .map_err(|e| IngestError::Invalid(e.0))?;
    metrics::counter!("symtrace_profiles_rejected_total").increment(normalized.rejected as u64);
    if normalized.truncated_stacks > 0 {
        metrics::counter!("symtrace_ingest_truncated_stacks_total")
            .increment(normalized.truncated_stacks as u64);
    }
    if normalized.accepted > 0 && !normalized.data.is_empty() {
        let written = profiles.write(tenant, normalized.data, 0).await?;
        metrics::counter!("symtrace_profile_points_total").increment(written.points);
        metrics::counter!("symtrace_profile_segment_bytes_total").increment(written.size);
        tracing::debug!(tenant, sha256 = %written.sha256, points = written.points, size = written.size, new = written.new, "stored segment");
    }
    let partial_success = (normalized.rejected > 0).then(|| ExportProfilesPartialSuccess {
        rejected_profiles: normalized.rejected as i64,
        error_message: normalized.errors.join("; "),
    });
    Ok(ExportProfilesServiceResponse { partial_success })
}
