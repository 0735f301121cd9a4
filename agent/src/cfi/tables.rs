//! The unwind tables the BPF walk searches (issue #40): one per file, by
//! file identity (shared by every process that maps the file), in a pool
//! of rows of a fixed size (`--unwind-table-bytes`), the rules of all
//! files deduplicated into one small array; and per process, its
//! executable mappings of files with a table, sorted, each with the
//! translation from its addresses to the table's.
//!
//! A file's rows are written before its slot says they are there, and a
//! freed range of rows is reused only after [`REUSE_AFTER`], so a walk
//! that read a slot a moment before it was freed finishes on the rows it
//! read. Files no process maps any more stay until their room is needed
//! (a command run again finds its tables), then the least recently used
//! go first. Pure bookkeeping over a [`Sink`]: the BPF maps, or memory in
//! tests.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::time::{Duration, Instant};

use super::deltas::pages::PageIndex;
use super::deltas::{CfaBase, Rule, SavedRbp, Table};
use crate::jobs::{JobError, Ticket};
use crate::record::{
    UnwindFile, UnwindProc, UnwindRange, UnwindRow, UnwindRule, RULE_OUTERMOST, RULE_RBP, RULE_RSP,
    RULE_UNKNOWN, UNWIND_FILES, UNWIND_FILE_FRAMED, UNWIND_FILE_SHIFT_AT, UNWIND_PAGE_SHIFT,
    UNWIND_PROC_RANGES, UNWIND_RANGE_FRAMED, UNWIND_RULES,
};

/// A file's identity: (device, inode, a fingerprint of its facts: an
/// inode reused by another file is another key).
pub type FileKey = (u64, u64, u64);

/// How long freed rows wait before they are reused (a BPF walk takes
/// microseconds).
pub const REUSE_AFTER: Duration = Duration::from_secs(1);

/// How long a frameless file's table nobody uses is kept from files that
/// keep frame pointers (a command run again finds its table; a framed
/// file's table serves only its leaves).
pub const FRAMELESS_KEPT: Duration = Duration::from_secs(300);

/// How long a file refused for room waits before a process mapping it
/// may have it built again (and then only if the pool could hold it).
pub const NO_ROOM_RETRY: Duration = Duration::from_secs(10);

/// Where the tables live: the BPF maps (rows, rules and files are
/// memory-mapped arrays; processes a hash map).
pub trait Sink {
    fn rows(&mut self) -> &mut [UnwindRow];
    fn rules(&mut self) -> &mut [UnwindRule];
    fn files(&mut self) -> &mut [UnwindFile];
    /// Sets (or with `None` deletes) a process's ranges.
    fn set_proc(&mut self, pid: u32, proc: Option<&UnwindProc>) -> Result<(), SinkError>;
    /// The process is forgotten: its next walk without ranges asks for
    /// them again (see `unwind_asked` in bpf/unwind.bpf.h).
    fn forgotten(&mut self, _pid: u32) {}
}

#[derive(Debug, thiserror::Error)]
#[error("updating the unwind map of process {pid}: {reason}")]
pub struct SinkError {
    pub pid: u32,
    pub reason: String,
}

/// How long a file whose build job was refused (the job queue full: a
/// busy host) waits before a process mapping it may have it built again.
pub const REFUSED_RETRY: Duration = Duration::from_secs(2);

/// Builds of one file that could not read it before it is given up (a
/// file no process can let the agent read: a hostile FUSE mount, say).
pub const UNREADABLE_TRIES: u8 = 5;

/// Why a file got no unwind table.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NoTable {
    /// No `.eh_frame` or (uncompressed) `.debug_frame` with anything in it.
    NoCfi,
    /// Its CFI is larger than the agent reads, or its table than a table
    /// may be.
    TooLarge,
    /// The file could not be read through the process, or changed.
    Unreadable,
}

/// A build job's answer.
pub type BuildAnswer = Result<Built, NoTable>;

/// A file's table as built in a job.
pub struct Built {
    pub table: Table,
    pub framed: bool,
    /// The CPU time the build took (charged to the process that asked).
    pub cpu: Duration,
}

/// What [`Tables::lookup`] knows of a file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Lookup {
    /// Loaded in `slot`; the table's offsets are from ELF address `base`.
    Loaded { slot: u32, base: u64 },
    /// Being built.
    Pending,
    /// No table: no usable CFI, or no room.
    Absent,
}

enum Entry {
    /// Its build job, and how many builds before it could not read the
    /// file.
    Building(Ticket<BuildAnswer>, u8),
    Loaded(Loaded),
    /// No usable CFI (or a table no pool of this size holds): for good.
    Absent,
    /// Its build job was refused at `at` (the queue full), or could not
    /// read the file (the process it was read through gone, as a
    /// compile's short-lived ones are, or the file replaced): built again,
    /// through whichever process maps it next, after [`REFUSED_RETRY`].
    /// `unreadable` counts the builds that could not read it; after
    /// [`UNREADABLE_TRIES`] it is absent for good.
    Refused {
        at: Instant,
        unreadable: u8,
    },
    /// Refused for room (or given up for frameless code) at `at`, `rows`
    /// long: built again once the pool could hold it.
    NoRoom {
        at: Instant,
        rows: u32,
        framed: bool,
    },
}

/// Why a built table was not loaded.
enum Refused {
    /// It never fits: larger than the pool, or the rule array is full.
    Never,
    /// Not now: the files using the pool are mapped. The rows of the
    /// pool it needs (its table's and its page index's).
    Room { rows: u32 },
}

struct Loaded {
    slot: u32,
    first: u32,
    /// Rows of the pool it holds: its table's and its page index's.
    count: u32,
    base: u64,
    /// Processes whose ranges name this slot.
    users: u32,
    last_used: Instant,
    /// The build's CPU time, until a process is charged for it.
    unpaid: Duration,
    /// The file keeps frame pointers: its table serves only leaves (which
    /// user space can still recover), so it makes room for a frameless
    /// file even while mapped.
    framed: bool,
}

/// What the tables hold and did.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct TableStats {
    pub files: u64,
    pub rows: u64,
    pub rules: u64,
    pub bytes: u64,
    pub capacity_bytes: u64,
    pub processes: u64,
    pub builds: u64,
    /// Builds that ended without a table: all causes, then by cause.
    pub build_failures: u64,
    pub no_cfi: u64,
    pub too_large: u64,
    pub unreadable: u64,
    /// Jobs refused (queue full: built again later), hung or panicked.
    pub jobs_failed: u64,
    pub evictions: u64,
    /// Files that got no table: no room even after evicting the unused.
    pub refused_full: u64,
    /// Of the evictions: tables of mapped files that keep frame pointers,
    /// given up to make room for frameless code (their leaves go back to
    /// user space).
    pub framed_given_up: u64,
    /// Mappings left out of a process's ranges (over UNWIND_PROC_RANGES).
    pub ranges_dropped: u64,
    pub sink_errors: u64,
}

pub struct Tables {
    files: HashMap<FileKey, Entry>,
    free_slots: Vec<u32>,
    /// Free rows: first → count, adjacent ranges merged.
    free_rows: BTreeMap<u32, u32>,
    retired: VecDeque<(Instant, u32, u32)>,
    capacity: u32,
    rules: HashMap<UnwindRule, u32>,
    /// Each process's ranges, and the file each names.
    procs: HashMap<u32, Vec<(FileKey, UnwindRange)>>,
    /// The `gen` of the last process entry written (each write a new one).
    gen: u32,
    stats: TableStats,
}

impl Tables {
    /// Tables in a pool of `capacity` rows.
    pub fn new(capacity: u32) -> Self {
        let mut free_rows = BTreeMap::new();
        if capacity > 0 {
            free_rows.insert(0, capacity);
        }
        Tables {
            files: HashMap::new(),
            free_slots: (0..UNWIND_FILES as u32).rev().collect(),
            free_rows,
            retired: VecDeque::new(),
            capacity,
            rules: HashMap::new(),
            procs: HashMap::new(),
            gen: 0,
            stats: TableStats {
                capacity_bytes: u64::from(capacity) * std::mem::size_of::<UnwindRow>() as u64,
                ..TableStats::default()
            },
        }
    }

    pub fn stats(&self) -> TableStats {
        TableStats {
            processes: self.procs.len() as u64,
            rules: self.rules.len() as u64,
            ..self.stats
        }
    }

    /// The table of file `key`, building it with `build` (a job) the
    /// first time; a finished build is loaded into `sink` here.
    pub fn lookup(
        &mut self,
        key: FileKey,
        now: Instant,
        sink: &mut dyn Sink,
        build: impl FnOnce() -> Option<Ticket<BuildAnswer>>,
    ) -> Lookup {
        let mut unreadable = 0;
        let retry = match self.files.get(&key) {
            Some(&Entry::Refused { at, unreadable: n }) => {
                if now.saturating_duration_since(at) < REFUSED_RETRY {
                    return Lookup::Absent;
                }
                unreadable = n;
                true
            }
            Some(&Entry::NoRoom { at, rows, framed }) => {
                if now.saturating_duration_since(at) < NO_ROOM_RETRY
                    || !self.could_hold(rows, framed, now)
                {
                    return Lookup::Absent;
                }
                true
            }
            _ => false,
        };
        if retry {
            self.files.remove(&key);
        }
        let built = match self.files.get_mut(&key) {
            None => {
                let Some(ticket) = build() else {
                    return Lookup::Pending;
                };
                self.stats.builds += 1;
                tracing::debug!(?key, "building an unwind table");
                match ticket.try_take() {
                    None => {
                        self.files.insert(key, Entry::Building(ticket, unreadable));
                        return Lookup::Pending;
                    }
                    Some(answer) => answer,
                }
            }
            Some(Entry::Building(ticket, n)) => {
                unreadable = *n;
                match ticket.try_take() {
                    None => return Lookup::Pending,
                    Some(answer) => answer,
                }
            }
            Some(Entry::Loaded(l)) => {
                l.last_used = now;
                return Lookup::Loaded {
                    slot: l.slot,
                    base: l.base,
                };
            }
            Some(Entry::Absent | Entry::NoRoom { .. } | Entry::Refused { .. }) => {
                return Lookup::Absent
            }
        };
        let entry = match built {
            Err(job) => {
                self.stats.build_failures += 1;
                self.stats.jobs_failed += 1;
                match job {
                    JobError::Refused => Entry::Refused {
                        at: now,
                        unreadable,
                    },
                    // It would hang or panic again.
                    JobError::Hung | JobError::Panicked(_) => Entry::Absent,
                }
            }
            Ok(Err(why)) => {
                self.stats.build_failures += 1;
                *match why {
                    NoTable::NoCfi => &mut self.stats.no_cfi,
                    NoTable::TooLarge => &mut self.stats.too_large,
                    NoTable::Unreadable => &mut self.stats.unreadable,
                } += 1;
                match why {
                    // Not the file's fault, as a rule: the process it was
                    // read through ended. Another process maps it.
                    NoTable::Unreadable if unreadable + 1 < UNREADABLE_TRIES => Entry::Refused {
                        at: now,
                        unreadable: unreadable + 1,
                    },
                    _ => Entry::Absent,
                }
            }
            Ok(Ok(built)) => match self.load(&built, now, sink) {
                Ok(loaded) => Entry::Loaded(Loaded {
                    unpaid: built.cpu,
                    ..loaded
                }),
                Err(why) => {
                    self.stats.refused_full += 1;
                    match why {
                        Refused::Never => Entry::Absent,
                        Refused::Room { rows } => Entry::NoRoom {
                            at: now,
                            rows,
                            framed: built.framed,
                        },
                    }
                }
            },
        };
        let answer = match &entry {
            Entry::Loaded(l) => Lookup::Loaded {
                slot: l.slot,
                base: l.base,
            },
            _ => Lookup::Absent,
        };
        self.files.insert(key, entry);
        answer
    }

    /// The CPU time file `key`'s build took, once (the first process to
    /// find the table pays for it).
    pub fn take_unpaid(&mut self, key: FileKey) -> Duration {
        match self.files.get_mut(&key) {
            Some(Entry::Loaded(l)) => std::mem::take(&mut l.unpaid),
            _ => Duration::ZERO,
        }
    }

    /// Loads the builds that finished (for processes that exited before
    /// they did: their answers do not wait for a lookup that never comes).
    pub fn poll(&mut self, now: Instant, sink: &mut dyn Sink) {
        let done: Vec<FileKey> = self
            .files
            .iter()
            .filter(|(_, e)| matches!(e, Entry::Building(t, _) if t.is_done()))
            .map(|(k, _)| *k)
            .collect();
        for key in done {
            self.lookup(key, now, sink, || None);
        }
    }

    /// Whether `rows` (of a file keeping frame pointers or not) could fit
    /// once the rows free, retired and held by what [`Tables::make_room`]
    /// may take are counted (fragmentation aside).
    fn could_hold(&self, rows: u32, framed: bool, now: Instant) -> bool {
        let free: u64 = self.free_rows.values().map(|&n| u64::from(n)).sum();
        let retired: u64 = self.retired.iter().map(|&(_, _, n)| u64::from(n)).sum();
        let unused: u64 = self
            .files
            .values()
            .filter_map(|e| match e {
                Entry::Loaded(l)
                    if may_go(l, framed, now) || (l.framed && !framed && l.last_used < now) =>
                {
                    Some(u64::from(l.count))
                }
                _ => None,
            })
            .sum();
        free + retired + unused >= u64::from(rows)
    }

    /// Writes a built table into the pool: rows first, then its slot.
    /// Files looked up at `now` (named by the ranges of the process being
    /// settled, not yet counted as its users) are not evicted for it.
    fn load(
        &mut self,
        built: &Built,
        now: Instant,
        sink: &mut dyn Sink,
    ) -> Result<Loaded, Refused> {
        let table = &built.table;
        let rows = u32::try_from(table.starts.len()).map_err(|_| Refused::Never)?;
        let (pages, count) = pool_rows(table);
        if rows == 0 || count > self.capacity {
            return Err(Refused::Never);
        }
        // Rule indices first (a full rule array refuses the file).
        let mut index = Vec::with_capacity(table.rules.len());
        for &rule in &table.rules {
            index.push(
                self.rule_index(bpf_rule(rule), sink)
                    .ok_or(Refused::Never)?,
            );
        }
        self.reclaim(now);
        let first = loop {
            if let Some(first) = self.take_rows(count) {
                break first;
            }
            if !self.make_room(now, built.framed, sink) {
                return Err(Refused::Room { rows: count });
            }
            // Rows of evicted files wait out REUSE_AFTER; take them now
            // only if nothing else is free — a walk in flight on them
            // lasts microseconds, not the build that preceded this. (They
            // were retired at `now`: this reclaims exactly those.)
            self.reclaim(now + REUSE_AFTER);
        };
        let Some(slot) = self.free_slots.pop().or_else(|| {
            self.make_room(now, built.framed, sink)
                .then(|| self.free_slots.pop())
                .flatten()
        }) else {
            self.give_back(first, count);
            return Err(Refused::Room { rows: count });
        };
        let pool = &mut sink.rows()[first as usize..(first + count) as usize];
        let (table_rows, page_rows) = pool.split_at_mut(rows as usize);
        for (row, (&start, &rule)) in table_rows
            .iter_mut()
            .zip(table.starts.iter().zip(&table.rule_of))
        {
            *row = UnwindRow {
                start,
                rule: index[usize::from(rule)],
            };
        }
        for (row, span) in page_rows.iter_mut().zip(&pages.spans) {
            *row = UnwindRow {
                start: span.lowest,
                rule: span.highest,
            };
        }
        std::sync::atomic::fence(std::sync::atomic::Ordering::Release);
        let framed = if built.framed {
            UNWIND_FILE_FRAMED as u32
        } else {
            0
        };
        sink.files()[slot as usize] = UnwindFile {
            first,
            count: rows,
            flags: framed | pages.shift << UNWIND_FILE_SHIFT_AT,
            pages: pages.spans.len() as u32,
        };
        self.stats.files += 1;
        self.stats.rows += u64::from(count);
        self.stats.bytes = self.stats.rows * std::mem::size_of::<UnwindRow>() as u64;
        Ok(Loaded {
            slot,
            first,
            count,
            base: table.base,
            users: 0,
            last_used: now,
            unpaid: Duration::ZERO,
            framed: built.framed,
        })
    }

    fn rule_index(&mut self, rule: UnwindRule, sink: &mut dyn Sink) -> Option<u32> {
        if let Some(&i) = self.rules.get(&rule) {
            return Some(i);
        }
        let i = u32::try_from(self.rules.len()).ok()?;
        if i as usize >= UNWIND_RULES {
            return None;
        }
        sink.rules()[i as usize] = rule;
        self.rules.insert(rule, i);
        Some(i)
    }

    fn take_rows(&mut self, count: u32) -> Option<u32> {
        let (&first, &n) = self.free_rows.iter().find(|(_, &n)| n >= count)?;
        self.free_rows.remove(&first);
        if n > count {
            self.free_rows.insert(first + count, n - count);
        }
        Some(first)
    }

    fn give_back(&mut self, first: u32, count: u32) {
        let mut first = first;
        let mut count = count;
        if let Some((&before, &n)) = self.free_rows.range(..first).next_back() {
            if before + n == first {
                self.free_rows.remove(&before);
                first = before;
                count += n;
            }
        }
        if let Some(&n) = self.free_rows.get(&(first + count)) {
            self.free_rows.remove(&(first + count));
            count += n;
        }
        self.free_rows.insert(first, count);
    }

    /// Retired rows older than REUSE_AFTER become free.
    fn reclaim(&mut self, now: Instant) {
        while let Some(&(at, first, count)) = self.retired.front() {
            if now.duration_since(at) < REUSE_AFTER {
                break;
            }
            self.retired.pop_front();
            self.give_back(first, count);
        }
    }

    /// Frees one table for a file keeping frame pointers (`framed`) or
    /// not; false when nothing may go. Tables looked up at `now` (named
    /// by the process being settled) stay. A frameless file's table is
    /// what keeps its stacks whole, a framed one's only its leaves (which
    /// user space recovers too), so the victims are, least recently used
    /// first: framed files nobody maps; for frameless code, framed files
    /// still mapped (given up: their processes' ranges drop them), then
    /// frameless files nobody maps; for framed code, frameless files
    /// nobody used for [`FRAMELESS_KEPT`].
    fn make_room(&mut self, now: Instant, framed: bool, sink: &mut dyn Sink) -> bool {
        self.evict_one(now, |l| l.framed, sink)
            || (!framed && self.give_up_framed(now, sink))
            || self.evict_one(now, |l| may_go(l, framed, now), sink)
    }

    /// Evicts the least recently used file no process maps, nothing
    /// looked up at `now`, for which `may` holds; false when there is
    /// none. Its rows are retired at `now`.
    fn evict_one(
        &mut self,
        now: Instant,
        may: impl Fn(&Loaded) -> bool,
        sink: &mut dyn Sink,
    ) -> bool {
        let victim = self
            .files
            .iter()
            .filter_map(|(k, e)| match e {
                Entry::Loaded(l) if l.users == 0 && l.last_used < now && may(l) => {
                    Some((l.last_used, *k))
                }
                _ => None,
            })
            .min();
        let Some((_, key)) = victim else {
            return false;
        };
        let Some(Entry::Loaded(l)) = self.files.remove(&key) else {
            return false;
        };
        self.retire(&l, now, sink);
        self.stats.evictions += 1;
        true
    }

    /// Gives up the table of the least recently used mapped file that
    /// keeps frame pointers (not looked up at `now`): the ranges of the
    /// processes mapping it drop it first, then its slot and rows go. It
    /// is built again once its processes' mappings change and the pool
    /// could hold it. False when there is none.
    fn give_up_framed(&mut self, now: Instant, sink: &mut dyn Sink) -> bool {
        let victim = self
            .files
            .iter()
            .filter_map(|(k, e)| match e {
                Entry::Loaded(l) if l.framed && l.last_used < now => Some((l.last_used, *k)),
                _ => None,
            })
            .min();
        let Some((_, key)) = victim else {
            return false;
        };
        let users: Vec<u32> = self
            .procs
            .iter()
            .filter(|(_, ranges)| ranges.iter().any(|(k, _)| *k == key))
            .map(|(&pid, _)| pid)
            .collect();
        for pid in users {
            let Some(ranges) = self.procs.get(&pid) else {
                continue;
            };
            let kept: Vec<_> = ranges.iter().filter(|(k, _)| *k != key).copied().collect();
            // The old ranges stay until the new ones are in (a failed
            // update keeps the file's slot named: give up on this file).
            if !self.write_proc(pid, &kept, sink) {
                return false;
            }
            self.procs.insert(pid, kept);
        }
        let Some(Entry::Loaded(l)) = self.files.remove(&key) else {
            return false;
        };
        self.retire(&l, now, sink);
        self.files.insert(
            key,
            Entry::NoRoom {
                at: now,
                rows: l.count,
                framed: true,
            },
        );
        self.stats.evictions += 1;
        self.stats.framed_given_up += 1;
        true
    }

    /// A loaded table's slot is cleared and freed; its rows retired at
    /// `now`.
    fn retire(&mut self, l: &Loaded, now: Instant, sink: &mut dyn Sink) {
        sink.files()[l.slot as usize] = UnwindFile::default();
        self.free_slots.push(l.slot);
        self.retired.push_back((now, l.first, l.count));
        self.stats.files -= 1;
        self.stats.rows -= u64::from(l.count);
        self.stats.bytes = self.stats.rows * std::mem::size_of::<UnwindRow>() as u64;
    }

    /// Writes process `pid`'s ranges (sorted, at most UNWIND_PROC_RANGES)
    /// to the sink; false (counted) when the sink refused them.
    fn write_proc(
        &mut self,
        pid: u32,
        ranges: &[(FileKey, UnwindRange)],
        sink: &mut dyn Sink,
    ) -> bool {
        // A new generation at each write: the BPF walk's memo of this
        // process's rules (by pid and address) holds only while it stays.
        self.gen = self.gen.wrapping_add(1);
        let mut proc = UnwindProc {
            count: ranges.len() as u32,
            gen: self.gen,
            ranges: [UnwindRange::default(); UNWIND_PROC_RANGES],
        };
        for (i, (key, r)) in ranges.iter().enumerate() {
            // The walk steps a framed file's non-leaf frames by frame
            // pointer without looking at its table: the range says so.
            let framed = matches!(self.files.get(key), Some(Entry::Loaded(l)) if l.framed);
            proc.ranges[i] = UnwindRange {
                file: r.file
                    | if framed {
                        UNWIND_RANGE_FRAMED as u32
                    } else {
                        0
                    },
                ..*r
            };
        }
        match sink.set_proc(pid, Some(&proc)) {
            Ok(()) => true,
            Err(e) => {
                self.stats.sink_errors += 1;
                tracing::debug!("{e}");
                false
            }
        }
    }

    /// Sets process `pid`'s ranges: (file, start, length, adjust) of each
    /// executable mapping of a loaded file, in any order. `complete`: every
    /// file's table that was going to be built is in; a complete process
    /// without ranges gets an empty entry (the BPF walk then knows it was
    /// read: no stack snapshots, no wakeups), an incomplete one none yet.
    pub fn set_process(
        &mut self,
        pid: u32,
        mut ranges: Vec<(FileKey, UnwindRange)>,
        complete: bool,
        sink: &mut dyn Sink,
    ) {
        ranges.sort_unstable_by_key(|(_, r)| r.start);
        if ranges.len() > UNWIND_PROC_RANGES {
            self.stats.ranges_dropped += (ranges.len() - UNWIND_PROC_RANGES) as u64;
            ranges.truncate(UNWIND_PROC_RANGES);
        }
        if ranges.is_empty() && !complete {
            self.forget_process(pid, sink);
            return;
        }
        if !self.write_proc(pid, &ranges, sink) {
            return;
        }
        self.add_users(&ranges, 1);
        if let Some(old) = self.procs.insert(pid, ranges) {
            self.add_users(&old, -1);
        }
    }

    pub fn forget_process(&mut self, pid: u32, sink: &mut dyn Sink) {
        sink.forgotten(pid);
        if let Some(old) = self.procs.remove(&pid) {
            if let Err(e) = sink.set_proc(pid, None) {
                self.stats.sink_errors += 1;
                tracing::debug!("{e}");
            }
            self.add_users(&old, -1);
        }
    }

    fn add_users(&mut self, ranges: &[(FileKey, UnwindRange)], delta: i32) {
        for (key, _) in ranges {
            if let Some(Entry::Loaded(l)) = self.files.get_mut(key) {
                l.users = l.users.saturating_add_signed(delta);
            }
        }
    }
}

/// Whether the table `l` (nobody maps, not looked up at `now`) may make
/// room for a file keeping frame pointers (`framed`) or not: any table for
/// frameless code; for framed code, framed ones and frameless ones unused
/// for [`FRAMELESS_KEPT`].
fn may_go(l: &Loaded, framed: bool, now: Instant) -> bool {
    l.users == 0
        && l.last_used < now
        && (!framed || l.framed || now.saturating_duration_since(l.last_used) >= FRAMELESS_KEPT)
}

/// A table's page index (see `struct unwind_file` in bpf/sample.h) and
/// the rows of the pool the two take together (at most twice the table's:
/// the index has no more pages than the table has rows).
fn pool_rows(table: &Table) -> (PageIndex, u32) {
    let pages = PageIndex::new(&table.starts, UNWIND_PAGE_SHIFT as u32);
    let rows = table.starts.len().saturating_add(pages.spans.len());
    (pages, u32::try_from(rows).unwrap_or(u32::MAX))
}

/// A rule as the BPF walk reads it.
pub fn bpf_rule(rule: Rule) -> UnwindRule {
    match rule {
        Rule::Step { base, cfa, ra, rbp } => UnwindRule {
            cfa,
            ra,
            rbp: match rbp {
                SavedRbp::AtCfa(o) => o,
                SavedRbp::Same => 0,
            },
            kind: match base {
                CfaBase::Rsp => RULE_RSP,
                CfaBase::Rbp => RULE_RBP,
            } as u8,
            rbp_saved: u8::from(matches!(rbp, SavedRbp::AtCfa(_))),
            pad: 0,
        },
        Rule::Outermost => UnwindRule {
            kind: RULE_OUTERMOST as u8,
            ..UnwindRule::default()
        },
        Rule::Unknown => UnwindRule {
            kind: RULE_UNKNOWN as u8,
            ..UnwindRule::default()
        },
    }
}

#[cfg(test)]
#[path = "tables_tests.rs"]
mod tests;
