//! Profiles: the stored model, the segment format, persistence, compaction
//! and queries.

pub mod model;
pub mod segment;
