//! OTLP profiles ingest: the engine's decode → normalize → encode → commit
//! (`symtrace_service::ingest`) behind the gRPC and HTTP edges.

pub use symtrace_service::ingest::*;
pub mod grpc;
pub mod http;
