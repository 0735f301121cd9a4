//! symtrace-server as a library: the HTTP and gRPC edge over the engine
//! (`symtrace-service`); `main.rs` only parses the command line and calls
//! [`run`] (or the `symbolize` command).
//!
//! The engine's modules are used here under their own names
//! (`crate::store`, `crate::query`, …); the modules of this crate parse
//! requests into engine calls and map the engine's answers and errors to
//! HTTP (`error`) or gRPC.

mod app;
mod auth;
pub mod config;
mod debuginfod;
mod error;
mod ingest;
mod listen;
mod metrics;
mod profiles;
mod query;
mod quota;
mod run;
mod serve;
mod symbolize;
mod tenant;
mod ui;
mod upload;

use symtrace_service::{claims, federation, limits, store, zerocopy};

pub use run::{init_tracing, run};
pub use symbolize::cli::run as symbolize_command;
