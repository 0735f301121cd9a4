//! OTLP requests for tests (this crate's, the server's): CPU profiles of
//! named frames, built the way senders lay them out. Enabled by the
//! `testing` feature.

use symtrace_proto::collector::ExportProfilesServiceRequest;
use symtrace_proto::common::{any_value, AnyValue, KeyValue};
use symtrace_proto::profiles::{
    Function, KeyValueAndUnit, Line, Link, Location, Mapping, Profile, ProfilesDictionary,
    ResourceProfiles, Sample, ScopeProfiles, Stack, ValueType,
};
use symtrace_proto::resource::Resource;

/// A string table: the CPU profile type at indexes 1–4
/// (`samples:count:cpu:nanoseconds`), then `extra` from index 5.
pub fn strings(extra: impl IntoIterator<Item = String>) -> Vec<String> {
    ["", "samples", "count", "cpu", "nanoseconds"]
        .into_iter()
        .map(str::to_owned)
        .chain(extra)
        .collect()
}

/// A CPU profile (10 ms period) starting at `time_ns`, one second long.
pub fn cpu_profile(time_ns: u64, samples: Vec<Sample>) -> Profile {
    Profile {
        sample_type: Some(ValueType {
            type_strindex: 1,
            unit_strindex: 2,
        }),
        period_type: Some(ValueType {
            type_strindex: 3,
            unit_strindex: 4,
        }),
        period: 10_000_000,
        time_unix_nano: time_ns,
        duration_nano: 1_000_000_000,
        samples,
        ..Default::default()
    }
}

/// A dictionary ([`strings`] first) of `depth` named frames `f0` … and one
/// stack (index 1) of all of them, `f0` the leaf: function and location
/// `i + 1` name frame `i`.
pub fn named_frames(depth: usize) -> ProfilesDictionary {
    ProfilesDictionary {
        string_table: strings((0..depth).map(|i| format!("f{i}"))),
        function_table: std::iter::once(Function::default())
            .chain((0..depth).map(|i| Function {
                name_strindex: 5 + i as i32,
                ..Default::default()
            }))
            .collect(),
        location_table: std::iter::once(Location::default())
            .chain((0..depth).map(|i| Location {
                lines: vec![Line {
                    function_index: 1 + i as i32,
                    ..Default::default()
                }],
                ..Default::default()
            }))
            .collect(),
        stack_table: vec![
            Stack::default(),
            Stack {
                location_indices: (1..=depth as i32).collect(),
            },
        ],
        attribute_table: vec![KeyValueAndUnit::default()],
        ..Default::default()
    }
}

/// One resource (named `service` when given) with one scope holding
/// `profiles`.
pub fn request(
    service: Option<&str>,
    profiles: Vec<Profile>,
    dictionary: ProfilesDictionary,
) -> ExportProfilesServiceRequest {
    let attributes = service
        .map(|s| KeyValue {
            key: "service.name".into(),
            value: Some(AnyValue {
                value: Some(any_value::Value::StringValue(s.into())),
            }),
            ..Default::default()
        })
        .into_iter()
        .collect();
    ExportProfilesServiceRequest {
        resource_profiles: vec![ResourceProfiles {
            resource: Some(Resource {
                attributes,
                ..Default::default()
            }),
            scope_profiles: vec![ScopeProfiles {
                profiles,
                ..Default::default()
            }],
            ..Default::default()
        }],
        dictionary: Some(dictionary),
    }
}

/// One resource of `service` with `labels` labels `note0`, … of distinct
/// values `label_bytes` bytes long (at least `0-`, …), and `types` profiles, each of its own sample
/// type (`type0:count`, …), one sample of three named frames each: a
/// request of `types` series that all share the long labels.
pub fn many_types_request(
    service: &str,
    labels: usize,
    label_bytes: usize,
    types: usize,
    time_ns: u64,
) -> ExportProfilesServiceRequest {
    let mut dictionary = named_frames(3);
    let first = dictionary.string_table.len() as i32;
    dictionary
        .string_table
        .extend((0..types).map(|i| format!("type{i}")));
    let profiles = (0..types)
        .map(|i| {
            let mut p = cpu_profile(
                time_ns,
                vec![Sample {
                    stack_index: 1,
                    timestamps_unix_nano: vec![time_ns + 1],
                    ..Default::default()
                }],
            );
            p.sample_type = Some(ValueType {
                type_strindex: first + i as i32,
                unit_strindex: 2,
            });
            p
        })
        .collect();
    let mut r = request(Some(service), profiles, dictionary);
    if let Some(resource) = r.resource_profiles[0].resource.as_mut() {
        resource.attributes.extend((0..labels).map(|i| {
            // Distinct values (the same text would be stored once).
            let mut value = format!("{i}-");
            value.push_str(&"x".repeat(label_bytes.saturating_sub(value.len())));
            KeyValue {
                key: format!("note{i}"),
                value: Some(AnyValue {
                    value: Some(any_value::Value::StringValue(value)),
                }),
                ..Default::default()
            }
        }));
    }
    r
}

/// A dictionary ([`strings`] first) with one native frame (address
/// 0x1234 in `/bin/app`, stack 1), one attribute (`thread.name=w`, index 1)
/// and one link (trace `07…`, span `08…`, index 1).
pub fn native_dictionary() -> ProfilesDictionary {
    ProfilesDictionary {
        string_table: strings(["/bin/app", "thread.name", "w"].map(String::from)),
        mapping_table: vec![
            Mapping::default(),
            Mapping {
                memory_start: 0x1000,
                memory_limit: 0x9000,
                filename_strindex: 5,
                ..Default::default()
            },
        ],
        location_table: vec![
            Location::default(),
            Location {
                mapping_index: 1,
                address: 0x1234,
                ..Default::default()
            },
        ],
        stack_table: vec![
            Stack::default(),
            Stack {
                location_indices: vec![1],
            },
        ],
        attribute_table: vec![
            KeyValueAndUnit::default(),
            KeyValueAndUnit {
                key_strindex: 6,
                value: Some(AnyValue {
                    value: Some(any_value::Value::StringValueStrindex(7)),
                }),
                unit_strindex: 0,
            },
        ],
        link_table: vec![
            Link {
                trace_id: vec![0; 16],
                span_id: vec![0; 8],
            },
            Link {
                trace_id: vec![7; 16],
                span_id: vec![8; 8],
            },
        ],
        ..Default::default()
    }
}

/// OTLP profiles v1.9's layout of the messages v1.10 renumbered: what an
/// old sender's bytes look like to a v1.10 receiver (its samples' values
/// land where v1.10 has none).
pub mod v19 {
    use symtrace_proto::profiles::{ProfilesDictionary, ValueType};

    /// v1.9's Sample: values 2, attribute_indices 3, link_index 4,
    /// timestamps 5.
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct Sample {
        /// Tag 1.
        #[prost(int32, tag = "1")]
        pub stack_index: i32,
        /// Tag 2.
        #[prost(int64, repeated, tag = "2")]
        pub values: Vec<i64>,
        /// Tag 3.
        #[prost(int32, repeated, tag = "3")]
        pub attribute_indices: Vec<i32>,
        /// Tag 4.
        #[prost(int32, tag = "4")]
        pub link_index: i32,
        /// Tag 5.
        #[prost(fixed64, repeated, tag = "5")]
        pub timestamps_unix_nano: Vec<u64>,
    }

    /// v1.9's Profile (the fields used here).
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct Profile {
        /// Tag 1.
        #[prost(message, optional, tag = "1")]
        pub sample_type: Option<ValueType>,
        /// Tag 2.
        #[prost(message, repeated, tag = "2")]
        pub samples: Vec<Sample>,
    }

    /// ScopeProfiles.
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct Scope {
        /// Tag 2.
        #[prost(message, repeated, tag = "2")]
        pub profiles: Vec<Profile>,
    }

    /// ResourceProfiles.
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct Resource {
        /// Tag 2.
        #[prost(message, repeated, tag = "2")]
        pub scope_profiles: Vec<Scope>,
    }

    /// ExportProfilesServiceRequest.
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct Request {
        /// Tag 1.
        #[prost(message, repeated, tag = "1")]
        pub resource_profiles: Vec<Resource>,
        /// Tag 2.
        #[prost(message, optional, tag = "2")]
        pub dictionary: Option<ProfilesDictionary>,
    }

    /// One CPU sample of stack 1 with value 3 and attribute 1, over
    /// `dictionary` (whose strings 1 and 2 are the sample type), as a v1.9
    /// sender lays it out.
    pub fn request(dictionary: ProfilesDictionary) -> Request {
        Request {
            resource_profiles: vec![Resource {
                scope_profiles: vec![Scope {
                    profiles: vec![Profile {
                        sample_type: Some(ValueType {
                            type_strindex: 1,
                            unit_strindex: 2,
                        }),
                        samples: vec![Sample {
                            stack_index: 1,
                            values: vec![3],
                            attribute_indices: vec![1],
                            ..Default::default()
                        }],
                    }],
                }],
            }],
            dictionary: Some(dictionary),
        }
    }
}

// ---- checks over normalized data -------------------------------------

/// A sample's facts with every index resolved: its series, its stack's
/// frames (with their mappings and lines), its labels, its link and its
/// events as sorted (time, value) pairs.
pub type Fact = (
    String,
    Vec<String>,
    Vec<(String, String)>,
    Vec<u8>,
    Vec<(u64, i64)>,
);

/// A segment's samples as their facts, sorted (independent of how its
/// tables are numbered).
pub fn facts(d: &crate::model::SegmentData) -> Vec<Fact> {
    let mut out: Vec<Fact> = d
        .samples
        .iter()
        .map(|s| {
            let series = &d.series[s.series as usize];
            // Sorted by text: a set is sorted by key index, which depends
            // on the table's numbering.
            let labels = |set: u32| -> Vec<(String, String)> {
                let mut labels: Vec<(String, String)> = d.label_sets[set as usize]
                    .iter()
                    .map(|&(k, v)| (d.str(k).to_owned(), d.str(v).to_owned()))
                    .collect();
                labels.sort();
                labels
            };
            let series_fact = format!(
                "{} {} {} {}..{} {:?}",
                d.str(series.service),
                d.profile_type(series),
                series.period,
                series.start_ns,
                series.end_ns,
                labels(series.labels)
            );
            let frames = d.stacks[s.stack as usize]
                .iter()
                .map(|&f| {
                    let f = &d.frames[f as usize];
                    let m = &d.mappings[f.mapping as usize];
                    let lines: Vec<String> = f
                        .lines
                        .iter()
                        .map(|l| format!("{}@{}:{}", d.str(l.function), d.str(l.file), l.line))
                        .collect();
                    format!(
                        "{} {} {:?} {} {} {:#x}-{:#x}+{} {:#x} {lines:?}",
                        d.str(f.frame_type),
                        d.str(m.build_id),
                        m.build_id_kind,
                        d.str(m.content),
                        d.str(m.file),
                        m.memory_start,
                        m.memory_limit,
                        m.file_offset,
                        f.address
                    )
                })
                .collect();
            let events = sorted_events(s);
            (
                series_fact,
                frames,
                labels(s.labels),
                d.links[s.link as usize].to_vec(),
                events,
            )
        })
        .collect();
    out.sort();
    out
}

/// A sample's events as (timestamp, value) pairs, sorted: a timestamp
/// alone counts 1, a value alone has timestamp 0.
pub fn sorted_events(s: &crate::model::Sample) -> Vec<(u64, i64)> {
    let mut events: Vec<(u64, i64)> = if s.values.is_empty() {
        s.timestamps.iter().map(|&t| (t, 1)).collect()
    } else if s.timestamps.is_empty() {
        s.values.iter().map(|&v| (0, v)).collect()
    } else {
        s.timestamps
            .iter()
            .copied()
            .zip(s.values.iter().copied())
            .collect()
    };
    events.sort_unstable();
    events
}

/// Normalizes `request` whole and by series, and checks that the parts
/// are what splitting the whole gives: the same keys in the same order,
/// each with the same facts, and the same counts and messages.
pub fn assert_by_series_is_the_split_whole(
    request: ExportProfilesServiceRequest,
    now_ns: u64,
    limits: &crate::normalize::Limits,
) {
    use crate::normalize::{normalize, normalize_by_series};
    let whole = normalize(request.clone(), now_ns, limits);
    let parts = normalize_by_series(request, now_ns, limits);
    let (whole, parts) = match (whole, parts) {
        (Ok(w), Ok(p)) => (w, p),
        (Err(w), Err(p)) => return assert_eq!(w.to_string(), p.to_string()),
        // Only by series is a label or a stack copied per series: only
        // there can those limits be crossed.
        (Ok(_), Err(crate::normalize::RequestError::TooLarge(m)))
            if m.contains("each series keeps its own copy") =>
        {
            return
        }
        (w, p) => panic!(
            "whole: {:?}, by series: {:?}",
            w.map(|_| ()).map_err(|e| e.to_string()),
            p.map(|_| ()).map_err(|e| e.to_string())
        ),
    };
    assert_eq!(
        (
            whole.accepted,
            whole.rejected,
            &whole.errors,
            whole.truncated_stacks
        ),
        (
            parts.accepted,
            parts.rejected,
            &parts.errors,
            parts.truncated_stacks
        )
    );
    let split = crate::parts::split(whole.data);
    let keys = |p: &[(crate::parts::PartKey, crate::model::SegmentData)]| {
        p.iter().map(|(k, _)| k.clone()).collect::<Vec<_>>()
    };
    assert_eq!(keys(&parts.data), keys(&split));
    for ((key, a), (_, b)) in parts.data.iter().zip(&split) {
        assert_eq!(facts(a), facts(b), "part {key:?}");
        assert_eq!(a.series.len(), b.series.len(), "part {key:?}: series");
    }
}

/// What [`crate::request::Request`] keeps of a generated request: all but
/// scopes, schema URLs and a profile's ID, dropped count and original
/// payload (checked when decoding, not kept); the dictionary always there.
pub fn kept(mut m: ExportProfilesServiceRequest) -> ExportProfilesServiceRequest {
    m.dictionary.get_or_insert_with(Default::default);
    for r in &mut m.resource_profiles {
        r.schema_url.clear();
        for s in &mut r.scope_profiles {
            s.scope = None;
            s.schema_url.clear();
            for p in &mut s.profiles {
                p.profile_id.clear();
                p.dropped_attributes_count = 0;
                p.original_payload_format.clear();
                p.original_payload.clear();
            }
        }
    }
    m
}

/// `bytes` decode as [`crate::request::Request`] exactly as prost decodes
/// them: the same content, or the same error.
pub fn assert_decodes_as_prost(bytes: &[u8]) {
    use prost::Message;
    let ours = crate::request::Request::decode(bytes);
    let theirs = ExportProfilesServiceRequest::decode(bytes);
    match (ours, theirs) {
        (Ok(ours), Ok(theirs)) => assert_eq!(ours.to_message(), kept(theirs)),
        (Err(ours), Err(theirs)) => assert_eq!(ours.to_string(), theirs.to_string()),
        (ours, theirs) => panic!(
            "ours: {:?}\nprost: {:?}",
            ours.map(|_| ()).map_err(|e| e.to_string()),
            theirs.map(|_| ()).map_err(|e| e.to_string())
        ),
    }
}
