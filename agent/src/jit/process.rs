//! One process's JIT symbols: the perf map and jitdump files it writes,
//! followed as they grow, into its table, within its share of the bounds.

use std::fs::File;
use std::os::unix::fs::{FileExt, MetadataExt};
use std::path::Path;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::{jitdump, names, perfmap, table, Named, Runtime, Shared, Symbol};
use crate::process::maps::MapEntry;

/// A missing perf map is looked for again at most this often.
const OPEN_RETRY: Duration = Duration::from_secs(1);
/// An address no symbol holds reads the files on at most this often.
const MISS_READ_INTERVAL: Duration = Duration::from_millis(20);
/// Bytes of perf map or jitdump read at one time, per file.
const READ_BUDGET: usize = 4 << 20;
/// A miss in a process whose entries were evicted rescans its perf map at
/// most this often, and at most this many bytes of it (and all processes'
/// rescans together at most `Shared::rescan_bytes` a second).
const RESCAN_INTERVAL: Duration = Duration::from_secs(1);
const RESCAN_MAX: u64 = 64 << 20;
/// Changes (loads, moves) applied to the table per read, at most: the rest
/// of what was read is dropped (counted bad) — a read of 4 MiB of tiny
/// records must not tie up the sampler thread.
const MAX_CHANGES_PER_READ: usize = 65_536;
/// Largest perf map opened (no runtime writes one this large).
const MAX_PERF_MAP_BYTES: u64 = 16 << 30;
/// jitdump files followed per process at once, at most (and files seen,
/// finished ones included).
const MAX_JITDUMPS: usize = 4;
const MAX_JITDUMPS_SEEN: usize = 64;
/// Table entries one loaded function is split into by its debug lines, at
/// most (neighbours with the same line are one entry; past the bound the
/// rest of the code keeps the last line).
const MAX_PIECES: usize = 256;

/// A change to the table, in the order the files said.
enum Change {
    Add(u64, u64, Named),
    /// The code at `from` now lives at `to`.
    Move(u64, u64, u64),
}

struct Followed<C> {
    file: File,
    cursor: C,
}

/// One process's JIT symbols and the files they come from.
pub struct ProcessJit {
    shared: Arc<Shared>,
    runtime: Runtime,
    table: table::Table,
    /// `/tmp/perf-NSPID.map` as the process sees it.
    perf_map_path: String,
    /// Users a perf map may belong to: the process's real and effective
    /// UIDs (a file of anyone else's is not trusted to name its code).
    uids: [u32; 2],
    perf_map: Option<Followed<perfmap::Cursor>>,
    perf_map_tried: Option<Instant>,
    /// A file at the perf map's path was refused (counted once).
    refused: bool,
    /// Followed now, by inode (closed once finished).
    jitdumps: Vec<(u64, Followed<jitdump::Reader>)>,
    /// Inodes of the jitdump files seen (finished ones included).
    jitdumps_seen: Vec<u64>,
    last_read: Option<Instant>,
    /// Entries of this process were evicted: a miss may rescan the map.
    evicted: bool,
    last_rescan: Option<Instant>,
    /// Accounted in `shared` (what Drop gives back).
    accounted: (usize, usize),
}

impl Drop for ProcessJit {
    fn drop(&mut self) {
        self.shared.bytes.fetch_sub(self.accounted.0, Relaxed);
        self.shared.symbols.fetch_sub(self.accounted.1, Relaxed);
        if self.accounted.1 > 0 {
            self.shared.live.fetch_sub(1, Relaxed);
        }
    }
}

impl ProcessJit {
    /// The JIT state of process `pid`, whose executable mappings are
    /// `maps` (they tell its runtime).
    pub fn new(
        shared: &Arc<Shared>,
        root: &Path,
        pid: u32,
        exe: Option<&str>,
        maps: &[MapEntry],
    ) -> Self {
        let status =
            std::fs::read_to_string(root.join(pid.to_string()).join("status")).unwrap_or_default();
        let field = |name: &str| {
            status
                .lines()
                .find_map(|l| l.strip_prefix(name))
                .map(|v| {
                    v.split_whitespace()
                        .map(|n| n.parse::<u32>().unwrap_or(u32::MAX))
                        .collect::<Vec<_>>()
                })
                .unwrap_or_default()
        };
        let ns_pid = field("NSpid:").last().copied().unwrap_or(pid);
        let uid = field("Uid:");
        ProcessJit {
            shared: shared.clone(),
            runtime: runtime_of(exe, maps),
            table: table::Table::default(),
            perf_map_path: format!("/tmp/perf-{ns_pid}.map"),
            uids: [
                uid.first().copied().unwrap_or(u32::MAX),
                uid.get(1).copied().unwrap_or(u32::MAX),
            ],
            perf_map: None,
            perf_map_tried: None,
            refused: false,
            jitdumps: Vec::new(),
            jitdumps_seen: Vec::new(),
            last_read: None,
            evicted: false,
            last_rescan: None,
            accounted: (0, 0),
        }
    }

    /// The symbol of generated code at `address`; a miss reads what the
    /// runtime wrote since the last read (at most every
    /// `MISS_READ_INTERVAL`, and only when `may_read`: the process is
    /// within its work budget).
    pub fn symbol(
        &mut self,
        root: &Path,
        pid: u32,
        maps: &[MapEntry],
        address: u64,
        now: Instant,
        may_read: bool,
    ) -> Option<Arc<crate::jit::Symbol>> {
        if let Some(s) = self.table.lookup(address) {
            return Some(s.clone());
        }
        if !may_read {
            return None;
        }
        if self
            .last_read
            .is_none_or(|t| now.duration_since(t) >= MISS_READ_INTERVAL)
        {
            self.last_read = Some(now);
            self.read(root, pid, maps, now);
            if let Some(s) = self.table.lookup(address) {
                return Some(s.clone());
            }
        }
        if self.evicted
            && self
                .last_rescan
                .is_none_or(|t| now.duration_since(t) >= RESCAN_INTERVAL)
        {
            self.last_rescan = Some(now);
            self.rescan(address);
            return self.table.lookup(address).cloned();
        }
        None
    }

    /// Looks for `address` in the part of the perf map already read (its
    /// entry may have been evicted before anything sampled it: the first
    /// read of a map larger than the bound keeps only its newest lines),
    /// at most `RESCAN_MAX` bytes of it; the latest line holding it is put
    /// back.
    fn rescan(&mut self, address: u64) {
        let Some(f) = &self.perf_map else { return };
        let end = f.cursor.offset.min(RESCAN_MAX);
        // Every process's rescans share one byte rate.
        let end = self.shared.take_rescan_bytes(end);
        let file = &f.file;
        let mut cursor = perfmap::Cursor::default();
        let mut found: Option<(u64, u64, Box<str>)> = None;
        while cursor.offset < end {
            let before = cursor.offset;
            let read = cursor.read(
                end,
                READ_BUDGET,
                |o, b| file.read_at(b, o),
                |start, size, name| {
                    if start <= address && address - start < size {
                        found = Some((start, size, name.into()));
                    }
                },
            );
            if read.is_err() || cursor.offset == before {
                break;
            }
        }
        if let Some((start, size, name)) = found {
            self.table
                .insert(start, size, Arc::new(Named::raw(&name, self.runtime)));
            self.shared.rescued.fetch_add(1, Relaxed);
            self.bound();
            self.account();
        }
    }

    fn read(&mut self, root: &Path, pid: u32, maps: &[MapEntry], now: Instant) {
        self.table.new_epoch();
        let process_root = root.join(pid.to_string()).join("root");
        if self.runtime == Runtime::Unknown {
            // Libraries mapped since (a JVM maps libjvm.so after start).
            self.runtime = runtime_of(None, maps);
        }
        if self
            .perf_map_tried
            .is_none_or(|t| now.duration_since(t) >= OPEN_RETRY)
        {
            // Missing, or maybe replaced by a new file at the path (a
            // runtime that writes a new map and renames it over the old).
            self.perf_map_tried = Some(now);
            let same = |a: &File, b: &File| {
                let (a, b) = (a.metadata(), b.metadata());
                matches!((a, b), (Ok(a), Ok(b)) if (a.dev(), a.ino()) == (b.dev(), b.ino()))
            };
            let opened = self.open_perf_map(&process_root);
            match (&self.perf_map, opened) {
                (Some(old), Some(new)) if same(&old.file, &new.file) => {}
                (_, Some(new)) => {
                    self.shared.files.fetch_add(1, Relaxed);
                    self.perf_map = Some(new);
                }
                _ => {}
            }
        }
        let mut changes: Vec<Change> = Vec::new();
        let mut bad = 0;
        if let Some(f) = &mut self.perf_map {
            let runtime = self.runtime;
            let len = f.file.metadata().map_or(0, |m| m.len());
            let file = &f.file;
            match f.cursor.read(
                len,
                READ_BUDGET,
                |o, b| file.read_at(b, o),
                |start, size, name| {
                    changes.push(Change::Add(start, size, Named::raw(name, runtime)));
                },
            ) {
                Ok(c) => bad += c.bad,
                Err(e) => {
                    tracing::debug!(pid, error = %e, "perf map unreadable");
                    self.perf_map = None;
                }
            }
        }
        self.follow_jitdumps(root, pid, maps);
        for (_, f) in &mut self.jitdumps {
            let runtime = self.runtime;
            let len = f.file.metadata().map_or(0, |m| m.len());
            let file = &f.file;
            let read = f.cursor.read(
                len,
                READ_BUDGET as u64,
                |o, b| file.read_at(b, o),
                |e| match e {
                    jitdump::Event::Load {
                        address,
                        size,
                        name,
                        lines,
                    } => load_pieces(
                        address,
                        size,
                        names::parse(name, runtime),
                        &lines,
                        &mut changes,
                    ),
                    jitdump::Event::Move { from, to, size } => {
                        changes.push(Change::Move(from, to, size))
                    }
                },
            );
            match read {
                Ok(c) => bad += c.bad,
                Err(_) => f.cursor.done = true,
            }
        }
        if changes.len() > MAX_CHANGES_PER_READ {
            bad += (changes.len() - MAX_CHANGES_PER_READ) as u64;
            changes.truncate(MAX_CHANGES_PER_READ);
        }
        for change in changes {
            match change {
                Change::Add(start, size, named) => {
                    self.table.insert(start, size, Arc::new(named));
                }
                // A function's pieces at most (and what straddles it).
                Change::Move(from, to, size) => {
                    if !self.table.move_range(from, to, size, MAX_PIECES + 2) {
                        bad += 1;
                    }
                }
            }
            self.bound();
        }
        self.shared.bad.fetch_add(bad, Relaxed);
        // Finished jitdump files are closed (their inode stays known).
        self.jitdumps.retain(|(_, f)| !f.cursor.done);
        self.account();
    }

    /// Evicts the oldest entries while over this process's share (the
    /// total bound over its share: when a new process makes the others'
    /// shares smaller, the caller trims them, `Shared::over_total`).
    fn bound(&mut self) {
        let share = self.shared.process_share(self.accounted.1 > 0);
        let pending: usize = self
            .jitdumps
            .iter()
            .map(|(_, f)| f.cursor.pending_bytes())
            .sum();
        loop {
            if self.table.bytes() + pending <= share {
                return;
            }
            if !self.table.evict_oldest() {
                return;
            }
            self.evicted = true;
            self.shared.dropped.fetch_add(1, Relaxed);
        }
    }

    /// Evicts down to this process's share now (run at every flush: a
    /// process that stopped missing shrinks too when others start).
    pub fn trim(&mut self) {
        self.bound();
        self.account();
    }

    /// Brings the shared totals up to date with this table (and the debug
    /// lines its jitdump readers hold for code not loaded yet).
    fn account(&mut self) {
        let pending: usize = self
            .jitdumps
            .iter()
            .map(|(_, f)| f.cursor.pending_bytes())
            .sum();
        let now = (self.table.bytes() + pending, self.table.len());
        match (self.accounted.1 > 0, now.1 > 0) {
            (false, true) => self.shared.live.fetch_add(1, Relaxed),
            (true, false) => self.shared.live.fetch_sub(1, Relaxed),
            _ => 0,
        };
        self.shared.bytes.fetch_add(now.0, Relaxed);
        self.shared.bytes.fetch_sub(self.accounted.0, Relaxed);
        self.shared.symbols.fetch_add(now.1, Relaxed);
        self.shared.symbols.fetch_sub(self.accounted.1, Relaxed);
        self.accounted = now;
    }

    /// Opens the perf map inside the process's root: a regular file of one
    /// of the process's users, checked before it is opened (a symlink to a
    /// device or a FIFO is never opened).
    fn open_perf_map(&mut self, process_root: &Path) -> Option<Followed<perfmap::Cursor>> {
        use crate::files::open::{open_owned_in_root, Skip};
        let file = match open_owned_in_root(
            process_root,
            &self.perf_map_path,
            &self.uids,
            MAX_PERF_MAP_BYTES,
        ) {
            Ok(file) => file,
            Err(why) => {
                // Missing is ordinary (no map yet); anything else is counted
                // once.
                let missing = why == Skip::Unreachable
                    && crate::files::open::path_in_root(process_root, &self.perf_map_path).is_err();
                if !missing && !std::mem::replace(&mut self.refused, true) {
                    tracing::debug!(path = %self.perf_map_path, ?why, "perf map refused: not a regular file of the process's user");
                    self.shared.bad.fetch_add(1, Relaxed);
                }
                return None;
            }
        };
        Some(Followed {
            file,
            cursor: perfmap::Cursor::default(),
        })
    }

    /// Opens the jitdump files the process maps (`jit-PID.dump`, mapped
    /// executable by its writer so that readers find it), as `perf inject
    /// --jit` finds them.
    fn follow_jitdumps(&mut self, root: &Path, pid: u32, maps: &[MapEntry]) {
        for map in maps.iter().filter(|m| m.is_file() && is_jitdump(&m.path)) {
            if self.jitdumps.len() >= MAX_JITDUMPS
                || self.jitdumps_seen.len() >= MAX_JITDUMPS_SEEN
                || self.jitdumps_seen.contains(&map.inode)
            {
                continue;
            }
            let Ok(opened) = crate::files::open::open_mapped(root, pid, map) else {
                continue;
            };
            self.shared.files.fetch_add(1, Relaxed);
            self.jitdumps_seen.push(map.inode);
            self.jitdumps.push((
                map.inode,
                Followed {
                    file: opened.file,
                    cursor: jitdump::Reader::default(),
                },
            ));
        }
    }
}

/// `…/jit-123.dump`.
fn is_jitdump(path: &str) -> bool {
    let name = path.rsplit('/').next().unwrap_or(path);
    name.strip_prefix("jit-")
        .and_then(|n| n.strip_suffix(".dump"))
        .is_some_and(|n| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()))
}

/// A loaded function as table entries: one per debug line when the writer
/// gave them (the code before the first line belongs to the first), else
/// one for the whole code.
fn load_pieces(
    address: u64,
    size: u64,
    symbol: Symbol,
    lines: &[jitdump::DebugLine],
    out: &mut Vec<Change>,
) {
    let end = address.saturating_add(size);
    let lines: Vec<&jitdump::DebugLine> = lines
        .iter()
        .filter(|l| l.address >= address && l.address < end)
        .collect();
    if lines.is_empty() {
        out.push(Change::Add(address, size, Named::parsed(symbol)));
        return;
    }
    // (start, line) pieces: neighbours with the same file and line are one.
    let mut pieces: Vec<(u64, &jitdump::DebugLine)> = Vec::new();
    for (i, l) in lines.iter().enumerate() {
        let from = if i == 0 { address } else { l.address };
        match pieces.last() {
            Some((_, prev)) if prev.line == l.line && prev.file == l.file => {}
            _ if pieces.len() >= MAX_PIECES => break,
            _ => pieces.push((from, l)),
        }
    }
    for (i, (from, l)) in pieces.iter().enumerate() {
        let to = pieces.get(i + 1).map_or(end, |n| n.0);
        if to > *from {
            out.push(Change::Add(
                *from,
                to - from,
                Named::parsed(Symbol {
                    file: Some(l.file.clone()),
                    line: l.line,
                    column: 0,
                    ..symbol.clone()
                }),
            ));
        }
    }
}

/// What runtime a process is, from its executable and libraries.
fn runtime_of(exe: Option<&str>, maps: &[MapEntry]) -> Runtime {
    let base = |p: &str| p.rsplit('/').next().unwrap_or(p).to_owned();
    let libs: Vec<String> = maps.iter().map(|m| base(&m.path)).collect();
    let has = |prefix: &str| libs.iter().any(|l| l.starts_with(prefix));
    if has("libjvm.so") {
        Runtime::Jvm
    } else if has("libcoreclr.so") {
        Runtime::Dotnet
    } else if has("libnode.so") || exe.map(base).is_some_and(|e| e == "node" || e == "nodejs") {
        Runtime::V8
    } else {
        Runtime::Unknown
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::jit::FrameKind;

    #[test]
    fn jitdump_names_and_runtimes() {
        assert!(is_jitdump(
            "/root/.debug/jit/java-jit-20240101.XyZ/jit-4242.dump"
        ));
        assert!(is_jitdump("jit-1.dump"));
        for no in [
            "/tmp/jit-.dump",
            "/tmp/jit-12.dump.bak",
            "/tmp/xjit-12.dump",
            "/tmp/jit-1a.dump",
        ] {
            assert!(!is_jitdump(no), "{no}");
        }
        let map = |path: &str| MapEntry {
            start: 0,
            end: 1,
            offset: 0,
            dev: 1,
            inode: 1,
            path: path.into(),
            deleted: false,
        };
        let jvm = [map(
            "/usr/lib/jvm/java-17-openjdk-amd64/lib/server/libjvm.so",
        )];
        assert_eq!(runtime_of(Some("/usr/bin/java"), &jvm), Runtime::Jvm);
        assert_eq!(runtime_of(Some("/usr/bin/node"), &[]), Runtime::V8);
        assert_eq!(
            runtime_of(Some("/srv/app"), &[map("/srv/libnode.so.108")]),
            Runtime::V8
        );
        assert_eq!(runtime_of(Some("/usr/bin/python3"), &[]), Runtime::Unknown);
    }

    #[test]
    fn debug_lines_split_a_function() {
        let line = |address, line| jitdump::DebugLine {
            address,
            line,
            file: Arc::from("gen.c"),
        };
        let mut out = Vec::new();
        let lines = [line(0x1010, 7), line(0x1020, 9), line(0x9999, 1)];
        load_pieces(0x1000, 0x40, Symbol::named("f"), &lines, &mut out);
        let got: Vec<(u64, u64, u32, Option<&str>)> = out
            .iter()
            .map(|c| match c {
                Change::Add(a, s, named) => {
                    let sym = named.symbol();
                    (*a, *s, sym.line, sym.file.as_deref())
                }
                Change::Move(..) => unreachable!(),
            })
            .collect();
        assert_eq!(
            got,
            vec![
                (0x1000, 0x20, 7, Some("gen.c")),
                (0x1020, 0x20, 9, Some("gen.c"))
            ]
        );
    }

    /// Over the per-process bound, the oldest entries go and are counted;
    /// the totals follow the tables and go back to zero when they go.
    #[test]
    fn bounded_per_process_and_in_total() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        let pid = std::process::id();
        // A fake /proc: PID/status, PID/root/tmp/perf-PID.map.
        let proc_dir = root.join(pid.to_string());
        std::fs::create_dir_all(proc_dir.join("root/tmp")).unwrap();
        // SAFETY: plain getters.
        let (uid, euid) = unsafe { (libc::getuid(), libc::geteuid()) };
        std::fs::write(
            proc_dir.join("status"),
            format!("Name:\tx\nUid:\t{uid}\t{euid}\t{euid}\t{euid}\nNSpid:\t{pid}\t77\n"),
        )
        .unwrap();
        let mut text = String::new();
        for i in 0..2000u64 {
            text.push_str(&format!(
                "{:x} 10 JS:*f{i} /app.js:{i}:1\n",
                0x10000 + i * 0x10
            ));
            if i % 100 == 0 {
                text.push_str("garbage line\n");
            }
        }
        std::fs::write(proc_dir.join("root/tmp/perf-77.map"), &text).unwrap();
        let per = table::ENTRY_OVERHEAD + 40;
        let shared = Shared::new(1 << 30, 500 * per);
        let mut jit = ProcessJit::new(&shared, root, pid, Some("/usr/bin/node"), &[]);
        let now = Instant::now();
        assert!(
            jit.symbol(root, pid, &[], 0x10000 + 1999 * 0x10, now, false)
                .is_none(),
            "over its budget: nothing read"
        );
        let last = jit
            .symbol(root, pid, &[], 0x10000 + 1999 * 0x10, now, true)
            .unwrap();
        assert_eq!(
            (&*last.function, last.line, last.kind),
            ("f1999", 1999, FrameKind::V8js)
        );
        assert_eq!(last.tier, Some("turbofan"));
        let s = shared.stats();
        assert_eq!(s.bad, 20);
        assert!(
            s.bytes <= 500 * per && s.symbols < 2000 && s.symbols > 300,
            "{s:?}"
        );
        assert_eq!(s.dropped as usize, 2000 - s.symbols, "the oldest evicted");
        assert_eq!(s.files, 1);
        // Sampled after its eviction: found again by a rescan of the map
        // (once a second at most: the next miss waits).
        let first = jit
            .symbol(root, pid, &[], 0x10000, now, true)
            .expect("rescued");
        assert_eq!(&*first.function, "f0");
        assert_eq!(shared.stats().rescued, 1);
        assert!(jit.symbol(root, pid, &[], 0x10010, now, true).is_none());
        assert!(shared.stats().bytes <= 500 * per);
        // A second process under a total bound: it evicts its own oldest.
        let total = Shared::new(300 * per, 1 << 30);
        let mut a = ProcessJit::new(&total, root, pid, None, &[]);
        a.symbol(root, pid, &[], 0, now, true);
        assert!(total.stats().bytes <= 300 * per);
        // A second one gets its share: each holds at most half once the
        // first is trimmed (at the next flush).
        // States with nothing in them (a Go binary's frames without a
        // build-ID make one) take no share.
        let empty: Vec<ProcessJit> = (0..8)
            .map(|_| ProcessJit::new(&total, root, 4_000_000, None, &[]))
            .collect();
        assert_eq!(total.process_share(true), 300 * per);
        drop(empty);
        let mut b = ProcessJit::new(&total, root, pid, None, &[]);
        b.symbol(root, pid, &[], 0, now, true);
        assert!(total.over_total());
        a.trim();
        assert!(!total.over_total());
        assert!(a.table.bytes() <= 150 * per && b.table.bytes() <= 150 * per);
        assert!(b.table.len() > 100, "{}", b.table.len());
        assert!(total.stats().bytes <= 300 * per);
        drop((a, b));
        drop(jit);
        assert_eq!((shared.stats().bytes, shared.stats().symbols), (0, 0));
        assert_eq!(total.stats().bytes, 0);
    }

    #[test]
    fn a_perf_map_of_another_user_is_not_read() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        let proc_dir = root.join("5");
        std::fs::create_dir_all(proc_dir.join("root/tmp")).unwrap();
        std::fs::write(
            proc_dir.join("status"),
            "Uid:\t4242\t4242\t4242\t4242\nNSpid:\t5\n",
        )
        .unwrap();
        std::fs::write(proc_dir.join("root/tmp/perf-5.map"), "1000 10 secret\n").unwrap();
        let shared = Shared::new(1 << 20, 1 << 20);
        let mut jit = ProcessJit::new(&shared, root, 5, None, &[]);
        assert!(jit
            .symbol(root, 5, &[], 0x1000, Instant::now(), true)
            .is_none());
        assert_eq!(shared.stats().bad, 1);
        // A FIFO in its place does not block the reader.
        std::fs::remove_file(proc_dir.join("root/tmp/perf-5.map")).unwrap();
        let c =
            std::ffi::CString::new(proc_dir.join("root/tmp/perf-5.map").to_str().unwrap()).unwrap();
        // SAFETY: mkfifo reads a NUL-terminated path.
        assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
        let mut jit = ProcessJit::new(&shared, root, 5, None, &[]);
        assert!(jit
            .symbol(root, 5, &[], 0x1000, Instant::now(), true)
            .is_none());
    }
}
