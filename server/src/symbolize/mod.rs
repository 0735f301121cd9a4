//! Symbolization: the engine's (`symtrace_service::symbolize`), its HTTP
//! endpoint and the `symbolize` command.

pub use symtrace_service::symbolize::*;
pub mod api;
pub mod cli;
