//! One part of a request being built: the samples of its checked profiles,
//! and the dictionary entries they use mapped into the part's own tables
//! (through memos reset between parts, so a request of many parts costs
//! what its parts use, not parts × its dictionary).

use std::rc::Rc;

use rustc_hash::{FxHashMap, FxHashSet};

use crate::request::{Dictionary, Profile};

use super::check::Dict;
use super::TRUNCATED_FRAME_TYPE;
use crate::memo::Memo;
use crate::model::{Frame, Line, Link, Mapping, Sample, SegmentBuilder, SegmentData, Series};

/// What a checked profile is stored as, found before any part is built.
pub(super) struct Accepted {
    pub(super) resource: usize,
    pub(super) scope: usize,
    pub(super) profile: usize,
    /// Its attributes that are labels besides its resource's (indices).
    pub(super) extras: Vec<u32>,
    pub(super) service: Rc<str>,
}

pub(super) struct Part {
    b: SegmentBuilder,
    /// Dictionary index → the part's index.
    locations: Memo<u32>,
    stacks: Memo<u32>,
    mappings: Memo<u32>,
    /// Attributes → the part's string of their rendered value.
    values: Memo<u32>,
    /// Dictionary strings → the part's.
    strings: Memo<u32>,
    /// Sample attribute lists → label sets.
    label_sets: FxHashMap<Vec<i32>, u32>,
    /// (resource, profile attributes) → the label set of their series.
    profile_labels: FxHashMap<(usize, Vec<u32>), u32>,
    /// Service names (by address: they are shared) → strings.
    services: FxHashMap<usize, u32>,
    max_stack_depth: usize,
    /// Dictionary stacks cut to `max_stack_depth` (counted once however
    /// many parts use them).
    pub(super) truncated: FxHashSet<usize>,
}

impl Part {
    pub(super) fn new(dict: &Dictionary, max_stack_depth: usize) -> Self {
        Self {
            b: SegmentBuilder::default(),
            locations: Memo::new(dict.location_table.len()),
            stacks: Memo::new(dict.stack_table.len()),
            mappings: Memo::new(dict.mapping_table.len()),
            values: Memo::new(dict.attribute_table.len()),
            strings: Memo::new(dict.string_table.len()),
            label_sets: FxHashMap::default(),
            profile_labels: FxHashMap::default(),
            services: FxHashMap::default(),
            max_stack_depth,
            truncated: FxHashSet::default(),
        }
    }

    /// The part built; the next starts empty.
    pub(super) fn finish(&mut self) -> SegmentData {
        for memo in [
            &mut self.locations,
            &mut self.stacks,
            &mut self.mappings,
            &mut self.values,
            &mut self.strings,
        ] {
            memo.reset();
        }
        // Fresh maps, not cleared ones: clearing costs their capacity, which
        // one large part would impose on every later part.
        self.label_sets = FxHashMap::default();
        self.profile_labels = FxHashMap::default();
        self.services = FxHashMap::default();
        std::mem::take(&mut self.b).finish()
    }

    /// The part's number of dictionary string `i` (checked).
    fn string(&mut self, d: &Dict, i: i32) -> u32 {
        let slot = i.max(0) as usize;
        if slot >= d.dict.string_table.len() {
            return 0;
        }
        if let Some(s) = self.strings.get(slot) {
            return s;
        }
        let s = self.b.string(d.str(i));
        self.strings.set(slot, s);
        s
    }

    /// The part's string of attribute `i`'s rendered value.
    fn value(&mut self, d: &mut Dict, i: usize) -> u32 {
        if let Some(v) = self.values.get(i) {
            return v;
        }
        let v = self.b.string(d.attribute_value(i));
        self.values.set(i, v);
        v
    }

    /// Attribute `i` as the part's (key, value) strings.
    fn attribute(&mut self, d: &mut Dict, i: i32) -> (u32, u32) {
        let key = self.string(d, d.dict.attribute_table[i as usize].key_strindex);
        (key, self.value(d, i as usize))
    }

    fn mapping(&mut self, d: &mut Dict, i: usize) -> u32 {
        if let Some(m) = self.mappings.get(i) {
            return m;
        }
        let file = self.string(d, d.dict.mapping_table[i].filename_strindex);
        let (build_id, kind) = d.build_id(i);
        let build_id = self.b.string(build_id);
        let content = d.content(i);
        let content = self.b.string(&content);
        let m = &d.dict.mapping_table[i];
        let n = self.b.mapping(Mapping {
            build_id,
            build_id_kind: kind,
            file,
            memory_start: m.memory_start,
            memory_limit: m.memory_limit,
            file_offset: m.file_offset,
            content,
        });
        self.mappings.set(i, n);
        n
    }

    fn location(&mut self, d: &mut Dict, i: usize) -> u32 {
        if let Some(f) = self.locations.get(i) {
            return f;
        }
        let info = d.location(i);
        let mapping = match info.mapping {
            0 => 0,
            m => self.mapping(d, m as usize),
        };
        let frame_type = match info.frame_type {
            u32::MAX => 0,
            a => self.value(d, a as usize),
        };
        let lines = if info.has_lines {
            let dict = d.dict;
            dict.location_table[i]
                .lines
                .iter()
                .map(|line| {
                    let f = &dict.function_table[line.function_index as usize];
                    Line {
                        function: self.string(d, f.name_strindex),
                        system_name: self.string(d, f.system_name_strindex),
                        file: self.string(d, f.filename_strindex),
                        line: line.line,
                        column: line.column,
                    }
                })
                .collect()
        } else {
            Vec::new()
        };
        let frame = self.b.frame(Frame {
            frame_type,
            mapping,
            address: info.address,
            lines,
        });
        self.locations.set(i, frame);
        frame
    }

    fn stack(&mut self, d: &mut Dict, i: usize) -> u32 {
        if i == 0 {
            return 0;
        }
        if let Some(s) = self.stacks.get(i) {
            return s;
        }
        let locations = d.request.stack(i);
        let keep = locations.len().min(self.max_stack_depth);
        let mut frames: Vec<u32> = Vec::with_capacity(keep + 1);
        for &l in &locations[..keep] {
            frames.push(self.location(d, l as usize));
        }
        if locations.len() > keep {
            // Leaf first: the cut frames were the root-most ones.
            self.truncated.insert(i);
            frames.push(self.truncated_frame(locations.len() - keep));
        }
        let stack = self.b.stack(frames);
        self.stacks.set(i, stack);
        stack
    }

    /// The synthetic root frame standing for `cut` root-most frames.
    fn truncated_frame(&mut self, cut: usize) -> u32 {
        let frame_type = self.b.string(TRUNCATED_FRAME_TYPE);
        let name = self.b.string(&format!(
            "[truncated: {cut} root-most frames beyond the {} kept]",
            self.max_stack_depth
        ));
        self.b.frame(Frame {
            frame_type,
            mapping: 0,
            address: 0,
            lines: vec![Line {
                function: name,
                ..Line::default()
            }],
        })
    }

    /// Adds a checked profile.
    pub(super) fn add_profile(
        &mut self,
        d: &mut Dict,
        profile: &Profile,
        resource: &[(String, String)],
        accepted: &Accepted,
        now_ns: u64,
    ) {
        let dict = d.dict;
        let sample_type = profile.sample_type.unwrap_or_default();
        let period_type = profile.period_type.unwrap_or_default();
        let labels = match self
            .profile_labels
            .get(&(accepted.resource, accepted.extras.clone()))
        {
            Some(&labels) => labels,
            None => {
                let mut pairs: Vec<(u32, u32)> = resource
                    .iter()
                    .map(|(k, v)| (self.b.string(k), self.b.string(v)))
                    .collect();
                for &a in &accepted.extras {
                    pairs.push(self.attribute(d, a as i32));
                }
                let labels = self.b.label_set(pairs);
                self.profile_labels
                    .insert((accepted.resource, accepted.extras.clone()), labels);
                labels
            }
        };
        let service = Rc::as_ptr(&accepted.service) as *const u8 as usize;
        let service = match self.services.get(&service) {
            Some(&s) => s,
            None => {
                let s = self.b.string(&accepted.service);
                self.services.insert(service, s);
                s
            }
        };
        let (mut start, mut end) = if profile.time_unix_nano != 0 {
            let start = profile.time_unix_nano;
            (start, start.saturating_add(profile.duration_nano))
        } else {
            (u64::MAX, 0)
        };
        let r = d.request;
        for sample in &profile.samples {
            for &t in r.timestamps(sample.timestamps) {
                start = start.min(t);
                end = end.max(t.saturating_add(1));
            }
        }
        if start == u64::MAX {
            (start, end) = (now_ns, now_ns);
        }
        let info = Series {
            service,
            sample_type: self.string(d, sample_type.type_strindex),
            sample_unit: self.string(d, sample_type.unit_strindex),
            period_type: self.string(d, period_type.type_strindex),
            period_unit: self.string(d, period_type.unit_strindex),
            period: profile.period,
            labels,
            start_ns: start,
            end_ns: end,
        };
        // Timestamped samples say when each event happened; value-only ones
        // only that they fell in this profile's range, which their series
        // keeps exactly (see SegmentBuilder::series_exact).
        let (mut timed, mut untimed) = (None, None);
        if profile.samples.is_empty() {
            self.b.series(info.clone());
        }
        for sample in &profile.samples {
            let series = if sample.timestamps.is_empty() {
                *untimed.get_or_insert_with(|| self.b.series_exact(info.clone()))
            } else {
                *timed.get_or_insert_with(|| self.b.series(info.clone()))
            };
            let stack = self.stack(d, sample.stack_index as usize);
            let attributes = r.ints(sample.attribute_indices);
            let labels = match self.label_sets.get(attributes) {
                Some(&labels) => labels,
                None => {
                    let mut pairs = Vec::with_capacity(attributes.len());
                    for &a in attributes {
                        let pair = self.attribute(d, a);
                        if pair.1 != 0 {
                            pairs.push(pair);
                        }
                    }
                    let labels = self.b.label_set(pairs);
                    self.label_sets.insert(attributes.to_vec(), labels);
                    labels
                }
            };
            let link = match dict.link_table.get(sample.link_index as usize) {
                Some(l)
                    if sample.link_index > 0
                        && !l.trace_id.iter().chain(&l.span_id).all(|&b| b == 0) =>
                {
                    let mut link: Link = [0; 24];
                    link[..l.trace_id.len()].copy_from_slice(&l.trace_id);
                    link[16..16 + l.span_id.len()].copy_from_slice(&l.span_id);
                    self.b.link(link)
                }
                _ => 0,
            };
            self.b.add_sample(Sample {
                series,
                stack,
                labels,
                link,
                timestamps: r.timestamps(sample.timestamps).to_vec(),
                values: r.values(sample.values).to_vec(),
            });
        }
    }
}
