//! Profiles: the engine's (`symtrace_service::profiles`) and the raw
//! samples endpoint.

pub use symtrace_service::profiles::*;
pub mod api;
