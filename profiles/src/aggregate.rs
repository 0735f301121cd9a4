//! Reading a selection's samples out of segments into one table of stacks
//! with their values. Segments each number their frames on their own; the
//! aggregate renumbers them into one table, so a stack seen in many
//! segments is one row. Work per segment is one pass over its samples plus
//! one per distinct stack, not per event.

use std::collections::BTreeSet;

use indexmap::IndexMap;
use rustc_hash::{FxBuildHasher, FxHashMap};

use crate::frame_table::{FrameTable, SegmentFrames};
use crate::gauge::{self, GaugeMode, Gauges};
use crate::model::SegmentData;
pub use crate::model::{RawFrame, Side};
use crate::selection::Selection;
use crate::strings::Strings;

/// Most distinct stacks one query holds in memory.
pub const MAX_STACKS: usize = 2_000_000;

/// Stacks with their values, per side.
#[derive(Default)]
pub struct Aggregate {
    /// The strings every number of this aggregate refers to.
    pub strings: Strings,
    /// The frames the stacks use (filled by [`Aggregate::finish`]).
    pub frames: Vec<RawFrame>,
    /// The frame table's generation the numbers are of.
    generation: Option<u64>,
    /// Until [`Aggregate::finish`]: (type, frame-table stack) → values.
    pending: FxHashMap<(u32, u32), [i64; 2]>,
    /// (profile type, frames leaf first) → value per side.
    pub stacks: IndexMap<(u32, Box<[u32]>), [i64; 2], FxBuildHasher>,
    /// Per profile type: (sample unit, period type, period unit, period).
    pub types: FxHashMap<u32, TypeInfo>,
    /// Events (samples) per profile type and side.
    pub points: FxHashMap<u32, [u64; 2]>,
    /// Gauge types' snapshots, until they are settled into `pending`.
    gauges: Gauges,
    /// How they combine (the first selection's mode).
    gauge_mode: GaugeMode,
    /// Segments read into this aggregate.
    pub segments_read: usize,
    /// Compressed bytes of those segments.
    pub bytes_read: u64,
}

/// A profile type's units and period, as the segments give them.
#[derive(Debug, Clone, Default)]
pub struct TypeInfo {
    /// What a sample's value counts (`samples`, `cpu`, `alloc_space`, …).
    pub sample_type: String,
    /// Its unit (`count`, `nanoseconds`, `bytes`, …).
    pub sample_unit: String,
    /// What the period measures (`cpu`, `space`, …; empty when none).
    pub period_type: String,
    /// The period's unit.
    pub period_unit: String,
    /// The sampling period (0 when none).
    pub period: i64,
}

/// Why a selection cannot be aggregated.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum AggregateError {
    /// The frame table started over while the query ran (run it again).
    #[error("the frame table started over during the query")]
    GenerationChanged,
    #[error(
        "the selection has more than {MAX_STACKS} distinct stacks; \
         narrow the time range or add a label selector"
    )]
    /// More distinct stacks than [`MAX_STACKS`].
    TooManyStacks,
    /// The query named no profile type and the selection has several,
    /// none of them the default.
    #[error("the selection has several profile types ({}); pick one with type=", .0.join(", "))]
    SeveralTypes(Vec<String>),
}

impl Aggregate {
    /// The number of `s` in [`Aggregate::strings`], added when new.
    pub fn intern(&mut self, s: &str) -> u32 {
        self.strings.intern(s)
    }

    /// The string numbered `i`.
    pub fn str(&self, i: u32) -> &str {
        self.strings.get(i)
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
                let ty = data.profile_type(s);
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
        if side == 0 {
            self.gauge_mode = sel.gauge;
        }
        // Gauge series (in-use memory): their identity, as a string of
        // this aggregate (service and resource labels).
        let gauge_series: Vec<Option<u32>> = data
            .series
            .iter()
            .zip(&series_type)
            .map(|(s, ty)| {
                ty.filter(|_| gauge::is_gauge(data.str(s.sample_type)))?;
                let mut id = data.str(s.service).to_owned();
                let mut labels: Vec<(&str, &str)> = data
                    .label_sets
                    .get(s.labels as usize)
                    .map(|set| {
                        set.iter()
                            .map(|&(k, v)| (data.str(k), data.str(v)))
                            .collect()
                    })
                    .unwrap_or_default();
                labels.sort_unstable();
                for (k, v) in labels {
                    id.push('\u{1}');
                    id.push_str(k);
                    id.push('=');
                    id.push_str(v);
                }
                Some(self.intern(&id))
            })
            .collect();
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
            if let Some(id) = gauge_series[sample.series as usize] {
                let stack = frames.stacks[sample.stack as usize];
                let series = &data.series[sample.series as usize];
                if sample.timestamps.is_empty() {
                    // One profile is one snapshot: at its end.
                    let t = series.end_ns.saturating_sub(1);
                    if (sel.from_ns..sel.to_ns).contains(&(t as i64)) {
                        self.gauges
                            .add(sel.gauge, side, ty, id, stack, t, sample.total());
                    }
                    continue;
                }
                for (i, &t) in sample.timestamps.iter().enumerate() {
                    if (sel.from_ns..sel.to_ns).contains(&(t as i64)) {
                        let v = sample.values.get(i).copied().unwrap_or(1);
                        self.gauges.add(sel.gauge, side, ty, id, stack, t, v);
                    }
                }
                continue;
            }
            let (value, points) = if whole[sample.series as usize] || sample.timestamps.is_empty() {
                (sample.total(), sample.points())
            } else {
                let mut value = 0;
                let mut points = 0;
                for (i, &t) in sample.timestamps.iter().enumerate() {
                    if (sel.from_ns..sel.to_ns).contains(&(t as i64)) {
                        value = sample
                            .values
                            .get(i)
                            .copied()
                            .unwrap_or(1)
                            .saturating_add(value);
                        points += 1;
                    }
                }
                (value, points)
            };
            if points == 0 {
                continue;
            }
            self.points.entry(ty).or_default()[side] += points as u64;
            // Values are the senders': saturate rather than overflow.
            let v = values.entry((sample.stack, ty)).or_default();
            *v = v.saturating_add(value);
        }
        // Stacks in the frame table's numbering (mapped once per segment).
        for ((stack, ty), value) in values {
            self.add_pending((ty, frames.stacks[stack as usize]), side, value)?;
        }
        Ok(())
    }

    /// Adds `value` to (type, frame-table stack) on `side`.
    fn add_pending(
        &mut self,
        key: (u32, u32),
        side: Side,
        value: i64,
    ) -> Result<(), AggregateError> {
        match self.pending.get_mut(&key) {
            Some(v) => v[side] = v[side].saturating_add(value),
            None => {
                if self.pending.len() >= MAX_STACKS {
                    return Err(AggregateError::TooManyStacks);
                }
                let mut v = [0; 2];
                v[side] = value;
                self.pending.insert(key, v);
            }
        }
        Ok(())
    }

    /// Copies the stacks and the frames they use out of the frame table
    /// (numbered locally, in order of first use), their strings into this
    /// aggregate's.
    pub fn finish(&mut self, table: &FrameTable) -> Result<(), AggregateError> {
        self.settle_gauges()?;
        let t = table.read();
        if self.generation.is_some_and(|g| g != t.generation) {
            return Err(AggregateError::GenerationChanged);
        }
        // Table frame → local number (dense: an array beats a hash map here).
        let mut local: Vec<u32> = vec![u32::MAX; t.frames.len()];
        let mut ids: Vec<u32> = Vec::new();
        let pending = std::mem::take(&mut self.pending);
        self.stacks.reserve(pending.len());
        for ((ty, stack), v) in pending {
            let frames: Box<[u32]> = t.stacks[stack as usize]
                .iter()
                .map(|&id| {
                    let slot = &mut local[id as usize];
                    if *slot == u32::MAX {
                        *slot = ids.len() as u32;
                        ids.push(id);
                    }
                    *slot
                })
                .collect();
            self.stacks.insert((ty, frames), v);
        }
        let mut strings: FxHashMap<u32, u32> = FxHashMap::default();
        let mut s = |agg: &mut Self, i: u32| -> u32 {
            *strings.entry(i).or_insert_with(|| agg.intern(t.str(i)))
        };
        self.frames.reserve(ids.len());
        for &id in &ids {
            let f = &t.frames[id as usize];
            let raw = RawFrame {
                kind: s(self, f.kind),
                build_id: s(self, f.build_id),
                build_id_kind: f.build_id_kind,
                module: s(self, f.module),
                content: s(self, f.content),
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
        Ok(())
    }

    /// Moves the gauge types' combined snapshots into the stacks (before
    /// choosing a type or finishing; again is a no-op).
    fn settle_gauges(&mut self) -> Result<(), AggregateError> {
        if self.gauges.is_empty() {
            return Ok(());
        }
        let (values, points) = self.gauges.settle(self.gauge_mode);
        for ((side, ty), n) in points {
            self.points.entry(ty).or_default()[side] += n;
        }
        for ((side, ty, stack), value) in values {
            self.add_pending((ty, stack), side, value)?;
        }
        Ok(())
    }

    /// The profile types the stacks have (before [`Aggregate::finish`]).
    pub fn pending_types(&self) -> BTreeSet<u32> {
        self.pending.keys().map(|&(t, _)| t).collect()
    }

    /// Keeps only the stacks of one profile type (before
    /// [`Aggregate::finish`], so frames only the others use are neither
    /// copied nor symbolized).
    pub fn retain_type(&mut self, ty: u32) {
        self.pending.retain(|&(t, _), _| t == ty);
    }

    /// Keeps one profile type (before [`Aggregate::finish`]): the
    /// requested one, the only one, or `default`; several others are a
    /// question only the caller can answer. None when nothing matched.
    pub fn choose_type(
        &mut self,
        requested: Option<&str>,
        default: &str,
    ) -> Result<Option<String>, AggregateError> {
        self.settle_gauges()?;
        if let Some(t) = requested {
            return Ok(Some(t.to_owned()));
        }
        let present = self.pending_types();
        let chosen = match present.len() {
            0 => return Ok(None),
            1 => *present.first().expect("one"),
            _ => match present.iter().find(|&&t| self.str(t) == default) {
                Some(&t) => t,
                None => {
                    let names = present.iter().map(|&t| self.str(t).to_owned()).collect();
                    return Err(AggregateError::SeveralTypes(names));
                }
            },
        };
        if present.len() > 1 {
            self.retain_type(chosen);
        }
        Ok(Some(self.str(chosen).to_owned()))
    }
}
