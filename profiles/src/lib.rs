//! symtrace's profile engine over bytes, with no I/O: the stored profile
//! model ([`model`]), the segment format ([`segment`]) and the
//! normalization of OpenTelemetry profiles into the model
//! ([`normalize`]). The server stores, compacts and queries what these
//! produce; the fuzz targets (`fuzz/`) drive them with arbitrary bytes.

pub mod model;
pub mod normalize;
pub mod segment;
#[cfg(any(test, feature = "testing"))]
pub mod testing;
