//! Decoded segments by sha256, least recently used dropped first once
//! their (estimated) bytes exceed the budget. Segments never change, so an
//! entry never goes stale; a compacted-away segment just stops being asked
//! for and ages out.

use std::sync::{Arc, Mutex};

use crate::lru::WeightedLru;
use crate::profiles::model::SegmentData;
use symtrace_profiles::frame_table::{FrameTable, SegmentFrames};

/// A decoded segment and, once a query asked, its frames in the frame
/// table's numbering.
pub struct Segment {
    pub data: SegmentData,
    frames: Mutex<Option<Arc<SegmentFrames>>>,
}

impl Segment {
    pub fn new(data: SegmentData) -> Self {
        Self {
            data,
            frames: Mutex::new(None),
        }
    }

    /// The segment's frames numbered by `table`, if that was done already
    /// (in the table's current generation).
    pub fn mapped_frames(&self, table: &FrameTable) -> Option<Arc<SegmentFrames>> {
        let frames = self.frames.lock().expect("segment frames");
        frames
            .as_ref()
            .filter(|f| f.generation == table.generation())
            .cloned()
    }

    /// The segment's frames numbered by `table` (mapped on first use, and
    /// again after the table started over). CPU work: call it off the
    /// async workers.
    pub fn frames(&self, table: &FrameTable) -> Arc<SegmentFrames> {
        let mut frames = self.frames.lock().expect("segment frames");
        match &*frames {
            Some(f) if f.generation == table.generation() => f.clone(),
            _ => {
                let mapped = Arc::new(table.map(&self.data));
                *frames = Some(mapped.clone());
                mapped
            }
        }
    }
}

/// The byte ranges of a segment's parts.
pub type PartRanges = Arc<Vec<std::ops::Range<u64>>>;

pub struct SegmentCache(WeightedLru<Arc<Segment>>, WeightedLru<PartRanges>);

impl SegmentCache {
    pub fn new(budget: u64) -> Self {
        // Part directories: 16 bytes a part, a 64th of the budget (at
        // least 1 MiB).
        Self(
            WeightedLru::new(budget),
            WeightedLru::new((budget / 64).max(1 << 20)),
        )
    }

    pub fn get(&self, sha256: &str) -> Option<Arc<Segment>> {
        self.0.get_if(sha256, |_| true)
    }

    /// Where a (version 2) segment's parts are, once a read saw its header:
    /// a segment listed whole is then served from its cached parts without
    /// fetching anything.
    pub fn parts_of(&self, sha256: &str) -> Option<PartRanges> {
        self.1.get_if(sha256, |_| true)
    }

    pub fn set_parts_of(&self, sha256: &str, ranges: PartRanges) {
        let weight = ranges.len() as u64 * 16 + sha256.len() as u64 + 64;
        self.1.insert(sha256, ranges, weight);
    }

    pub fn insert(&self, sha256: &str, data: Arc<Segment>) {
        // The stack numbering adds 4 bytes per stack.
        let bytes = estimated_bytes(&data.data) + data.data.stacks.len() as u64 * 4;
        if bytes > self.0.budget() {
            return;
        }
        let total = self.0.insert(sha256, data, bytes);
        metrics::gauge!("symtrace_segment_cache_bytes").set(total as f64);
    }
}

/// Memory a decoded segment holds, roughly (vectors and strings; hash
/// overheads ignored).
fn estimated_bytes(d: &SegmentData) -> u64 {
    let strings: usize = d.strings.iter().map(|s| s.len() + 24).sum();
    let frames: usize = d.frames.iter().map(|f| 48 + f.lines.len() * 40).sum();
    let stacks: usize = d.stacks.iter().map(|s| 24 + s.len() * 4).sum();
    let labels: usize = d.label_sets.iter().map(|s| 24 + s.len() * 8).sum();
    let samples: usize = d
        .samples
        .iter()
        .map(|s| 64 + s.timestamps.len() * 8 + s.values.len() * 8)
        .sum();
    (strings + frames + stacks + labels + samples + d.mappings.len() * 40 + d.links.len() * 24)
        as u64
}
