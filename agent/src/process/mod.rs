//! The processes the agent has seen, in one place: who they are
//! ([`identity`]), where their code is ([`maps`]: executable mappings →
//! build-ID and ELF virtual address, through [`crate::files`]), how their
//! threads publish trace contexts ([`loader`]), how their stacks resolve
//! ([`resolve`]), and what each may cost ([`budget`]).
//!
//! Entries are read on a process's first sample and dropped on exec and
//! exit; the mappings are read again when an address falls outside them (a
//! new `dlopen`), when they are older than `MAPS_MAX_AGE`, and when ld.so
//! reports a `dlopen` or `dlclose` (`link_map_changed`) — each within the
//! process's own budgets. At most [`MAX_PROCESSES`] are kept (the least
//! recently sampled go first).

pub mod budget;
pub mod identity;
mod loader;
pub mod maps;
mod resolve;
mod unwinding;

use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use rustc_hash::FxHashMap;

pub use identity::ProcessInfo;
pub use resolve::{Mapping, UserFrame, UserStack};

use crate::cfi::CfiCache;
use crate::files::Binaries;
use crate::jit::{self, ProcessJit};
use crate::jobs::{About, Lane, Pool, Ticket, Waiting};
use crate::record::ThreadCtxLoc;
use crate::unwind::UnwindStats;
use crate::vdso::Vdso;
use budget::{Bucket, Contained};
use identity::Identity;
use loader::Loaders;
use maps::MapEntry;

/// Mappings older than this are read again on the next sample.
const MAPS_MAX_AGE: Duration = Duration::from_secs(10);
/// A miss reads the mappings again at most this often per process.
pub(crate) const MAPS_MISS_INTERVAL: Duration = Duration::from_millis(200);
/// ... but for the first miss after the first read, which is often of a
/// process still being loaded (read at its first sample, its libraries not
/// all mapped yet): until they are read, its unwind ranges lack them and
/// every walk through them is cut.
pub(crate) const MAPS_FIRST_MISS_INTERVAL: Duration = Duration::from_millis(5);
/// Processes kept at most (a fork bomb's are not all remembered).
pub const MAX_PROCESSES: usize = 16_384;
/// How often, and for how long at most, the trace-context slot of a
/// process whose read or link-map change found a file still being read is
/// looked for again ([`Processes::settle_thread_ctxs`]): a library just
/// loaded is read in milliseconds, and its first spans are entered as soon
/// as it is; on a busy host the file's read can wait seconds in the job
/// queue, so the looks thin out (a quarter of the time waited so far,
/// between the two bounds) rather than stop.
const UNSURE_RECHECK: Duration = Duration::from_millis(2);
const UNSURE_RECHECK_MAX: Duration = Duration::from_millis(250);
const UNSURE_FOR: Duration = Duration::from_secs(10);

/// When a process unsure of its trace-context slot since `since` looks
/// again, looked at `now`.
fn unsure_next(since: Instant, now: Instant) -> Instant {
    now + (now.saturating_duration_since(since) / 4).clamp(UNSURE_RECHECK, UNSURE_RECHECK_MAX)
}
/// An entry without samples for this long is dropped at the next flush if
/// its process is gone (its exit event may have been lost).
const IDLE_MAX_AGE: Duration = Duration::from_secs(120);
/// How long the sampler thread waits for one job (a file's facts, a
/// process's identity, code bytes), and the share of its time all such
/// waits may take (the rest run on, and are taken when they answer).
const JOB_WAIT: Duration = Duration::from_millis(250);
/// ... and for a process's identity (procfs reads: quick unless its memory
/// is a FUSE file's).
const IDENTITY_WAIT: Duration = Duration::from_millis(100);
/// Identities of exited processes kept for their late records (the map
/// starts over beyond it).
const MAX_GONE: usize = 4096;
const WAIT_SHARE: f64 = 0.2;
const WAIT_BURST: Duration = Duration::from_secs(2);

pub(crate) struct Process {
    pub(crate) info: Arc<ProcessInfo>,
    /// Its identity being read (`info` is provisional meanwhile), since
    /// when.
    identity: Option<(Ticket<Identity>, Instant)>,
    /// Read on a BPF walk's wakeup, ahead of the records before it: an
    /// exec record among them is of the image read, not a later one.
    read_ahead: bool,
    /// Its real user.
    pub(crate) uid: u32,
    pub(crate) maps: Vec<MapEntry>,
    /// Per entry of `maps`, made on first use.
    pub(crate) mappings: Vec<Option<Arc<Mapping>>>,
    pub(crate) maps_read: Instant,
    /// Its mappings were read again since the first read.
    pub(crate) maps_reread: bool,
    last_sample: Instant,
    /// How its threads reach `otel_thread_ctx_v1`, when its executable or
    /// a library defines it (the BPF program reads their contexts).
    thread_ctx: Option<ThreadCtxLoc>,
    /// Some mapped file was still being read when `thread_ctx` was looked
    /// for: looked for again at the next sample.
    thread_ctx_unsure: bool,
    /// Its `OTEL_CTX` mapping was there when `info` was read (else `info`
    /// is read again when the mappings show one).
    process_context_read: bool,
    /// Its JIT symbols, made when a sample first lands in code without a
    /// build-ID.
    pub(crate) jit: Option<Box<ProcessJit>>,
    /// The sampler thread's time it may still cost.
    pub(crate) work: Bucket,
    /// Its link-map changes handled now, or later.
    link_map: Bucket,
    link_map_due: bool,
    /// When (CLOCK_MONOTONIC ns) the earliest link-map change not yet
    /// followed by a settled context location was reported.
    link_map_since: Option<u64>,
    /// Its ranges for the BPF walk's unwind tables.
    unwind: unwinding::ProcUnwind,
}

/// Everything but the processes themselves: what resolving a process's
/// stacks needs besides its own entry (disjoint borrows).
pub(crate) struct Context {
    pub(crate) proc_root: PathBuf,
    pub(crate) binaries: Binaries,
    pub(crate) unknown: Arc<Mapping>,
    pub(crate) cfi: CfiCache,
    pub(crate) vdso: Option<Vdso>,
    /// (file or memory, address) → whether a return address there follows
    /// a call instruction (or is a signal trampoline).
    pub(crate) code_checks: FxHashMap<(u64, u64, u64), bool>,
    /// What unwinding did so far.
    pub(crate) unwind: UnwindStats,
    /// Processes gone before their first sample was read.
    pub(crate) vanished: u64,
    /// Trace-context locations to hand to the BPF program: `Some` for a
    /// process that publishes thread contexts, `None` for one that is gone.
    pub(crate) tls_changes: Vec<(u32, Option<ThreadCtxLoc>)>,
    /// Context locations found after a library load: how many, and the
    /// longest time (ns) from ld.so's report to the location being set.
    pub(crate) ctx_after_load: (u64, u64),
    /// Processes whose read or link-map change found a file still being
    /// read: since when, and when they look again
    /// ([`Processes::settle_thread_ctxs`]).
    pub(crate) unsure_thread_ctx: Vec<(u32, Instant, Instant)>,
    /// Processes whose files' facts or tables were pending, and when they
    /// look again (one entry each).
    pub(crate) unwind_due: Vec<(u32, Instant)>,
    /// Dynamic loaders seen, and those whose dlopen hook is yet to be
    /// attached.
    pub(crate) loaders: Loaders,
    /// Bounds and counters of every process's JIT symbols.
    pub(crate) jit: Arc<jit::Shared>,
    pub(crate) pool: Pool,
    /// How long the sampler thread may wait for jobs.
    pub(crate) waiting: Waiting,
    /// What budgets and bounds refused.
    pub(crate) contained: Contained,
    /// Identities that became known: (provisional, known), for the samples
    /// taken meanwhile.
    pub(crate) identified: Vec<(Arc<ProcessInfo>, Arc<ProcessInfo>)>,
    /// The processes with an identity read under way (a drain settles
    /// these, not every process known).
    pub(crate) identifying: HashSet<u32>,
    /// The identities of processes whose exit record was read: a record
    /// of one read after (the sampler behind its ring buffer on a busy
    /// host) names it, not its executable, when the process is gone.
    gone: HashMap<u32, Arc<ProcessInfo>>,
    /// How long the sampler thread may wait for identities (apart from
    /// the other jobs: a process's name must not depend on what others
    /// made the agent wait for).
    pub(crate) identity_waiting: Waiting,
    /// Each process's work budget: a share of a CPU and a burst.
    pub(crate) work_budget: (f64, Duration),
    /// The unwind tables of the BPF walk (`None`: no BPF maps, in tests).
    pub(crate) unwinding: Option<unwinding::Unwinding>,
}

pub struct Processes {
    by_pid: HashMap<u32, Process>,
    ctx: Context,
}

impl Processes {
    /// `cfi_budget`: bytes of call-frame information kept in memory;
    /// `jit_bytes`: bytes of JIT symbols kept per process and in total;
    /// `pool`: where per-file and per-process jobs run.
    pub fn new(proc_root: &Path, cfi_budget: usize, jit_bytes: (usize, usize), pool: Pool) -> Self {
        Self {
            by_pid: HashMap::new(),
            ctx: Context {
                proc_root: proc_root.to_owned(),
                binaries: Binaries::new(proc_root, pool.clone()),
                unknown: Arc::new(Mapping {
                    path: "[unknown]".to_owned(),
                    build_id: None,
                    htlhash: false,
                    content_sha256: None,
                    start: 0,
                    limit: u64::MAX,
                    file_offset: 0,
                    file: (0, 0),
                }),
                vanished: 0,
                tls_changes: Vec::new(),
                ctx_after_load: (0, 0),
                unsure_thread_ctx: Vec::new(),
                unwind_due: Vec::new(),
                loaders: Loaders::default(),
                cfi: CfiCache::new(cfi_budget),
                vdso: Vdso::read_own(),
                code_checks: FxHashMap::default(),
                unwind: UnwindStats::default(),
                jit: jit::Shared::new(jit_bytes.1, jit_bytes.0),
                pool,
                waiting: Waiting::new(JOB_WAIT, WAIT_SHARE, WAIT_BURST),
                contained: Contained::default(),
                identified: Vec::new(),
                identifying: HashSet::new(),
                gone: HashMap::new(),
                identity_waiting: Waiting::new(IDENTITY_WAIT, WAIT_SHARE / 2.0, WAIT_BURST / 2),
                work_budget: (budget::WORK_RATE, budget::WORK_BURST),
                unwinding: None,
            },
        }
    }

    /// Offers every file whose code is sampled to `offers` (publishing
    /// the binaries no CI uploaded).
    pub fn offer_binaries_to(&mut self, offers: Option<crate::upload::Offers>) {
        self.ctx.binaries.offers = offers;
    }

    /// Writes unwind tables into `maps` (a pool of `rows` rows) for the
    /// BPF walk to step through code without frame pointers.
    pub fn unwind_into(&mut self, maps: Box<dyn crate::cfi::tables::Sink + Send>, rows: u32) {
        self.ctx.unwinding = Some(unwinding::Unwinding {
            tables: crate::cfi::tables::Tables::new(rows),
            maps,
        });
    }

    /// What the unwind tables hold and did.
    pub fn table_stats(&self) -> crate::cfi::tables::TableStats {
        self.ctx
            .unwinding
            .as_ref()
            .map_or_else(Default::default, |u| u.tables.stats())
    }

    /// What the JIT symbols hold and lost.
    pub fn jit_stats(&self) -> jit::JitStats {
        self.ctx.jit.stats()
    }

    /// Functions of the vDSO the agent names (0: no vDSO read).
    pub fn vdso_functions(&self) -> usize {
        self.ctx.vdso.as_ref().map_or(0, Vdso::functions)
    }

    /// What the CFI cache holds.
    pub fn cfi_stats(&self) -> crate::cfi::CacheStats {
        self.ctx.cfi.stats()
    }

    /// What unwinding did so far.
    pub fn unwind_stats(&self) -> UnwindStats {
        self.ctx.unwind
    }

    /// Processes gone before their first sample was read.
    pub fn vanished(&self) -> u64 {
        self.ctx.vanished
    }

    /// What budgets and bounds refused so far.
    pub fn contained(&self) -> Contained {
        self.ctx.contained
    }

    /// Context locations found after a library load: how many, and the
    /// longest from ld.so's report to the BPF program reading the
    /// library's contexts (ns): a span a thread enters sooner after
    /// loading its publisher is read from its samples only from then on.
    pub fn ctx_after_load(&self) -> (u64, u64) {
        self.ctx.ctx_after_load
    }

    /// Waits of the sampler thread cut short by its waiting budgets.
    pub fn waits_cut(&self) -> u64 {
        self.ctx.waiting.cut + self.ctx.identity_waiting.cut
    }

    /// Identities that became known since the last call: (provisional,
    /// known) — the samples taken under the first belong to the second.
    /// Takes first the answers of every pending read that came, sampled
    /// since or not (a process sampled once under a provisional name must
    /// not keep it because it was not sampled again before a batch went).
    pub fn take_identified(&mut self) -> Vec<(Arc<ProcessInfo>, Arc<ProcessInfo>)> {
        let Processes { by_pid, ctx } = self;
        let mut pending = std::mem::take(&mut ctx.identifying);
        pending.retain(|pid| {
            let Some(process) = by_pid.get_mut(pid) else {
                return false; // gone: its read is forgotten with it
            };
            ctx.settle_identity(process);
            process.identity.is_some()
        });
        ctx.identifying.extend(pending);
        std::mem::take(&mut self.ctx.identified)
    }

    /// Whether a process's identity read asked for since `since` is under
    /// way (its samples so far go under a provisional name until it
    /// answers; a read older than that is not waited for again).
    pub fn identity_under_way(&self, since: Instant) -> bool {
        self.ctx.identifying.iter().any(|pid| {
            self.by_pid
                .get(pid)
                .and_then(|p| p.identity.as_ref())
                .is_some_and(|(_, at)| *at >= since)
        })
    }

    /// What changed for the BPF program's trace-context offsets since the
    /// last call.
    pub fn take_tls_changes(&mut self) -> Vec<(u32, Option<ThreadCtxLoc>)> {
        std::mem::take(&mut self.ctx.tls_changes)
    }

    /// Dynamic loaders met since the last call, whose dlopen hook is to be
    /// attached: (a process mapping it, its mapping, the hook's offset).
    pub fn take_new_loaders(&mut self) -> Vec<(u32, MapEntry, u64)> {
        std::mem::take(&mut self.ctx.loaders.new)
    }

    /// Processes read since the last call: their link-map changes are to
    /// wake the agent (`link_map_changed`).
    pub fn take_new_processes(&mut self) -> Vec<u32> {
        std::mem::take(&mut self.ctx.loaders.watch)
    }

    /// A loader whose hook could not be attached: tried again with the next
    /// process that maps it.
    pub fn loader_not_hooked(&mut self, map: &MapEntry) {
        self.ctx.loaders.seen.remove(&(map.dev, map.inode));
    }

    /// The job pool (for the collector's own jobs: opening a loader to
    /// hook it).
    pub fn pool(&self) -> &Pool {
        &self.ctx.pool
    }

    /// Takes the reports of hung jobs: their devices are not read again,
    /// their processes are treated as over budget for a while.
    pub fn hung_jobs(&mut self) {
        for About { pid, dev } in self.ctx.pool.take_hung() {
            self.ctx.binaries.device_hung(dev);
            if let Some(p) = self.by_pid.get_mut(&pid) {
                p.work.charge_time(budget::WORK_BURST * 10);
            }
        }
    }

    /// ld.so says process `pid` changed its link map (a dlopen or dlclose):
    /// its mappings are read again — now, or when its link-map budget
    /// allows ([`Self::due_link_maps`]) — and a library that defines the
    /// OTEP 4947 slot — an addon, an extension loaded after start-up — is
    /// handed to the BPF program, before the library's first use.
    /// When it is handled now, `rearm` is called first, before the read:
    /// its next change wakes the agent again, even one (`dlopen` reports
    /// twice: before and after mapping) that comes while this read runs.
    /// A deferred change is read (and rearmed) by [`Self::due_link_maps`].
    pub fn link_map_changed(&mut self, pid: u32, at_ns: u64, rearm: impl FnOnce()) {
        let now = Instant::now();
        let Some(process) = self.by_pid.get_mut(&pid) else {
            // Not sampled yet (every process start calls the hook): read on
            // its first sample, libraries and all.
            rearm();
            return;
        };
        process.link_map_since.get_or_insert(at_ns);
        if process.link_map_due {
            return; // one read serves every change until then
        }
        if !process.link_map.take(now) || !process.work.has(now) {
            process.link_map_due = true;
            self.ctx.contained.link_maps_deferred += 1;
            return;
        }
        rearm();
        self.ctx.link_map_read(pid, process, now);
    }

    /// When the next deferred link-map change may be handled (`None`: none
    /// waits).
    pub fn next_link_map_due(&self) -> Option<Instant> {
        // Both its link-map and its work budgets must allow it.
        self.by_pid
            .values()
            .filter(|p| p.link_map_due)
            .map(|p| p.link_map.next_token().max(p.work.next_positive()))
            .min()
    }

    /// Handles the deferred link-map changes whose processes have a token
    /// again, each `rearm`ed (its next change may wake the agent again)
    /// before its read.
    pub fn due_link_maps(&mut self, mut rearm: impl FnMut(u32)) {
        let now = Instant::now();
        let Processes { by_pid, ctx } = self;
        for (&pid, process) in by_pid.iter_mut().filter(|(_, p)| p.link_map_due) {
            if process.link_map.has(now) && process.work.has(now) && process.link_map.take(now) {
                process.link_map_due = false;
                rearm(pid);
                ctx.link_map_read(pid, process, now);
            }
        }
    }

    /// Looks again for the trace-context slot of each process whose
    /// link-map change found a file still being read (the library just
    /// loaded, as a rule): the slot reaches the BPF program once the file
    /// is read, not at the process's next sample drained. Charged to the
    /// process's work budget (a process with tens of thousands of
    /// mappings pays for its own looks), and looked at for [`UNSURE_FOR`]
    /// after its last link-map change at most.
    pub fn settle_thread_ctxs(&mut self) {
        let now = Instant::now();
        let Processes { by_pid, ctx } = self;
        let mut pending = std::mem::take(&mut ctx.unsure_thread_ctx);
        pending.retain_mut(|(pid, since, next)| {
            let Some(process) = by_pid.get_mut(pid) else {
                return false;
            };
            if now.saturating_duration_since(*since) >= UNSURE_FOR {
                return false;
            }
            if *next > now || !process.work.has(now) {
                return true; // not due, or over its budget: not looked at now
            }
            let started = crate::jobs::thread_cpu();
            ctx.settle_thread_ctx(*pid, process);
            process.work.charge_cpu_since(started);
            *next = unsure_next(*since, now);
            process.thread_ctx_unsure
        });
        ctx.unsure_thread_ctx = pending;
    }

    /// When [`Self::settle_thread_ctxs`] is due: at the first waiting
    /// process's next look (when it has work budget again, if it is over
    /// it), never when none waits.
    pub fn next_thread_ctx_due(&self, now: Instant) -> Option<Instant> {
        self.ctx
            .unsure_thread_ctx
            .iter()
            .filter_map(|(pid, _, next)| Some((self.by_pid.get(pid)?, next)))
            .map(|(p, next)| p.work.next_positive().max(*next).max(now))
            .min()
    }

    /// When the first process whose unwind tables were pending looks
    /// again.
    pub fn next_unwind_due(&self) -> Option<Instant> {
        self.ctx.next_unwind_due()
    }

    /// Sets the ranges of the processes whose files were pending and whose
    /// look is due, without waiting for their next sample (a process gone
    /// meanwhile is dropped from the list).
    pub fn settle_due_unwinds(&mut self, now: Instant) {
        let Processes { by_pid, ctx } = self;
        let mut due = Vec::new();
        ctx.unwind_due.retain(|&(pid, at)| {
            let is_due = at <= now;
            if is_due {
                due.push(pid);
            }
            !is_due
        });
        for pid in due {
            if let Some(process) = by_pid.get_mut(&pid) {
                ctx.settle_unwind(pid, process, now);
            }
        }
    }

    pub fn len(&self) -> usize {
        self.by_pid.len()
    }

    /// Offers the sampled files whose content hash came since they were
    /// sampled (see `files::Binaries::offer_hashed`).
    pub fn offer_hashed(&mut self) {
        self.ctx.binaries.offer_hashed();
    }

    /// What the content hashes cost so far.
    pub fn hash_stats(&self) -> crate::files::hash::HashStats {
        self.ctx.binaries.hashed.stats()
    }

    pub fn binaries(&self) -> usize {
        self.ctx.binaries.len()
    }

    /// Mapped files not read, by `files::Skip::index`.
    pub fn files_skipped(&self) -> [u64; crate::files::Skip::ALL.len()] {
        self.ctx.binaries.skipped
    }

    /// The file of mapping `map` of process `pid`, read once per file.
    pub fn binary(&mut self, pid: u32, map: &MapEntry) -> Option<Arc<crate::files::Binary>> {
        let allowed = self
            .by_pid
            .get_mut(&pid)
            .is_none_or(|p| p.work.has(Instant::now()));
        let ctx = &mut self.ctx;
        ctx.binaries.get(pid, map, &mut ctx.waiting, allowed)
    }

    /// Whether the file of `map` was read or given up (not being read).
    pub fn binary_settled(&self, map: &MapEntry) -> bool {
        self.ctx.binaries.settled(map)
    }

    /// The files process `pid` maps, once each (its entry made now if new;
    /// its maps read again — within its budget — when older than
    /// `FRESH_FOR`); `None` when it is gone.
    pub fn mapped_files(&mut self, pid: u32) -> Option<Vec<MapEntry>> {
        const FRESH_FOR: Duration = Duration::from_millis(50);
        let now = Instant::now();
        let Processes { by_pid, ctx } = self;
        // Kernel threads (no executable) and gone processes get no entry.
        if !by_pid.contains_key(&pid)
            && std::fs::read_link(ctx.proc_root.join(pid.to_string()).join("exe")).is_err()
        {
            return None;
        }
        let process = ctx.entry(by_pid, pid, "");
        if now.duration_since(process.maps_read) > FRESH_FOR {
            ctx.reread(pid, process, now);
        }
        if process.maps.is_empty() {
            return None;
        }
        let mut seen = std::collections::HashSet::new();
        Some(
            process
                .maps
                .iter()
                .filter(|m| m.is_file() && seen.insert((m.dev, m.inode)))
                .cloned()
                .collect(),
        )
    }

    /// Process `pid` exec'd (its record read now, in record order): what
    /// the agent held of it goes — unless it was read ahead of the record
    /// and is the new image already (the executable it runs now, or it is
    /// gone since): read again, it could be gone, and named by its
    /// executable, not its service.
    pub fn exec(&mut self, pid: u32) {
        let Processes { by_pid, ctx } = self;
        if let Some(p) = by_pid.get_mut(&pid) {
            if std::mem::take(&mut p.read_ahead) {
                let exe = identity::executable_path(&ctx.proc_root, pid);
                let alive = exe.is_some();
                if exe.is_none_or(|exe| p.info.executable_path.as_deref() == Some(&exe)) {
                    // Its identity read again all the same: read during
                    // the exec, after the kernel set the new executable
                    // but before the new environment, it found none.
                    if alive && p.identity.is_none() {
                        ctx.submit_identity(pid, p, None, Instant::now());
                    }
                    return;
                }
            }
        }
        self.forget(pid);
    }

    /// Process `pid` exited (its record read now): what the agent held of
    /// it goes; its identity is kept a while for its records read after.
    pub fn exit(&mut self, pid: u32) {
        if let Some(p) = self.by_pid.get(&pid) {
            if self.ctx.gone.len() >= MAX_GONE {
                self.ctx.gone.clear();
            }
            self.ctx.gone.insert(pid, p.info.clone());
        }
        self.forget(pid);
    }

    /// exec: new mappings, maybe a new service name.
    pub fn forget(&mut self, pid: u32) {
        if let Some(p) = self.by_pid.remove(&pid) {
            if p.thread_ctx.is_some() {
                self.ctx.tls_changes.push((pid, None));
            }
            self.ctx.forget_unwind(pid);
        }
    }

    /// A walk of process `pid` found no unwind ranges in BPF: a process
    /// new to the agent is read and its ranges set now, not at the sample
    /// ring's next drain (up to 50 ms of its samples walked by frame
    /// pointer alone). A process already known (it exec'd: its entry is
    /// of the old image until the exec record is read) has its mappings
    /// read again.
    pub fn unwind_now(&mut self, pid: u32) {
        let now = Instant::now();
        let Processes { by_pid, ctx } = self;
        match by_pid.get_mut(&pid) {
            // Known, and its ranges gone: it exec'd (its entry goes when
            // the exec record is read; the ranges follow its mappings).
            Some(process) => {
                if now.duration_since(process.maps_read) < MAPS_MISS_INTERVAL {
                    return;
                }
                ctx.reread(pid, process, now);
                ctx.settle_unwind(pid, process, now);
            }
            None => {
                let process = ctx.entry(by_pid, pid, "");
                process.read_ahead = true;
                ctx.settle_unwind(pid, process, now);
            }
        }
        ctx.unwind.read_early += 1;
    }

    /// Reads every running process now (at start-up), so that the trace
    /// contexts of processes that were running before the agent are read
    /// from their very first sample. Returns how many were read.
    pub fn prime(&mut self) -> usize {
        let Ok(dir) = std::fs::read_dir(&self.ctx.proc_root) else {
            return 0;
        };
        let pids: Vec<u32> = dir
            .filter_map(|e| e.ok()?.file_name().to_str()?.parse().ok())
            .take(MAX_PROCESSES)
            .collect();
        for pid in pids {
            // Kernel threads have no executable; gone processes neither.
            if std::fs::read_link(self.ctx.proc_root.join(pid.to_string()).join("exe")).is_ok() {
                self.entry(pid, "");
            }
        }
        // Not sampling yet: every file being read is waited for (a hung
        // one is given up within the time), so the trace-context slots of
        // the processes running now are known from their first samples.
        self.ctx
            .binaries
            .wait_reading(Instant::now() + crate::jobs::HUNG_AFTER);
        let Processes { by_pid, ctx } = self;
        for (&pid, process) in by_pid.iter_mut() {
            ctx.settle_thread_ctx(pid, process);
        }
        self.by_pid.len()
    }

    /// Runs at every flush: entries of processes that are gone and were not
    /// sampled for a while go (their exit event may have been lost), and
    /// cached files are read again from time to time.
    pub fn age(&mut self) {
        let now = Instant::now();
        let changes = &mut self.ctx.tls_changes;
        let root = &self.ctx.proc_root;
        let mut gone = Vec::new();
        self.by_pid.retain(|&pid, p| {
            let keep = now.duration_since(p.last_sample) < IDLE_MAX_AGE
                || root.join(pid.to_string()).exists();
            if !keep && p.thread_ctx.is_some() {
                changes.push((pid, None));
            }
            if !keep {
                gone.push(pid);
            }
            keep
        });
        for pid in gone {
            self.ctx.forget_unwind(pid);
        }
        self.ctx.poll_unwind();
        // Each process's JIT symbols within its share of the total.
        for jit in self.by_pid.values_mut().filter_map(|p| p.jit.as_mut()) {
            jit.trim();
        }
        let files = self.ctx.binaries.len();
        self.ctx.binaries.age();
        if self.ctx.binaries.len() < files {
            self.ctx.cfi.forget_all(); // (device, inode) may name other files now
            self.ctx.code_checks.clear();
        }
    }

    /// The content hash of file (device, inode), if known by now.
    pub fn content_of(&mut self, file: (u64, u64)) -> Option<String> {
        let Context {
            binaries, waiting, ..
        } = &mut self.ctx;
        binaries.content_of(file, waiting)
    }

    /// Whether the content hash of file `file` is being computed.
    pub fn hash_under_way(&self, file: (u64, u64)) -> bool {
        self.ctx.binaries.hash_under_way(file)
    }

    /// A record of process `pid` could not be handled (its handling
    /// panicked): what the agent held of it goes, and it is read anew.
    pub fn quarantine(&mut self, pid: u32) {
        self.ctx.contained.record_panics += 1;
        self.forget(pid);
    }

    fn entry(&mut self, pid: u32, comm: &str) -> &mut Process {
        let Processes { by_pid, ctx } = self;
        ctx.entry(by_pid, pid, comm)
    }
}

impl Context {
    /// The entry of process `pid`, read now if new.
    fn entry<'a>(
        &mut self,
        by_pid: &'a mut HashMap<u32, Process>,
        pid: u32,
        comm: &str,
    ) -> &'a mut Process {
        if !by_pid.contains_key(&pid) {
            if by_pid.len() >= MAX_PROCESSES {
                evict_one(by_pid, self);
                self.contained.processes_evicted += 1;
            }
            let process = self.read_process(pid, comm);
            by_pid.insert(pid, process);
        }
        by_pid.get_mut(&pid).expect("inserted")
    }

    /// A new process's identity, if its read answers within the wait
    /// allowed; else a provisional one and the read's ticket.
    fn read_identity(
        &mut self,
        pid: u32,
        comm: &str,
        process_context: Option<u64>,
        now: Instant,
    ) -> (ProcessInfo, u32, bool, Option<(Ticket<Identity>, Instant)>) {
        let (root, name) = (self.proc_root.clone(), comm.to_owned());
        let ticket =
            self.pool
                .submit_in_order(Lane::Identity, false, About { pid, dev: 0 }, move || {
                    identity::read(&root, pid, &name, process_context)
                });
        match self.identity_waiting.wait(&ticket) {
            Some(Ok(id)) => (id.info, id.uid, id.process_context_read, None),
            Some(Err(_)) => (
                identity::provisional(&self.proc_root, pid, comm),
                u32::MAX,
                true,
                None,
            ),
            None => {
                self.identifying.insert(pid);
                (
                    identity::provisional(&self.proc_root, pid, comm),
                    u32::MAX,
                    false,
                    Some((ticket, now)),
                )
            }
        }
    }

    fn read_process(&mut self, pid: u32, comm: &str) -> Process {
        let now = Instant::now();
        let started = crate::jobs::thread_cpu();
        // One read of the maps serves the mappings and the process context.
        let read = maps::read_maps(&self.proc_root, pid).ok();
        if read.as_ref().is_some_and(|m| m.truncated) {
            self.contained.maps_truncated += 1;
        }
        let read = read.unwrap_or_else(|| {
            self.vanished += 1;
            maps::Maps::default()
        });
        // Gone (its records read after its exit): named as it was.
        let gone = if read.executable.is_empty() {
            self.gone.get(&pid).map(|info| ProcessInfo::clone(info))
        } else {
            self.gone.remove(&pid);
            None
        };
        let (info, uid, process_context_read, identity) = match gone {
            Some(info) => (info, u32::MAX, true, None),
            None => self.read_identity(pid, comm, read.process_context, now),
        };
        let mut process = Process {
            info: Arc::new(info),
            identity,
            read_ahead: false,
            uid,
            mappings: vec![None; read.executable.len()],
            maps: read.executable,
            maps_read: now,
            maps_reread: false,
            last_sample: now,
            thread_ctx: None,
            thread_ctx_unsure: false,
            process_context_read: process_context_read || read.process_context.is_none(),
            jit: None,
            work: Bucket::of_time(self.work_budget.0, self.work_budget.1, now),
            link_map: Bucket::new(budget::LINK_MAP_RATE, budget::LINK_MAP_BURST, now),
            link_map_due: false,
            link_map_since: None,
            unwind: Default::default(),
        };
        let (location, complete) = self.thread_ctx_location(pid, &process);
        self.loaders.watch.push(pid);
        if let Some(loc) = location {
            tracing::debug!(pid, ?loc, "process publishes OpenTelemetry thread contexts");
            self.tls_changes.push((pid, Some(loc)));
        }
        process.thread_ctx = location;
        process.thread_ctx_unsure = !complete;
        if !complete {
            // Not only at its next sample: a service waiting for work
            // enters its first span before it is sampled again.
            self.look_again_for_thread_ctx(pid, now);
        }
        process.work.charge_cpu_since(started);
        process
    }

    /// Looks for the process's trace-context slot again when a file was
    /// still being read the last time.
    fn settle_thread_ctx(&mut self, pid: u32, process: &mut Process) {
        if !process.thread_ctx_unsure {
            return;
        }
        let (location, complete) = self.thread_ctx_location(pid, process);
        self.set_thread_ctx(pid, process, location, complete);
    }

    /// Where the process's trace-context slot is now, and whether every
    /// file was read when it was looked for (else it is looked for again).
    fn set_thread_ctx(
        &mut self,
        pid: u32,
        process: &mut Process,
        location: Option<ThreadCtxLoc>,
        complete: bool,
    ) {
        process.thread_ctx_unsure = !complete;
        let since = if complete || location.is_some() {
            process.link_map_since.take()
        } else {
            None
        };
        if let (Some(since), Some(_)) = (since, location.filter(|l| Some(*l) != process.thread_ctx))
        {
            // A library loaded now publishes contexts: its threads' spans
            // are read from now on, this long after ld.so reported it.
            let late = monotonic_ns().saturating_sub(since);
            self.ctx_after_load.0 += 1;
            self.ctx_after_load.1 = self.ctx_after_load.1.max(late);
        }
        if location != process.thread_ctx {
            // A library loaded now publishes contexts, or the one that did
            // was unloaded (dlclose): its GOT entry is no longer read.
            tracing::debug!(
                pid,
                ?location,
                "where the process publishes OpenTelemetry thread contexts changed"
            );
            process.thread_ctx = location;
            self.tls_changes.push((pid, location));
        }
    }

    /// Reads a known process's identity (again: its samples meanwhile go
    /// under the one it has).
    fn submit_identity(
        &mut self,
        pid: u32,
        process: &mut Process,
        process_context: Option<u64>,
        now: Instant,
    ) {
        let (root, name) = (self.proc_root.clone(), process.info.executable_name.clone());
        let ticket =
            self.pool
                .submit_in_order(Lane::Identity, false, About { pid, dev: 0 }, move || {
                    identity::read(&root, pid, &name, process_context)
                });
        process.identity = Some((ticket, now));
        self.identifying.insert(pid);
        self.settle_identity(process);
    }

    /// Takes a pending identity read's answer, if it came.
    fn settle_identity(&mut self, process: &mut Process) {
        let Some((ticket, _)) = &process.identity else {
            return;
        };
        let Some(answer) = ticket.try_take() else {
            return;
        };
        process.identity = None;
        if let Ok(id) = answer {
            tracing::debug!(
                pid = id.info.pid,
                service = id.info.service_name,
                "a process's identity read answered after its first sample"
            );
            let known = Arc::new(id.info);
            self.identified.push((process.info.clone(), known.clone()));
            process.info = known;
            process.uid = id.uid;
            process.process_context_read = id.process_context_read;
        } else {
            process.process_context_read = true; // not tried again
        }
    }

    /// Reads a process's mappings again after a link-map change.
    fn link_map_read(&mut self, pid: u32, process: &mut Process, now: Instant) {
        // (Charged itself.)
        self.reread(pid, process, now);
        // The context location first: the unwind tables settled next may
        // charge a large build to the process's budget, which must not
        // keep the library just loaded from being read.
        let started = crate::jobs::thread_cpu();
        let location = self.library_location_of(pid, process);
        process.work.charge_cpu_since(started);
        // The libraries just loaded are walked by their tables from now
        // on, not from the next drain.
        self.settle_unwind(pid, process, now);
        let Some((location, complete)) = location else {
            return;
        };
        // A library still being read may be the one: looked at again
        // soon, and at the next sample.
        self.set_thread_ctx(pid, process, location, complete);
        if !complete {
            self.look_again_for_thread_ctx(pid, now);
        }
    }

    /// Looks for process `pid`'s trace-context slot again, soon and for
    /// [`UNSURE_FOR`] after `now` (a file it maps still being read).
    fn look_again_for_thread_ctx(&mut self, pid: u32, now: Instant) {
        let next = unsure_next(now, now);
        match self
            .unsure_thread_ctx
            .iter_mut()
            .find(|(p, _, _)| *p == pid)
        {
            Some(entry) => (entry.1, entry.2) = (now, next),
            None => self.unsure_thread_ctx.push((pid, now, next)),
        }
    }

    /// Reads the process's mappings again (within its budget); reads its
    /// identity again if a process context appeared since.
    pub(crate) fn reread(&mut self, pid: u32, process: &mut Process, now: Instant) {
        process.maps_read = now;
        process.maps_reread = true;
        if !process.work.has(now) {
            self.contained.maps_rereads_refused += 1;
            return;
        }
        let started = crate::jobs::thread_cpu();
        let Ok(read) = maps::read_maps(&self.proc_root, pid) else {
            return;
        };
        if read.truncated {
            self.contained.maps_truncated += 1;
        }
        if read.executable != process.maps {
            process.mappings = vec![None; read.executable.len()];
            process.maps = read.executable;
            process.unwind_unsettled();
        }
        if !process.process_context_read && process.identity.is_none() {
            if let Some(at) = read.process_context {
                self.submit_identity(pid, process, Some(at), now);
            }
        }
        process.work.charge_cpu_since(started);
    }
}

/// Forgets the least recently sampled process.
fn evict_one(by_pid: &mut HashMap<u32, Process>, ctx: &mut Context) {
    let Some((&pid, _)) = by_pid.iter().min_by_key(|(_, p)| p.last_sample) else {
        return;
    };
    if let Some(p) = by_pid.remove(&pid) {
        if p.thread_ctx.is_some() {
            ctx.tls_changes.push((pid, None));
        }
        ctx.forget_unwind(pid);
    }
}

/// CLOCK_MONOTONIC in ns: the clock of the BPF program's `bpf_ktime_get_ns`.
pub fn monotonic_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes the one timespec it is given.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    (ts.tv_sec as u64)
        .saturating_mul(1_000_000_000)
        .saturating_add(ts.tv_nsec as u64)
}

#[cfg(test)]
pub(crate) mod tests;
