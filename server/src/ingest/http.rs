//! `POST /v1development/profiles`: OTLP/HTTP, protobuf or JSON, gzip or
//! not. Answers in the request's content type; errors are a
//! `google.rpc.Status` in that content type, as OTLP/HTTP specifies.

use axum::body::Body;
use axum::extract::{ConnectInfo, State};
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use axum::Router;

use super::IngestError;
use crate::app::SharedState;
use crate::zerocopy::PeerAddr;

pub fn routes() -> Router<SharedState> {
    Router::new().route("/v1development/profiles", post(export))
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Format {
    Protobuf,
    Json,
}

impl Format {
    fn content_type(self) -> &'static str {
        match self {
            Format::Protobuf => "application/x-protobuf",
            Format::Json => "application/json",
        }
    }
}

/// `google.rpc.Status`, the body of OTLP/HTTP error responses.
#[derive(Clone, PartialEq, prost::Message)]
struct RpcStatus {
    #[prost(int32, tag = "1")]
    code: i32,
    #[prost(string, tag = "2")]
    message: String,
}

fn failure(
    format: Format,
    status: StatusCode,
    grpc_code: tonic::Code,
    message: String,
) -> Response {
    let body = match format {
        Format::Protobuf => prost::Message::encode_to_vec(&RpcStatus {
            code: grpc_code as i32,
            message,
        }),
        Format::Json => serde_json::to_vec(&serde_json::json!({
            "code": grpc_code as i32,
            "message": message,
        }))
        .expect("json"),
    };
    (
        status,
        [(header::CONTENT_TYPE, format.content_type())],
        body,
    )
        .into_response()
}

async fn export(
    State(state): State<SharedState>,
    ConnectInfo(PeerAddr(peer)): ConnectInfo<PeerAddr>,
    headers: HeaderMap,
    body: Body,
) -> Response {
    let content_type = headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("");
    let mime = content_type.split(';').next().unwrap_or("").trim();
    let format = match mime {
        "application/x-protobuf" | "application/protobuf" => Format::Protobuf,
        "application/json" => Format::Json,
        _ => {
            return failure(
                Format::Json,
                StatusCode::UNSUPPORTED_MEDIA_TYPE,
                tonic::Code::InvalidArgument,
                format!(
                    "Content-Type {content_type:?} is not accepted: send application/x-protobuf or application/json"
                ),
            )
        }
    };
    let tenant = match crate::tenant::writer(&state.auth, &headers, peer) {
        Ok(t) => t,
        Err(e) => {
            use crate::auth::AuthError;
            let code = match &e {
                AuthError::Unauthenticated(_) => tonic::Code::Unauthenticated,
                AuthError::BadTenant(_) => tonic::Code::InvalidArgument,
                AuthError::Forbidden(_) => tonic::Code::PermissionDenied,
            };
            let e = crate::error::ApiError::from(e);
            return failure(format, e.status, code, e.message);
        }
    };
    // Held while the body is read, decoded and stored: bounds the memory
    // exports in progress take.
    let slot = match state.concurrency.ingest.take() {
        Ok(slot) => slot,
        Err(busy) => {
            let mut response = failure(
                format,
                StatusCode::SERVICE_UNAVAILABLE,
                tonic::Code::Unavailable,
                busy.to_string(),
            );
            response
                .headers_mut()
                .insert(header::RETRY_AFTER, header::HeaderValue::from_static("1"));
            return response;
        }
    };
    let limit = state.config.max_export_bytes;
    let too_large = |what: &str| {
        failure(
            format,
            StatusCode::PAYLOAD_TOO_LARGE,
            tonic::Code::ResourceExhausted,
            format!("{what} is larger than the limit of {limit} bytes (SYMTRACE_MAX_EXPORT_BYTES)"),
        )
    };
    // A whole-body deadline too: an idle timeout alone would let a sender
    // trickle a byte a minute and hold an export slot for hours.
    let deadline = std::time::Duration::from_secs(state.config.export_body_timeout_secs.max(1));
    let read = match tokio::time::timeout(deadline, axum::body::to_bytes(body, limit)).await {
        Ok(read) => read,
        Err(_) => {
            return failure(
                format,
                StatusCode::REQUEST_TIMEOUT,
                tonic::Code::DeadlineExceeded,
                format!(
                    "the request body did not arrive within {deadline:?} \
                     (SYMTRACE_EXPORT_BODY_TIMEOUT)"
                ),
            )
        }
    };
    let raw = match read {
        Ok(b) => b,
        Err(e) => {
            use std::error::Error;
            let over = e
                .source()
                .is_some_and(|s| s.is::<http_body_util::LengthLimitError>())
                || e.to_string().contains("length limit");
            if over {
                return too_large("the request body");
            }
            let text = format!(
                "{e} {}",
                e.source().map(|s| s.to_string()).unwrap_or_default()
            );
            if crate::listen::is_body_idle(&text) {
                return failure(
                    format,
                    StatusCode::REQUEST_TIMEOUT,
                    tonic::Code::DeadlineExceeded,
                    format!("reading the request body failed: {text}"),
                );
            }
            return failure(
                format,
                StatusCode::BAD_REQUEST,
                tonic::Code::InvalidArgument,
                format!("reading the request body failed: {e}"),
            );
        }
    };
    let encoding = headers
        .get(header::CONTENT_ENCODING)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("identity")
        .trim()
        .to_ascii_lowercase();
    let gzip = match encoding.as_str() {
        "identity" | "" => false,
        "gzip" => true,
        other => {
            return failure(
                format,
                StatusCode::UNSUPPORTED_MEDIA_TYPE,
                tonic::Code::InvalidArgument,
                format!("Content-Encoding {other:?} is not supported (use gzip or none)"),
            )
        }
    };
    let body = super::Body {
        bytes: raw,
        encoding: match format {
            Format::Protobuf => super::Encoding::Protobuf,
            Format::Json => super::Encoding::Json,
        },
        gzip,
    };
    match state.ingest.export(&tenant, body, slot).await {
        Ok(response) => {
            let body = match format {
                Format::Protobuf => prost::Message::encode_to_vec(&response),
                Format::Json => symtrace_proto::json::encode_export_response(&response),
            };
            (
                StatusCode::OK,
                [(header::CONTENT_TYPE, format.content_type())],
                body,
            )
                .into_response()
        }
        Err(IngestError::Invalid(message)) => failure(
            format,
            StatusCode::BAD_REQUEST,
            tonic::Code::InvalidArgument,
            message,
        ),
        Err(IngestError::TooLarge(message)) => failure(
            format,
            StatusCode::PAYLOAD_TOO_LARGE,
            tonic::Code::ResourceExhausted,
            message,
        ),
        Err(e @ IngestError::Store(_)) => {
            tracing::error!(error = %e, "profile export not stored");
            let mut response = failure(
                format,
                StatusCode::SERVICE_UNAVAILABLE,
                tonic::Code::Unavailable,
                e.to_string(),
            );
            response
                .headers_mut()
                .insert(header::RETRY_AFTER, header::HeaderValue::from_static("1"));
            response
        }
    }
}
