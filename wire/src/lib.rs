//! The wire types symtrace's programs share, one definition each and no
//! I/O: what a publisher asks the server before it uploads
//! ([`missing`]: the uploader's CI items, the agent's claims and probes),
//! and the label index stored with each series ([`labels`]), written by
//! ingest and compaction and read by the query API.

pub mod labels;
pub mod missing;
