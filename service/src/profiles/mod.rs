//! Profiles: the stored model, the segment format, persistence, compaction
//! and queries.

pub mod cache;
pub mod compact;
pub use symtrace_profiles::model;
pub use symtrace_profiles::segment;
pub mod reader;
pub mod store;
