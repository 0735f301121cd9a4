//! Writes seed inputs for the fuzz targets of `fuzz/` that take OTLP
//! exports and segments: `fuzz_seeds DIR` fills `DIR/otlp_protobuf`,
//! `DIR/otlp_json` and `DIR/segment_decode` (see fuzz/seed.sh).

use std::path::Path;

use prost::Message;
use symtrace_profiles::normalize::{normalize, Limits};
use symtrace_profiles::segment;
use symtrace_proto::collector::ExportProfilesServiceRequest;
use symtrace_proto::common::{any_value, AnyValue, ArrayValue, KeyValue};
use symtrace_proto::profiles::{
    Function, KeyValueAndUnit, Line, Link, Location, Mapping, Profile, ProfilesDictionary,
    ResourceProfiles, Sample, ScopeProfiles, Stack, ValueType,
};
use symtrace_proto::resource::Resource;

fn string(s: &str) -> Option<AnyValue> {
    Some(AnyValue {
        value: Some(any_value::Value::StringValue(s.into())),
    })
}

/// An export with every kind of table entry: native and named frames, a
/// mapping with a build-ID, attributes (one nested), links, and samples
/// with timestamps, values, or both.
fn rich(depth: usize, timestamps: bool) -> ExportProfilesServiceRequest {
    let mut strings: Vec<String> = [
        "",
        "samples",
        "count",
        "cpu",
        "nanoseconds",
        "/usr/bin/app",
        "process.executable.build_id.gnu",
        "thread.name",
        "profile.frame.type",
        "kernel",
    ]
    .map(String::from)
    .to_vec();
    let first_fn = strings.len();
    strings.extend((0..depth).map(|i| format!("fn_{i}")));
    let attribute = |key: i32, value: Option<AnyValue>| KeyValueAndUnit {
        key_strindex: key,
        value,
        unit_strindex: 0,
    };
    let dictionary = ProfilesDictionary {
        string_table: strings,
        mapping_table: vec![
            Mapping::default(),
            Mapping {
                memory_start: 0x400000,
                memory_limit: 0x500000,
                file_offset: 0,
                filename_strindex: 5,
                attribute_indices: vec![1],
            },
        ],
        attribute_table: vec![
            KeyValueAndUnit::default(),
            attribute(6, string("0123456789abcdef0123456789abcdef01234567")),
            attribute(7, string("worker-1")),
            attribute(8, string("kernel")),
            attribute(
                7,
                Some(AnyValue {
                    value: Some(any_value::Value::ArrayValue(ArrayValue {
                        values: vec![string("a").unwrap(), string("b").unwrap()],
                    })),
                }),
            ),
        ],
        function_table: std::iter::once(Function::default())
            .chain((0..depth).map(|i| Function {
                name_strindex: (first_fn + i) as i32,
                ..Default::default()
            }))
            .collect(),
        location_table: std::iter::once(Location::default())
            .chain((0..depth).map(|i| {
                if i % 2 == 0 {
                    Location {
                        mapping_index: 1,
                        address: 0x401000 + 16 * i as u64,
                        ..Default::default()
                    }
                } else {
                    Location {
                        lines: vec![Line {
                            function_index: 1 + i as i32,
                            line: i as i64,
                            column: 1,
                        }],
                        attribute_indices: vec![3],
                        ..Default::default()
                    }
                }
            }))
            .collect(),
        stack_table: vec![
            Stack::default(),
            Stack {
                location_indices: (1..=depth as i32).collect(),
            },
            Stack {
                location_indices: vec![1],
            },
        ],
        link_table: vec![
            Link {
                trace_id: vec![0; 16],
                span_id: vec![0; 8],
            },
            Link {
                trace_id: (1..=16).collect(),
                span_id: (1..=8).collect(),
            },
        ],
    };
    let t = 1_700_000_000_000_000_000u64;
    let samples = vec![
        Sample {
            stack_index: 1,
            attribute_indices: vec![2],
            link_index: 1,
            values: if timestamps { vec![1, 2] } else { vec![5] },
            timestamps_unix_nano: if timestamps {
                vec![t + 1, t + 2]
            } else {
                vec![]
            },
        },
        Sample {
            stack_index: 2,
            attribute_indices: vec![4],
            link_index: 0,
            values: vec![],
            timestamps_unix_nano: vec![t + 3],
        },
    ];
    ExportProfilesServiceRequest {
        resource_profiles: vec![ResourceProfiles {
            resource: Some(Resource {
                attributes: vec![KeyValue {
                    key: "service.name".into(),
                    value: string("seed"),
                    ..Default::default()
                }],
                ..Default::default()
            }),
            scope_profiles: vec![ScopeProfiles {
                profiles: vec![Profile {
                    sample_type: Some(ValueType {
                        type_strindex: 1,
                        unit_strindex: 2,
                    }),
                    period_type: Some(ValueType {
                        type_strindex: 3,
                        unit_strindex: 4,
                    }),
                    period: 10_000_000,
                    time_unix_nano: t,
                    duration_nano: 10_000_000_000,
                    samples,
                    attribute_indices: vec![2],
                    ..Default::default()
                }],
                ..Default::default()
            }],
            ..Default::default()
        }],
        dictionary: Some(dictionary),
    }
}

fn main() {
    let dir = std::env::args().nth(1).expect("usage: fuzz_seeds DIR");
    let dir = Path::new(&dir);
    for d in ["otlp_protobuf", "otlp_json", "segment_decode"] {
        std::fs::create_dir_all(dir.join(d)).unwrap();
    }
    let seeds = [
        ("small", rich(4, true)),
        ("value-only", rich(6, false)),
        ("deep", rich(80, true)),
    ];
    for (name, request) in seeds {
        std::fs::write(
            dir.join(format!("otlp_protobuf/{name}.pb")),
            request.encode_to_vec(),
        )
        .unwrap();
        std::fs::write(
            dir.join(format!("otlp_json/{name}.json")),
            symtrace_proto::json::encode_export_request(&request),
        )
        .unwrap();
        let limits = Limits {
            max_stack_depth: 64,
            ..Limits::default()
        };
        let out = normalize(request, 1, &limits).expect("seeds are valid");
        assert_eq!(out.rejected, 0, "{:?}", out.errors);
        std::fs::write(
            dir.join(format!("segment_decode/{name}.seg")),
            segment::encode(&out.data, 3),
        )
        .unwrap();
    }
}
