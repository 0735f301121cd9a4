//! Properties over generated inputs (proptest): a segment decodes to what
//! was encoded, and a query's tree does not depend on how the samples were
//! split into exports or merged by compaction.

use std::collections::BTreeMap;

use proptest::prelude::*;
use symtrace_proto::profiles::{
    Function, KeyValueAndUnit, Line as OtlpLine, Location, ProfilesDictionary,
    Sample as OtlpSample, Stack,
};

use crate::aggregate::Aggregate;
use crate::answer::DEFAULT_TYPE;
use crate::frame_table::FrameTable;
use crate::model::{
    BuildIdKind, Frame, Line, Mapping, Sample, SegmentBuilder, SegmentData, Series,
};
use crate::normalize::{normalize, Limits};
use crate::render;
use crate::resolved::Resolved;
use crate::segment;
use crate::selection::Selection;
use crate::testing::{self, facts};
use crate::tree::{Expanded, Tree};

const T0: u64 = 1_700_000_000_000_000_000;

// ---- segments --------------------------------------------------------

/// A frame: (type, mapping, address, lines as (function, line)).
type FrameSpec = (u8, u8, u64, Vec<(u8, i64)>);
/// A sample: (series, stack, label value, link, timestamps, values?).
type SampleSpec = (u8, u8, u8, u8, Vec<u32>, bool);

fn word(i: u8) -> String {
    format!("w{}", i % 12)
}

fn build(frames: &[FrameSpec], stacks: &[Vec<u8>], samples: &[SampleSpec]) -> SegmentData {
    let mut b = SegmentBuilder::default();
    let kinds = ["native", "kernel", "cpython", "go"].map(|k| b.string(k));
    let mappings: Vec<u32> = (0..3u8)
        .map(|m| {
            let build_id = b.string(&format!("{m:02x}ab"));
            let file = b.string(&format!("/lib/m{m}.so"));
            // One mapping carries its content hash (a segment extension).
            let content = if m == 1 {
                b.string(&"c1".repeat(32))
            } else {
                0
            };
            b.mapping(Mapping {
                build_id,
                build_id_kind: BuildIdKind::from_u8(m % 4).unwrap(),
                file,
                memory_start: 0x1000 * m as u64,
                memory_limit: 0x1000 * m as u64 + 0x800,
                file_offset: m as u64,
                content,
            })
        })
        .collect();
    let frame_ids: Vec<u32> = frames
        .iter()
        .map(|(kind, mapping, address, lines)| {
            let lines = lines
                .iter()
                .map(|&(f, line)| Line {
                    function: b.string(&word(f)),
                    system_name: 0,
                    file: b.string("src.c"),
                    line,
                    column: 0,
                })
                .collect();
            b.frame(Frame {
                frame_type: kinds[*kind as usize % 4],
                mapping: mappings[*mapping as usize % 3],
                address: *address,
                lines,
            })
        })
        .collect();
    let stack_ids: Vec<u32> = stacks
        .iter()
        .map(|s| {
            b.stack(
                s.iter()
                    .map(|&f| frame_ids[f as usize % frame_ids.len()])
                    .collect(),
            )
        })
        .collect();
    let service = b.string("svc");
    let type_strings = ["samples", "count", "cpu", "nanoseconds"].map(|s| b.string(s));
    let key = b.string("thread");
    for (series, stack, label, link, timestamps, valued) in samples {
        let value = b.string(&word(*label));
        let labels = b.label_set(vec![(key, value)]);
        let s = Series {
            service,
            sample_type: type_strings[0],
            sample_unit: type_strings[1],
            period_type: type_strings[2],
            period_unit: type_strings[3],
            period: 10_000_000 * (*series as i64 % 2 + 1),
            labels: 0,
            start_ns: T0,
            end_ns: T0 + 1_000_000_000,
        };
        let series = if timestamps.is_empty() {
            b.series_exact(s)
        } else {
            b.series(s)
        };
        let link = if link % 3 == 0 {
            0
        } else {
            let mut l = [0u8; 24];
            l[0] = *link;
            l[16] = 1;
            b.link(l)
        };
        let timestamps: Vec<u64> = timestamps.iter().map(|&t| T0 + t as u64).collect();
        let values = if *valued || timestamps.is_empty() {
            (0..timestamps.len().max(1)).map(|i| i as i64 + 1).collect()
        } else {
            Vec::new()
        };
        b.add_sample(Sample {
            series,
            stack: stack_ids[*stack as usize % stack_ids.len()],
            labels,
            link,
            timestamps,
            values,
        });
    }
    b.finish()
}

fn frame_spec() -> impl Strategy<Value = FrameSpec> {
    (
        any::<u8>(),
        any::<u8>(),
        any::<u64>(),
        prop::collection::vec((any::<u8>(), -5i64..100_000), 0..3),
    )
}

fn sample_spec() -> impl Strategy<Value = SampleSpec> {
    (
        any::<u8>(),
        any::<u8>(),
        any::<u8>(),
        any::<u8>(),
        prop::collection::vec(0u32..1_000_000_000, 0..4),
        any::<bool>(),
    )
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    #[test]
    fn segments_decode_to_what_was_encoded(
        frames in prop::collection::vec(frame_spec(), 1..12),
        stacks in prop::collection::vec(prop::collection::vec(any::<u8>(), 0..8), 1..8),
        samples in prop::collection::vec(sample_spec(), 0..24),
        level in 1i32..6,
    ) {
        let data = build(&frames, &stacks, &samples);
        let bytes = segment::encode(&data, level);
        let decoded = segment::decode(&bytes).expect("decodes");
        // The format renumbers stacks and orders samples and their events;
        // every fact is kept.
        prop_assert_eq!(facts(&decoded), facts(&data));
        // And again: the encoding is a function of the content.
        prop_assert_eq!(segment::encode(&decoded, level), bytes);
    }

    #[test]
    fn segments_split_by_series_keep_every_fact(
        frames in prop::collection::vec(frame_spec(), 1..12),
        stacks in prop::collection::vec(prop::collection::vec(any::<u8>(), 0..8), 1..8),
        samples in prop::collection::vec(sample_spec(), 0..24),
        services in 1u8..4,
    ) {
        let mut data = build(&frames, &stacks, &samples);
        // Spread the samples over `services` services.
        let names: Vec<u32> = (0..services)
            .map(|i| {
                data.strings.push(format!("svc{i}"));
                (data.strings.len() - 1) as u32
            })
            .collect();
        for (i, s) in data.series.iter_mut().enumerate() {
            s.service = names[i % names.len()];
        }
        let parts = crate::parts::split(data.clone());
        for ((service, ty), part) in &parts {
            // A part's label sets are sorted by key in its own numbering.
            for set in &part.label_sets {
                prop_assert!(set.windows(2).all(|w| w[0].0 < w[1].0), "{:?}", set);
            }
            for s in &part.series {
                prop_assert_eq!(part.str(s.service), service.as_str());
                prop_assert_eq!(&part.profile_type(s), ty);
            }
        }
        let datas: Vec<SegmentData> = parts.into_iter().map(|(_, p)| p).collect();
        let (bytes, ranges) = segment::encode_parts(&datas, 1);
        prop_assert_eq!(segment::part_ranges(&bytes).unwrap(), ranges.clone());
        // Each part alone, by its range, as a query reads it.
        for (range, part) in ranges.iter().zip(&datas) {
            let alone = segment::decode(&bytes[range.start as usize..range.end as usize]).unwrap();
            prop_assert_eq!(facts(&alone), facts(part));
        }
        let merged = segment::decode(&bytes).unwrap();
        prop_assert_eq!(facts(&merged), facts(&data));
        // A damaged container is an error, never a panic.
        for cut in [1usize, 9, 13, bytes.len() / 2] {
            if cut < bytes.len() {
                let _ = segment::decode(&bytes[..bytes.len() - cut]);
            }
        }
    }
}

// ---- aggregation -----------------------------------------------------

/// Eight named functions `g0` … `g7` (locations 1–8) and `stacks` over
/// them (stack `i + 1` is `stacks[i]`, leaf first).
fn dictionary(stacks: &[Vec<u8>]) -> ProfilesDictionary {
    ProfilesDictionary {
        string_table: testing::strings((0..8).map(|i| format!("g{i}")).chain([
            "thread".to_owned(),
            "a".to_owned(),
            "b".to_owned(),
        ])),
        function_table: std::iter::once(Function::default())
            .chain((0..8).map(|i| Function {
                name_strindex: 5 + i,
                ..Default::default()
            }))
            .collect(),
        location_table: std::iter::once(Location::default())
            .chain((0..8).map(|i| Location {
                lines: vec![OtlpLine {
                    function_index: 1 + i,
                    ..Default::default()
                }],
                ..Default::default()
            }))
            .collect(),
        stack_table: std::iter::once(Stack::default())
            .chain(stacks.iter().map(|s| Stack {
                location_indices: s.iter().map(|&l| 1 + (l % 8) as i32).collect(),
            }))
            .collect(),
        attribute_table: vec![
            KeyValueAndUnit::default(),
            KeyValueAndUnit {
                key_strindex: 13,
                value: Some(symtrace_proto::common::AnyValue {
                    value: Some(symtrace_proto::common::any_value::Value::StringValueStrindex(14)),
                }),
                unit_strindex: 0,
            },
            KeyValueAndUnit {
                key_strindex: 13,
                value: Some(symtrace_proto::common::AnyValue {
                    value: Some(symtrace_proto::common::any_value::Value::StringValueStrindex(15)),
                }),
                unit_strindex: 0,
            },
        ],
        ..Default::default()
    }
}

/// (stack, thread a or b, timestamp offset in ms, value or none).
type Event = (u8, bool, u16, Option<u8>);

/// The events as one export's segment.
fn export(stacks: &[Vec<u8>], events: &[Event]) -> SegmentData {
    let samples = events
        .iter()
        .map(|&(stack, b, ms, value)| OtlpSample {
            stack_index: 1 + (stack as usize % stacks.len()) as i32,
            attribute_indices: vec![1 + b as i32],
            timestamps_unix_nano: vec![T0 + ms as u64 * 1_000_000],
            values: value.map(|v| vec![v as i64]).unwrap_or_default(),
            ..Default::default()
        })
        .collect();
    let request = testing::request(
        Some("svc"),
        vec![testing::cpu_profile(T0, samples)],
        dictionary(stacks),
    );
    let now = T0 + 10_000_000_000;
    testing::assert_by_series_is_the_split_whole(request.clone(), now, &Limits::default());
    let out = normalize(request, now, &Limits::default()).expect("usable");
    assert_eq!(out.rejected, 0, "{:?}", out.errors);
    // Through the segment format, as a query reads it.
    segment::decode(&segment::encode(&out.data, 1)).expect("decodes")
}

/// The flamegraph of `segments` as path of names → (total, self), and the
/// folded text.
fn flamegraph(
    segments: &[SegmentData],
    selector: &str,
) -> (BTreeMap<Vec<String>, (i64, i64)>, String) {
    let table = FrameTable::default();
    let sel = Selection {
        tenant: "t".into(),
        from_ns: 0,
        to_ns: i64::MAX,
        selector: crate::selector::Selector::parse(selector).unwrap(),
        ..Default::default()
    };
    let mut agg = Aggregate::default();
    for data in segments {
        let frames = table.map(data);
        agg.add_segment(data, &frames, &sel, 0).unwrap();
    }
    agg.choose_type(None, DEFAULT_TYPE).unwrap();
    agg.finish(&table).unwrap();
    let resolved = Resolved::build(&mut agg, Vec::new());
    let expanded = Expanded::new(&agg, &resolved);
    let tree = Tree::build(&expanded, 100_000);
    let mut paths = BTreeMap::new();
    let mut stack = vec![(0u32, Vec::<String>::new())];
    while let Some((i, path)) = stack.pop() {
        let node = &tree.nodes[i as usize];
        paths.insert(path.clone(), (node.total[0], node.self_[0]));
        for &c in tree.children(i) {
            let mut p = path.clone();
            let frame = tree.nodes[c as usize].frame;
            p.push(agg.str(resolved.shown[frame as usize].name).to_owned());
            stack.push((c, p));
        }
    }
    let folded = render::folded(&expanded, &agg, &resolved, 0);
    (paths, folded)
}

fn event() -> impl Strategy<Value = Event> {
    (
        any::<u8>(),
        any::<bool>(),
        0u16..10_000,
        prop::option::of(1u8..50),
    )
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(48))]

    #[test]
    fn any_split_of_the_exports_gives_the_same_tree(
        stacks in prop::collection::vec(prop::collection::vec(any::<u8>(), 1..6), 1..6),
        events in prop::collection::vec(event(), 1..40),
        cuts in prop::collection::vec(any::<prop::sample::Index>(), 0..4),
    ) {
        let whole = [export(&stacks, &events)];
        let mut cuts: Vec<usize> = cuts.iter().map(|c| c.index(events.len() + 1)).collect();
        cuts.extend([0, events.len()]);
        cuts.sort_unstable();
        let parts: Vec<SegmentData> = cuts
            .windows(2)
            .filter(|w| w[0] < w[1])
            .map(|w| export(&stacks, &events[w[0]..w[1]]))
            .collect();
        // Compaction: the parts merged into one segment.
        let mut merged = SegmentBuilder::default();
        for p in &parts {
            merged.merge(p);
        }
        let merged = [merged.finish()];
        let expected = flamegraph(&whole, "");
        let total: i64 = events.iter().map(|e| e.3.map_or(1, i64::from)).sum();
        prop_assert_eq!(expected.0[&Vec::new()].0, total, "the root holds every event");
        prop_assert_eq!(&flamegraph(&parts, ""), &expected);
        prop_assert_eq!(&flamegraph(&merged, ""), &expected);
        // A label selector selects the same from every layout.
        let only_a = flamegraph(&whole, "{thread=\"a\"}");
        prop_assert_eq!(&flamegraph(&parts, "{thread=\"a\"}"), &only_a);
        prop_assert_eq!(&flamegraph(&merged, "{thread=\"a\"}"), &only_a);
    }
}
