//! OpenTelemetry protocol v1.11.0 for symtrace, generated at build time from
//! the vendored `.proto` files (see `proto/README.md`): the profiles data
//! model, the collector's `ProfilesService` (tonic client and server), the
//! process context (OTEP 4719), and OTLP/JSON through pbjson.
//!
//! OTLP/JSON differs from the canonical protobuf JSON mapping in one place
//! that matters here: trace and span IDs are hex, not base64. [`json`]
//! handles that.

#![allow(clippy::all, missing_docs, rustdoc::all)]

pub mod json;
pub mod limits;

pub mod opentelemetry {
    pub mod proto {
        pub mod common {
            pub mod v1 {
                include!(concat!(
                    env!("OUT_DIR"),
                    "/opentelemetry.proto.common.v1.rs"
                ));
                include!(concat!(
                    env!("OUT_DIR"),
                    "/opentelemetry.proto.common.v1.serde.rs"
                ));
            }
        }
        pub mod resource {
            pub mod v1 {
                include!(concat!(
                    env!("OUT_DIR"),
                    "/opentelemetry.proto.resource.v1.rs"
                ));
                include!(concat!(
                    env!("OUT_DIR"),
                    "/opentelemetry.proto.resource.v1.serde.rs"
                ));
            }
        }
        pub mod profiles {
            pub mod v1development {
                include!(concat!(
                    env!("OUT_DIR"),
                    "/opentelemetry.proto.profiles.v1development.rs"
                ));
                include!(concat!(
                    env!("OUT_DIR"),
                    "/opentelemetry.proto.profiles.v1development.serde.rs"
                ));
            }
        }
        pub mod collector {
            pub mod profiles {
                pub mod v1development {
                    include!(concat!(
                        env!("OUT_DIR"),
                        "/opentelemetry.proto.collector.profiles.v1development.rs"
                    ));
                    include!(concat!(
                        env!("OUT_DIR"),
                        "/opentelemetry.proto.collector.profiles.v1development.serde.rs"
                    ));
                }
            }
        }
        pub mod processcontext {
            pub mod v1development {
                include!(concat!(
                    env!("OUT_DIR"),
                    "/opentelemetry.proto.processcontext.v1development.rs"
                ));
                include!(concat!(
                    env!("OUT_DIR"),
                    "/opentelemetry.proto.processcontext.v1development.serde.rs"
                ));
            }
        }
    }
}

/// The mapping attribute (ours: OpenTelemetry's semantic conventions have
/// none for it) holding the SHA-256 of the mapped file's whole content, as
/// lowercase hex. `symtrace-agent` sends it with every file mapping; the
/// server names a frame from a file an agent published only when the
/// frame's mapping carries that file's hash.
pub const FILE_SHA256: &str = "symtrace.file.sha256";

pub use opentelemetry::proto::collector::profiles::v1development as collector;
pub use opentelemetry::proto::common::v1 as common;
pub use opentelemetry::proto::processcontext::v1development as processcontext;
pub use opentelemetry::proto::profiles::v1development as profiles;
pub use opentelemetry::proto::resource::v1 as resource;

impl profiles::ProfilesDictionary {
    /// A dictionary holding only the zero values every table starts with
    /// (index 0 means "none" in OTLP profiles v1.10+): the empty string and
    /// a default mapping, location, function, attribute and stack, and a
    /// link with all-zero trace and span IDs.
    pub fn with_zero_values() -> Self {
        Self {
            string_table: vec![String::new()],
            mapping_table: vec![profiles::Mapping::default()],
            location_table: vec![profiles::Location::default()],
            function_table: vec![profiles::Function::default()],
            link_table: vec![profiles::Link {
                trace_id: vec![0; 16],
                span_id: vec![0; 8],
            }],
            attribute_table: vec![profiles::KeyValueAndUnit::default()],
            stack_table: vec![profiles::Stack::default()],
        }
    }
}
