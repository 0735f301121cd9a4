//! Each sampled process's mappings, as the BPF walk looks them up to find
//! the unwind table of the code at an address (issue #40): set at the
//! process's first sample and again whenever its mappings change; while a
//! mapped file's facts are read or its table built, looked at again every
//! [`RETRY`] — on a timer of the sampler thread, not at its next sample,
//! and without waiting for the jobs (a huge binary's facts must not hold
//! up the ranges of the processes sampled beside it).
//! The tables themselves are per file ([`crate::cfi::tables`]).

use std::hash::{Hash, Hasher};
use std::time::{Duration, Instant};

use super::{Context, Process};
use crate::cfi::tables::{FileKey, Lookup, Sink, Tables};
use crate::files::Binary;
use crate::process::maps::MapEntry;
use crate::record::{UnwindRange, UNWIND_PROC_RANGES};

/// How often a process whose files' tables are being built looks again.
const RETRY: Duration = Duration::from_millis(10);

/// Files looked up per settling of a process at most (its mappings beyond
/// are walked by frame pointer).
const MAX_LOOKS: usize = 4 * UNWIND_PROC_RANGES;

/// The tables and the BPF maps they are written to.
pub(crate) struct Unwinding {
    pub(crate) tables: Tables,
    pub(crate) maps: Box<dyn Sink + Send>,
}

/// Where a process stands.
#[derive(Debug, Default)]
pub(crate) struct ProcUnwind {
    /// Its ranges are set for its current mappings, with every table
    /// that was going to be built.
    settled: bool,
    retry_at: Option<Instant>,
}

impl Context {
    /// Sets the BPF walk's ranges of `process` unless they are settled.
    pub(crate) fn settle_unwind(&mut self, pid: u32, process: &mut Process, now: Instant) {
        let Context {
            unwinding,
            binaries,
            unwind_due,
            ..
        } = self;
        let Some(u) = unwinding.as_mut() else {
            return;
        };
        let state = &mut process.unwind;
        if state.settled || state.retry_at.is_some_and(|at| now < at) {
            return;
        }
        // Within the process's own work budget: a process with thousands of
        // mappings (and a dlopen loop re-reading them) pays for its looks.
        if !process.work.has(now) {
            state.retry_at = Some(now + RETRY);
            return;
        }
        let started = crate::jobs::thread_cpu();
        // Jobs are started, never waited for: the process looks again in
        // RETRY.
        let mut no_wait = crate::jobs::Waiting::new(Duration::ZERO, 0.0, Duration::ZERO);
        let mut ranges = Vec::new();
        let mut out = Outcome::default();
        // Mappings of one file come together (its segments): one look each.
        let mut last: Option<((u64, u64), Option<Found>)> = None;
        let mut looks = 0;
        for map in process.maps.iter().filter(|m| m.is_file()) {
            if ranges.len() > UNWIND_PROC_RANGES || looks >= MAX_LOOKS {
                break; // (more ranges than fit are counted by set_process)
            }
            let file = (map.dev, map.inode);
            let found = match last {
                Some((f, ref found)) if f == file => found.clone(),
                _ => {
                    looks += 1;
                    let found = look_up(u, binaries, &mut no_wait, pid, map, now, &mut out);
                    last = Some((file, found.clone()));
                    found
                }
            };
            if let Some((key, slot, base, binary)) = found {
                ranges.push((key, range(map, &binary, slot, base)));
            }
        }
        u.tables
            .set_process(pid, ranges, !out.pending, &mut *u.maps);
        let state = &mut process.unwind;
        state.settled = !out.pending;
        state.retry_at = out.pending.then_some(now + RETRY);
        if out.pending {
            match unwind_due.iter_mut().find(|(p, _)| *p == pid) {
                Some(due) => due.1 = now + RETRY,
                None => unwind_due.push((pid, now + RETRY)),
            }
        }
        process.work.charge_cpu_since(started);
        process.work.charge_time(out.paid);
    }

    /// When the first process whose files were pending looks again.
    pub(crate) fn next_unwind_due(&self) -> Option<Instant> {
        self.unwind_due.iter().map(|&(_, at)| at).min()
    }

    /// Loads the tables whose builds finished.
    pub(crate) fn poll_unwind(&mut self) {
        if let Some(u) = self.unwinding.as_mut() {
            u.tables.poll(Instant::now(), &mut *u.maps);
        }
    }

    /// The process is gone (or forgotten): its ranges go.
    pub(crate) fn forget_unwind(&mut self, pid: u32) {
        if let Some(u) = self.unwinding.as_mut() {
            u.tables.forget_process(pid, &mut *u.maps);
        }
    }
}

impl Process {
    /// Its mappings changed: its ranges are set again at its next sample.
    pub(crate) fn unwind_unsettled(&mut self) {
        self.unwind = ProcUnwind::default();
    }
}

/// What settling a process's files came to.
#[derive(Default)]
struct Outcome {
    /// A file's facts or table are still coming.
    pending: bool,
    /// Table builds it is charged for.
    paid: Duration,
}

/// A file's table, loaded: its key, slot, base, and the file's facts.
type Found = (FileKey, u32, u64, std::sync::Arc<Binary>);

/// The table of `map`'s file when loaded; `out.pending` set while its
/// facts are read or its table built.
fn look_up(
    u: &mut Unwinding,
    binaries: &mut crate::files::Binaries,
    waiting: &mut crate::jobs::Waiting,
    pid: u32,
    map: &MapEntry,
    now: Instant,
    out: &mut Outcome,
) -> Option<Found> {
    let Some(binary) = binaries.get(pid, map, waiting, true) else {
        out.pending |= !binaries.settled(map);
        return None;
    };
    binary.eh_frame.or(binary.debug_frame)?;
    let key = file_key(map, &binary);
    let lookup = u.tables.lookup(key, now, &mut *u.maps, || {
        Some(binaries.build_unwind_table(pid, map, &binary))
    });
    match lookup {
        Lookup::Loaded { slot, base } => {
            // The build's CPU, to the process that asked for it (a process
            // mapping files of huge CFI pays for their tables itself).
            out.paid += u.tables.take_unpaid(key);
            Some((key, slot, base, binary))
        }
        Lookup::Pending => {
            out.pending = true;
            None
        }
        Lookup::Absent => None,
    }
}

/// A file's key: its (device, inode) and a fingerprint of its facts.
fn file_key(map: &MapEntry, binary: &Binary) -> FileKey {
    let mut h = std::collections::hash_map::DefaultHasher::new();
    (
        binary.size,
        &binary.build_id,
        binary.eh_frame,
        binary.debug_frame,
        binary.text_address,
        &binary.loads,
    )
        .hash(&mut h);
    (map.dev, map.inode, h.finish())
}

/// The range of `map` in its file's table (loaded in `slot`, its offsets
/// from ELF address `base`).
fn range(map: &MapEntry, binary: &Binary, slot: u32, base: u64) -> UnwindRange {
    // Runtime address A is ELF address A - map.start + vaddr, table
    // offset A - (map.start - vaddr + base).
    let vaddr = binary.vaddr_of_mapping(map.offset);
    UnwindRange {
        start: map.start,
        adjust: map.start.wrapping_sub(vaddr).wrapping_add(base),
        len: u32::try_from(map.end - map.start).unwrap_or(u32::MAX),
        file: slot,
    }
}
