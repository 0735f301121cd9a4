//! symtrace's engine, under every endpoint of the server: the symbol store
//! (metadata and blobs), the profile store and its compaction, OTLP
//! ingest's decode → normalize → encode → commit, the query engine
//! (flamegraph, diff, trace view, samples, series, labels, profile types),
//! symbolization, federation to upstream debuginfod servers and the
//! agents' upload claims.
//!
//! Nothing here knows HTTP: no axum, hyper, tonic or `http` types (CI
//! checks the dependency tree). Errors are typed; the server maps each to
//! an HTTP status or a gRPC code in one place.

pub mod claims;
pub mod cpu;
pub mod federation;
pub mod ingest;
pub mod limits;
pub mod lru;
pub mod profiles;
pub mod query;
pub mod store;
pub mod symbolize;
pub mod zerocopy;
