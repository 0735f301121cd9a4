//! Tests of the segment format: round trips, damage, merging.
use super::*;
use crate::model::SegmentBuilder;

fn sample_data() -> SegmentData {
    let mut b = SegmentBuilder::default();
    let native = b.string("native");
    let kernel = b.string("kernel");
    let build_id = b.string("0123abcd");
    let file = b.string("/usr/bin/app");
    let m = b.mapping(Mapping {
        build_id,
        build_id_kind: BuildIdKind::Gnu,
        file,
        memory_start: 0x1000,
        memory_limit: 0x9000,
        file_offset: 0,
        content: 0,
    });
    let f1 = b.frame(Frame {
        frame_type: native,
        mapping: m,
        address: 0x1234,
        lines: vec![],
    });
    let f2 = b.frame(Frame {
        frame_type: native,
        mapping: m,
        address: 0x1100,
        lines: vec![],
    });
    let name = b.string("do_syscall_64");
    let f3 = b.frame(Frame {
        frame_type: kernel,
        mapping: 0,
        address: 0,
        lines: vec![Line {
            function: name,
            line: -1,
            ..Default::default()
        }],
    });
    let s1 = b.stack(vec![f3, f1, f2]);
    let s2 = b.stack(vec![f1, f2]);
    let service = b.string("app");
    let (samples, count, cpu, ns) = (
        b.string("samples"),
        b.string("count"),
        b.string("cpu"),
        b.string("nanoseconds"),
    );
    let (k, v) = (b.string("thread.name"), b.string("worker"));
    let labels = b.label_set(vec![(k, v)]);
    let series = b.series(Series {
        service,
        sample_type: samples,
        sample_unit: count,
        period_type: cpu,
        period_unit: ns,
        period: 50_000_000,
        labels: 0,
        start_ns: 1_000,
        end_ns: 2_000_000,
    });
    let mut link = [0u8; 24];
    link[0] = 7;
    let link = b.link(link);
    b.add_sample(Sample {
        series,
        stack: s1,
        labels,
        link,
        timestamps: vec![1_500, 1_200],
        values: vec![],
    });
    b.add_sample(Sample {
        series,
        stack: s2,
        labels: 0,
        link: 0,
        timestamps: vec![900],
        values: vec![-3],
    });
    b.add_sample(Sample {
        series,
        stack: s2,
        labels: 0,
        link: 0,
        timestamps: vec![],
        values: vec![5],
    });
    b.add_sample(Sample {
        series,
        stack: s1,
        labels,
        link,
        timestamps: vec![1_300],
        values: vec![],
    });
    b.finish()
}

/// Samples as comparable facts: (series service, stack as frame addresses
/// and names, labels, link, sorted (timestamp, value) events).
fn facts(d: &SegmentData) -> Vec<String> {
    let mut out: Vec<String> = d
        .samples
        .iter()
        .map(|s| {
            let stack: Vec<String> = d.stacks[s.stack as usize]
                .iter()
                .map(|&f| {
                    let f = &d.frames[f as usize];
                    let names: Vec<&str> = f.lines.iter().map(|l| d.str(l.function)).collect();
                    format!(
                        "{}:{:#x}:{}:{:?}",
                        d.str(f.frame_type),
                        f.address,
                        d.str(d.mappings[f.mapping as usize].build_id),
                        names
                    )
                })
                .collect();
            let labels: Vec<(&str, &str)> = d.label_sets[s.labels as usize]
                .iter()
                .map(|&(k, v)| (d.str(k), d.str(v)))
                .collect();
            let events = crate::testing::sorted_events(s);
            format!(
                "{} {stack:?} {labels:?} {:?} {events:?}",
                d.str(d.series[s.series as usize].service),
                d.links[s.link as usize]
            )
        })
        .collect();
    out.sort();
    out
}

#[test]
fn round_trip_keeps_every_fact() {
    let data = sample_data();
    assert_eq!(
        data.samples.len(),
        3,
        "same identity with timestamps merges"
    );
    let bytes = encode(&data, 3);
    let back = decode(&bytes).unwrap();
    assert_eq!(facts(&back), facts(&data));
    assert_eq!(back.points(), data.points());
    assert_eq!(back.series, data.series);
}

#[test]
fn damage_is_an_error() {
    let bytes = encode(&sample_data(), 3);
    assert!(matches!(decode(b"not a segment"), Err(SegmentError::Magic)));
    assert!(decode(&bytes[..bytes.len() - 3]).is_err());
    let mut body = Vec::new();
    encode_body(&sample_data(), &mut body, &mut Vec::new());
    for cut in 0..body.len() {
        assert!(decode_body(&body[..cut]).is_err(), "cut at {cut}");
    }
    body[0] = 0xff;
    assert!(decode_body(&body).is_err());
}

#[test]
fn mapping_contents_ride_in_an_extension() {
    // Without a content hash a segment is as it always was (no extension:
    // older decoders read it); with one the hashes come back, and merge.
    let plain = sample_data();
    let mut body = Vec::new();
    encode_body(&plain, &mut body, &mut Vec::new());
    let mut with = sample_data();
    let mut b = SegmentBuilder::default();
    b.merge(&with);
    let sha = "ab".repeat(32);
    let content = b.string(&sha);
    with = b.finish();
    with.mappings[1].content = content;
    let mut extended = Vec::new();
    encode_body(&with, &mut extended, &mut Vec::new());
    assert!(extended.len() > body.len());
    let back = decode_body(&extended).unwrap();
    assert_eq!(back.str(back.mappings[1].content), sha);
    assert_eq!(back.mappings[0].content, 0);
    let mut merged = SegmentBuilder::default();
    merged.merge(&back);
    let merged = merged.finish();
    assert!(merged.mappings.iter().any(|m| merged.str(m.content) == sha));
    // An extension this decoder does not know: damage, not a guess.
    body.push(99);
    assert!(matches!(
        decode_body(&body),
        Err(SegmentError::Corrupt("unknown extension"))
    ));
}

#[test]
fn merging_segments_sums_samples() {
    let data = sample_data();
    let mut b = SegmentBuilder::default();
    b.merge(&data);
    b.merge(&data);
    let merged = b.finish();
    assert_eq!(merged.points(), 2 * data.points());
    assert_eq!(merged.samples.len(), data.samples.len());
    let total: i64 = merged.samples.iter().map(|s| s.total()).sum();
    let once: i64 = data.samples.iter().map(|s| s.total()).sum();
    assert_eq!(total, 2 * once);
}

/// Found by the `segment_decode` fuzz target: a header claiming a 4 GiB
/// body made decoding allocate 4 GiB before inflating a stream of a few
/// bytes.
#[test]
fn a_body_length_claim_is_not_allocated_on_trust() {
    let data = SegmentBuilder::default().finish();
    let mut bytes = encode(&data, 3);
    bytes[8..12].copy_from_slice(&(u32::MAX - 1).to_le_bytes());
    match decode(&bytes) {
        Err(SegmentError::Corrupt("body length")) => {}
        other => panic!("{other:?}"),
    }
}

#[test]
fn column_sizes_account_for_every_byte_of_the_body() {
    let data = sample_data();
    let sizes = column_sizes(&data, 3);
    let names: Vec<&str> = sizes.iter().map(|c| c.name).collect();
    assert_eq!(names[0], "strings");
    assert_eq!(names.last(), Some(&"values"));
    assert!(names.contains(&"timestamps"), "{names:?}");
    let mut body = Vec::new();
    encode_body(&data, &mut body, &mut Vec::new());
    assert_eq!(sizes.iter().map(|c| c.raw).sum::<usize>(), body.len());
    let timestamps = sizes.iter().find(|c| c.name == "timestamps").unwrap();
    assert!(
        timestamps.raw > 0 && timestamps.compressed > 0,
        "{timestamps:?}"
    );
}
