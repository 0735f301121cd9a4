//! A segment laid out by series: its samples split into parts, one per
//! (service, profile type), each an independent segment, so that a query
//! of one service reads and decodes only that service's parts (see
//! [`crate::segment::encode_parts`]).
//!
//! Splitting runs on every export at ingest, so it copies rather than
//! interns: the segment's tables are already deduplicated, so the entries
//! one part uses are too, and each is copied once through an index map
//! (no hashing of frames, stacks or strings).

use rustc_hash::FxHashMap as HashMap;

use crate::memo::Memo;

use crate::model::{Frame, Line, Mapping, Sample, SegmentBuilder, SegmentData, Series};

/// What a part holds: one service's samples of one profile type.
pub type PartKey = (String, String);

/// The segment's samples grouped into parts by (service, profile type), in
/// key order. Each part holds only the table entries its samples use; the
/// samples' timestamps and values move into their part.
pub fn split(mut data: SegmentData) -> Vec<(PartKey, SegmentData)> {
    // The part of each series, and each part's series and samples.
    let mut part_of_key: HashMap<PartKey, usize> = HashMap::default();
    let mut keys: Vec<PartKey> = Vec::new();
    let mut part_of_series: Vec<usize> = Vec::with_capacity(data.series.len());
    for s in &data.series {
        let key = (data.str(s.service).to_owned(), data.profile_type(s));
        let n = *part_of_key.entry(key).or_insert_with_key(|key| {
            keys.push(key.clone());
            keys.len() - 1
        });
        part_of_series.push(n);
    }
    let mut series_of: Vec<Vec<u32>> = vec![Vec::new(); keys.len()];
    for (i, &n) in part_of_series.iter().enumerate() {
        series_of[n].push(i as u32);
    }
    let mut samples_of: Vec<Vec<u32>> = vec![Vec::new(); keys.len()];
    for (i, sample) in data.samples.iter().enumerate() {
        samples_of[part_of_series[sample.series as usize]].push(i as u32);
    }
    let mut order: Vec<usize> = (0..keys.len()).collect();
    order.sort_unstable_by(|&a, &b| keys[a].cmp(&keys[b]));

    let mut samples = std::mem::take(&mut data.samples);
    let mut copy = Copier::new(&data);
    order
        .into_iter()
        .map(|n| {
            let part = copy.part(&series_of[n], &samples_of[n], &mut samples);
            (std::mem::take(&mut keys[n]), part)
        })
        .collect()
}

/// An index map per table, from the segment's numbering to the part's,
/// reset between parts.
struct Copier<'a> {
    data: &'a SegmentData,
    strings: Memo<u32>,
    mappings: Memo<u32>,
    frames: Memo<u32>,
    stacks: Memo<u32>,
    label_sets: Memo<u32>,
    links: Memo<u32>,
}

impl<'a> Copier<'a> {
    fn new(data: &'a SegmentData) -> Self {
        let mut copier = Self {
            data,
            strings: Memo::new(data.strings.len()),
            mappings: Memo::new(data.mappings.len()),
            frames: Memo::new(data.frames.len()),
            stacks: Memo::new(data.stacks.len()),
            label_sets: Memo::new(data.label_sets.len()),
            links: Memo::new(data.links.len()),
        };
        copier.reset();
        copier
    }

    /// Forgets the last part's numbering; index 0 of every table but
    /// frames is the zero value, already in every part.
    fn reset(&mut self) {
        self.frames.reset();
        let d = self.data;
        for (memo, len) in [
            (&mut self.strings, d.strings.len()),
            (&mut self.mappings, d.mappings.len()),
            (&mut self.stacks, d.stacks.len()),
            (&mut self.label_sets, d.label_sets.len()),
            (&mut self.links, d.links.len()),
        ] {
            memo.reset();
            if len > 0 {
                memo.set(0, 0);
            }
        }
    }

    /// One part: the series `series` (some may have no samples) and the
    /// samples `samples`, taken out of `all`.
    fn part(&mut self, series: &[u32], samples: &[u32], all: &mut [Sample]) -> SegmentData {
        let mut out = SegmentData::default();
        // Series and samples go through a builder: it keeps a series of
        // value-only samples apart from the timestamped one of the same
        // properties, as the whole segment's builder did.
        let mut b = SegmentBuilder::default();
        let data = self.data;
        let mut targets: HashMap<(u32, bool), u32> = HashMap::default();
        for &i in samples {
            let sample = &all[i as usize];
            let exact = sample.timestamps.is_empty();
            if let std::collections::hash_map::Entry::Vacant(slot) =
                targets.entry((sample.series, exact))
            {
                let se = self.series(&mut out, &data.series[sample.series as usize]);
                slot.insert(if exact {
                    b.series_exact(se)
                } else {
                    b.series(se)
                });
            }
        }
        for &i in series {
            if !targets.contains_key(&(i, false)) && !targets.contains_key(&(i, true)) {
                let se = self.series(&mut out, &data.series[i as usize]);
                targets.insert((i, false), b.series(se));
            }
        }
        for &i in samples {
            let sample = std::mem::take(&mut all[i as usize]);
            let series = targets[&(sample.series, sample.timestamps.is_empty())];
            b.add_sample(Sample {
                series,
                stack: self.stack(&mut out, sample.stack),
                labels: self.label_set(&mut out, sample.labels),
                link: self.link(&mut out, sample.link),
                ..sample
            });
        }
        let built = b.finish();
        out.series = built.series;
        out.samples = built.samples;
        self.reset();
        out
    }

    fn string(&mut self, out: &mut SegmentData, i: u32) -> u32 {
        self.strings
            .get_or_assign(i, out.strings.len())
            .unwrap_or_else(|| {
                out.strings.push(self.data.strings[i as usize].clone());
                (out.strings.len() - 1) as u32
            })
    }

    fn mapping(&mut self, out: &mut SegmentData, i: u32) -> u32 {
        if let Some(n) = self.mappings.get_or_assign(i, out.mappings.len()) {
            return n;
        }
        let m = &self.data.mappings[i as usize];
        let mapped = Mapping {
            build_id: self.string(out, m.build_id),
            file: self.string(out, m.file),
            content: self.string(out, m.content),
            ..m.clone()
        };
        out.mappings.push(mapped);
        (out.mappings.len() - 1) as u32
    }

    fn frame(&mut self, out: &mut SegmentData, i: u32) -> u32 {
        if let Some(n) = self.frames.get_or_assign(i, out.frames.len()) {
            return n;
        }
        // Numbered `out.frames.len()`: copying its strings and mapping adds
        // no frame, so it is pushed last.
        let f = &self.data.frames[i as usize];
        let lines = f
            .lines
            .iter()
            .map(|l| Line {
                function: self.string(out, l.function),
                system_name: self.string(out, l.system_name),
                file: self.string(out, l.file),
                ..l.clone()
            })
            .collect();
        let mapped = Frame {
            frame_type: self.string(out, f.frame_type),
            mapping: self.mapping(out, f.mapping),
            address: f.address,
            lines,
        };
        out.frames.push(mapped);
        (out.frames.len() - 1) as u32
    }

    fn stack(&mut self, out: &mut SegmentData, i: u32) -> u32 {
        if let Some(n) = self.stacks.get_or_assign(i, out.stacks.len()) {
            return n;
        }
        // Copying its frames adds no stack: pushed last, numbered as assigned.
        let frames = self.data.stacks[i as usize]
            .iter()
            .map(|&f| self.frame(out, f))
            .collect();
        out.stacks.push(frames);
        (out.stacks.len() - 1) as u32
    }

    fn label_set(&mut self, out: &mut SegmentData, i: u32) -> u32 {
        if let Some(n) = self.label_sets.get_or_assign(i, out.label_sets.len()) {
            return n;
        }
        let mut set: Vec<(u32, u32)> = self.data.label_sets[i as usize]
            .iter()
            .map(|&(k, v)| (self.string(out, k), self.string(out, v)))
            .collect();
        // Sorted by key, as the builder keeps them, in the part's numbering.
        set.sort_unstable();
        out.label_sets.push(set);
        (out.label_sets.len() - 1) as u32
    }

    fn link(&mut self, out: &mut SegmentData, i: u32) -> u32 {
        self.links
            .get_or_assign(i, out.links.len())
            .unwrap_or_else(|| {
                out.links.push(self.data.links[i as usize]);
                (out.links.len() - 1) as u32
            })
    }

    fn series(&mut self, out: &mut SegmentData, se: &Series) -> Series {
        Series {
            service: self.string(out, se.service),
            sample_type: self.string(out, se.sample_type),
            sample_unit: self.string(out, se.sample_unit),
            period_type: self.string(out, se.period_type),
            period_unit: self.string(out, se.period_unit),
            labels: self.label_set(out, se.labels),
            ..se.clone()
        }
    }
}
