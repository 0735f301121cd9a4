//! The query engine (`symtrace_service::query`) and its HTTP edge: the
//! query API and the rendering of its answers.

pub use symtrace_service::query::*;
pub mod api;
mod render;
