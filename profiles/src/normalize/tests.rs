//! Normalization rules over bytes-built requests (no server).

use symtrace_proto::collector::ExportProfilesServiceRequest;
use symtrace_proto::common::{any_value, AnyValue, ArrayValue};
use symtrace_proto::profiles::{KeyValueAndUnit, Sample};

use super::check::SHORT_LIST;
use super::*;
use crate::model::SegmentBuilder;
use crate::testing::{self, cpu_profile, named_frames};

/// [`super::normalize`], checking on the way that by series it gives the
/// split whole.
fn normalize(
    request: ExportProfilesServiceRequest,
    now_ns: u64,
    limits: &Limits,
) -> Result<Normalized, RequestError> {
    testing::assert_by_series_is_the_split_whole(request.clone(), now_ns, limits);
    super::normalize(request, now_ns, limits)
}

/// Named frames `f0` (leaf) … `f{depth-1}`, one stack of all of them, in a
/// 1 µs profile at `time_ns`.
fn request(depth: usize, samples: Vec<Sample>, time_ns: u64) -> ExportProfilesServiceRequest {
    let mut profile = cpu_profile(time_ns, samples);
    profile.duration_nano = 1_000;
    testing::request(None, vec![profile], named_frames(depth))
}

fn valued(values: Vec<i64>) -> Sample {
    Sample {
        stack_index: 1,
        values,
        ..Default::default()
    }
}

fn names(data: &SegmentData, stack: u32) -> Vec<&str> {
    data.stacks[stack as usize]
        .iter()
        .map(|&f| data.str(data.frames[f as usize].lines[0].function))
        .collect()
}

#[test]
fn deep_stacks_keep_their_leaf_most_frames_and_a_marker() {
    let limits = Limits {
        max_stack_depth: 10,
        ..Limits::default()
    };
    let out = normalize(request(25, vec![valued(vec![3])], 1), 0, &limits).unwrap();
    assert_eq!(out.accepted, 1);
    assert_eq!(out.truncated_stacks, 1);
    let stack = out.data.samples[0].stack;
    let got = names(&out.data, stack);
    assert_eq!(got.len(), 11);
    assert_eq!(
        got[..10],
        ["f0", "f1", "f2", "f3", "f4", "f5", "f6", "f7", "f8", "f9"]
    );
    assert_eq!(
        got[10],
        "[truncated: 15 root-most frames beyond the 10 kept]"
    );
    let marker = &out.data.frames[*out.data.stacks[stack as usize].last().unwrap() as usize];
    assert_eq!(out.data.str(marker.frame_type), TRUNCATED_FRAME_TYPE);
    // At the limit: untouched.
    let out = normalize(request(10, vec![valued(vec![3])], 1), 0, &limits).unwrap();
    assert_eq!(out.truncated_stacks, 0);
    assert_eq!(names(&out.data, out.data.samples[0].stack).len(), 10);
}

#[test]
fn repeated_keys_are_found_in_long_and_short_lists() {
    for n in [3usize, SHORT_LIST, SHORT_LIST + 1, 5_000] {
        let mut r = request(1, vec![], 1);
        let dict = r.dictionary.as_mut().unwrap();
        let first = dict.string_table.len() as i32;
        dict.string_table.extend((0..n).map(|i| format!("k{i}")));
        for i in 0..n {
            dict.attribute_table.push(KeyValueAndUnit {
                key_strindex: first + i as i32,
                value: Some(AnyValue {
                    value: Some(any_value::Value::IntValue(1)),
                }),
                unit_strindex: 0,
            });
        }
        let all: Vec<i32> = (1..=n as i32).collect();
        let profiles = &mut r.resource_profiles[0].scope_profiles[0].profiles;
        let mut ok = valued(vec![1]);
        ok.attribute_indices = all.clone();
        let mut repeated = valued(vec![1]);
        // The last key again, far from its first use.
        repeated.attribute_indices = std::iter::once(n as i32).chain(all).collect();
        profiles[0].samples = vec![ok];
        let mut bad = profiles[0].clone();
        bad.samples = vec![repeated];
        profiles.push(bad);
        let out = normalize(r, 0, &Limits::default()).unwrap();
        assert_eq!((out.accepted, out.rejected), (1, 1), "n = {n}");
        let key = format!("repeat the key \"k{}\"", n - 1);
        assert!(out.errors[0].contains(&key), "n = {n}: {:?}", out.errors);
    }
}

#[test]
fn attribute_values_nested_too_deep_are_refused() {
    let mut value = AnyValue {
        value: Some(any_value::Value::IntValue(1)),
    };
    // Prost's decoder refuses more than 100 nested messages, two per level
    // here (AnyValue, ArrayValue), so no request nests deeper than ~48;
    // 40 is more than the 16 accepted.
    for _ in 0..40 {
        value = AnyValue {
            value: Some(any_value::Value::ArrayValue(ArrayValue {
                values: vec![value],
            })),
        };
    }
    let mut r = request(1, vec![], 1);
    let dict = r.dictionary.as_mut().unwrap();
    dict.string_table.push("deep".into());
    dict.attribute_table.push(KeyValueAndUnit {
        key_strindex: dict.string_table.len() as i32 - 1,
        value: Some(value),
        unit_strindex: 0,
    });
    let mut sample = valued(vec![1]);
    sample.attribute_indices = vec![1];
    r.resource_profiles[0].scope_profiles[0].profiles[0].samples = vec![sample];
    let out = normalize(r, 0, &Limits::default()).unwrap();
    assert_eq!(out.rejected, 1);
    assert!(
        out.errors[0].contains("more than 16 deep"),
        "{:?}",
        out.errors
    );
}

#[test]
fn value_only_samples_keep_their_profile_range_through_merges() {
    let a = normalize(
        request(2, vec![valued(vec![100])], 1_000),
        0,
        &Limits::default(),
    )
    .unwrap();
    let b = normalize(
        request(2, vec![valued(vec![7])], 36_000),
        0,
        &Limits::default(),
    )
    .unwrap();
    let mut timed_sample = valued(vec![5]);
    timed_sample.timestamps_unix_nano = vec![50_000];
    let c = normalize(
        request(2, vec![timed_sample], 40_000),
        0,
        &Limits::default(),
    )
    .unwrap();
    let mut merged = SegmentBuilder::default();
    for d in [&a.data, &b.data, &c.data] {
        merged.merge(d);
    }
    let merged = merged.finish();
    // Each value-only sample under a series of its own export's range.
    let ranges: Vec<(u64, u64, i64)> = merged
        .samples
        .iter()
        .filter(|s| s.timestamps.is_empty())
        .map(|s| {
            let se = &merged.series[s.series as usize];
            (se.start_ns, se.end_ns, s.total())
        })
        .collect();
    assert_eq!(ranges, [(1_000, 2_000, 100), (36_000, 37_000, 7)]);
    // The timestamped one under a series that covers its timestamps.
    let timed = merged
        .samples
        .iter()
        .find(|s| !s.timestamps.is_empty())
        .unwrap();
    let se = &merged.series[timed.series as usize];
    assert!(se.start_ns <= 50_000 && 50_000 < se.end_ns, "{se:?}");
    // Merging again (a second compaction) changes nothing.
    let mut again = SegmentBuilder::default();
    again.merge(&merged);
    assert_eq!(again.finish(), merged);
}

#[test]
fn by_series_each_part_holds_one_service_and_type_and_only_what_it_uses() {
    // Three resources, two of them the same service, the dictionary's
    // stack shared by all (and cut to the depth limit once).
    let limits = Limits {
        max_stack_depth: 3,
        ..Limits::default()
    };
    let mut r = request(6, vec![valued(vec![3])], 1);
    let mut resource = r.resource_profiles[0].clone();
    let with_service = |res: &mut symtrace_proto::profiles::ResourceProfiles, name: &str| {
        res.resource = Some(symtrace_proto::resource::Resource {
            attributes: vec![symtrace_proto::common::KeyValue {
                key: "service.name".into(),
                value: Some(AnyValue {
                    value: Some(any_value::Value::StringValue(name.into())),
                }),
                ..Default::default()
            }],
            ..Default::default()
        });
    };
    with_service(&mut r.resource_profiles[0], "b");
    with_service(&mut resource, "a");
    r.resource_profiles.push(resource);
    let again = r.resource_profiles[0].clone();
    r.resource_profiles.push(again);
    testing::assert_by_series_is_the_split_whole(r.clone(), 0, &limits);
    let out = normalize_by_series(r, 0, &limits).unwrap();
    assert_eq!((out.accepted, out.truncated_stacks), (3, 1));
    let keys: Vec<&str> = out.data.iter().map(|(k, _)| k.0.as_str()).collect();
    assert_eq!(keys, ["a", "b"]);
    let (_, b) = &out.data[1];
    assert_eq!(b.points(), 2, "both of b's profiles");
    assert_eq!(b.samples.len(), 1, "merged: the same identity");
    assert_eq!(b.samples[0].values, [3, 3]);
    // Only what the part uses: 3 kept frames and the marker, no mapping.
    assert_eq!(b.frames.len(), 4);
    assert_eq!(b.mappings.len(), 1);
    for (key, part) in &out.data {
        assert!(part.series.iter().all(|s| part.str(s.service) == key.0));
        assert_eq!(part.profile_type(&part.series[0]), key.1);
    }
}

#[test]
fn a_long_resource_label_is_kept_once_however_many_profiles_share_it() {
    // 5,000 profiles under one resource with a 4 MB attribute: a copy of
    // the label per profile would need 20 GB.
    let blob = "a".repeat(4 << 20);
    let profiles = (0..5_000u64)
        .map(|i| {
            let mut p = cpu_profile(1_000 + i, vec![valued(vec![1])]);
            p.duration_nano = 1_000;
            p
        })
        .collect();
    let mut r = testing::request(Some("svc"), profiles, named_frames(2));
    let resource = r.resource_profiles[0].resource.as_mut().unwrap();
    resource.attributes.push(symtrace_proto::common::KeyValue {
        key: "blob".into(),
        value: Some(AnyValue {
            value: Some(any_value::Value::StringValue(blob.clone())),
        }),
        ..Default::default()
    });
    let limits = Limits {
        max_label_value_bytes: 8 << 20,
        ..Limits::default()
    };
    let out = normalize_by_series(r.clone(), 0, &limits).unwrap();
    assert_eq!(out.accepted, 5_000);
    assert_eq!(out.data.len(), 1);
    let (_, part) = &out.data[0];
    assert_eq!(part.points(), 5_000);
    assert_eq!(part.strings.iter().filter(|s| **s == blob).count(), 1);
    let whole = super::normalize(r, 0, &limits).unwrap();
    assert_eq!(whole.data.points(), 5_000);
}

#[test]
fn label_values_beyond_the_limit_are_cut_at_a_character_boundary_and_counted() {
    let limits = Limits {
        max_label_value_bytes: 40,
        ..Limits::default()
    };
    let with_label = |value: &str| {
        let mut r = testing::request(
            Some("svc"),
            vec![cpu_profile(1_000, vec![valued(vec![1])])],
            named_frames(1),
        );
        r.resource_profiles[0]
            .resource
            .as_mut()
            .unwrap()
            .attributes
            .push(symtrace_proto::common::KeyValue {
                key: "long".into(),
                value: Some(AnyValue {
                    value: Some(any_value::Value::StringValue(value.into())),
                }),
                ..Default::default()
            });
        r
    };
    // 25 ASCII bytes, then 3-byte characters past the limit: 40 bytes kept
    // at most, the cut before the character that crosses byte 26.
    let out = normalize(
        with_label(&format!("{}{}", "x".repeat(25), "€".repeat(6))),
        0,
        &limits,
    )
    .unwrap();
    assert_eq!((out.accepted, out.truncated_labels), (1, 1));
    let cut = format!("{}{TRUNCATED_LABEL_SUFFIX}", "x".repeat(25));
    assert!(out.data.strings.contains(&cut), "{:?}", out.data.strings);
    assert!(cut.len() <= 40);
    // At the limit: kept whole, not counted.
    let whole = format!("{}€", "x".repeat(37));
    let out = normalize(with_label(&whole), 0, &limits).unwrap();
    assert_eq!(out.truncated_labels, 0);
    assert!(out.data.strings.contains(&whole));
    // Nested arrays of quotes (their JSON doubles at each level) are
    // rendered within the limit, not to gigabytes first.
    let mut value = AnyValue {
        value: Some(any_value::Value::StringValue("\"".repeat(1 << 20))),
    };
    for _ in 0..16 {
        value = AnyValue {
            value: Some(any_value::Value::ArrayValue(ArrayValue {
                values: vec![value],
            })),
        };
    }
    let mut r = with_label("");
    r.resource_profiles[0].resource.as_mut().unwrap().attributes[1].value = Some(value);
    let out = normalize(r, 0, &limits).unwrap();
    assert_eq!((out.accepted, out.truncated_labels), (1, 1));
}

#[test]
fn a_label_shared_by_many_series_is_bounded_by_the_text_limit() {
    // 300 series sharing a 1 MB label would be 300 MB of parts.
    let r = testing::many_types_request("svc", 1, 1 << 20, 300, 1_000);
    let limits = Limits {
        max_label_value_bytes: 2 << 20,
        max_text_bytes: 64 << 20,
        ..Limits::default()
    };
    let err = normalize_by_series(r.clone(), 0, &limits)
        .err()
        .expect("refused");
    assert!(matches!(err, RequestError::TooLarge(_)), "{err}");
    assert!(
        err.to_string().contains("SYMTRACE_MAX_EXPORT_TEXT_BYTES"),
        "{err}"
    );
    // With the default label value limit the same request fits (each part
    // keeps 16 KiB of it).
    let out = normalize_by_series(
        r,
        0,
        &Limits {
            max_text_bytes: 64 << 20,
            ..Limits::default()
        },
    )
    .unwrap();
    assert_eq!((out.accepted, out.data.len()), (300, 300));
    let text: usize = out
        .data
        .iter()
        .flat_map(|(_, p)| &p.strings)
        .map(String::len)
        .sum();
    assert!(text < 300 * (17 << 10), "{text}");
}

#[test]
fn requests_of_more_series_than_the_limit_are_refused_in_either_layout() {
    let limits = Limits {
        max_series: 20,
        ..Limits::default()
    };
    let fits = testing::many_types_request("svc", 1, 1, 20, 1_000);
    assert_eq!(normalize(fits, 0, &limits).unwrap().accepted, 20);
    let over = testing::many_types_request("svc", 1, 1, 21, 1_000);
    for err in [
        super::normalize(over.clone(), 0, &limits).err(),
        normalize_by_series(over, 0, &limits).err(),
    ] {
        let err = err.expect("refused");
        assert!(matches!(err, RequestError::TooLarge(_)), "{err}");
        assert!(err.to_string().contains("more than 20 series"), "{err}");
    }
}

#[test]
fn series_are_counted_by_their_text() {
    // Five resources of one service and one type: one series, one part.
    let limits = Limits {
        max_series: 1,
        ..Limits::default()
    };
    let mut r = testing::many_types_request("svc", 0, 0, 1, 1_000);
    let one = r.resource_profiles[0].clone();
    r.resource_profiles.extend(std::iter::repeat_n(one, 4));
    let out = normalize_by_series(r, 0, &limits).unwrap();
    assert_eq!((out.accepted, out.data.len()), (5, 1));
}

#[test]
fn labels_that_render_past_the_text_budget_refuse_the_request() {
    // 300 resources whose label points at one 1 MB string: 300 MB of label
    // text from a 1 MB request.
    let limits = Limits {
        max_label_value_bytes: 2 << 20,
        max_text_bytes: 64 << 20,
        ..Limits::default()
    };
    let mut r = testing::many_types_request("svc", 0, 0, 1, 1_000);
    let dict = r.dictionary.as_mut().unwrap();
    dict.string_table.push("y".repeat(1 << 20));
    let big = dict.string_table.len() as i32 - 1;
    let one = r.resource_profiles[0].clone();
    r.resource_profiles = (0..300)
        .map(|i| {
            let mut res = one.clone();
            res.resource
                .as_mut()
                .unwrap()
                .attributes
                .push(symtrace_proto::common::KeyValue {
                    key: format!("note{i}"),
                    value: Some(AnyValue {
                        value: Some(any_value::Value::StringValueStrindex(big)),
                    }),
                    ..Default::default()
                });
            res
        })
        .collect();
    for err in [
        super::normalize(r.clone(), 0, &limits).err(),
        normalize_by_series(r, 0, &limits).err(),
    ] {
        let err = err.expect("refused");
        assert!(matches!(err, RequestError::TooLarge(_)), "{err}");
        assert!(
            err.to_string().contains("SYMTRACE_MAX_EXPORT_TEXT_BYTES"),
            "{err}"
        );
    }
}

#[test]
fn stacks_copied_into_many_series_are_bounded() {
    // Each of 20 series copies the 3 frames and 3 stack entries it uses.
    let r = testing::many_types_request("svc", 0, 0, 20, 1_000);
    let limits = |max_elements| Limits {
        max_elements,
        ..Limits::default()
    };
    assert!(normalize_by_series(r.clone(), 0, &limits(120)).is_ok());
    let err = normalize_by_series(r, 0, &limits(119))
        .err()
        .expect("refused");
    assert!(matches!(err, RequestError::TooLarge(_)), "{err}");
    assert!(
        err.to_string().contains("SYMTRACE_MAX_EXPORT_ELEMENTS"),
        "{err}"
    );
}
