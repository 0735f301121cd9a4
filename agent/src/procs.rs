//! The processes the agent has seen: who they are (service name, executable,
//! container) and where their code is (executable mappings → build-ID and
//! ELF virtual address). Entries are read on a process's first sample and
//! dropped on exec and exit; the mappings are read again when an address
//! falls outside them (a new `dlopen`), when they are older than
//! `MAPS_MAX_AGE`, and when ld.so reports a `dlopen` or `dlclose`
//! (`link_map_changed`).

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use rustc_hash::FxHashMap;

use crate::binaries::Binaries;
use crate::cfi::CfiCache;
use crate::jit::{self, ProcessJit, Symbol};
use crate::maps::{self, MapEntry};
use crate::record::{
    self, ThreadCtxLoc, USER_END_NOT_INCREASING, USER_END_ROOT, USER_END_UNREADABLE,
};
use crate::resolve::Resolver;
use crate::threadctx;
use crate::unwind::{self, Cut, LeafStep, UnwindStats};
use crate::vdso::Vdso;

/// Mappings older than this are read again on the next sample.
const MAPS_MAX_AGE: Duration = Duration::from_secs(10);
/// A miss reads the mappings again at most this often per process.
pub(crate) const MAPS_MISS_INTERVAL: Duration = Duration::from_millis(200);

/// Who a process is: its OTLP resource.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct ProcessInfo {
    pub pid: u32,
    pub service_name: String,
    pub executable_name: String,
    pub executable_path: Option<String>,
    pub container_id: Option<String>,
    /// Other resource attributes from the OpenTelemetry process context.
    pub resource: Vec<(String, String)>,
    /// Names of the thread-context attribute keys, by key index.
    pub attribute_keys: Vec<String>,
}

/// A mapping as the profile names it: a file's range in ELF virtual
/// addresses (the OpenTelemetry eBPF profiler's convention), or a range of
/// memory that is no file (`[anon]`, `[vdso]`) in runtime addresses.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Mapping {
    pub path: String,
    /// The file's ID: its GNU build-ID, else its htlhash (`htlhash`).
    pub build_id: Option<String>,
    /// `build_id` is an htlhash (the file has no GNU build-ID).
    pub htlhash: bool,
    pub start: u64,
    pub limit: u64,
    pub file_offset: u64,
}

/// A user frame: its mapping and address (an ELF virtual address when the
/// mapping is a file or the vDSO, the runtime address in generated code),
/// and its name when the agent knows it (the vDSO's functions, JIT code).
#[derive(Debug, Clone)]
pub struct UserFrame {
    pub mapping: Arc<Mapping>,
    pub address: u64,
    pub name: Option<Arc<Symbol>>,
}

/// A user stack as the BPF program captured it.
#[derive(Debug, Clone, Copy)]
pub struct UserStack<'a> {
    /// `%rip`, then the frame-pointer chain's return addresses.
    pub chain: &'a [u64],
    /// `enum user_stack_end`.
    pub end: u32,
    /// `%rbp` at the sample (where the chain was walked from).
    pub bp: u64,
    /// The stack bytes from `%rsp` up.
    pub window: &'a [u8],
}

/// Cached answers of "is this return address just after a call" at most;
/// the cache starts over beyond.
pub(crate) const CODE_CHECKS_MAX: usize = 64 * 1024;

pub(crate) struct Process {
    pub(crate) info: Arc<ProcessInfo>,
    pub(crate) maps: Vec<MapEntry>,
    /// Per entry of `maps`, made on first use.
    pub(crate) mappings: Vec<Option<Arc<Mapping>>>,
    pub(crate) maps_read: Instant,
    last_sample: Instant,
    /// How its threads reach `otel_thread_ctx_v1`, when its executable or
    /// a library defines it (the BPF program reads their contexts).
    thread_ctx: Option<ThreadCtxLoc>,
    /// Its `OTEL_CTX` mapping was there when `info` was read (else `info`
    /// is read again when the mappings show one).
    process_context_read: bool,
    /// Its JIT symbols, made when a sample first lands in code without a
    /// build-ID.
    pub(crate) jit: Option<Box<ProcessJit>>,
}

/// An entry without samples for this long is dropped at the next flush if
/// its process is gone (its exit event may have been lost).
const IDLE_MAX_AGE: Duration = Duration::from_secs(120);

pub struct Processes {
    proc_root: PathBuf,
    by_pid: HashMap<u32, Process>,
    binaries: Binaries,
    unknown: Arc<Mapping>,
    cfi: CfiCache,
    vdso: Option<Vdso>,
    /// (file or memory, address) → whether a return address there follows
    /// a call instruction (or is a signal trampoline).
    code_checks: FxHashMap<(u64, u64, u64), bool>,
    /// What unwinding did so far.
    pub unwind: UnwindStats,
    /// Processes gone before their first sample was read.
    pub vanished: u64,
    /// Trace-context locations to hand to the BPF program: `Some` for a
    /// process that publishes thread contexts, `None` for one that is gone.
    tls_changes: Vec<(u32, Option<ThreadCtxLoc>)>,
    /// Dynamic loaders seen (device, inode), and those whose dlopen hook is
    /// yet to be attached: (a process mapping it, its mapping, the hook's
    /// file offset).
    loaders: Loaders,
    /// Bounds and counters of every process's JIT symbols.
    jit: Arc<jit::Shared>,
}

impl Processes {
    /// `cfi_budget`: bytes of call-frame information kept in memory;
    /// `jit_bytes`: bytes of JIT symbols kept per process and in total.
    pub fn new(proc_root: &Path, cfi_budget: usize, jit_bytes: (usize, usize)) -> Self {
        Self {
            proc_root: proc_root.to_owned(),
            by_pid: HashMap::new(),
            binaries: Binaries::default(),
            unknown: Arc::new(Mapping {
                path: "[unknown]".to_owned(),
                build_id: None,
                htlhash: false,
                start: 0,
                limit: u64::MAX,
                file_offset: 0,
            }),
            vanished: 0,
            tls_changes: Vec::new(),
            loaders: Loaders::default(),
            cfi: CfiCache::new(cfi_budget),
            vdso: Vdso::read_own(),
            code_checks: FxHashMap::default(),
            unwind: UnwindStats::default(),
            jit: jit::Shared::new(jit_bytes.1, jit_bytes.0),
        }
    }

    /// Offers every file whose code is sampled to `offers` (publishing
    /// the binaries no CI uploaded).
    pub fn offer_binaries_to(&mut self, offers: Option<crate::upload::Offers>) {
        self.binaries.offers = offers;
    }

    /// What the JIT symbols hold and lost.
    pub fn jit_stats(&self) -> jit::JitStats {
        self.jit.stats()
    }

    /// Functions of the vDSO the agent names (0: no vDSO read).
    pub fn vdso_functions(&self) -> usize {
        self.vdso.as_ref().map_or(0, Vdso::functions)
    }

    /// What the CFI cache holds.
    pub fn cfi_stats(&self) -> crate::cfi::CacheStats {
        self.cfi.stats()
    }

    /// What changed for the BPF program's trace-context offsets since the
    /// last call.
    pub fn take_tls_changes(&mut self) -> Vec<(u32, Option<ThreadCtxLoc>)> {
        std::mem::take(&mut self.tls_changes)
    }

    /// Dynamic loaders met since the last call, whose dlopen hook is to be
    /// attached: (a process mapping it, its mapping, the hook's offset).
    pub fn take_new_loaders(&mut self) -> Vec<(u32, MapEntry, u64)> {
        std::mem::take(&mut self.loaders.new)
    }

    /// Processes read since the last call: their link-map changes are to
    /// wake the agent (`link_map_changed`).
    pub fn take_new_processes(&mut self) -> Vec<u32> {
        std::mem::take(&mut self.loaders.watch)
    }

    /// A loader whose hook could not be attached: tried again with the next
    /// process that maps it.
    pub fn loader_not_hooked(&mut self, map: &MapEntry) {
        self.loaders.seen.remove(&(map.dev, map.inode));
    }

    /// ld.so says process `pid` changed its link map (a dlopen or dlclose):
    /// its mappings are read again, and a library that defines the
    /// OTEP 4947 slot — an addon, an extension loaded after start-up — is
    /// handed to the BPF program now, before the library's first use.
    /// Also reads its process context if one appeared.
    pub fn link_map_changed(&mut self, pid: u32) {
        let Some(process) = self.by_pid.get_mut(&pid) else {
            // Not sampled yet (every process start calls the hook): read on
            // its first sample, libraries and all.
            return;
        };
        let Ok(text) = maps::read_text(&self.proc_root, pid) else {
            return;
        };
        refresh(&self.proc_root, pid, process, &text, Instant::now());
        if process
            .thread_ctx
            .is_some_and(|l| l.kind == record::CTX_TP_OFFSET)
        {
            return; // the executable's slot, whatever the libraries do
        }
        let location = library_location(
            &self.proc_root,
            pid,
            process.info.executable_path.as_deref(),
            &process.maps,
            &mut self.binaries,
            &mut self.loaders,
        );
        if location != process.thread_ctx {
            // A library loaded now publishes contexts, or the one that did
            // was unloaded (dlclose): its GOT entry is no longer read.
            tracing::debug!(
                pid,
                ?location,
                "the library publishing OpenTelemetry thread contexts changed"
            );
            process.thread_ctx = location;
            self.tls_changes.push((pid, location));
        }
    }

    pub fn len(&self) -> usize {
        self.by_pid.len()
    }

    pub fn binaries(&self) -> usize {
        self.binaries.len()
    }

    /// Mapped files not read, by `safefile::Skip::index`.
    pub fn files_skipped(&self) -> [u64; 6] {
        self.binaries.skipped
    }

    /// The file of mapping `map` of process `pid`, read once per file.
    pub fn binary(&mut self, pid: u32, map: &MapEntry) -> Option<Arc<crate::binaries::Binary>> {
        self.binaries.get(&self.proc_root, pid, map)
    }

    /// Reads process `pid` now if it is new (its trace-context slot among
    /// the rest), before its first sample.
    pub fn register(&mut self, pid: u32) {
        self.entry(pid, "");
    }

    /// exec: new mappings, maybe a new service name.
    pub fn forget(&mut self, pid: u32) {
        if let Some(p) = self.by_pid.remove(&pid) {
            if p.thread_ctx.is_some() {
                self.tls_changes.push((pid, None));
            }
        }
    }

    /// Reads every running process now (at start-up), so that the trace
    /// contexts of processes that were running before the agent are read
    /// from their very first sample. Returns how many were read.
    pub fn prime(&mut self) -> usize {
        let Ok(dir) = std::fs::read_dir(&self.proc_root) else {
            return 0;
        };
        let pids: Vec<u32> = dir
            .filter_map(|e| e.ok()?.file_name().to_str()?.parse().ok())
            .collect();
        for pid in pids {
            // Kernel threads have no executable; gone processes neither.
            if std::fs::read_link(self.proc_root.join(pid.to_string()).join("exe")).is_ok() {
                self.entry(pid, "");
            }
        }
        self.by_pid.len()
    }

    /// Runs at every flush: entries of processes that are gone and were not
    /// sampled for a while go (their exit event may have been lost), and
    /// cached files are read again from time to time.
    pub fn age(&mut self) {
        let now = Instant::now();
        let changes = &mut self.tls_changes;
        let root = &self.proc_root;
        self.by_pid.retain(|&pid, p| {
            let keep = now.duration_since(p.last_sample) < IDLE_MAX_AGE
                || root.join(pid.to_string()).exists();
            if !keep && p.thread_ctx.is_some() {
                changes.push((pid, None));
            }
            keep
        });
        // Each process's JIT symbols within its share of the total.
        for jit in self.by_pid.values_mut().filter_map(|p| p.jit.as_mut()) {
            jit.trim();
        }
        if self.binaries.len() > 4096 {
            self.binaries.clear();
            self.cfi.forget_all(); // (device, inode) may name other files now
            self.code_checks.clear();
        }
    }

    fn entry(&mut self, pid: u32, comm: &str) -> &mut Process {
        entry(
            &mut self.by_pid,
            &self.proc_root,
            &mut self.binaries,
            &mut self.tls_changes,
            &mut self.loaders,
            &mut self.vanished,
            pid,
            comm,
        )
    }

    /// Resolves a user stack of process `pid` into `out` (leaf first; see
    /// `record::call_site`): the leaf's caller inserted when its CFI says the
    /// frame-pointer chain skips it, every return address checked, the stack
    /// cut where one fails (the `Cut` returned then). Also returns who the
    /// process is (read now if new; `comm` names it if it is gone).
    pub fn resolve(
        &mut self,
        pid: u32,
        comm: &str,
        stack: &UserStack<'_>,
        out: &mut Vec<UserFrame>,
    ) -> (Arc<ProcessInfo>, Option<Cut>) {
        let now = Instant::now();
        let Processes {
            proc_root: root,
            by_pid,
            binaries,
            unknown,
            vanished,
            tls_changes,
            loaders,
            cfi,
            vdso,
            code_checks,
            unwind: stats,
            jit,
        } = self;
        let process = entry(
            by_pid,
            root,
            binaries,
            tls_changes,
            loaders,
            vanished,
            pid,
            comm,
        );
        process.last_sample = now;
        if now.duration_since(process.maps_read) > MAPS_MAX_AGE {
            reread(root, pid, process, now);
        }
        let info = process.info.clone();
        let Some((&ip, chain)) = stack.chain.split_first() else {
            return (info, None);
        };
        let mut r = Resolver {
            root,
            pid,
            process,
            binaries,
            unknown,
            vdso: vdso.as_ref(),
            jit,
            now,
        };
        let Some(leaf) = r.frame(ip) else {
            out.push(r.unknown_frame(ip));
            return (info, None);
        };
        // Step out of the leaf with its CFI.
        let rule = r.leaf_rule(cfi, &leaf);
        out.push(leaf.frame);
        let mut cut = None;
        match rule.map(|rule| unwind::leaf_step(rule, stack.bp, stack.window)) {
            None => stats.leaf_without_cfi += 1,
            Some(LeafStep::Chain) => {}
            Some(LeafStep::OutOfWindow) => stats.out_of_window += 1,
            Some(LeafStep::Caller {
                mut ret,
                mut chain_ok,
            }) => {
                stats.callers_recovered += 1;
                // The caller may be frameless too (a libc wrapper around a
                // syscall wrapper: where every blocked thread waits): step
                // on with each one's CFI, in the captured window, until a
                // function with its frame, from which the chain is right.
                let mut base = rule.and_then(unwind::caller_sp).unwrap_or(0);
                for _ in 0..unwind::MAX_FRAMELESS_CALLERS {
                    if !r.check_and_push(code_checks, ret, false, out, &mut cut) {
                        break;
                    }
                    if !chain_ok {
                        cut = Some(Cut::CallerFrameUnknown);
                        break;
                    }
                    let Some(caller) = r.frame(record::call_site(1, ret)) else {
                        break;
                    };
                    let Some(rule) = r.leaf_rule(cfi, &caller) else {
                        break;
                    };
                    match unwind::step(rule, stack.bp, stack.window, base) {
                        LeafStep::Chain => break,
                        LeafStep::OutOfWindow => {
                            // Its caller is above the window: the chain from
                            // %rbp would skip it.
                            cut = Some(Cut::CallerFrameUnknown);
                            break;
                        }
                        LeafStep::Caller {
                            ret: next,
                            chain_ok: ok,
                        } => {
                            stats.frameless_callers += 1;
                            base += unwind::caller_sp(rule).unwrap_or(0);
                            (ret, chain_ok) = (next, ok);
                        }
                    }
                }
            }
        }
        if cut.is_none() {
            let last = chain.len().saturating_sub(1);
            for (i, &ret) in chain.iter().enumerate() {
                // The root frame of a chain that ended normally may be a
                // runtime's entry point that nothing called (Go's goexit).
                let root_frame = i == last && stack.end == USER_END_ROOT;
                if !r.check_and_push(code_checks, ret, root_frame, out, &mut cut) {
                    break;
                }
            }
        }
        if cut.is_none() {
            cut = match stack.end {
                USER_END_NOT_INCREASING => Some(Cut::NotIncreasing),
                USER_END_UNREADABLE => Some(Cut::Unreadable),
                _ => None,
            };
        }
        if let Some(c) = cut {
            stats.cut[c.index()] += 1;
        }
        if jit.over_total() {
            // A process read JIT symbols beyond what the others leave.
            for p in by_pid.values_mut() {
                if let Some(j) = p.jit.as_mut() {
                    j.trim();
                }
            }
        }
        (info, cut)
    }
}

#[allow(clippy::too_many_arguments)] // the disjoint borrows of Processes
fn entry<'a>(
    by_pid: &'a mut HashMap<u32, Process>,
    root: &Path,
    binaries: &mut Binaries,
    tls_changes: &mut Vec<(u32, Option<ThreadCtxLoc>)>,
    loaders: &mut Loaders,
    vanished: &mut u64,
    pid: u32,
    comm: &str,
) -> &'a mut Process {
    by_pid.entry(pid).or_insert_with(|| {
        // One read of the maps serves the mappings and the process context.
        let text = maps::read_text(root, pid).ok();
        let maps = text.as_deref().map(maps::parse).unwrap_or_else(|| {
            *vanished += 1;
            Vec::new()
        });
        let info = read_info(root, pid, comm, text.as_deref());
        let location = thread_ctx_location(root, pid, &info, &maps, binaries, loaders);
        loaders.watch.push(pid);
        if let Some(loc) = location {
            tracing::debug!(pid, ?loc, "process publishes OpenTelemetry thread contexts");
            tls_changes.push((pid, Some(loc)));
        }
        Process {
            info: Arc::new(info),
            mappings: vec![None; maps.len()],
            maps,
            maps_read: Instant::now(),
            last_sample: Instant::now(),
            thread_ctx: location,
            process_context_read: text
                .as_deref()
                .is_some_and(|t| threadctx::process_context_address(t).is_some()),
            jit: None,
        }
    })
}

/// The dynamic loaders met, by (device, inode); and the processes read
/// since the last hand-over, whose link-map changes are to wake the agent
/// (every process start calls the hook: only those of processes the agent
/// knows do).
#[derive(Default)]
struct Loaders {
    seen: std::collections::HashSet<(u64, u64)>,
    new: Vec<(u32, MapEntry, u64)>,
    watch: Vec<u32>,
}

/// How the process's threads reach their OTEP 4947 slot: the executable's
/// own symbol first (the one symbol lookup finds first), else a shared
/// library's, through the GOT entry of its TLS relocation.
fn thread_ctx_location(
    root: &Path,
    pid: u32,
    info: &ProcessInfo,
    maps: &[MapEntry],
    binaries: &mut Binaries,
    loaders: &mut Loaders,
) -> Option<ThreadCtxLoc> {
    let exe = info.executable_path.as_deref();
    if let Some(map) = exe.and_then(|exe| maps.iter().find(|m| m.path == exe)) {
        if let Some(offset) = binaries
            .get(root, pid, map)
            .and_then(|b| b.thread_ctx_offset)
        {
            // The loaders are still looked for: a library loaded later
            // changes nothing here, but the hook serves every process.
            library_location(root, pid, exe, maps, binaries, loaders);
            return Some(threadctx::executable_location(offset));
        }
    }
    library_location(root, pid, exe, maps, binaries, loaders)
}

/// The first mapped library that defines the slot (every mapped file is
/// looked at once, cached by file; dynamic loaders are noted on the way).
fn library_location(
    root: &Path,
    pid: u32,
    exe: Option<&str>,
    maps: &[MapEntry],
    binaries: &mut Binaries,
    loaders: &mut Loaders,
) -> Option<ThreadCtxLoc> {
    let mut found = None;
    for map in maps
        .iter()
        .filter(|m| m.is_file() && Some(m.path.as_str()) != exe)
    {
        let Some(binary) = binaries.get(root, pid, map) else {
            continue;
        };
        if let Some(offset) = binary.dl_debug_state {
            if loaders.seen.insert((map.dev, map.inode)) {
                loaders.new.push((pid, map.clone(), offset));
            }
        }
        if found.is_none() {
            if let Some(slot) = binary.thread_ctx_library {
                let bias = map.start.wrapping_sub(binary.vaddr_of_mapping(map.offset));
                found = Some(threadctx::library_location(slot, bias));
            }
        }
    }
    found
}

/// Takes mappings read now (`text`); reads the process context again if
/// one appeared since `info` was read.
fn refresh(root: &Path, pid: u32, process: &mut Process, text: &str, now: Instant) {
    let maps = maps::parse(text);
    if maps != process.maps {
        process.mappings = vec![None; maps.len()];
        process.maps = maps;
    }
    process.maps_read = now;
    if !process.process_context_read && threadctx::process_context_address(text).is_some() {
        let info = read_info(root, pid, &process.info.executable_name, Some(text));
        process.info = Arc::new(info);
        process.process_context_read = true;
    }
}

pub(crate) fn reread(root: &Path, pid: u32, process: &mut Process, now: Instant) {
    match maps::read_text(root, pid) {
        Ok(text) => refresh(root, pid, process, &text, now),
        Err(_) => process.maps_read = now,
    }
}

pub(crate) fn mapping_of(
    binaries: &mut Binaries,
    root: &Path,
    pid: u32,
    map: &MapEntry,
    vdso: Option<&Vdso>,
) -> Mapping {
    if let Some(vdso) = vdso.filter(|_| map.path == "[vdso]") {
        // In the image's own addresses, as for files.
        return Mapping {
            path: map.path.clone(),
            build_id: None,
            htlhash: false,
            start: vdso.base,
            limit: vdso.base + (map.end - map.start),
            file_offset: 0,
        };
    }
    let binary = binaries.get(root, pid, map);
    match binary {
        Some(b) => {
            let start = b.vaddr_of_mapping(map.offset);
            Mapping {
                path: map.path.clone(),
                build_id: b.build_id.clone().or_else(|| b.htlhash.clone()),
                htlhash: b.build_id.is_none() && b.htlhash.is_some(),
                start,
                limit: start + (map.end - map.start),
                file_offset: map.offset,
            }
        }
        // A file we could not read still has a name; its addresses become
        // file offsets, which equal virtual addresses for most PIEs.
        None if map.is_file() => Mapping {
            path: map.path.clone(),
            build_id: None,
            htlhash: false,
            start: map.offset,
            limit: map.offset + (map.end - map.start),
            file_offset: map.offset,
        },
        None => Mapping {
            path: if map.path.is_empty() {
                "[anon]".to_owned()
            } else {
                map.path.clone()
            },
            build_id: None,
            htlhash: false,
            start: map.start,
            limit: map.end,
            file_offset: 0,
        },
    }
}

fn read_info(root: &Path, pid: u32, comm: &str, maps: Option<&str>) -> ProcessInfo {
    let dir = root.join(pid.to_string());
    let executable_path = std::fs::read_link(dir.join("exe")).ok().map(|p| {
        let p = p.to_string_lossy();
        p.strip_suffix(" (deleted)").unwrap_or(&p).to_owned()
    });
    let executable_name = executable_path
        .as_deref()
        .and_then(|p| p.rsplit('/').next())
        .filter(|n| !n.is_empty())
        .map(str::to_owned)
        .or_else(|| {
            std::fs::read_to_string(dir.join("comm"))
                .ok()
                .map(|c| c.trim_end().to_owned())
        })
        .unwrap_or_else(|| comm.to_owned());
    let context = maps
        .and_then(|m| threadctx::read_process_context(root, pid, m))
        .unwrap_or_default();
    let environ = std::fs::read(dir.join("environ")).unwrap_or_default();
    let service_name = context
        .resource
        .iter()
        .find(|(k, v)| k == "service.name" && !v.is_empty())
        .map(|(_, v)| v.clone())
        .or_else(|| service_from_environ(&environ))
        .unwrap_or_else(|| executable_name.clone());
    let resource = context
        .resource
        .into_iter()
        .filter(|(k, _)| k != "service.name")
        .collect();
    let container_id = std::fs::read_to_string(dir.join("cgroup"))
        .ok()
        .and_then(|c| container_id(&c));
    ProcessInfo {
        pid,
        service_name,
        executable_name,
        executable_path,
        container_id,
        resource,
        attribute_keys: context.attribute_keys,
    }
}

/// `OTEL_SERVICE_NAME`, else `service.name` of `OTEL_RESOURCE_ATTRIBUTES`
/// (as the OpenTelemetry SDKs read them), from a NUL-separated environment.
fn service_from_environ(environ: &[u8]) -> Option<String> {
    let var = |name: &str| {
        environ.split(|&b| b == 0).find_map(|kv| {
            let kv = std::str::from_utf8(kv).ok()?;
            kv.strip_prefix(name)?.strip_prefix('=').map(str::to_owned)
        })
    };
    if let Some(name) = var("OTEL_SERVICE_NAME").filter(|n| !n.is_empty()) {
        return Some(name);
    }
    var("OTEL_RESOURCE_ATTRIBUTES")?.split(',').find_map(|kv| {
        let (k, v) = kv.split_once('=')?;
        (k.trim() == "service.name" && !v.trim().is_empty()).then(|| v.trim().to_owned())
    })
}

/// The container ID in a `/proc/PID/cgroup`: a 64-hex path segment, bare
/// or as `docker-…`, `cri-containerd-…`, `crio-…`, `libpod-…` with `.scope`.
fn container_id(cgroup: &str) -> Option<String> {
    cgroup.lines().find_map(|line| {
        let path = line.splitn(3, ':').nth(2)?;
        path.rsplit('/').find_map(|segment| {
            let segment = segment.strip_suffix(".scope").unwrap_or(segment);
            let id = segment.rsplit('-').next()?;
            (id.len() == 64 && id.bytes().all(|b| b.is_ascii_hexdigit())).then(|| id.to_owned())
        })
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn service_name_from_the_environment() {
        let env = b"PATH=/bin\0OTEL_SERVICE_NAME=checkout\0HOME=/\0";
        assert_eq!(service_from_environ(env).as_deref(), Some("checkout"));
        let env = b"OTEL_RESOURCE_ATTRIBUTES=deployment.environment=prod, service.name=cart\0";
        assert_eq!(service_from_environ(env).as_deref(), Some("cart"));
        let env = b"OTEL_SERVICE_NAME=\0OTEL_SERVICE_NAMES=x\0";
        assert_eq!(service_from_environ(env), None);
    }

    #[test]
    fn container_ids_of_common_runtimes() {
        let id = "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef";
        for cgroup in [
            format!("0::/system.slice/docker-{id}.scope\n"),
            format!("0::/kubepods/burstable/pod1234/{id}\n"),
            format!("0::/kubepods.slice/kubepods-pod1.slice/cri-containerd-{id}.scope\n"),
            format!("12:cpu:/crio-{id}.scope\n"),
        ] {
            assert_eq!(container_id(&cgroup).as_deref(), Some(id), "{cgroup}");
        }
        assert_eq!(
            container_id("0::/user.slice/user-0.slice/session-1.scope\n"),
            None
        );
    }

    #[test]
    fn resolves_our_own_stack_to_our_build_id() {
        let mut procs = Processes::new(Path::new("/proc"), 64 << 20, (1 << 20, 1 << 20));
        let pid = std::process::id();
        // A real return address of ours: the one this function returns to
        // is after a call; take one from our own frame-pointer chain.
        let ret = our_return_address();
        let leaf = resolves_our_own_stack_to_our_build_id as *const () as u64 + 1;
        let mut out = Vec::new();
        let stack = UserStack {
            chain: &[leaf, ret],
            end: USER_END_ROOT,
            bp: 0,
            window: &[],
        };
        let (info, cut) = procs.resolve(pid, "test", &stack, &mut out);
        let exe = std::fs::read("/proc/self/exe").unwrap();
        let ours = crate::binaries::Binary::parse(&exe[..]).unwrap().build_id;
        assert_eq!(cut, None);
        assert_eq!(out.len(), 2, "{out:?}");
        assert_eq!(out[0].mapping.build_id, ours);
        assert!(out[0].mapping.path.ends_with(&info.executable_name));
        assert_eq!(info.pid, pid);
        assert!((out[0].mapping.start..out[0].mapping.limit).contains(&out[0].address));
        // The leaf, after `push %rbp` of a function with frame pointers, is in its
        // prologue: %rsp-based CFA, but the window is empty.
        assert_eq!(procs.unwind.out_of_window, 1);

        // The same caller recovered from the window by CFI: inserted after
        // the leaf.
        out.clear();
        let leaf_entry = leaf - 1; // first instruction: return address at %rsp
        let stack = UserStack {
            chain: &[leaf_entry],
            end: USER_END_ROOT,
            bp: 0,
            window: &ret.to_le_bytes(),
        };
        let (_, cut) = procs.resolve(pid, "test", &stack, &mut out);
        assert_eq!((cut, out.len()), (None, 2), "{out:?}");
        assert_eq!(procs.unwind.callers_recovered, 1);

        // A return address in no mapping ends the stack, as does one that
        // is not after a call (the start of a function).
        for (bad, why) in [(8, Cut::OutsideCode), (leaf_entry + 1, Cut::NotAfterCall)] {
            out.clear();
            let stack = UserStack {
                chain: &[leaf, bad, ret, ret],
                end: USER_END_ROOT,
                bp: 0,
                window: &[],
            };
            let (_, cut) = procs.resolve(pid, "test", &stack, &mut out);
            assert_eq!((cut, out.len()), (Some(why), 1), "{out:?}");
        }
        // A leaf in no mapping stays, as an unknown frame.
        out.clear();
        let stack = UserStack {
            chain: &[8],
            end: USER_END_ROOT,
            bp: 0,
            window: &[],
        };
        procs.resolve(pid, "test", &stack, &mut out);
        assert_eq!(
            (out[0].mapping.path.as_str(), out[0].address),
            ("[unknown]", 8)
        );
        // A chain the BPF program stopped (frame pointer not increasing).
        out.clear();
        let stack = UserStack {
            chain: &[leaf, ret],
            end: crate::record::USER_END_NOT_INCREASING,
            bp: 0,
            window: &[],
        };
        let (_, cut) = procs.resolve(pid, "test", &stack, &mut out);
        assert_eq!((cut, out.len()), (Some(Cut::NotIncreasing), 2));
        out.clear();
        let stack = UserStack {
            end: crate::record::USER_END_UNREADABLE,
            ..stack
        };
        let (_, cut) = procs.resolve(pid, "test", &stack, &mut out);
        assert_eq!((cut, out.len()), (Some(Cut::Unreadable), 2));
        assert_eq!(procs.unwind.cut_total(), 4);
    }

    /// The return address of this call: in the caller, after a call.
    #[inline(never)]
    fn our_return_address() -> u64 {
        let ret: u64;
        // SAFETY: reads our own frame record (frame pointers are on).
        unsafe { std::arch::asm!("mov {}, [rbp + 8]", out(reg) ret) };
        ret
    }
}
