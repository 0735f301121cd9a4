//! gRPC `opentelemetry.proto.collector.profiles.v1development.ProfilesService/Export`.
//!
//! Served by hand rather than through the generated server so that the
//! request's bytes go to [`super::Ingest::export`], which decodes them where it
//! normalizes and stores them (one blocking thread), and so that a malformed or v1.9
//! payload becomes INVALID_ARGUMENT with a message naming the problem
//! (the generated codec reports INTERNAL), and an oversized one becomes
//! RESOURCE_EXHAUSTED as OTLP specifies. gzip is accepted and answered.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::task::{Context, Poll};

use bytes::Buf;
use symtrace_proto::collector::ExportProfilesServiceResponse;
use tonic::codec::{Codec, DecodeBuf, Decoder, EncodeBuf, Encoder};
use tonic::codegen::{BoxFuture, CompressionEncoding, EnabledCompressionEncodings, StdError};
use tonic::server::{NamedService, UnaryService};
use tonic::{Code, Status};

use super::IngestError;
use crate::app::SharedState;
use crate::auth::AuthError;

const PATH: &str = "/opentelemetry.proto.collector.profiles.v1development.ProfilesService/Export";

#[derive(Clone)]
pub struct ProfilesGrpc {
    state: SharedState,
}

impl ProfilesGrpc {
    pub fn new(state: SharedState) -> Self {
        Self { state }
    }
}

impl NamedService for ProfilesGrpc {
    const NAME: &'static str =
        "opentelemetry.proto.collector.profiles.v1development.ProfilesService";
}

impl<B> tower::Service<http::Request<B>> for ProfilesGrpc
where
    B: http_body::Body + Send + 'static,
    B::Error: Into<StdError> + Send + 'static,
{
    type Response = http::Response<tonic::body::Body>;
    type Error = Infallible;
    type Future = BoxFuture<Self::Response, Self::Error>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: http::Request<B>) -> Self::Future {
        let state = self.state.clone();
        if request.uri().path() != PATH {
            return Box::pin(async move {
                Ok(
                    Status::unimplemented(format!("no method {}", request.uri().path()))
                        .into_http(),
                )
            });
        }
        Box::pin(async move {
            // Held while the message is received, decoded and stored.
            let slot = match state.concurrency.ingest.take() {
                Ok(slot) => slot,
                Err(busy) => return Ok(Status::unavailable(busy.to_string()).into_http()),
            };
            let mut gzip = EnabledCompressionEncodings::default();
            gzip.enable(CompressionEncoding::Gzip);
            let limit = state.config.max_export_bytes;
            let codec = ExportCodec;
            let mut grpc = tonic::server::Grpc::new(codec)
                .apply_compression_config(gzip, gzip)
                .apply_max_message_size_config(Some(limit), None);
            let export = Export {
                state,
                slot: Some(slot),
            };
            let mut response = grpc.unary(export, request).await;
            // tonic reports an oversized message as OUT_OF_RANGE; OTLP says
            // RESOURCE_EXHAUSTED.
            let headers = response.headers_mut();
            if headers.get("grpc-status").is_some_and(|v| v == "11") {
                headers.insert("grpc-status", (Code::ResourceExhausted as i32).into());
            }
            Ok(response)
        })
    }
}

/// The export of one request: its state and its ingest slot (taken when
/// the message arrived, handed to the ingest job).
struct Export {
    state: SharedState,
    slot: Option<tokio::sync::OwnedSemaphorePermit>,
}

impl UnaryService<bytes::Bytes> for Export {
    type Response = ExportProfilesServiceResponse;
    type Future = BoxFuture<tonic::Response<Self::Response>, Status>;

    fn call(&mut self, request: tonic::Request<bytes::Bytes>) -> Self::Future {
        let state = self.state.clone();
        let slot = self.slot.take();
        Box::pin(async move {
            let Some(slot) = slot else {
                return Err(Status::internal("one export per gRPC call"));
            };
            let headers = request.metadata().clone().into_headers();
            let peer = request
                .remote_addr()
                .unwrap_or(SocketAddr::from(([0, 0, 0, 0], 0)));
            let tenant =
                crate::tenant::writer(&state.auth, &headers, peer).map_err(|e| match e {
                    AuthError::Unauthenticated(m) => Status::unauthenticated(m),
                    AuthError::BadTenant(m) => Status::invalid_argument(m),
                    AuthError::Forbidden(m) => Status::permission_denied(m),
                })?;
            let body = super::Body {
                bytes: request.into_inner(),
                encoding: super::Encoding::Protobuf,
                gzip: false,
            };
            match state.ingest.export(&tenant, body, slot).await {
                Ok(response) => Ok(tonic::Response::new(response)),
                Err(IngestError::Invalid(message)) => Err(Status::invalid_argument(message)),
                Err(IngestError::TooLarge(message)) => Err(Status::resource_exhausted(message)),
                Err(e @ IngestError::Store(_)) => {
                    tracing::error!(error = %e, "profile export not stored");
                    Err(Status::unavailable(e.to_string()))
                }
            }
        })
    }
}

/// Passes requests on as bytes (see [`super::Ingest::export`]), encodes responses
/// with prost.
#[derive(Clone, Copy)]
struct ExportCodec;

impl Codec for ExportCodec {
    type Encode = ExportProfilesServiceResponse;
    type Decode = bytes::Bytes;
    type Encoder = ResponseEncoder;
    type Decoder = RequestDecoder;

    fn encoder(&mut self) -> Self::Encoder {
        ResponseEncoder
    }

    fn decoder(&mut self) -> Self::Decoder {
        RequestDecoder
    }
}

struct ResponseEncoder;

impl Encoder for ResponseEncoder {
    type Item = ExportProfilesServiceResponse;
    type Error = Status;

    fn encode(&mut self, item: Self::Item, dst: &mut EncodeBuf<'_>) -> Result<(), Status> {
        prost::Message::encode(&item, dst).map_err(|e| Status::internal(e.to_string()))
    }
}

struct RequestDecoder;

impl Decoder for RequestDecoder {
    type Item = bytes::Bytes;
    type Error = Status;

    fn decode(&mut self, src: &mut DecodeBuf<'_>) -> Result<Option<Self::Item>, Status> {
        Ok(Some(src.copy_to_bytes(src.remaining())))
    }
}
