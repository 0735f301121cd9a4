//! Memory profiling's probes: the `otel_memory:alloc` and `otel_memory:free`
//! USDT probe sites of the files processes map (read with the rest of a
//! binary, from its `.note.stapsdt`), and attaching one uprobe per site and
//! file — not per process: the kernel puts the breakpoint in every process
//! that maps the file, running or started later — each with its argument
//! spec in the BPF program's `usdt_specs` map, found by the link's cookie.
//!
//! Which files: every executable file mapping of every process, read once
//! per (device, inode) with the binaries the agent reads anyway. A process
//! that exec'd is looked at [`FIRST_LOOK`] after it (the BPF side wakes the
//! agent at every exec) and again [`AFTER_EXEC`] later, new processes
//! every [`SCAN`] (twice), every process every
//! [`FULL_SCAN`] (libraries loaded later with `dlopen`), and files no
//! process maps any more are detached then.

use std::collections::{HashMap, HashSet};
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use object::{Object, ObjectSection, ObjectSegment, ReadRef};
use symtrace_elf::usdt::{ArgLocation, NoteLayout, Reg, UsdtArg};

use crate::files::{open as safefile, Binary};
use crate::jobs::About;
use crate::process::maps::MapEntry;
use crate::process::Processes;
use crate::record::{
    UsdtArgSpec, UsdtSpec, USDT_ARGS, USDT_ARG_CONST, USDT_ARG_MEM, USDT_ARG_REG, USDT_PROBE_ALLOC,
    USDT_PROBE_FREE, USDT_SPECS,
};

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
/// Bytes of `.note.stapsdt` read at most.
const MAX_NOTES_BYTES: u64 = 1 << 20;

/// One `otel_memory` probe site of a file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MemoryProbe {
    /// Where the uprobe goes: the site's offset in the file.
    pub file_offset: u64,
    /// `USDT_PROBE_ALLOC` or `USDT_PROBE_FREE`.
    pub probe: u32,
    /// Its arguments, as the BPF program reads them.
    pub spec: UsdtSpec,
    /// The site has a semaphore (a counter that enables it, which the
    /// agent does not set: such sites are not attached).
    pub semaphore: bool,
}

/// The `otel_memory` probe sites of a parsed ELF file (empty for most).
/// A site whose arguments cannot be read (another architecture's spec,
/// `%rip`-relative memory) is left out, with a debug log.
pub fn memory_probes<'d, R: ReadRef<'d>>(file: &object::File<'d, R>, data: R) -> Vec<MemoryProbe> {
    let Some(section) = file.section_by_name(".note.stapsdt") else {
        return Vec::new();
    };
    let Some((offset, size)) = section.file_range() else {
        return Vec::new();
    };
    if size > MAX_NOTES_BYTES {
        tracing::debug!(size, "a .note.stapsdt too large to read");
        return Vec::new();
    }
    let Ok(notes) = data.read_bytes_at(offset, size) else {
        return Vec::new();
    };
    let layout = NoteLayout {
        little_endian: file.is_little_endian(),
        is_64: file.is_64(),
        stapsdt_base: file.section_by_name(".stapsdt.base").map(|s| s.address()),
        segments: file
            .segments()
            .map(|s| {
                let (start, size) = s.file_range();
                (s.address(), size.min(s.size()), start)
            })
            .collect(),
        file_len: data.len().unwrap_or(0),
    };
    let probes = match symtrace_elf::usdt::probes_from_notes(notes, layout) {
        Ok(p) => p,
        Err(e) => {
            tracing::debug!("unreadable USDT notes: {e}");
            return Vec::new();
        }
    };
    probes
        .into_iter()
        .filter(|p| p.provider == "otel_memory")
        .filter_map(|p| {
            let probe = match p.name.as_str() {
                "alloc" => USDT_PROBE_ALLOC,
                "free" => USDT_PROBE_FREE,
                _ => return None,
            };
            let wanted = if probe == USDT_PROBE_ALLOC { 3 } else { 1 };
            let spec = match p.args.as_deref().map_err(String::clone).and_then(|args| {
                if args.len() < wanted {
                    return Err(format!("{} arguments, {wanted} needed", args.len()));
                }
                spec_of(probe, &args[..wanted])
            }) {
                Ok(spec) => spec,
                Err(why) => {
                    tracing::debug!(probe = %p.name, args = %p.args_text, "probe left out: {why}");
                    return None;
                }
            };
            Some(MemoryProbe {
                file_offset: p.file_offset?,
                probe,
                spec,
                semaphore: p.semaphore.is_some(),
            })
        })
        .collect()
}

/// The BPF program's spec of a probe's arguments.
pub fn spec_of(probe: u32, args: &[UsdtArg]) -> Result<UsdtSpec, String> {
    let mut spec = UsdtSpec {
        probe,
        ..Default::default()
    };
    for (slot, arg) in spec.args.iter_mut().zip(args).take(USDT_ARGS) {
        let size = i8::try_from(arg.size).map_err(|_| "an argument wider than 8 bytes")?;
        if !matches!(arg.size, 1 | 2 | 4 | 8) {
            return Err(format!("an argument of {} bytes", arg.size));
        }
        *slot = match arg.location {
            ArgLocation::Constant(value) => UsdtArgSpec {
                value,
                kind: USDT_ARG_CONST,
                ..Default::default()
            },
            ArgLocation::Register(Reg::Rip) | ArgLocation::Memory { base: Reg::Rip, .. } => {
                return Err("a %rip-relative argument".into())
            }
            ArgLocation::Register(reg) => UsdtArgSpec {
                kind: USDT_ARG_REG,
                reg_off: reg.pt_regs_offset() as u16,
                ..Default::default()
            },
            ArgLocation::Memory { base, offset } => UsdtArgSpec {
                value: offset,
                kind: USDT_ARG_MEM,
                reg_off: base.pt_regs_offset() as u16,
                ..Default::default()
            },
        };
        slot.size = if arg.signed { -size } else { size };
    }
    Ok(spec)
}

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
}

/// The files whose probes are attached, by (device, inode).
pub struct MemoryProbes<L> {
    proc_root: PathBuf,
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
    pub fn new(proc_root: &Path) -> Self {
        let now = Instant::now();
        Self {
            proc_root: proc_root.to_owned(),
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
            let generation = self.generation;
            let gone: Vec<(u64, u64)> = self
                .files
                .iter()
                .filter(|(_, f)| f.seen != generation)
                .map(|(k, _)| *k)
                .collect();
            for key in gone {
                let file = self.files.remove(&key).expect("listed");
                tracing::info!(path = %file.path, "no process maps it any more: memory probes detached");
                for (link, slot) in file.links {
                    attach.detach(link, slot);
                    self.detaching.insert(slot, file.owner);
                }
            }
            // Files seen without probes are looked at again (an inode can
            // be another file by now).
            self.without.clear();
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
        let held = self.by_owner.get(&owner).copied().unwrap_or(0);
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
            .unwrap_or(Err(crate::files::Skip::Hung));
        let opened = match opened {
            Ok(o) => o,
            Err(why) => {
                tracing::debug!(pid, path = %map.path, ?why, "mapped file not opened: not attached");
                return false; // looked at again with the next process mapping it
            }
        };
        let path = PathBuf::from(format!("/proc/self/fd/{}", opened.file.as_raw_fd()));
        let mut links = Vec::new();
        for probe in probes.iter().take(MAX_SITES_PER_FILE) {
            if probe.semaphore || held + links.len() >= MAX_SITES_PER_OWNER {
                self.refused += 1;
                continue;
            }
            let Some(slot) = self.free_slots.pop() else {
                self.refused += 1;
                continue;
            };
            match attach.attach(&path, probe.file_offset, slot, &probe.spec) {
                Ok(link) => links.push((link, slot)),
                Err(e) => {
                    self.free_slots.push(slot);
                    self.refused += 1;
                    tracing::warn!(path = %map.path, offset = probe.file_offset, "attaching a memory probe: {e:#}");
                }
            }
        }
        self.refused += probes.len().saturating_sub(MAX_SITES_PER_FILE) as u64;
        if links.is_empty() {
            self.without.insert(key);
            return false;
        }
        tracing::info!(
            pid,
            path = %map.path,
            sites = links.len(),
            "otel_memory probes attached (memory allocation profiling)"
        );
        *self.by_owner.entry(owner).or_default() += links.len();
        self.files.insert(
            key,
            AttachedFile {
                path: map.path.clone(),
                owner,
                links,
                seen: self.generation,
            },
        );
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use symtrace_elf::usdt::parse_args;

    #[test]
    fn argument_specs_for_the_bpf_program() {
        let args = parse_args("8@%rdi -4@-20(%rbp) 8@$5").unwrap();
        let spec = spec_of(USDT_PROBE_ALLOC, &args).unwrap();
        assert_eq!(spec.probe, USDT_PROBE_ALLOC);
        assert_eq!(
            spec.args[0],
            UsdtArgSpec {
                value: 0,
                kind: USDT_ARG_REG,
                reg_off: Reg::Rdi.pt_regs_offset() as u16,
                size: 8,
                pad: 0
            }
        );
        assert_eq!(
            (spec.args[1].kind, spec.args[1].value, spec.args[1].size),
            (USDT_ARG_MEM, -20, -4)
        );
        assert_eq!((spec.args[2].kind, spec.args[2].value), (USDT_ARG_CONST, 5));
        let rip = parse_args("8@16(%rip)").unwrap();
        assert!(spec_of(USDT_PROBE_FREE, &rip).is_err());
    }

    /// Attaches nothing: records what it was asked.
    #[derive(Default)]
    struct Recorded {
        /// (inode, offset, slot, probe)
        attached: Vec<(u64, u64, u32, u32)>,
        detached: Vec<u32>,
        /// Detached, and gone by the next look.
        gone: Vec<u32>,
        finished: bool,
    }

    impl Attach for Recorded {
        type Link = u32;

        fn attach(
            &mut self,
            path: &Path,
            offset: u64,
            slot: u32,
            spec: &UsdtSpec,
        ) -> anyhow::Result<u32> {
            // The path is a descriptor of the mapped file.
            assert!(path.starts_with("/proc/self/fd/"), "{}", path.display());
            let inode = std::os::unix::fs::MetadataExt::ino(&std::fs::metadata(path).unwrap());
            self.attached.push((inode, offset, slot, spec.probe));
            Ok(slot)
        }

        fn detach(&mut self, link: u32, slot: u32) {
            assert_eq!(link, slot);
            self.detached.push(slot);
            self.gone.push(slot);
        }

        fn reaped(&mut self) -> Vec<u32> {
            std::mem::take(&mut self.gone)
        }

        fn finish(&mut self) {
            self.finished = true;
        }
    }

    fn build_preload(dir: &Path) -> std::path::PathBuf {
        let status = std::process::Command::new("make")
            .args(["-s", "-C"])
            .arg(Path::new(env!("CARGO_MANIFEST_DIR")).join("../alloc/preload"))
            .arg(format!("O={}", dir.display()))
            .status()
            .expect("make is needed to build the preload library");
        assert!(status.success());
        dir.join("libsymtrace_alloc_preload.so")
    }

    #[test]
    fn probes_are_attached_once_per_file_and_detached_when_unmapped() {
        let dir = tempfile::tempdir().unwrap();
        let lib = build_preload(dir.path());
        let mut sleeper = std::process::Command::new("sleep")
            .arg("30")
            .env("LD_PRELOAD", &lib)
            .spawn()
            .unwrap();
        // The dynamic loader maps the library before `sleep` runs.
        let maps = format!("/proc/{}/maps", sleeper.id());
        let deadline = Instant::now() + Duration::from_secs(10);
        while !std::fs::read_to_string(&maps)
            .unwrap_or_default()
            .contains("libsymtrace_alloc_preload")
        {
            assert!(Instant::now() < deadline, "the library never mapped");
            std::thread::sleep(Duration::from_millis(10));
        }
        // Every job waited for: a busy machine must not leave the library
        // unread at the scan.
        let mut procs = crate::process::tests::processes();
        let mut probes: MemoryProbes<u32> = MemoryProbes::new(Path::new("/proc"));
        let mut kernel = Recorded::default();
        probes.scan(true, &mut procs, &mut kernel);
        // (Other processes of the machine may map probed files too: only
        // the library's sites are checked.)
        let inode = std::os::unix::fs::MetadataExt::ino(&std::fs::metadata(&lib).unwrap());
        let ours: Vec<(u64, u64, u32, u32)> = kernel
            .attached
            .iter()
            .filter(|a| a.0 == inode)
            .copied()
            .collect();
        let kinds: Vec<u32> = ours.iter().map(|a| a.3).collect();
        assert!(
            kinds.contains(&USDT_PROBE_ALLOC) && kinds.contains(&USDT_PROBE_FREE),
            "{kinds:?}"
        );
        let slots: HashSet<u32> = kernel.attached.iter().map(|a| a.2).collect();
        assert_eq!(slots.len(), kernel.attached.len(), "a cookie per site");
        let ours: Vec<u32> = ours.iter().map(|a| a.2).collect();
        assert!(probes.stats().files >= 1);
        // Looked at again (an exec, a scan): nothing attached twice.
        let n = kernel.attached.len();
        probes.exec(sleeper.id());
        probes.tick(Instant::now(), &mut procs, &mut kernel);
        probes.scan(true, &mut procs, &mut kernel);
        assert_eq!(kernel.attached.len(), n);
        // No process maps it any more: detached at the next full scan, its
        // slots free again.
        sleeper.kill().unwrap();
        sleeper.wait().unwrap();
        probes.scan(false, &mut procs, &mut kernel);
        assert!(
            ours.iter().all(|s| !kernel.detached.contains(s)),
            "only a full scan detaches"
        );
        probes.scan(true, &mut procs, &mut kernel);
        assert!(
            ours.iter().all(|s| kernel.detached.contains(s)),
            "{ours:?} detached: {:?}",
            kernel.detached
        );
        // Not free while their links may still be there; free once gone.
        assert!(ours.iter().all(|s| !probes.free_slots.contains(s)));
        probes.scan(false, &mut procs, &mut kernel);
        assert!(ours.iter().all(|s| probes.free_slots.contains(s)));
        assert!(probes.detaching.is_empty());
        // At shutdown every probe goes at once, and is waited for.
        probes.detach_all(&mut kernel);
        assert!(kernel.finished);
        assert_eq!(probes.stats().sites, 0);
        assert_eq!(probes.free_slots.len(), USDT_SPECS);
        assert!(probes.by_owner.values().all(|&n| n == 0));
    }

    #[test]
    fn reads_the_probes_of_the_preload_library() {
        // Built here from the same source as alloc/tests build it.
        let dir = tempfile::tempdir().unwrap();
        let lib = std::fs::read(build_preload(dir.path())).unwrap();
        let file = object::File::parse(&lib[..]).unwrap();
        let probes = memory_probes(&file, &lib[..]);
        let kinds: Vec<u32> = probes.iter().map(|p| p.probe).collect();
        assert!(kinds.contains(&USDT_PROBE_ALLOC) && kinds.contains(&USDT_PROBE_FREE));
        for p in &probes {
            assert!(!p.semaphore);
            assert!(p.file_offset > 0 && (p.file_offset as usize) < lib.len());
            assert!(p.spec.args[0].kind != 0);
        }
        // Our own test binary has no notes.
        let me = std::fs::read("/proc/self/exe").unwrap();
        let file = object::File::parse(&me[..]).unwrap();
        assert!(memory_probes(&file, &me[..]).is_empty());
    }
}
