//! symtrace's profile engine over bytes, with no I/O: the stored profile
//! model ([`model`]) and segment format ([`segment`]), the normalization
//! of OpenTelemetry profiles into the model ([`normalize`]), and the query
//! engine's pure parts — selections ([`selection`], [`selector`]), the
//! aggregation of segments into stacks ([`aggregate`], [`frame_table`]),
//! frame resolution from a symbolizer's answers ([`resolved`]), the
//! flamegraph tree ([`tree`]), the output formats ([`render`]) and a
//! trace's per-span table ([`trace`]). The server stores, compacts,
//! symbolizes and serves what these produce; the fuzz targets (`fuzz/`)
//! drive them with arbitrary bytes. Requests come from bytes through
//! [`decode`].

pub mod aggregate;
pub mod answer;
pub mod decode;
pub mod frame_table;
pub mod gauge;
mod memo;
pub mod model;
pub mod normalize;
pub mod parts;
#[cfg(test)]
mod properties_tests;
pub mod render;
pub mod request;
pub mod resolved;
#[cfg(test)]
mod rules_tests;
pub mod segment;
pub mod selection;
pub mod selector;
pub mod strings;
#[cfg(any(test, feature = "testing"))]
pub mod testing;
pub mod trace;
pub mod tree;
pub mod waits;
