//! A segment laid out by series: its samples split into parts, one per
//! (service, profile type), each an independent segment, so that a query
//! of one service reads and decodes only that service's parts (see
//! [`crate::segment::encode_parts`]).

use std::collections::BTreeMap;

use crate::model::{SegmentBuilder, SegmentData};

/// What a part holds: one service's samples of one profile type.
pub type PartKey = (String, String);

/// The segment's samples grouped into parts by (service, profile type), in
/// key order. Each part holds only the table entries its samples use.
pub fn split(data: &SegmentData) -> Vec<(PartKey, SegmentData)> {
    // Series and samples per key.
    let mut groups: BTreeMap<PartKey, (Vec<u32>, Vec<u32>)> = BTreeMap::new();
    let mut key_of: Vec<usize> = Vec::with_capacity(data.series.len());
    let mut keys: Vec<PartKey> = Vec::new();
    for (i, s) in data.series.iter().enumerate() {
        let key = (data.str(s.service).to_owned(), data.profile_type(s));
        let n = match keys.iter().position(|k| *k == key) {
            Some(n) => n,
            None => {
                keys.push(key.clone());
                keys.len() - 1
            }
        };
        key_of.push(n);
        groups.entry(key).or_default().0.push(i as u32);
    }
    let mut samples_of: Vec<Vec<u32>> = vec![Vec::new(); keys.len()];
    for (i, sample) in data.samples.iter().enumerate() {
        samples_of[key_of[sample.series as usize]].push(i as u32);
    }
    for (n, key) in keys.iter().enumerate() {
        groups.get_mut(key).expect("a group per key").1 = std::mem::take(&mut samples_of[n]);
    }
    groups
        .into_iter()
        .map(|(key, (series, samples))| {
            let mut b = SegmentBuilder::default();
            b.merge_part(data, &series, &samples);
            (key, b.finish())
        })
        .collect()
}
