//! Reading a selection's samples out of segments into one table of stacks
//! with their values. Segments each number their frames on their own; the
//! aggregate renumbers them into one table, so a stack seen in many
//! segments is one row. Work per segment is one pass over its samples plus
//! one per distinct stack, not per event.

use indexmap::{IndexMap, IndexSet};
use rustc_hash::{FxBuildHasher, FxHashMap};

use super::frame_table::{FrameTable, SegmentFrames};
use super::params::Selection;
use crate::profiles::model::{BuildIdKind, SegmentData};
use crate::profiles::store::profile_type;

/// Most distinct stacks one query holds in memory.
pub const MAX_STACKS: usize = 2_000_000;

/// A frame as stored, renumbered into the aggregate's string table.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct RawFrame {
    /// `profile.frame.type` (native, kernel, …).
    pub kind: u32,
    pub build_id: u32,
    pub build_id_kind: BuildIdKind,
    /// The mapping's file name.
    pub module: u32,
    pub address: u64,
    /// (function, system name, file, line), leaf first; empty for native
    /// frames left for the symbolizer.
    pub lines: Box<[(u32, u32, u32, i64)]>,
}

impl RawFrame {
    pub fn is_native_unsymbolized(&self) -> bool {
        self.lines.is_empty() && self.build_id != 0
    }
}

/// Which of two selections a sample belongs to (a diff has both).
pub type Side = usize;

/// Stacks with their values, per side.
pub struct Aggregate {
    pub strings: IndexSet<Box<str>, FxBuildHasher>,
    /// The frames the stacks use (filled by [`Aggregate::finish`]; until
    /// then stacks hold local numbers of frame-table frames).
    pub frames: Vec<RawFrame>,
    /// The frame table's generation the numbers are of.
    generation: Option<u64>,
    /// Frame-table frame → local number (`u32::MAX`: not used yet).
    local_of: Vec<u32>,
    /// Local number → frame-table frame.
    table_ids: Vec<u32>,
    /// (profile type, frames leaf first) → value per side.
    pub stacks: IndexMap<(u32, Box<[u32]>), [i64; 2], FxBuildHasher>,
    /// Per profile type: (sample unit, period type, period unit, period).
    pub types: FxHashMap<u32, TypeInfo>,
    /// Events (samples) per profile type and side.
    pub points: FxHashMap<u32, [u64; 2]>,
    pub segments_read: usize,
    pub bytes_read: u64,
}

#[derive(Debug, Clone, Default)]
pub struct TypeInfo {
    pub sample_type: String,
    pub sample_unit: String,
    pub period_type: String,
    pub period_unit: String,
    pub period: i64,
}

#[derive(Debug, thiserror::Error)]
pub enum AggregateError {
    /// The frame table started over while the query ran (run it again).
    #[error("the frame table started over during the query")]
    GenerationChanged,
    #[error(
        "the selection has more than {MAX_STACKS} distinct stacks; \
         narrow the time range or add a label selector"
    )]
    TooManyStacks,
}

impl Default for Aggregate {
    fn default() -> Self {
        let mut strings = IndexSet::default();
        strings.insert(Box::from(""));
        Self {
            strings,
            frames: Vec::new(),
            generation: None,
            local_of: Vec::new(),
            table_ids: Vec::new(),
            stacks: IndexMap::default(),
            types: FxHashMap::default(),
            points: FxHashMap::default(),
            segments_read: 0,
            bytes_read: 0,
        }
    }
}

impl Aggregate {
    pub fn intern(&mut self, s: &str) -> u32 {
        match self.strings.get_index_of(s) {
            Some(i) => i as u32,
            None => self.strings.insert_full(Box::from(s)).0 as u32,
        }
    }

    pub fn str(&self, i: u32) -> &str {
        &self.strings[i as usize]
    }

    /// Adds the samples of `data` that `sel` selects to `side`; `frames`
    /// numbers the segment's frames in the frame table.
    pub fn add_segment(
        &mut self,
        data: &SegmentData,
        frames: &SegmentFrames,
        sel: &Selection,
        side: Side,
    ) -> Result<(), AggregateError> {
        if *self.generation.get_or_insert(frames.generation) != frames.generation {
            return Err(AggregateError::GenerationChanged);
        }
        // Per series: its profile type (interned), or None when excluded.
        let series_type: Vec<Option<u32>> = data
            .series
            .iter()
            .map(|s| {
                if sel
                    .service
                    .as_deref()
                    .is_some_and(|want| want != data.str(s.service))
                {
                    return None;
                }
                if (s.end_ns as i64) < sel.from_ns || s.start_ns as i64 >= sel.to_ns {
                    return None;
                }
                let ty = profile_type(data, s);
                if sel.profile_type.as_deref().is_some_and(|want| want != ty) {
                    return None;
                }
                let id = self.intern(&ty);
                self.types.entry(id).or_insert_with(|| TypeInfo {
                    sample_type: data.str(s.sample_type).to_owned(),
                    sample_unit: data.str(s.sample_unit).to_owned(),
                    period_type: data.str(s.period_type).to_owned(),
                    period_unit: data.str(s.period_unit).to_owned(),
                    period: s.period,
                });
                Some(id)
            })
            .collect();
        if series_type.iter().all(Option::is_none) {
            return Ok(());
        }
        let whole: Vec<bool> = data
            .series
            .iter()
            .map(|s| s.start_ns as i64 >= sel.from_ns && (s.end_ns as i64) < sel.to_ns)
            .collect();
        let mut label_ok: FxHashMap<(u32, u32), bool> = FxHashMap::default();
        // Value per (segment stack, type).
        let mut values: FxHashMap<(u32, u32), i64> = FxHashMap::default();
        for sample in &data.samples {
            let Some(ty) = series_type[sample.series as usize] else {
                continue;
            };
            if let Some(trace) = &sel.trace_id {
                let link = &data.links[sample.link as usize];
                if sample.link == 0
                    || link[..16] != trace[..]
                    || sel.span_id.is_some_and(|span| link[16..] != span[..])
                {
                    continue;
                }
            }
            if !sel.selector.is_empty() {
                let series = &data.series[sample.series as usize];
                let ok = *label_ok
                    .entry((series.labels, sample.labels))
                    .or_insert_with(|| {
                        let get = |name: &str| {
                            let find = |set: u32| {
                                data.label_sets[set as usize]
                                    .iter()
                                    .find(|&&(k, _)| data.str(k) == name)
                                    .map(|&(_, v)| data.str(v))
                            };
                            find(sample.labels).or_else(|| find(series.labels))
                        };
                        sel.selector.matches(get)
                    });
                if !ok {
                    continue;
                }
            }
            let (value, points) = if whole[sample.series as usize] || sample.timestamps.is_empty() {
                (sample.total(), sample.points())
            } else {
                let mut value = 0;
                let mut points = 0;
                for (i, &t) in sample.timestamps.iter().enumerate() {
                    if (sel.from_ns..sel.to_ns).contains(&(t as i64)) {
                        value += sample.values.get(i).copied().unwrap_or(1);
                        points += 1;
                    }
                }
                (value, points)
            };
            if points == 0 {
                continue;
            }
            self.points.entry(ty).or_default()[side] += points as u64;
            *values.entry((sample.stack, ty)).or_default() += value;
        }
        self.stacks
            .reserve(values.len().saturating_sub(self.stacks.len()));
        // Renumber the frames of the stacks that have values: segment →
        // frame table (precomputed per segment) → local, by array indexing
        // only (a hash map here, or renumbering at the end, measured slower).
        if let Some(&max) = frames.ids.iter().max() {
            if max as usize >= self.local_of.len() {
                self.local_of.resize(max as usize + 1, u32::MAX);
            }
        }
        let mut stack_buf = Vec::new();
        for ((stack, ty), value) in values {
            stack_buf.clear();
            for &f in &data.stacks[stack as usize] {
                let table_id = frames.ids[f as usize];
                let local = &mut self.local_of[table_id as usize];
                if *local == u32::MAX {
                    *local = self.table_ids.len() as u32;
                    self.table_ids.push(table_id);
                }
                stack_buf.push(*local);
            }
            let key = (ty, stack_buf.as_slice());
            match self.stacks.get_mut(&key as &dyn StackKey) {
                Some(v) => v[side] += value,
                None => {
                    if self.stacks.len() >= MAX_STACKS {
                        return Err(AggregateError::TooManyStacks);
                    }
                    let mut v = [0; 2];
                    v[side] = value;
                    self.stacks.insert((ty, stack_buf.clone().into()), v);
                }
            }
        }
        Ok(())
    }

    /// Copies the frames the stacks use out of the frame table, their
    /// strings into this aggregate's.
    pub fn finish(&mut self, table: &FrameTable) -> Result<(), AggregateError> {
        let t = table.read();
        if self.generation.is_some_and(|g| g != t.generation) {
            return Err(AggregateError::GenerationChanged);
        }
        let mut strings: FxHashMap<u32, u32> = FxHashMap::default();
        let mut s = |agg: &mut Self, i: u32| -> u32 {
            *strings.entry(i).or_insert_with(|| agg.intern(t.str(i)))
        };
        let ids = std::mem::take(&mut self.table_ids);
        self.frames.reserve(ids.len());
        for &id in &ids {
            let f = &t.frames[id as usize];
            let raw = RawFrame {
                kind: s(self, f.kind),
                build_id: s(self, f.build_id),
                build_id_kind: f.build_id_kind,
                module: s(self, f.module),
                address: f.address,
                lines: f
                    .lines
                    .iter()
                    .map(|&(function, system_name, file, line)| {
                        (s(self, function), s(self, system_name), s(self, file), line)
                    })
                    .collect(),
            };
            self.frames.push(raw);
        }
        self.local_of = Vec::new();
        Ok(())
    }

    /// Keeps only the stacks of one profile type.
    pub fn retain_type(&mut self, ty: u32) {
        self.stacks.retain(|(t, _), _| *t == ty);
    }
}

/// Lets the stack map be probed with a borrowed slice (no allocation per
/// lookup), the `indexmap::Equivalent` way.
trait StackKey {
    fn key(&self) -> (u32, &[u32]);
}

impl StackKey for (u32, &[u32]) {
    fn key(&self) -> (u32, &[u32]) {
        (self.0, self.1)
    }
}

impl std::hash::Hash for dyn StackKey + '_ {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        self.key().hash(state)
    }
}

impl indexmap::Equivalent<(u32, Box<[u32]>)> for dyn StackKey + '_ {
    fn equivalent(&self, key: &(u32, Box<[u32]>)) -> bool {
        let (t, s) = self.key();
        t == key.0 && s == &key.1[..]
    }
}
