//! symtrace-server as a library: every module of the server; `main.rs`
//! only parses the command line and calls [`run`] (or the `symbolize`
//! command).

mod app;
mod auth;
mod claims;
pub mod config;
mod cpu;
mod debuginfod;
mod error;
mod federation;
mod ingest;
mod limits;
mod listen;
mod lru;
mod metrics;
mod profiles;
mod query;
mod quota;
mod run;
mod serve;
mod store;
mod symbolize;
mod tenant;
mod ui;
mod upload;
mod zerocopy;

pub use run::{init_tracing, run};
pub use symbolize::cli::run as symbolize_command;
