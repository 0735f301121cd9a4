//! Profiles: the stored model, the segment format, persistence, compaction
//! and queries.

pub mod api;
pub mod compact;
pub mod model;
pub mod segment;
pub mod store;
