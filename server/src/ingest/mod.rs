//! OTLP profiles ingest: gRPC `ProfilesService/Export` and
//! `POST /v1development/profiles` (protobuf or OTLP/JSON), validated,
//! normalized and stored as one segment per request before the answer.

pub mod grpc;
pub mod http;
pub use symtrace_profiles::normalize;

use std::sync::Arc;

use symtrace_proto::collector::{
    ExportProfilesPartialSuccess, ExportProfilesServiceRequest, ExportProfilesServiceResponse,
};

use crate::profiles::store::{ProfileStore, ProfileStoreError};

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

/// Decodes a protobuf request, naming the v1.9 layout when that is what
/// broke the decoding; one holding more than `max_elements` elements is
/// refused before it is decoded.
pub fn decode_protobuf(
    body: &[u8],
    max_elements: usize,
) -> Result<ExportProfilesServiceRequest, IngestError> {
    let elements = symtrace_proto::limits::count_protobuf_elements(body, max_elements);
    check_elements(elements, max_elements)?;
    <ExportProfilesServiceRequest as prost::Message>::decode(body).map_err(|e| {
        let text = e.to_string();
        let hint = if text.contains("Sample.") {
            " (this is what an OTLP profiles v1.9 or older sender produces: v1.10 renumbered \
             Sample's fields; upgrade the sender to proto >= 1.10)"
        } else {
            ""
        };
        IngestError::Invalid(format!(
            "malformed ExportProfilesServiceRequest: {text}{hint}"
        ))
    })
}

/// Decodes an OTLP/JSON request, refusing one that may hold more than
/// `max_elements` elements before it is decoded.
pub fn decode_json(
    body: &[u8],
    max_elements: usize,
) -> Result<ExportProfilesServiceRequest, IngestError> {
    check_elements(
        symtrace_proto::limits::count_json_elements(body),
        max_elements,
    )?;
    symtrace_proto::json::decode_export_request(body)
        .map_err(|e| IngestError::Invalid(format!("malformed OTLP/JSON request: {e}")))
}

fn check_elements(elements: usize, max: usize) -> Result<(), IngestError> {
    if elements > max {
        metrics::counter!("symtrace_ingest_refused_total", "reason" => "elements").increment(1);
        return Err(IngestError::TooLarge(format!(
            "the request holds more than {max} elements (table entries, samples, stack \
             frames, values and timestamps; SYMTRACE_MAX_EXPORT_ELEMENTS): send smaller exports"
        )));
    }
    Ok(())
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
    let normalized =
        tokio::task::spawn_blocking(move || normalize::normalize(request, now, &limits))
            .await
            .map_err(|e| IngestError::Invalid(format!("normalizing the request failed: {e}")))?
            .map_err(|e| IngestError::Invalid(e.0))?;
    metrics::counter!("symtrace_profiles_rejected_total").increment(normalized.rejected as u64);
    if normalized.truncated_stacks > 0 {
        metrics::counter!("symtrace_ingest_truncated_stacks_total")
            .increment(normalized.truncated_stacks as u64);
    }
    if normalized.accepted > 0 && !normalized.data.samples.is_empty() {
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
