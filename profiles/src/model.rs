//! The stored form of profiles: what a segment holds, independent of how
//! OTLP laid it out. Every table is deduplicated, and index 0 of the
//! string, mapping, stack, label-set and link tables is the empty value, so
//! 0 means "none" wherever an index appears.

use indexmap::IndexSet;
use rustc_hash::{FxBuildHasher, FxHashMap as HashMap};
use std::hash::Hash;

/// How a mapping's build-ID was given.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
#[repr(u8)]
pub enum BuildIdKind {
    /// No build-ID.
    #[default]
    None = 0,
    /// `process.executable.build_id.gnu`: the ELF note, hex.
    Gnu = 1,
    /// `process.executable.build_id.htlhash`: the eBPF profiler's file ID.
    Htlhash = 2,
    /// `process.executable.build_id.go`.
    Go = 3,
}

impl BuildIdKind {
    /// The kind stored as `v` (None for an unknown number).
    pub fn from_u8(v: u8) -> Option<Self> {
        Some(match v {
            0 => Self::None,
            1 => Self::Gnu,
            2 => Self::Htlhash,
            3 => Self::Go,
            _ => return None,
        })
    }

    /// The attribute's suffix (`gnu`, `htlhash`, `go`; empty for none).
    pub fn as_str(self) -> &'static str {
        match self {
            Self::None => "",
            Self::Gnu => "gnu",
            Self::Htlhash => "htlhash",
            Self::Go => "go",
        }
    }
}

/// A loaded file: addresses of frames in it are ELF virtual addresses.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Default)]
pub struct Mapping {
    /// The build-ID (a string index, 0 = none).
    pub build_id: u32,
    /// How the build-ID was given.
    pub build_id_kind: BuildIdKind,
    /// The file's name (a string index).
    pub file: u32,
    /// First address of the mapping in the process.
    pub memory_start: u64,
    /// First address past the mapping.
    pub memory_limit: u64,
    /// File offset of `memory_start`.
    pub file_offset: u64,
    /// The SHA-256 of the mapped file's content as the sender computed it
    /// (`symtrace.file.sha256`: lowercase hex, a string index, 0 = none):
    /// what an agent's published file must have been taken from to name
    /// this mapping's frames.
    pub content: u32,
}

/// One source line of a frame (several when the sender resolved inlining).
#[derive(Debug, Clone, PartialEq, Eq, Hash, Default)]
pub struct Line {
    /// The function's name (a string index).
    pub function: u32,
    /// Its system (linkage) name (a string index).
    pub system_name: u32,
    /// The source file (a string index).
    pub file: u32,
    /// The line (0 or negative: unknown).
    pub line: i64,
    /// The column (0: unknown).
    pub column: i64,
}

/// A frame: native ones have a mapping and an address and no lines (they
/// are symbolized at query time); the sender named the others.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Default)]
pub struct Frame {
    /// `profile.frame.type` (native, kernel, cpython, go, …), a string index.
    pub frame_type: u32,
    /// The mapping (0 = none).
    pub mapping: u32,
    /// The ELF virtual address in the mapping's file (native frames).
    pub address: u64,
    /// Names the sender gave, leaf (innermost) first; empty for native frames.
    pub lines: Vec<Line>,
}

/// A trace and span ID pair (`[0; 24]` = none).
pub type Link = [u8; 24];

/// Everything sharing a service, a profile type and resource attributes.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Series {
    /// `service.name` (a string index).
    pub service: u32,
    /// What the values count (a string index).
    pub sample_type: u32,
    /// Their unit (a string index).
    pub sample_unit: u32,
    /// What the period measures (a string index).
    pub period_type: u32,
    /// The period's unit (a string index).
    pub period_unit: u32,
    /// The sampling period.
    pub period: i64,
    /// Resource, scope and profile attributes (a label-set index).
    pub labels: u32,
    /// Earliest time covered, Unix nanoseconds.
    pub start_ns: u64,
    /// Time past the last covered, Unix nanoseconds.
    pub end_ns: u64,
}

/// Samples with the same identity: series, stack, sample labels and link.
/// `timestamps` and `values` are empty or of the same length as each other
/// when both are present; a sample without values counts 1 per timestamp.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Sample {
    /// The series (an index).
    pub series: u32,
    /// The stack (an index, leaf first).
    pub stack: u32,
    /// Sample attributes (a label-set index).
    pub labels: u32,
    /// The trace and span (a link index, 0 = none).
    pub link: u32,
    /// Event times, Unix nanoseconds (may be empty).
    pub timestamps: Vec<u64>,
    /// Event values (empty: each timestamp counts 1).
    pub values: Vec<i64>,
}

impl Sample {
    /// Number of events: timestamps, else values.
    pub fn points(&self) -> usize {
        self.timestamps.len().max(self.values.len())
    }

    /// Sum of values; a timestamps-only sample counts 1 per timestamp.
    pub fn total(&self) -> i64 {
        if self.values.is_empty() {
            self.timestamps.len() as i64
        } else {
            // Values are the sender's: saturate rather than overflow.
            self.values.iter().fold(0i64, |a, &b| a.saturating_add(b))
        }
    }
}

/// The content of one segment.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SegmentData {
    /// Strings, `""` first.
    pub strings: Vec<String>,
    /// Mappings, the empty one first.
    pub mappings: Vec<Mapping>,
    /// Frames.
    pub frames: Vec<Frame>,
    /// Frame indexes, leaf first.
    pub stacks: Vec<Vec<u32>>,
    /// (key, value) string indexes, sorted by key, keys unique.
    pub label_sets: Vec<Vec<(u32, u32)>>,
    /// Trace/span pairs, none first.
    pub links: Vec<Link>,
    /// Series.
    pub series: Vec<Series>,
    /// Samples.
    pub samples: Vec<Sample>,
}

impl Default for SegmentData {
    fn default() -> Self {
        Self {
            strings: vec![String::new()],
            mappings: vec![Mapping::default()],
            frames: Vec::new(),
            stacks: vec![Vec::new()],
            label_sets: vec![Vec::new()],
            links: vec![[0; 24]],
            series: Vec::new(),
            samples: Vec::new(),
        }
    }
}

impl SegmentData {
    /// The string numbered `index`.
    pub fn str(&self, index: u32) -> &str {
        &self.strings[index as usize]
    }

    /// A series' profile type, `sample_type:unit:period_type:unit` (the
    /// name queries select by).
    pub fn profile_type(&self, series: &Series) -> String {
        format!(
            "{}:{}:{}:{}",
            self.str(series.sample_type),
            self.str(series.sample_unit),
            self.str(series.period_type),
            self.str(series.period_unit)
        )
    }

    /// Events in the segment (each timestamp counts).
    pub fn points(&self) -> u64 {
        self.samples.iter().map(|s| s.points() as u64).sum()
    }
}

/// A deduplicating table: each value stored once, numbered in insertion
/// order.
struct Table<T>(IndexSet<T, FxBuildHasher>);

impl<T: Eq + Hash> Table<T> {
    fn new(items: Vec<T>) -> Self {
        Self(items.into_iter().collect())
    }

    fn intern(&mut self, item: T) -> u32 {
        self.0.insert_full(item).0 as u32
    }

    fn items(self) -> Vec<T> {
        self.0.into_iter().collect()
    }
}

/// Builds a [`SegmentData`], deduplicating every table and merging samples
/// of the same identity.
pub struct SegmentBuilder {
    strings: Table<String>,
    mappings: Table<Mapping>,
    frames: Table<Frame>,
    stacks: Table<Vec<u32>>,
    label_sets: Table<Vec<(u32, u32)>>,
    links: Table<Link>,
    series: Vec<Series>,
    series_index: HashMap<SeriesKey, u32>,
    samples: Vec<Sample>,
    /// (series, stack, labels, link, has timestamps) → sample.
    sample_index: HashMap<(u32, u32, u32, u32, bool), u32>,
}

/// A series' properties, and for one of value-only samples its exact time
/// range (see [`SegmentBuilder::series_exact`]).
type SeriesKey = (u32, u32, u32, u32, u32, i64, u32, Option<(u64, u64)>);

impl Default for SegmentBuilder {
    fn default() -> Self {
        let empty = SegmentData::default();
        Self {
            strings: Table::new(empty.strings),
            mappings: Table::new(empty.mappings),
            frames: Table::new(empty.frames),
            stacks: Table::new(empty.stacks),
            label_sets: Table::new(empty.label_sets),
            links: Table::new(empty.links),
            series: Vec::new(),
            series_index: HashMap::default(),
            samples: Vec::new(),
            sample_index: HashMap::default(),
        }
    }
}

impl SegmentBuilder {
    /// The number of `s`, added when new.
    pub fn string(&mut self, s: &str) -> u32 {
        match self.strings.0.get_index_of(s) {
            Some(i) => i as u32,
            None => self.strings.intern(s.to_owned()),
        }
    }

    /// The string numbered `index`.
    pub fn str(&self, index: u32) -> &str {
        &self.strings.0[index as usize]
    }

    /// The number of `mapping`, added when new.
    pub fn mapping(&mut self, mapping: Mapping) -> u32 {
        self.mappings.intern(mapping)
    }

    /// The number of `frame`, added when new.
    pub fn frame(&mut self, frame: Frame) -> u32 {
        self.frames.intern(frame)
    }

    /// The number of a stack (frame numbers, leaf first), added when new.
    pub fn stack(&mut self, frames: Vec<u32>) -> u32 {
        self.stacks.intern(frames)
    }

    /// Interns a label set; `pairs` need not be sorted but keys must be
    /// unique.
    pub fn label_set(&mut self, mut pairs: Vec<(u32, u32)>) -> u32 {
        pairs.sort_unstable();
        self.label_sets.intern(pairs)
    }

    /// The number of `link`, added when new.
    pub fn link(&mut self, link: Link) -> u32 {
        self.links.intern(link)
    }

    /// The series with these properties, widened to `[start_ns, end_ns)`:
    /// for samples with timestamps, which a query filters one by one.
    pub fn series(&mut self, series: Series) -> u32 {
        self.series_keyed(series, false)
    }

    /// The series with these properties and exactly this time range: for
    /// samples without timestamps, which a query counts whole when their
    /// series overlaps its range. Widening their series when exports are
    /// merged would move their events in time (a query over the first of
    /// two merged exports would count the second's), so compaction keeps
    /// each range as ingest stored it.
    pub fn series_exact(&mut self, series: Series) -> u32 {
        self.series_keyed(series, true)
    }

    fn series_keyed(&mut self, series: Series, exact: bool) -> u32 {
        let key = (
            series.service,
            series.sample_type,
            series.sample_unit,
            series.period_type,
            series.period_unit,
            series.period,
            series.labels,
            exact.then_some((series.start_ns, series.end_ns)),
        );
        if let Some(&i) = self.series_index.get(&key) {
            let existing = &mut self.series[i as usize];
            existing.start_ns = existing.start_ns.min(series.start_ns);
            existing.end_ns = existing.end_ns.max(series.end_ns);
            return i;
        }
        let i = self.series.len() as u32;
        self.series.push(series);
        self.series_index.insert(key, i);
        i
    }

    /// Adds events to the sample of this identity. When one side has values
    /// and the other only timestamps, the latter's values become 1s.
    pub fn add_sample(&mut self, sample: Sample) {
        let key = (
            sample.series,
            sample.stack,
            sample.labels,
            sample.link,
            !sample.timestamps.is_empty(),
        );
        let Some(&i) = self.sample_index.get(&key) else {
            self.sample_index.insert(key, self.samples.len() as u32);
            self.samples.push(sample);
            return;
        };
        // Samples with and without timestamps are kept apart (the key says
        // which), rather than inventing timestamps.
        let existing = &mut self.samples[i as usize];
        match (existing.values.is_empty(), sample.values.is_empty()) {
            (true, true) => {}
            (true, false) => {
                existing.values = vec![1; existing.timestamps.len()];
                existing.values.extend_from_slice(&sample.values);
            }
            (false, true) => existing
                .values
                .extend(std::iter::repeat_n(1, sample.timestamps.len())),
            (false, false) => existing.values.extend_from_slice(&sample.values),
        }
        existing.timestamps.extend_from_slice(&sample.timestamps);
    }

    /// The segment built.
    pub fn finish(self) -> SegmentData {
        SegmentData {
            strings: self.strings.items(),
            mappings: self.mappings.items(),
            frames: self.frames.items(),
            stacks: self.stacks.items(),
            label_sets: self.label_sets.items(),
            links: self.links.items(),
            series: self.series,
            samples: self.samples,
        }
    }

    /// Copies `data`'s samples (and what they reference) into this builder.
    pub fn merge(&mut self, data: &SegmentData) {
        let strings: Vec<u32> = data.strings.iter().map(|s| self.string(s)).collect();
        let s = |i: u32| strings[i as usize];
        let mappings: Vec<u32> = data
            .mappings
            .iter()
            .map(|m| {
                self.mapping(Mapping {
                    build_id: s(m.build_id),
                    file: s(m.file),
                    content: s(m.content),
                    ..m.clone()
                })
            })
            .collect();
        let frames: Vec<u32> = data
            .frames
            .iter()
            .map(|f| {
                self.frame(Frame {
                    frame_type: s(f.frame_type),
                    mapping: mappings[f.mapping as usize],
                    address: f.address,
                    lines: f
                        .lines
                        .iter()
                        .map(|l| Line {
                            function: s(l.function),
                            system_name: s(l.system_name),
                            file: s(l.file),
                            ..l.clone()
                        })
                        .collect(),
                })
            })
            .collect();
        let stacks: Vec<u32> = data
            .stacks
            .iter()
            .map(|st| self.stack(st.iter().map(|&f| frames[f as usize]).collect()))
            .collect();
        let label_sets: Vec<u32> = data
            .label_sets
            .iter()
            .map(|set| self.label_set(set.iter().map(|&(k, v)| (s(k), s(v))).collect()))
            .collect();
        let links: Vec<u32> = data.links.iter().map(|l| self.link(*l)).collect();
        let series: Vec<Series> = data
            .series
            .iter()
            .map(|se| Series {
                service: s(se.service),
                sample_type: s(se.sample_type),
                sample_unit: s(se.sample_unit),
                period_type: s(se.period_type),
                period_unit: s(se.period_unit),
                labels: label_sets[se.labels as usize],
                ..se.clone()
            })
            .collect();
        // Per source series: its (timestamped, value-only) series here,
        // made when first used (a series without samples is kept as one of
        // the first kind).
        let mut targets: Vec<[u32; 2]> = vec![[u32::MAX; 2]; series.len()];
        for sample in &data.samples {
            let exact = sample.timestamps.is_empty();
            let slot = &mut targets[sample.series as usize][exact as usize];
            if *slot == u32::MAX {
                let se = series[sample.series as usize].clone();
                *slot = self.series_keyed(se, exact);
            }
        }
        for (i, t) in targets.iter_mut().enumerate() {
            if *t == [u32::MAX; 2] {
                t[0] = self.series(series[i].clone());
            }
        }
        for sample in &data.samples {
            let target = targets[sample.series as usize][sample.timestamps.is_empty() as usize];
            self.add_sample(Sample {
                series: target,
                stack: stacks[sample.stack as usize],
                labels: label_sets[sample.labels as usize],
                link: links[sample.link as usize],
                timestamps: sample.timestamps.clone(),
                values: sample.values.clone(),
            });
        }
    }
}

/// A frame as stored, renumbered into the aggregate's string table.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct RawFrame {
    /// `profile.frame.type` (native, kernel, …).
    pub kind: u32,
    /// The mapping's build-ID (a string index, 0 = none).
    pub build_id: u32,
    /// How the build-ID was given (only GNU ones can be looked up).
    pub build_id_kind: BuildIdKind,
    /// The mapping's file name.
    pub module: u32,
    /// The mapping's content hash (a string index, 0 = none).
    pub content: u32,
    /// The ELF virtual address (native frames) as stored.
    pub address: u64,
    /// (function, system name, file, line), leaf first; empty for native
    /// frames left for the symbolizer.
    pub lines: Box<[(u32, u32, u32, i64)]>,
}

impl RawFrame {
    /// A native frame the sender did not name: the symbolizer's to name.
    pub fn is_native_unsymbolized(&self) -> bool {
        self.lines.is_empty() && self.build_id != 0
    }
}

/// Which of two selections a sample belongs to (a diff has both).
pub type Side = usize;
