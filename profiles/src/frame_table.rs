//! One numbering of frames and stacks for the whole process. Each segment
//! numbers its frames and stacks on its own; mapping them to a common
//! numbering costs a hash probe per frame, and a query over an hour of
//! uncompacted exports would pay it tens of millions of times. So the
//! mapping is done once per segment (and kept with the decoded segment in
//! the cache), and a query only adds values per stack number.
//!
//! The tables only grow; past [`MAX_FRAMES`] frames or stacks they start
//! over with a new generation, and mappings of an older generation are
//! redone (a query that sees the generation change mid-way runs again).

use std::sync::{RwLock, RwLockReadGuard};

use indexmap::IndexSet;
use rustc_hash::FxBuildHasher;

use crate::model::RawFrame;
use crate::model::SegmentData;
use crate::strings::Strings;

/// Frames (~64 bytes each), and stacks, kept before the tables start over.
pub const MAX_FRAMES: usize = 4_000_000;

/// The tables behind a [`FrameTable`].
#[derive(Default)]
pub struct Tables {
    /// Bumped each time the tables start over.
    pub generation: u64,
    /// The strings frames refer to.
    pub strings: Strings,
    /// Frames whose string fields are indexes into `strings`.
    pub frames: IndexSet<RawFrame, FxBuildHasher>,
    /// Stacks of `frames` numbers, leaf first.
    pub stacks: IndexSet<Box<[u32]>, FxBuildHasher>,
}

impl Tables {
    /// The string numbered `i`.
    pub fn str(&self, i: u32) -> &str {
        self.strings.get(i)
    }
}

/// A segment's stacks in the tables' numbering.
pub struct SegmentFrames {
    /// The generation the numbers are of.
    pub generation: u64,
    /// Table stack of each segment stack.
    pub stacks: Vec<u32>,
}

/// Frames and stacks numbered once for the whole process (see the module).
#[derive(Default)]
pub struct FrameTable {
    tables: RwLock<Tables>,
}

impl FrameTable {
    /// The tables, for reading.
    pub fn read(&self) -> RwLockReadGuard<'_, Tables> {
        self.tables.read().expect("frame table")
    }

    /// The current generation.
    pub fn generation(&self) -> u64 {
        self.read().generation
    }

    /// Numbers a segment's frames (CPU work; call it off the async
    /// workers). The write lock is held for the inserts only.
    pub fn map(&self, data: &SegmentData) -> SegmentFrames {
        let mut t = self.tables.write().expect("frame table");
        if t.frames.len() + data.frames.len() > MAX_FRAMES
            || t.stacks.len() + data.stacks.len() > MAX_FRAMES
        {
            let generation = t.generation + 1;
            *t = Tables {
                generation,
                ..Tables::default()
            };
        }
        let mut strings: Vec<u32> = vec![u32::MAX; data.strings.len()];
        let mut s = |t: &mut Tables, i: u32| {
            let slot = &mut strings[i as usize];
            if *slot == u32::MAX {
                *slot = t.strings.intern(data.str(i));
            }
            *slot
        };
        let ids: Vec<u32> = data
            .frames
            .iter()
            .map(|frame| {
                let mapping = &data.mappings[frame.mapping as usize];
                let raw = RawFrame {
                    kind: s(&mut t, frame.frame_type),
                    build_id: s(&mut t, mapping.build_id),
                    build_id_kind: mapping.build_id_kind,
                    module: s(&mut t, mapping.file),
                    content: s(&mut t, mapping.content),
                    address: frame.address,
                    lines: frame
                        .lines
                        .iter()
                        .map(|l| {
                            (
                                s(&mut t, l.function),
                                s(&mut t, l.system_name),
                                s(&mut t, l.file),
                                l.line,
                            )
                        })
                        .collect(),
                };
                t.frames.insert_full(raw).0 as u32
            })
            .collect();
        let stacks = data
            .stacks
            .iter()
            .map(|stack| {
                let mapped: Box<[u32]> = stack.iter().map(|&f| ids[f as usize]).collect();
                match t.stacks.get_index_of(&mapped) {
                    Some(i) => i as u32,
                    None => t.stacks.insert_full(mapped).0 as u32,
                }
            })
            .collect();
        SegmentFrames {
            generation: t.generation,
            stacks,
        }
    }
}
