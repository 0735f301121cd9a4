//! OTLP profiles ingest: gRPC `ProfilesService/Export` and
//! `POST /v1development/profiles` (protobuf or OTLP/JSON), validated,
//! normalized and stored as one segment per request before the answer.

use symtrace_profiles::decode;
pub use symtrace_profiles::normalize;

use std::sync::Arc;

use tokio::sync::OwnedSemaphorePermit;

use symtrace_profiles::request::Request;
use symtrace_proto::collector::{ExportProfilesPartialSuccess, ExportProfilesServiceResponse};

use crate::cpu::CpuPool;
use crate::profiles::store::{Content, ProfileStore, ProfileStoreError, SegmentEncoder};

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
pub fn decode_protobuf(body: &[u8], max_elements: usize) -> Result<Request, IngestError> {
    decode::decode_protobuf(body, max_elements).map_err(IngestError::from)
}

/// Decodes an OTLP/JSON request ([`symtrace_profiles::decode`]).
pub fn decode_json(body: &[u8], max_elements: usize) -> Result<Request, IngestError> {
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

/// How a request's body is encoded.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Encoding {
    /// `application/x-protobuf` (and every gRPC message).
    Protobuf,
    /// OTLP/JSON.
    Json,
}

/// A request's body as it arrived.
pub struct Body {
    pub bytes: bytes::Bytes,
    pub encoding: Encoding,
    /// gzip-compressed (OTLP/HTTP's `Content-Encoding`; tonic undoes gRPC's).
    pub gzip: bool,
}

/// OTLP ingest: its limits, where it stores, and its CPU pool.
pub struct Ingest {
    profiles: Arc<ProfileStore>,
    limits: normalize::Limits,
    /// Largest body after gzip is undone (`SYMTRACE_MAX_EXPORT_BYTES`).
    max_bytes: usize,
    pool: CpuPool,
}

impl Ingest {
    /// Ingest into `profiles`, with a CPU pool of one thread per CPU.
    pub fn new(
        profiles: Arc<ProfileStore>,
        limits: normalize::Limits,
        max_bytes: usize,
    ) -> std::io::Result<Self> {
        Ok(Self {
            profiles,
            limits,
            max_bytes,
            pool: CpuPool::per_cpu("ingest")?,
        })
    }

    /// Decodes, validates, normalizes and durably stores one request. What
    /// costs CPU (gunzip, decoding into [`Request`] — no message per sample
    /// or stack —, normalization, encoding) runs on the CPU pool, in one
    /// job that also frees the request there; the segment is then written
    /// and fsynced on the blocking pool and its rows committed. The answer
    /// says how many profiles were rejected and why.
    pub async fn export(
        &self,
        tenant: &str,
        body: Body,
        slot: OwnedSemaphorePermit,
    ) -> Result<ExportProfilesServiceResponse, IngestError> {
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos() as u64)
            .unwrap_or(0);
        let (limits, max_bytes) = (self.limits, self.max_bytes);
        let encoder = self.profiles.encoder(0);
        let by_series = self.profiles.ingest_parts;
        let owner = tenant.to_owned();
        // The slot goes with the job: a request whose client gave up keeps
        // it until its queued job is skipped or done.
        let (prepared, _slot) = self
            .pool
            .run("decoding an export", move || {
                let prepared = prepare(&encoder, by_series, &owner, body, &limits, max_bytes, now);
                (prepared, slot)
            })
            .await
            .map_err(|e| IngestError::Store(ProfileStoreError::Internal(e.to_string())))?;
        let prepared = prepared?;
        let Some(prepared) = prepared else {
            return Ok(ExportProfilesServiceResponse::default());
        };
        metrics::counter!("symtrace_profiles_rejected_total").increment(prepared.rejected as u64);
        if prepared.truncated_stacks > 0 {
            metrics::counter!("symtrace_ingest_truncated_stacks_total")
                .increment(prepared.truncated_stacks as u64);
        }
        if prepared.truncated_labels > 0 {
            metrics::counter!("symtrace_ingest_truncated_labels_total")
                .increment(prepared.truncated_labels as u64);
        }
        if let Some((bytes, row)) = prepared.segment {
            let written = self.profiles.write_encoded(bytes, row).await?;
            metrics::counter!("symtrace_profile_points_total").increment(written.points);
            metrics::counter!("symtrace_profile_segment_bytes_total").increment(written.size);
            tracing::debug!(tenant, sha256 = %written.sha256, points = written.points, size = written.size, new = written.new, "stored segment");
        }
        let partial_success = (prepared.rejected > 0).then(|| ExportProfilesPartialSuccess {
            rejected_profiles: prepared.rejected as i64,
            error_message: prepared.errors.join("; "),
        });
        Ok(ExportProfilesServiceResponse { partial_success })
    }
}

/// A request made ready to store: its segment encoded, its outcome.
struct Prepared {
    segment: Option<(Vec<u8>, crate::store::model::NewSegment)>,
    rejected: usize,
    errors: Vec<String>,
    truncated_stacks: usize,
    truncated_labels: usize,
}

/// The CPU part of [`Ingest::export`]; `None` for a request without
/// profiles.
fn prepare(
    encoder: &SegmentEncoder,
    by_series: bool,
    tenant: &str,
    body: Body,
    limits: &normalize::Limits,
    max_bytes: usize,
    now: u64,
) -> Result<Option<Prepared>, IngestError> {
    // The body (and what gunzip made of it) is freed once decoded: the
    // request owns what it keeps.
    let request = {
        let inflated;
        let bytes: &[u8] = if body.gzip {
            inflated = match gunzip(&body.bytes, max_bytes) {
                Ok(Some(b)) => b,
                Ok(None) => {
                    return Err(IngestError::TooLarge(format!(
                        "the decompressed request is larger than the limit of {max_bytes} bytes \
                         (SYMTRACE_MAX_EXPORT_BYTES)"
                    )))
                }
                Err(e) => {
                    return Err(IngestError::Invalid(format!(
                        "the gzip body is damaged: {e}"
                    )))
                }
            };
            &inflated
        } else {
            &body.bytes
        };
        match body.encoding {
            Encoding::Protobuf => decode_protobuf(bytes, limits.max_elements)?,
            Encoding::Json => decode_json(bytes, limits.max_elements)?,
        }
    };
    drop(body);
    if request.resource_profiles.is_empty() {
        return Ok(None);
    }
    let normalized = if by_series {
        normalize::normalize_request_by_series(&request, now, limits).map(|n| n.map(Content::Parts))
    } else {
        normalize::normalize_request(&request, now, limits).map(|n| n.map(Content::Whole))
    }
    .map_err(|e| match e {
        normalize::RequestError::TooLarge(m) => IngestError::TooLarge(m),
        e => IngestError::Invalid(e.to_string()),
    })?;
    drop(request);
    let segment = (normalized.accepted > 0 && !normalized.data.is_empty())
        .then(|| encoder.encode(tenant, normalized.data));
    Ok(Some(Prepared {
        segment,
        rejected: normalized.rejected,
        errors: normalized.errors,
        truncated_stacks: normalized.truncated_stacks,
        truncated_labels: normalized.truncated_labels,
    }))
}

/// Inflates at most `limit` bytes; `None` when the content is larger.
pub fn gunzip(data: &[u8], limit: usize) -> std::io::Result<Option<Vec<u8>>> {
    use std::io::Read;
    let mut out = Vec::with_capacity(data.len().saturating_mul(3).min(limit));
    let mut decoder = flate2::read::MultiGzDecoder::new(data).take(limit as u64 + 1);
    decoder.read_to_end(&mut out)?;
    Ok((out.len() <= limit).then_some(out))
}
