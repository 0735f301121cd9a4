//! Bounds on what an export decodes into, checked on the bytes before any
//! decoder allocates: 64 MiB of protobuf can hold 30 million empty
//! `Location`s (two bytes each on the wire, ~64 bytes each decoded), and
//! 64 MiB of OTLP/JSON as many `{}`s.
//!
//! [`count_protobuf_elements`] walks an `ExportProfilesServiceRequest`'s
//! wire format with an explicit stack (no recursion), knowing just enough
//! of the schema to find every repeated field: each entry of a repeated
//! message, string or scalar field is one element (a packed run of `n`
//! integers is `n`). [`count_json_elements`] bounds the same for JSON by
//! its structure: every value inside an array or object is preceded by a
//! `[`, `{` or `,`.
//!
//! Both are bounds, not validators: bytes they cannot parse are left to
//! the decoder, which refuses them with its own message.

/// The messages whose fields the walk descends into.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Request,
    Dictionary,
    ResourceProfiles,
    Resource,
    KeyValue,
    AnyValue,
    ArrayValue,
    KeyValueList,
    ScopeProfiles,
    Scope,
    Profile,
    Sample,
    Mapping,
    Stack,
    Location,
    KeyValueAndUnit,
    EntityRef,
    /// A group (deprecated wire type 3) of this field number: unknown to
    /// the schema, skipped by the decoder, walked to its end here.
    Group(u64),
}

/// What a field holds.
#[derive(Debug, Clone, Copy)]
enum Field {
    /// A message to descend into (one element).
    Message(Kind),
    /// A message, string or bytes not descended into (one element).
    Leaf,
    /// Repeated varints, packed or not.
    Varints,
    /// Repeated fixed64s, packed or not.
    Fixed64s,
    /// A singular scalar or string.
    Other,
}

/// Nesting followed at most (prost refuses more than 100 levels anyway).
const MAX_DEPTH: usize = 100;

fn field(kind: Kind, number: u64) -> Field {
    use Field::*;
    use Kind::*;
    match (kind, number) {
        (Request, 1) => Message(ResourceProfiles),
        (Request, 2) => Message(Dictionary),
        (Dictionary, 1) => Message(Mapping),
        (Dictionary, 2) => Message(Location),
        (Dictionary, 3 | 4 | 5) => Leaf,
        (Dictionary, 6) => Message(KeyValueAndUnit),
        (Dictionary, 7) => Message(Stack),
        (ResourceProfiles, 1) => Message(Resource),
        (ResourceProfiles, 2) => Message(ScopeProfiles),
        (Resource, 1) => Message(KeyValue),
        (Resource, 3) => Message(EntityRef),
        (EntityRef, 3 | 4) => Leaf,
        (KeyValue, 2) | (KeyValueAndUnit, 2) => Message(AnyValue),
        (AnyValue, 5) => Message(ArrayValue),
        (AnyValue, 6) => Message(KeyValueList),
        (ArrayValue, 1) => Message(AnyValue),
        (KeyValueList, 1) => Message(KeyValue),
        (ScopeProfiles, 1) => Message(Scope),
        (ScopeProfiles, 2) => Message(Profile),
        (Scope, 3) => Message(KeyValue),
        (Profile, 1 | 5) => Leaf,
        (Profile, 2) => Message(Sample),
        (Profile, 11) => Varints,
        (Sample, 2 | 4) => Varints,
        (Sample, 5) => Fixed64s,
        (Mapping, 5) => Varints,
        (Stack, 1) => Varints,
        (Location, 3) => Leaf,
        (Location, 4) => Varints,
        _ => Other,
    }
}

fn varint(bytes: &[u8], at: &mut usize) -> Option<u64> {
    let mut value = 0u64;
    for shift in (0..64).step_by(7) {
        let b = *bytes.get(*at)?;
        *at += 1;
        value |= u64::from(b & 0x7f) << shift;
        if b < 0x80 {
            return Some(value);
        }
    }
    None
}

/// Elements (entries of repeated fields, at every level) of a protobuf
/// `ExportProfilesServiceRequest`; stops counting where the bytes stop
/// making sense, and once `stop_after` is passed.
pub fn count_protobuf_elements(bytes: &[u8], stop_after: usize) -> usize {
    let mut count = 0usize;
    // (message kind, end offset of its bytes; a group's is its parent's).
    let mut stack: Vec<(Kind, usize)> = vec![(Kind::Request, bytes.len())];
    let mut at = 0usize;
    while let Some(&(kind, end)) = stack.last() {
        if count > stop_after {
            break;
        }
        if at >= end {
            stack.pop();
            continue;
        }
        let Some(tag) = varint(bytes, &mut at) else {
            break;
        };
        // Nothing inside a group is a field of ours.
        let f = match kind {
            Kind::Group(_) => Field::Other,
            _ => field(kind, tag >> 3),
        };
        match tag & 7 {
            // varint
            0 => {
                if varint(bytes, &mut at).is_none() {
                    break;
                }
                if matches!(f, Field::Varints) {
                    count += 1;
                }
            }
            // fixed64
            1 => {
                at += 8;
                if matches!(f, Field::Fixed64s) {
                    count += 1;
                }
            }
            // length-delimited
            2 => {
                let Some(len) = varint(bytes, &mut at) else {
                    break;
                };
                let Some(child_end) = usize::try_from(len)
                    .ok()
                    .and_then(|len| at.checked_add(len))
                    .filter(|&e| e <= end)
                else {
                    break;
                };
                match f {
                    Field::Message(child) => {
                        count += 1;
                        if stack.len() < MAX_DEPTH {
                            stack.push((child, child_end));
                            continue;
                        }
                    }
                    Field::Leaf => count += 1,
                    // A varint ends in each byte below 0x80.
                    Field::Varints => {
                        count += bytes[at..child_end].iter().filter(|&&b| b < 0x80).count()
                    }
                    Field::Fixed64s => count += (child_end - at) / 8,
                    Field::Other => {}
                }
                at = child_end;
            }
            // fixed32
            5 => at += 4,
            // start group: the decoder skips groups (and what follows them
            // is decoded), so they are walked, not a reason to stop.
            3 => {
                if stack.len() >= MAX_DEPTH {
                    break;
                }
                stack.push((Kind::Group(tag >> 3), end));
            }
            // end group: must close the open one (else the decoder fails).
            4 => match kind {
                Kind::Group(number) if number == tag >> 3 => {
                    stack.pop();
                }
                _ => break,
            },
            // garbage: the decoder says what.
            _ => break,
        }
    }
    count
}

/// An upper bound on the values inside arrays and objects of a JSON text:
/// the `[`, `{` and `,` outside strings.
pub fn count_json_elements(bytes: &[u8]) -> usize {
    let mut count = 0usize;
    let mut in_string = false;
    let mut escaped = false;
    for &b in bytes {
        if in_string {
            if escaped {
                escaped = false;
            } else if b == b'\\' {
                escaped = true;
            } else if b == b'"' {
                in_string = false;
            }
        } else {
            match b {
                b'"' => in_string = true,
                b'[' | b'{' | b',' => count += 1,
                _ => {}
            }
        }
    }
    count
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::collector::ExportProfilesServiceRequest;
    use crate::profiles::{
        Location, Profile, ProfilesDictionary, ResourceProfiles, Sample, ScopeProfiles, Stack,
    };
    use prost::Message;

    fn request(
        locations: usize,
        stack_depth: usize,
        samples: usize,
    ) -> ExportProfilesServiceRequest {
        ExportProfilesServiceRequest {
            dictionary: Some(ProfilesDictionary {
                location_table: vec![Location::default(); locations],
                stack_table: vec![
                    Stack::default(),
                    Stack {
                        location_indices: (0..stack_depth as i32).collect(),
                    },
                ],
                string_table: vec![String::new(), "x".into()],
                ..Default::default()
            }),
            resource_profiles: vec![ResourceProfiles {
                scope_profiles: vec![ScopeProfiles {
                    profiles: vec![Profile {
                        samples: vec![
                            Sample {
                                stack_index: 1,
                                values: vec![1, 300],
                                timestamps_unix_nano: vec![5, 6, 7],
                                ..Default::default()
                            };
                            samples
                        ],
                        ..Default::default()
                    }],
                    ..Default::default()
                }],
                ..Default::default()
            }],
        }
    }

    #[test]
    fn counts_every_repeated_entry_packed_or_not() {
        let r = request(1000, 200, 10);
        let bytes = r.encode_to_vec();
        // resource + scope + profile + 10 samples × (1 + 2 values + 3
        // timestamps) + dictionary + 1000 locations + 2 stacks + 200
        // indices + 2 strings.
        let want = 1 + 1 + 1 + 10 * 6 + 1 + 1000 + 2 + 200 + 2;
        assert_eq!(count_protobuf_elements(&bytes, usize::MAX), want);
    }

    #[test]
    fn stops_early_and_never_panics_on_garbage() {
        let bytes = request(100_000, 1, 1).encode_to_vec();
        assert!(count_protobuf_elements(&bytes, 10) <= 12);
        // Every prefix and a few corruptions: a bound, never a panic.
        for cut in (0..bytes.len()).step_by(997) {
            count_protobuf_elements(&bytes[..cut], usize::MAX);
        }
        let mut bad = bytes.clone();
        for i in (0..bad.len()).step_by(13) {
            bad[i] ^= 0xff;
        }
        count_protobuf_elements(&bad, usize::MAX);
        count_protobuf_elements(
            &[
                0x0a, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x7f,
            ],
            9,
        );
    }

    #[test]
    fn deep_attribute_values_are_walked_without_recursion() {
        fn wrap(tag: u8, content: &[u8]) -> Vec<u8> {
            let mut out = vec![tag];
            prost::encoding::encode_varint(content.len() as u64, &mut out);
            out.extend_from_slice(content);
            out
        }
        // An attribute whose value is 10,000 nested arrays:
        // AnyValue{array_value: ArrayValue{values: [AnyValue{…}]}}.
        let mut any: Vec<u8> = Vec::new();
        for _ in 0..10_000 {
            any = wrap(0x2a, &wrap(0x0a, &any));
        }
        let attribute = wrap(0x12, &any);
        let request = wrap(0x12, &wrap(0x32, &attribute));
        let n = count_protobuf_elements(&request, usize::MAX);
        assert!(
            (MAX_DEPTH - 5..=MAX_DEPTH + 5).contains(&n),
            "descended to the depth bound only: {n}"
        );
    }

    #[test]
    fn groups_are_walked_not_a_way_around_the_count() {
        // Found in review: a group in front made the walk stop at 0 while
        // prost skips it and decodes the 100,000 locations behind it.
        let mut bytes = vec![0x1b, 0x08, 0x01, 0x1c]; // group 3 { field 1 = 1 }
        bytes.extend(request(100_000, 1, 1).encode_to_vec());
        assert!(ExportProfilesServiceRequest::decode(&bytes[..]).is_ok());
        assert!(count_protobuf_elements(&bytes, usize::MAX) > 100_000);
    }

    #[test]
    fn entity_ref_keys_are_counted() {
        use crate::common::EntityRef;
        use crate::resource::Resource;
        let mut r = request(1, 1, 1);
        r.resource_profiles[0].resource = Some(Resource {
            entity_refs: vec![EntityRef {
                id_keys: vec![String::new(); 50_000],
                ..Default::default()
            }],
            ..Default::default()
        });
        assert!(count_protobuf_elements(&r.encode_to_vec(), usize::MAX) > 50_000);
    }

    #[test]
    fn json_bound_counts_structure_outside_strings() {
        assert_eq!(count_json_elements(br#"{"a":[1,2,3],"b":"[,{\"]"}"#), 5);
        assert_eq!(count_json_elements(b"[{},{},{}]"), 6);
    }
}
