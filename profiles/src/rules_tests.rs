//! Every rule of request decoding and normalization, over bytes (no
//! server): each bad profile is rejected with a message naming what was
//! wrong while the good profile of the same request is kept; each bad
//! request is refused as a whole. The server's HTTP and gRPC tests keep one
//! case per status code.

use prost::Message;
use symtrace_proto::collector::ExportProfilesServiceRequest;
use symtrace_proto::common::{any_value, AnyValue};
use symtrace_proto::profiles::{
    Link, Location, Profile, ProfilesDictionary, Sample, Stack, ValueType,
};

use crate::decode::{decode_json, decode_protobuf, DecodeError};
use crate::normalize::{normalize, Limits, Normalized};
use crate::testing;

const T0: u64 = 1_700_000_000_000_000_000;

fn dictionary() -> ProfilesDictionary {
    testing::native_dictionary()
}

fn good() -> Profile {
    testing::cpu_profile(
        T0,
        vec![Sample {
            stack_index: 1,
            attribute_indices: vec![1],
            link_index: 1,
            timestamps_unix_nano: vec![T0 + 1, T0 + 2],
            ..Default::default()
        }],
    )
}

fn with_sample(sample: Sample) -> Profile {
    testing::cpu_profile(T0, vec![sample])
}

fn request(profiles: Vec<Profile>) -> ExportProfilesServiceRequest {
    testing::request(Some("svc"), profiles, dictionary())
}

/// Normalizes `request`, checking that by series it gives the split whole.
fn run(request: ExportProfilesServiceRequest) -> Normalized {
    let now = T0 + 10_000_000_000;
    testing::assert_by_series_is_the_split_whole(request.clone(), now, &Limits::default());
    normalize(request, now, &Limits::default()).expect("a usable request")
}

/// `bad` next to a good profile: the good one is kept (2 events), the bad
/// one rejected with a message containing `needle`.
fn rejected(bad: Profile, needle: &str) {
    let out = run(request(vec![good(), bad]));
    assert_eq!((out.accepted, out.rejected), (1, 1), "{needle}");
    assert!(
        out.errors.iter().any(|e| e.contains(needle)),
        "want {needle:?} in {:?}",
        out.errors
    );
    assert_eq!(out.data.points(), 2, "{needle}: the good profile is kept");
}

#[test]
fn a_good_profile_keeps_its_frames_labels_and_link() {
    let out = run(request(vec![good()]));
    assert_eq!((out.accepted, out.rejected), (1, 0));
    let data = &out.data;
    assert_eq!(data.samples.len(), 1);
    let sample = &data.samples[0];
    assert_eq!(sample.timestamps, vec![T0 + 1, T0 + 2]);
    let link = data.links[sample.link as usize];
    assert_eq!(&link[..16], &[7; 16]);
    assert_eq!(&link[16..], &[8; 8]);
    let labels = &data.label_sets[sample.labels as usize];
    assert!(labels
        .iter()
        .any(|&(k, v)| data.str(k) == "thread.name" && data.str(v) == "w"));
    let frame = &data.frames[data.stacks[sample.stack as usize][0] as usize];
    assert_eq!(frame.address, 0x1234);
    assert_eq!(
        data.profile_type(&data.series[0]),
        "samples:count:cpu:nanoseconds"
    );
}

#[test]
fn out_of_range_indexes_are_rejected() {
    rejected(
        with_sample(Sample {
            stack_index: 99,
            timestamps_unix_nano: vec![1],
            ..Default::default()
        }),
        "stack_index 99 is out of range",
    );
    rejected(
        with_sample(Sample {
            stack_index: 1,
            attribute_indices: vec![5],
            timestamps_unix_nano: vec![1],
            ..Default::default()
        }),
        "sample attribute index 5 is out of range",
    );
    rejected(
        with_sample(Sample {
            stack_index: 1,
            link_index: 2,
            timestamps_unix_nano: vec![1],
            ..Default::default()
        }),
        "link_index 2 is out of range",
    );
    rejected(
        Profile {
            sample_type: Some(ValueType {
                type_strindex: 40,
                unit_strindex: 2,
            }),
            ..good()
        },
        "sample_type.type_strindex 40 is out of range",
    );
    // A location index out of range, reached through a stack.
    let mut req = request(vec![
        good(),
        with_sample(Sample {
            stack_index: 2,
            timestamps_unix_nano: vec![1],
            ..Default::default()
        }),
    ]);
    req.dictionary.as_mut().unwrap().stack_table.push(Stack {
        location_indices: vec![1, 9],
    });
    let out = run(req);
    assert_eq!(out.rejected, 1);
    assert!(
        out.errors[0].contains("location index 9 is out of range"),
        "{:?}",
        out.errors
    );
}

#[test]
fn locations_mappings_functions_and_links_are_checked_through_the_stack() {
    // Stack 2 → location 2, whose mapping (9) or function (9) is missing.
    for (location, needle) in [
        (
            Location {
                mapping_index: 9,
                ..Default::default()
            },
            "mapping_index 9 is out of range",
        ),
        (
            Location {
                lines: vec![symtrace_proto::profiles::Line {
                    function_index: 9,
                    ..Default::default()
                }],
                ..Default::default()
            },
            "function_index 9 is out of range",
        ),
    ] {
        let mut req = request(vec![
            good(),
            with_sample(Sample {
                stack_index: 2,
                timestamps_unix_nano: vec![T0 + 1],
                ..Default::default()
            }),
        ]);
        let dict = req.dictionary.as_mut().unwrap();
        dict.location_table.push(location);
        dict.stack_table.push(Stack {
            location_indices: vec![2],
        });
        let out = run(req);
        assert_eq!((out.accepted, out.rejected), (1, 1), "{needle}");
        assert!(out.errors[0].contains(needle), "{:?}", out.errors);
    }
    // A link of the wrong byte lengths.
    let mut req = request(vec![
        good(),
        with_sample(Sample {
            stack_index: 1,
            link_index: 2,
            timestamps_unix_nano: vec![T0 + 1],
            ..Default::default()
        }),
    ]);
    req.dictionary.as_mut().unwrap().link_table.push(Link {
        trace_id: vec![1; 15],
        span_id: vec![2; 8],
    });
    let out = run(req);
    assert_eq!(out.rejected, 1);
    assert!(
        out.errors[0].contains("a 15-byte trace_id and a 8-byte span_id"),
        "{:?}",
        out.errors
    );
}

#[test]
fn profile_fields_are_checked() {
    rejected(
        Profile {
            period_type: Some(ValueType {
                type_strindex: 40,
                unit_strindex: 4,
            }),
            ..good()
        },
        "period_type.type_strindex 40 is out of range",
    );
    rejected(
        Profile {
            time_unix_nano: i64::MAX as u64 - 10,
            duration_nano: 100,
            ..good()
        },
        "time_unix_nano + duration_nano is after the year 2262",
    );
}

#[test]
fn a_resource_attribute_without_a_key_rejects_its_resource_only() {
    let mut req = request(vec![good()]);
    let mut bad = req.resource_profiles[0].clone();
    bad.resource
        .as_mut()
        .unwrap()
        .attributes
        .push(symtrace_proto::common::KeyValue {
            key: String::new(),
            value: Some(AnyValue {
                value: Some(any_value::Value::StringValue("x".into())),
            }),
            ..Default::default()
        });
    req.resource_profiles.push(bad);
    let out = run(req);
    assert_eq!((out.accepted, out.rejected), (1, 1), "{:?}", out.errors);
    assert!(
        out.errors[0].contains("an attribute has an empty key"),
        "{:?}",
        out.errors
    );
}

#[test]
fn values_timestamps_and_types_must_agree() {
    rejected(
        with_sample(Sample {
            stack_index: 1,
            values: vec![1, 2],
            timestamps_unix_nano: vec![1, 2, 3],
            ..Default::default()
        }),
        "2 values and 3 timestamps",
    );
    rejected(
        with_sample(Sample {
            stack_index: 1,
            ..Default::default()
        }),
        "neither values nor timestamps",
    );
    rejected(
        with_sample(Sample {
            stack_index: 1,
            timestamps_unix_nano: vec![u64::MAX],
            ..Default::default()
        }),
        "after the year 2262",
    );
    rejected(
        Profile {
            sample_type: None,
            ..good()
        },
        "sample_type is missing",
    );
    rejected(
        with_sample(Sample {
            stack_index: 1,
            attribute_indices: vec![1, 1],
            timestamps_unix_nano: vec![1],
            ..Default::default()
        }),
        "repeat the key",
    );
}

#[test]
fn an_empty_request_is_accepted_as_nothing() {
    let out = run(ExportProfilesServiceRequest::default());
    assert_eq!((out.accepted, out.rejected), (0, 0));
    assert!(out.data.samples.is_empty());
}

#[test]
fn a_broken_dictionary_refuses_the_request() {
    let mut req = request(vec![good()]);
    req.dictionary.as_mut().unwrap().string_table[0] = "x".into();
    let err = normalize(req, T0, &Limits::default())
        .err()
        .expect("refused");
    assert!(
        err.to_string()
            .contains("string_table[0] must be the zero value"),
        "{err}"
    );
}

#[test]
fn the_zero_attribute_may_carry_an_empty_value_as_the_collector_writes_it() {
    // The OpenTelemetry Collector (pdata) re-marshals attribute_table[0]
    // with its value present and empty: still the zero value.
    let mut req = request(vec![good()]);
    req.dictionary.as_mut().unwrap().attribute_table[0].value = Some(AnyValue { value: None });
    let out = run(req);
    assert_eq!((out.accepted, out.rejected), (1, 0));
    // A value that holds something is not.
    let mut req = request(vec![good()]);
    req.dictionary.as_mut().unwrap().attribute_table[0].value = Some(AnyValue {
        value: Some(any_value::Value::IntValue(1)),
    });
    let err = normalize(req, T0, &Limits::default())
        .err()
        .expect("refused");
    assert!(
        err.to_string()
            .contains("attribute_table[0] must be the zero value"),
        "{err}"
    );
}

/// A request as an OTLP profiles v1.9 sender lays it out.
pub(crate) fn v19_request_bytes() -> Vec<u8> {
    testing::v19::request(dictionary()).encode_to_vec()
}

fn malformed<T: std::fmt::Debug>(r: Result<T, DecodeError>) -> String {
    match r {
        Err(DecodeError::Malformed(m)) => m,
        other => panic!("not malformed: {other:?}"),
    }
}

#[test]
fn bytes_that_are_not_a_request_say_why() {
    let max = Limits::default().max_elements;
    let m = malformed(decode_protobuf(&v19_request_bytes(), max));
    assert!(
        m.contains("v1.9") && m.contains("upgrade the sender"),
        "{m}"
    );
    let bytes = request(vec![good()]).encode_to_vec();
    assert_eq!(
        decode_protobuf(&bytes, max).unwrap().to_message(),
        crate::testing::kept(request(vec![good()])),
        "a good request decodes as it was"
    );
    assert_eq!(
        crate::decode::decode_protobuf_message(&bytes, max).unwrap(),
        request(vec![good()])
    );
    let m = malformed(decode_protobuf(&bytes[..bytes.len() - 7], max));
    assert!(m.contains("malformed ExportProfilesServiceRequest"), "{m}");
    let m = malformed(decode_json(b"{\"resourceProfiles\": 7}", max));
    assert!(m.contains("malformed OTLP/JSON"), "{m}");
    let m = malformed(decode_json(b"{\"resourceProfiles\": [", max));
    assert!(m.contains("malformed OTLP/JSON"), "{m}");
}

#[test]
fn requests_over_the_element_limit_are_refused_before_decoding() {
    let bytes = request(vec![good()]).encode_to_vec();
    assert!(decode_protobuf(&bytes, 1_000).is_ok());
    assert_eq!(
        decode_protobuf(&bytes, 5).err(),
        Some(DecodeError::TooManyElements { max: 5 })
    );
    let json = br#"{"resourceProfiles": [{}, {}, {}, {}, {}, {}, {}, {}]}"#;
    assert_eq!(
        decode_json(json, 4).err(),
        Some(DecodeError::TooManyElements { max: 4 })
    );
    let err = decode_protobuf(&bytes, 5).unwrap_err().to_string();
    assert!(err.contains("SYMTRACE_MAX_EXPORT_ELEMENTS"), "{err}");
}
