use prost::encoding::{encode_key, encode_varint, WireType};
use prost::Message;

use super::*;
use crate::testing::{self, assert_decodes_as_prost, cpu_profile, named_frames};
use symtrace_proto::profiles::{Link, Sample as PbSample};

/// A small request with every table, links, attributes, values and
/// timestamps.
fn small() -> ExportProfilesServiceRequest {
    let mut dictionary = named_frames(3);
    dictionary.link_table = vec![
        Link {
            trace_id: vec![0; 16],
            span_id: vec![0; 8],
        },
        Link {
            trace_id: vec![7; 16],
            span_id: vec![8; 8],
        },
    ];
    let samples = vec![
        PbSample {
            stack_index: 1,
            link_index: 1,
            values: vec![3, -4],
            timestamps_unix_nano: vec![1_001, 1_002],
            ..Default::default()
        },
        PbSample {
            stack_index: 1,
            timestamps_unix_nano: vec![1_003],
            ..Default::default()
        },
    ];
    let mut profile = cpu_profile(1_000, samples);
    profile.profile_id = vec![1; 16];
    profile.original_payload_format = "pprof".into();
    testing::request(Some("svc"), vec![profile], dictionary)
}

#[test]
fn decodes_what_prost_decodes() {
    let mut requests = vec![
        ExportProfilesServiceRequest::default(),
        small(),
        testing::many_types_request("svc", 3, 10, 5, 1_000),
    ];
    let mut without_dictionary = small();
    without_dictionary.dictionary = None;
    requests.push(without_dictionary);
    for r in &requests {
        assert_decodes_as_prost(&r.encode_to_vec());
    }
    let r = Request::decode(&small().encode_to_vec()).unwrap();
    let profile = &r.resource_profiles[0].scope_profiles[0].profiles[0];
    let s = profile.samples[0];
    assert_eq!(
        (r.values(s.values), r.timestamps(s.timestamps)),
        (&[3, -4][..], &[1_001, 1_002][..])
    );
    assert_eq!(r.stack(1), &[1, 2, 3]);
    assert!(r.stack(99).is_empty());
}

fn field(out: &mut Vec<u8>, tag: u32, wire_type: WireType) {
    encode_key(tag, wire_type, out);
}

fn message(out: &mut Vec<u8>, tag: u32, body: &[u8]) {
    field(out, tag, WireType::LengthDelimited);
    encode_varint(body.len() as u64, out);
    out.extend_from_slice(body);
}

fn packed(out: &mut Vec<u8>, tag: u32, items: &[u64]) {
    let mut body = Vec::new();
    for &i in items {
        encode_varint(i, &mut body);
    }
    message(out, tag, &body);
}

#[test]
fn repeated_fields_unpacked_or_split_are_concatenated_as_prost_does() {
    // A sample whose attribute indexes come unpacked, in two places, with
    // values between them; its timestamps unpacked, then packed.
    let mut sample = Vec::new();
    field(&mut sample, 2, WireType::Varint);
    encode_varint(3, &mut sample);
    packed(&mut sample, 4, &[7, 8]);
    field(&mut sample, 2, WireType::Varint);
    encode_varint(4, &mut sample);
    field(&mut sample, 5, WireType::SixtyFourBit);
    sample.extend_from_slice(&5u64.to_le_bytes());
    message(
        &mut sample,
        5,
        &[6u64.to_le_bytes(), 9u64.to_le_bytes()].concat(),
    );
    // A profile whose attribute indexes come before and after the sample
    // (which appends its own in between).
    let mut profile = Vec::new();
    packed(&mut profile, 11, &[1]);
    message(&mut profile, 2, &sample);
    field(&mut profile, 11, WireType::Varint);
    encode_varint(2, &mut profile);
    // A second sample_type merges into the first (only its unit).
    let mut unit = Vec::new();
    field(&mut unit, 2, WireType::Varint);
    encode_varint(2, &mut unit);
    let mut ty = Vec::new();
    field(&mut ty, 1, WireType::Varint);
    encode_varint(1, &mut ty);
    message(&mut profile, 1, &ty);
    message(&mut profile, 1, &unit);
    let mut scope = Vec::new();
    message(&mut scope, 2, &profile);
    let mut resource = Vec::new();
    message(&mut resource, 2, &scope);
    // A stack whose locations come unpacked; a dictionary in two pieces.
    let mut stack = Vec::new();
    for l in [1u64, 2] {
        field(&mut stack, 1, WireType::Varint);
        encode_varint(l, &mut stack);
    }
    let mut first = Vec::new();
    message(&mut first, 7, &[]);
    let mut second = Vec::new();
    message(&mut second, 7, &stack);
    message(&mut second, 5, b"");
    let mut request = Vec::new();
    message(&mut request, 2, &first);
    message(&mut request, 1, &resource);
    message(&mut request, 2, &second);
    assert_decodes_as_prost(&request);
    let r = Request::decode(&request).unwrap();
    let p = &r.resource_profiles[0].scope_profiles[0].profiles[0];
    let s = p.samples[0];
    assert_eq!(r.ints(s.attribute_indices), &[3, 4]);
    assert_eq!(r.values(s.values), &[7, 8]);
    assert_eq!(r.timestamps(s.timestamps), &[5, 6, 9]);
    assert_eq!(r.ints(p.attribute_indices), &[1, 2]);
    assert_eq!(
        p.sample_type,
        Some(ValueType {
            type_strindex: 1,
            unit_strindex: 2
        })
    );
    assert_eq!((r.stack(0), r.stack(1)), (&[][..], &[1, 2][..]));
}

#[test]
fn every_truncation_and_byte_change_fails_or_decodes_as_prost() {
    let bytes = small().encode_to_vec();
    for end in 0..bytes.len() {
        assert_decodes_as_prost(&bytes[..end]);
    }
    for at in 0..bytes.len() {
        for value in [0x00, 0x01, 0x02, 0x05, 0x0a, 0x12, 0x7f, 0x80, 0xff] {
            let mut changed = bytes.clone();
            changed[at] = value;
            assert_decodes_as_prost(&changed);
        }
    }
}

#[test]
fn v19_and_malformed_requests_fail_with_prosts_messages() {
    let v19 = testing::v19::request(named_frames(2)).encode_to_vec();
    assert_decodes_as_prost(&v19);
    // Invalid UTF-8 in the string table, a group never closed, a field
    // number 0.
    let mut bad_string = Vec::new();
    message(&mut bad_string, 5, &[0xff, 0xfe]);
    let mut request = Vec::new();
    message(&mut request, 2, &bad_string);
    let err = Request::decode(&request).unwrap_err().to_string();
    assert!(err.contains("ProfilesDictionary.string_table"), "{err}");
    assert_decodes_as_prost(&request);
    let mut group = Vec::new();
    field(&mut group, 9, WireType::StartGroup);
    assert_decodes_as_prost(&group);
    assert_decodes_as_prost(&[0x00, 0x01]);
}

#[test]
fn a_profiles_attribute_indexes_split_by_its_samples_cost_their_length_once() {
    // 10,000 indexes, then 10,000 times a sample (which appends to the
    // same array) and an empty occurrence of the profile's field: moving
    // the indexes at each occurrence would copy 10^8 of them.
    let mut profile = Vec::new();
    packed(&mut profile, 11, &[0; 10_000]);
    for _ in 0..10_000 {
        profile.extend_from_slice(&[0x12, 0x02, 0x10, 0x00]);
        profile.extend_from_slice(&[0x5a, 0x00]);
    }
    let mut scope = Vec::new();
    message(&mut scope, 2, &profile);
    let mut resource = Vec::new();
    message(&mut resource, 2, &scope);
    let mut request = Vec::new();
    message(&mut request, 1, &resource);
    assert_decodes_as_prost(&request);
    let r = Request::decode(&request).unwrap();
    let p = &r.resource_profiles[0].scope_profiles[0].profiles[0];
    assert_eq!(
        (p.attribute_indices.len(), p.samples.len()),
        (10_000, 10_000)
    );
    assert_eq!(r.ints.len(), 20_000, "each index stored once");
}
