//! Which files' `otel_memory` probe sites are attached: one uprobe per
//! site and file — not per process: the kernel puts the breakpoint in every
//! process that maps the file, running or started later, from its first
//! instruction — each with its argument spec in the BPF program's
//! `usdt_specs` map, found by the link's cookie.
//!
//! Which files:
//! - at start, the probe files the operator names (`--memory-probe-files`)
//!   and the preload library where it is installed ([`DEFAULT_FILES`]):
//!   the first process started with them is covered from its first
//!   allocation. Looked at again every [`FULL_SCAN`] (a new version under
//!   the same path is attached too).
//! - every executable file mapping of every process, read once per
//!   (device, inode) with the binaries the agent reads anyway. A process
//!   that exec'd is looked at [`FIRST_LOOK`] after it (the BPF side wakes
//!   the agent at every exec) and again [`AFTER_EXEC`] later, new
//!   processes every [`SCAN`] (twice), every process every [`FULL_SCAN`]
//!   (libraries loaded later with `dlopen`). The first process of a file
//!   nobody named misses what it allocates before the look.
//!
//! A file stays attached when no process maps it any more, so that the
//! next process that maps it is covered from its first allocation: until
//! it is deleted (or replaced: its old inode has no name left), or until
//! its slots are wanted by a file that is mapped (idle files go first).

use std::collections::{HashMap, HashSet};
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::files::{open as safefile, Binary, Skip};
use crate::jobs::About;
use crate::process::maps::MapEntry;
use crate::process::Processes;
use crate::record::{UsdtSpec, USDT_SPECS};
use crate::usdt::MemoryProbe;

/// Where the preload library (alloc/preload) is installed, looked for at
/// start beside the files named by `--memory-probe-files`.
pub const DEFAULT_FILES: &[&str] = &[
    "/usr/local/lib/libsymtrace_alloc_preload.so",
    "/usr/lib/libsymtrace_alloc_preload.so",
    "/usr/lib/x86_64-linux-gnu/libsymtrace_alloc_preload.so",
    "/usr/lib64/libsymtrace_alloc_preload.so",
];
/// Files read from one named directory, at most.
const MAX_FILES_PER_DIRECTORY: usize = 1024;

/// How long after its exec a process is first looked at: the BPF side
/// wakes the agent at the exec, and the dynamic loader maps the libraries
/// (`LD_PRELOAD` ones first) within a millisecond or two of it.
pub const FIRST_LOOK: Duration = Duration::from_millis(4);
/// And looked at again, for a loader that took longer.
pub const AFTER_EXEC: Duration = Duration::from_millis(100);
/// Exec'd processes waiting for their looks, at most (a fork bomb's are
/// left to the scans).
const MAX_SOON: usize = 4096;
/// Looks at exec'd processes per tick, at most (the rest wait: an exec
/// storm costs a bounded number of maps reads a second).
const LOOKS_PER_TICK: usize = 16;
/// How often new processes are looked at.
pub const SCAN: Duration = Duration::from_secs(1);
/// How often every process is.
pub const FULL_SCAN: Duration = Duration::from_secs(30);
/// Probe sites of one file beyond which it is not attached (a hostile or
/// broken file; ours have one site per probe).
pub const MAX_SITES_PER_FILE: usize = 64;
/// Probe sites attached for the files of one owner (user), at most: the
/// `USDT_SPECS` slots are shared by every process of the host, and one
/// user's files cannot take them all; each site attached also costs a
/// detach of ~0.1 s in the kernel (on the reaper thread, or at shutdown).
pub const MAX_SITES_PER_OWNER: usize = USDT_SPECS / 16;
/// How long the sampler thread waits to open a file to attach to.
const OPEN_WAIT: Duration = Duration::from_millis(250);

/// What attaching is done through (the BPF side, or a test's record).
pub trait Attach {
    type Link;
    /// Attaches the probe program at `offset` of the file at `path`, its
    /// cookie `slot`, after writing `spec` at `slot`.
    fn attach(
        &mut self,
        path: &Path,
        offset: u64,
        slot: u32,
        spec: &UsdtSpec,
    ) -> anyhow::Result<Self::Link>;
    /// Detaches `link` (at `slot`), maybe later: its slot comes back from
    /// [`Attach::reaped`] once it is gone.
    fn detach(&mut self, link: Self::Link, slot: u32);
    /// The slots whose links are gone since the last call.
    fn reaped(&mut self) -> Vec<u32>;
    /// Waits until every link detached is gone.
    fn finish(&mut self);
}

struct AttachedFile<L> {
    path: String,
    /// Its owner, whose share of the slots it takes.
    owner: u32,
    links: Vec<(L, u32)>,
    /// The scan generation it was last seen mapped in.
    seen: u64,
    /// No process mapped it at the last full scan: its slots may go to a
    /// file that is mapped.
    idle: bool,
    /// Named by the operator (or installed where the preload library is):
    /// never given up for another file.
    named: bool,
    /// The file, held open: its link count says when it is gone.
    file: std::fs::File,
}

/// Counts of what the probe manager did, for the stats line.
#[derive(Debug, Default, Clone, Copy)]
pub struct ProbeStats {
    /// Files with probes attached now, and their sites.
    pub files: usize,
    pub sites: usize,
    /// Sites being detached (their slots not free yet).
    pub detaching: usize,
    /// Sites not attached: a semaphore, no free spec slot, or attaching
    /// failed.
    pub refused: u64,
    /// Files attached that no process maps (kept for the next one).
    pub idle: usize,
}

/// The files whose probes are attached, by (device, inode).
pub struct MemoryProbes<L> {
    proc_root: PathBuf,
    /// Files and directories named by the operator, and [`DEFAULT_FILES`].
    named: Vec<PathBuf>,
    files: HashMap<(u64, u64), AttachedFile<L>>,
    /// Files looked at and found without usable probes (or refused).
    without: HashSet<(u64, u64)>,
    free_slots: Vec<u32>,
    /// Slots taken per owner of the files attached (and being detached).
    by_owner: HashMap<u32, usize>,
    /// Slots being detached, and their owners.
    detaching: HashMap<u32, u32>,
    /// Pids looked at, and how many more looks each new one gets.
    known: HashMap<u32, u8>,
    /// Exec'd processes and when to look at them: first, and again (each
    /// queue in time order).
    first: std::collections::VecDeque<(u32, Instant)>,
    soon: std::collections::VecDeque<(u32, Instant)>,
    generation: u64,
    next_scan: Instant,
    next_full: Instant,
    refused: u64,
}

impl<L> MemoryProbes<L> {
    /// `named`: probe files (or directories of them) attached at start and
    /// at every full scan, whether or not a process maps them.
    pub fn new(proc_root: &Path, named: Vec<PathBuf>) -> Self {
        let now = Instant::now();
        Self {
            proc_root: proc_root.to_owned(),
            named,
            files: HashMap::new(),
            without: HashSet::new(),
            free_slots: (0..USDT_SPECS as u32).rev().collect(),
            by_owner: HashMap::new(),
            detaching: HashMap::new(),
            known: HashMap::new(),
            first: std::collections::VecDeque::new(),
            soon: std::collections::VecDeque::new(),
            generation: 0,
            next_scan: now,
            next_full: now,
            refused: 0,
        }
    }

    /// The slots of detached links that are gone: free again, and no
    /// longer their owner's.
    fn take_back(&mut self, attach: &mut impl Attach<Link = L>) {
        for slot in attach.reaped() {
            if let Some(owner) = self.detaching.remove(&slot) {
                if let Some(held) = self.by_owner.get_mut(&owner) {
                    *held = held.saturating_sub(1);
                }
                self.free_slots.push(slot);
            }
        }
    }

    /// Detaches every probe (at shutdown), all at once, and waits until
    /// they are gone.
    pub fn detach_all(&mut self, attach: &mut impl Attach<Link = L>) {
        for (_, file) in self.files.drain() {
            for (link, slot) in file.links {
                attach.detach(link, slot);
                self.detaching.insert(slot, file.owner);
            }
        }
        attach.finish();
        self.take_back(attach);
    }

    pub fn stats(&self) -> ProbeStats {
        ProbeStats {
            files: self.files.len(),
            sites: self.files.values().map(|f| f.links.len()).sum(),
            detaching: self.detaching.len(),
            refused: self.refused,
            idle: self.files.values().filter(|f| f.idle).count(),
        }
    }

    /// A process exec'd (or exited: its pid is looked at, and skipped if
    /// gone): its new mappings are looked at soon, and at the next scans.
    pub fn exec(&mut self, pid: u32) {
        self.known.insert(pid, 1);
        if self.soon.len() < MAX_SOON {
            let now = Instant::now();
            self.first.push_back((pid, now + FIRST_LOOK));
            self.soon.push_back((pid, now + AFTER_EXEC));
        }
    }

    /// How long until a look at an exec'd process is due (`None`: none
    /// waits).
    pub fn next_due(&self, now: Instant) -> Option<Duration> {
        [self.first.front(), self.soon.front()]
            .into_iter()
            .flatten()
            .map(|&(_, due)| due.saturating_duration_since(now))
            .min()
    }

    /// Looks at processes when it is time: new ones every [`SCAN`], all
    /// every [`FULL_SCAN`] (then detaching what no process maps).
    pub fn tick(
        &mut self,
        now: Instant,
        procs: &mut Processes,
        attach: &mut impl Attach<Link = L>,
    ) {
        // Due looks: the first ones after exec, then the later ones.
        let mut looks = 0;
        while looks < LOOKS_PER_TICK {
            let queue = if self.first.front().is_some_and(|&(_, due)| due <= now) {
                &mut self.first
            } else if self.soon.front().is_some_and(|&(_, due)| due <= now) {
                &mut self.soon
            } else {
                break;
            };
            let (pid, _) = queue.pop_front().expect("front");
            self.look_at_process(pid, procs, attach);
            looks += 1;
        }
        if now < self.next_scan {
            return;
        }
        self.next_scan = now + SCAN;
        let full = now >= self.next_full;
        if full {
            self.next_full = now + FULL_SCAN;
        }
        self.scan(full, procs, attach);
    }

    /// One look at the processes (all of them when `full`).
    pub fn scan(&mut self, full: bool, procs: &mut Processes, attach: &mut impl Attach<Link = L>) {
        self.generation += 1;
        self.take_back(attach);
        let Ok(dir) = std::fs::read_dir(&self.proc_root) else {
            return;
        };
        let pids: Vec<u32> = dir
            .filter_map(|e| e.ok()?.file_name().to_str()?.parse().ok())
            .collect();
        let alive: HashSet<u32> = pids.iter().copied().collect();
        self.known.retain(|pid, _| alive.contains(pid));
        for pid in pids {
            let looks = self.known.entry(pid).or_insert(2);
            if !full && *looks == 0 {
                continue;
            }
            *looks = looks.saturating_sub(1);
            self.look_at_process(pid, procs, attach);
        }
        if full {
            self.after_full_scan(attach);
        }
    }

    /// After a full scan: files no process mapped become idle (kept
    /// attached); deleted or replaced ones are detached; the named files
    /// are looked at again.
    fn after_full_scan(&mut self, attach: &mut impl Attach<Link = L>) {
        let generation = self.generation;
        let mut gone = Vec::new();
        for (key, file) in &mut self.files {
            file.idle = file.seen != generation;
            // No name left (deleted, or replaced by a rename over it):
            // no process can map it again.
            let unlinked = file
                .file
                .metadata()
                .map_or(true, |m| std::os::unix::fs::MetadataExt::nlink(&m) == 0);
            if file.idle && unlinked {
                gone.push(*key);
            }
        }
        for key in gone {
            let file = self.files.remove(&key).expect("listed");
            tracing::info!(path = %file.path, "deleted and no longer mapped: memory probes detached");
            self.detach(file, attach);
        }
        // Files seen without probes are looked at again (an inode can be
        // another file by now).
        self.without.clear();
        self.attach_named(attach);
    }

    fn detach(&mut self, file: AttachedFile<L>, attach: &mut impl Attach<Link = L>) {
        for (link, slot) in file.links {
            attach.detach(link, slot);
            self.detaching.insert(slot, file.owner);
        }
    }

    /// Starts detaching idle files (not named ones; of `owner` only, when
    /// given) until `sites` of their sites are on their way out: room for
    /// a file that is mapped. Their slots come back once reaped.
    /// Returns how many sites it started detaching.
    fn give_up_idle(
        &mut self,
        owner: Option<u32>,
        sites: usize,
        attach: &mut impl Attach<Link = L>,
    ) -> usize {
        let idle: Vec<(u64, u64)> = self
            .files
            .iter()
            .filter(|(_, f)| f.idle && !f.named && owner.is_none_or(|o| f.owner == o))
            .map(|(k, _)| *k)
            .collect();
        let mut freed = 0;
        for key in idle {
            if freed >= sites {
                break;
            }
            let file = self.files.remove(&key).expect("listed");
            freed += file.links.len();
            tracing::info!(path = %file.path, "memory probes of a file no process maps detached: its slots are wanted");
            self.detach(file, attach);
        }
        freed
    }

    /// Attaches the named files (and the files of named directories) not
    /// attached yet. A path that does not exist is skipped quietly (most
    /// of [`DEFAULT_FILES`] do not).
    pub fn attach_named(&mut self, attach: &mut impl Attach<Link = L>) {
        let mut files = Vec::new();
        for path in &self.named {
            match std::fs::metadata(path) {
                Ok(m) if m.is_dir() => match std::fs::read_dir(path) {
                    Ok(dir) => files.extend(
                        dir.filter_map(|e| e.ok())
                            .filter(|e| e.file_type().is_ok_and(|t| t.is_file() || t.is_symlink()))
                            .map(|e| e.path())
                            .take(MAX_FILES_PER_DIRECTORY),
                    ),
                    Err(e) => {
                        tracing::warn!(path = %path.display(), "memory probe directory unreadable: {e}")
                    }
                },
                Ok(_) => files.push(path.clone()),
                Err(_) => {}
            }
        }
        for path in files {
            // Known files cost a stat: only new ones are read. (Opened
            // without waiting: a FIFO in a named directory must not block.)
            let Ok(file) = std::os::unix::fs::OpenOptionsExt::custom_flags(
                std::fs::OpenOptions::new().read(true),
                libc::O_NONBLOCK,
            )
            .open(&path) else {
                continue;
            };
            let Ok(meta) = file.metadata() else { continue };
            let key = crate::files::file_key(&meta);
            if self.files.contains_key(&key) || self.without.contains(&key) {
                continue;
            }
            let binary = match crate::files::read_named(file) {
                Ok((binary, file)) if !binary.memory_probes.is_empty() => (binary, file),
                Ok(_) => {
                    self.without.insert(key);
                    continue;
                }
                Err(why) => {
                    tracing::debug!(path = %path.display(), ?why, "named memory probe file not read");
                    continue;
                }
            };
            let (binary, file) = binary;
            let path = path.display().to_string();
            self.attach_file(
                key,
                &path,
                binary.uid,
                file,
                &binary.memory_probes,
                true,
                attach,
            );
        }
    }

    fn look_at_process(
        &mut self,
        pid: u32,
        procs: &mut Processes,
        attach: &mut impl Attach<Link = L>,
    ) {
        // Its files, through its entry (read now if new; read again within
        // its budget): a process's maps can cost a lot to read.
        let Some(files) = procs.mapped_files(pid) else {
            return;
        };
        for map in &files {
            self.look_at(pid, map, procs, attach);
        }
    }

    /// Attaches to the probes of `map`'s file if it has any and is new;
    /// whether the file's probes are attached.
    fn look_at(
        &mut self,
        pid: u32,
        map: &MapEntry,
        procs: &mut Processes,
        attach: &mut impl Attach<Link = L>,
    ) -> bool {
        let key = (map.dev, map.inode);
        if let Some(file) = self.files.get_mut(&key) {
            file.seen = self.generation;
            file.idle = false;
            return true;
        }
        if self.without.contains(&key) {
            return false;
        }
        let binary: Option<Arc<Binary>> = procs.binary(pid, map);
        if binary.is_none() && !procs.binary_settled(map) {
            return false; // still being read: looked at again later
        }
        let probes = binary.as_ref().map_or(&[][..], |b| &b.memory_probes[..]);
        if probes.is_empty() {
            self.without.insert(key);
            return false;
        }
        let owner = binary.as_ref().map_or(u32::MAX, |b| b.uid);
        // Attached through a descriptor of the very file the process maps
        // (opened as the binaries are, inside the process's root, its inode
        // checked, in a job): a path the process could swap between a check
        // and the attach is never handed to the kernel.
        let (root, m) = (self.proc_root.clone(), map.clone());
        let opened = procs
            .pool()
            .run(About { pid, dev: map.dev }, OPEN_WAIT, move || {
                safefile::open_mapped(&root, pid, &m)
            })
            .unwrap_or(Err(Skip::Hung));
        let opened = match opened {
            Ok(o) => o,
            Err(why) => {
                tracing::debug!(pid, path = %map.path, ?why, "mapped file not opened: not attached");
                return false; // looked at again with the next process mapping it
            }
        };
        let probes = binary.as_ref().map_or(&[][..], |b| &b.memory_probes[..]);
        self.attach_file(key, &map.path, owner, opened.file, probes, false, attach)
    }

    /// Attaches `probes` of `file` (its key `key`, owned by `owner`): each
    /// site in a free slot, within the owner's share. When slots are short,
    /// idle files give theirs up (for the next look: detaching takes a
    /// while) and this one is not marked as without probes.
    #[allow(clippy::too_many_arguments)]
    fn attach_file(
        &mut self,
        key: (u64, u64),
        path: &str,
        owner: u32,
        file: std::fs::File,
        probes: &[MemoryProbe],
        named: bool,
        attach: &mut impl Attach<Link = L>,
    ) -> bool {
        let wanted = probes
            .iter()
            .take(MAX_SITES_PER_FILE)
            .filter(|p| !p.semaphore)
            .count();
        let held = self.by_owner.get(&owner).copied().unwrap_or(0);
        // Slots coming back from idle files: this file is looked at again
        // (not marked as without probes).
        let mut coming = 0;
        if held + wanted > MAX_SITES_PER_OWNER {
            coming += self.give_up_idle(Some(owner), held + wanted - MAX_SITES_PER_OWNER, attach);
        }
        if self.free_slots.len() < wanted {
            coming += self.give_up_idle(None, wanted - self.free_slots.len(), attach);
        }
        let fd_path = PathBuf::from(format!("/proc/self/fd/{}", file.as_raw_fd()));
        let mut links = Vec::new();
        for probe in probes.iter().take(MAX_SITES_PER_FILE) {
            if probe.semaphore {
                self.refused += 1;
                continue;
            }
            if held + links.len() >= MAX_SITES_PER_OWNER {
                self.refused += 1;
                continue;
            }
            let Some(slot) = self.free_slots.pop() else {
                self.refused += 1;
                continue;
            };
            match attach.attach(&fd_path, probe.file_offset, slot, &probe.spec) {
                Ok(link) => links.push((link, slot)),
                Err(e) => {
                    self.free_slots.push(slot);
                    self.refused += 1;
                    tracing::warn!(path = %path, offset = probe.file_offset, "attaching a memory probe: {e:#}");
                }
            }
        }
        self.refused += probes.len().saturating_sub(MAX_SITES_PER_FILE) as u64;
        if links.is_empty() {
            if coming == 0 {
                self.without.insert(key);
            }
            return false;
        }
        tracing::info!(
            path = %path,
            sites = links.len(),
            named,
            "otel_memory probes attached (memory allocation profiling)"
        );
        *self.by_owner.entry(owner).or_default() += links.len();
        self.files.insert(
            key,
            AttachedFile {
                path: path.to_owned(),
                owner,
                links,
                seen: self.generation,
                idle: false,
                named,
                file,
            },
        );
        true
    }
}

#[cfg(test)]
#[path = "attached_tests.rs"]
mod tests;
