//! The sampler thread: drains the ring buffer every `POLL`, turns records
//! into samples of the current batch, hands finished batches to the export
//! queue every interval, follows CPU hotplug, and prints stats.

use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::batch::{Batch, Memory, Observed};
use crate::export::Queue;
use crate::health::Health;
use crate::jobs::{About, Pool};
use crate::kallsyms::KernelSymbols;
use crate::memory;
use crate::offcpu::{self, Waiting, Waits};
use crate::process::{ProcessInfo, Processes, UserFrame, UserStack};
use crate::record::{self, CpuSample, Record, StackSnapshot};
use crate::sampler::{CtxOffsets, OffCpu, Sampler};
use crate::stats;
use crate::unwind::Cut;
use crate::usdt::MemoryProbes;

/// How often the ring buffer is drained (the BPF side never wakes us); also
/// how long a new process's first samples can go without its trace context.
const POLL: Duration = Duration::from_millis(50);
/// How long one drain handles records before the loop goes round (records
/// left wait for the next, at once): a link-map change or an exec waiting
/// to be handled is not held up by a long backlog, nor by the jobs some
/// records wait for.
const DRAIN_SLICE: Duration = Duration::from_millis(20);
/// How often online CPUs are compared with the ones sampled.
const CPU_SYNC: Duration = Duration::from_secs(5);
/// How long past its interval a batch is held while a file it samples is
/// being hashed (a mapping sent without its content hash names nothing an
/// agent published, so those samples wait for it: a hash of a large file
/// on a loaded host takes seconds) or a process's identity is being read
/// (its samples would go under its provisional name, not its service's);
/// past this they go without.
const HASH_HOLD: Duration = Duration::from_secs(5);

pub struct Collector {
    pub sampler: Sampler,
    pub queue: Arc<Queue>,
    pub interval: Duration,
    pub frequency: u64,
    pub host_name: String,
    pub print_stats: bool,
    pub cfi_cache_bytes: usize,
    /// Bounds of the JIT symbols: per process, in total.
    pub jit_bytes: (usize, usize),
    pub off_cpu: OffCpu,
    /// Where sampled binaries are offered for publishing, and what became
    /// of them (`None`: `--no-upload-binaries`).
    pub uploads: Option<(crate::upload::Offers, Arc<crate::upload::Stats>)>,
    /// Where per-file and per-process work runs.
    pub pool: Pool,
    /// What the liveness endpoint reports.
    pub health: Arc<Health>,
    /// Memory probe files (or directories) attached at start, beside
    /// [`crate::usdt::DEFAULT_FILES`].
    pub memory_probe_files: Vec<std::path::PathBuf>,
    /// A fault to inject (`SYMTRACE_AGENT_TEST_FAULT`: tests of the
    /// liveness endpoint and of thread death).
    pub fault: Option<Fault>,
}

/// A fault the tests inject into the sampler thread.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fault {
    /// Panics outside every contained job, after the first export.
    Panic,
    /// Stops going round the loop (as if stuck in the kernel), after the
    /// first export.
    Stall,
}

impl Fault {
    /// From `SYMTRACE_AGENT_TEST_FAULT` (`sampler-panic`, `sampler-stall`).
    pub fn from_env() -> Option<Fault> {
        match std::env::var("SYMTRACE_AGENT_TEST_FAULT").ok()?.as_str() {
            "sampler-panic" => Some(Fault::Panic),
            "sampler-stall" => Some(Fault::Stall),
            _ => None,
        }
    }
}

/// What the collector saw over its whole run, for the final summary.
pub struct Totals {
    pub first: stats::Reading,
    pub last: stats::Reading,
    /// Gauges at the end; `delivery` is filled in by the caller once the
    /// export queue has drained.
    pub gauges: stats::Gauges,
}

impl Collector {
    pub fn run(mut self, stop: &AtomicBool) -> anyhow::Result<Totals> {
        let kernel = KernelSymbols::read().unwrap_or_else(|e| {
            tracing::warn!("cannot read /proc/kallsyms ({e}): kernel frames stay unnamed");
            KernelSymbols::parse("")
        });
        tracing::debug!(symbols = kernel.len(), "kernel symbols read");
        if kernel.is_empty() {
            tracing::warn!(
                "/proc/kallsyms shows no addresses (kernel.kptr_restrict; add CAP_SYSLOG to \
                 name kernel frames): kernel frames stay unnamed"
            );
        }
        let mut procs = Processes::new(
            Path::new("/proc"),
            self.cfi_cache_bytes,
            self.jit_bytes,
            self.pool.clone(),
        );
        procs.offer_binaries_to(self.uploads.as_ref().map(|(offers, _)| offers.clone()));
        if let Some(maps) = self.sampler.take_unwind_maps() {
            procs.unwind_into(Box::new(maps), self.sampler.unwind_rows());
        }
        tracing::debug!(functions = procs.vdso_functions(), "vDSO symbols read");
        // The named probe files first: a process started once the agent
        // says it read the running ones is covered from its first
        // allocation.
        let named = crate::usdt::DEFAULT_FILES
            .iter()
            .map(std::path::PathBuf::from)
            .chain(self.memory_probe_files.iter().cloned())
            .collect();
        let mut probes = MemoryProbes::new(Path::new("/proc"), named);
        if self.sampler.memory_enabled() {
            probes.attach_named(&mut self.sampler);
        }
        let priming = Instant::now();
        let primed = procs.prime();
        let publishing = hand_over(&mut self.sampler, &mut procs);
        tracing::info!(
            "read {primed} running processes in {:?}; {publishing} publish OpenTelemetry thread contexts",
            priming.elapsed(),
        );
        let mut mem = memory::Memory::default();
        if self.sampler.memory_enabled() {
            let scanning = Instant::now();
            probes.scan(true, &mut procs, &mut self.sampler);
            let found = probes.stats();
            tracing::info!(
                "memory profiling: otel_memory probes in {} files ({} sites) after {:?}",
                found.files,
                found.sites,
                scanning.elapsed()
            );
        }
        let mut gone: Vec<(u32, Vec<u64>, bool)> = Vec::new();
        let mut batch = Batch::new(unix_now_ns(), self.frequency, &self.host_name);
        let mut waits = Waits::new(self.off_cpu.max_waiting as usize);
        let mut boot_to_unix = boot_to_unix_ns();
        let mut user = Vec::with_capacity(128);
        // Each CPU's last stack snapshot, for the sample written after it.
        let mut snapshots = Snapshots::default();
        let mut kernel_frames: Vec<(u64, Option<&str>)> = Vec::with_capacity(64);
        let start = Instant::now();
        let mut next_flush = start + self.interval;
        // How long batches went out after their interval, in all (held for
        // content hashes and identities, or the loop behind).
        let mut late = Duration::ZERO;
        let mut next_cpu_sync = start + CPU_SYNC;
        let mut last = self.reading();
        let first = last;
        let mut next_drain = Instant::now() + POLL;
        let mut ticks = 0;
        let mut exported = false;
        while !stop.load(Ordering::Relaxed) {
            self.health.beat();
            if exported {
                match self.fault {
                    Some(Fault::Panic) => panic!("SYMTRACE_AGENT_TEST_FAULT: sampler-panic"),
                    Some(Fault::Stall) => loop {
                        std::thread::sleep(Duration::from_secs(3600));
                    },
                    None => {}
                }
            }
            // Asleep until the next drain, or until a look at an exec'd
            // process is due, or a process execs, or a deferred link-map
            // change may be handled, or a process is sampled before the
            // agent set its unwind ranges, or a process whose files' tables
            // were pending looks again.
            let now = Instant::now();
            let wait = next_drain.saturating_duration_since(now);
            let wait = probes.next_due(now).map_or(wait, |d| d.min(wait));
            let wait = procs
                .next_link_map_due()
                .map_or(wait, |t| t.saturating_duration_since(now).min(wait));
            let wait = procs
                .next_thread_ctx_due(now)
                .map_or(wait, |t| t.saturating_duration_since(now).min(wait));
            let wait = procs
                .next_unwind_due()
                .map_or(wait, |t| t.saturating_duration_since(now).min(wait));
            let wakeups = self.sampler.wait(wait);
            contained(&self.health, "handling link-map changes", || {
                for &pid in &wakeups.unwind_misses {
                    procs.unwind_now(pid);
                }
                let sampler = &mut self.sampler;
                for &(pid, at) in &wakeups.link_maps {
                    procs.link_map_changed(pid, at, || sampler.rearm_link_map(pid));
                }
                procs.due_link_maps(|pid| sampler.rearm_link_map(pid));
                procs.settle_thread_ctxs();
                procs.settle_due_unwinds(Instant::now());
                procs.hung_jobs();
                hand_over(&mut self.sampler, &mut procs);
            });
            if self.sampler.memory_enabled() {
                contained(&self.health, "looking for memory probes", || {
                    for &pid in &wakeups.execs {
                        probes.exec(pid);
                    }
                    probes.tick(Instant::now(), &mut procs, &mut self.sampler);
                });
            }
            if Instant::now() < next_drain {
                continue;
            }
            next_drain = Instant::now() + POLL;
            let now_ticks = self.sampler.ticks();
            if now_ticks != ticks {
                ticks = now_ticks;
                self.health.sampled();
            }
            let (_, more) = self.sampler.drain(Some(Instant::now() + DRAIN_SLICE), |record, offsets| {
                // A record's handling reads what its process controls: a
                // panic in it is that process's problem, never the thread's.
                let pid = record.pid();
                let exited = matches!(record, Record::Exit(_));
                let handled = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| match record {
                Record::Snapshot(snap) => snapshots.keep(snap),
                Record::Sample(s) => {
                    let comm = s.thread_name();
                    user.clear();
                    let snap = snapshots.take(&s);
                    let (process, cut) =
                        resolve(&mut procs, offsets, &s, snap.as_ref(), &comm, &mut user);
                    kernel_frames.clear();
                    for (depth, &ret) in s.kernel_stack().iter().enumerate() {
                        let address = record::call_site(depth, ret);
                        kernel_frames.push((address, kernel.name(address)));
                    }
                    batch.add(
                        &Observed {
                            process: &process,
                            thread_name: &comm,
                            unix_ns: s.boot_ns.saturating_add_signed(boot_to_unix),
                            user: &user,
                            cut,
                            kernel: &kernel_frames,
                            trace: &s.trace,
                        },
                        None,
                    );
                }
                Record::OffCpuStart(s) => {
                    // Resolved now, while the process and its mappings are
                    // surely there; emitted when the thread runs again.
                    let comm = s.thread_name();
                    let mut frames = Vec::new();
                    let (process, cut) = resolve(&mut procs, offsets, &s, None, &comm, &mut frames);
                    // The stack was taken inside the scheduler's tracepoint:
                    // its leaf frames are the BPF program and the tracing
                    // glue, not the thread's.
                    let kernel = s
                        .kernel_stack()
                        .iter()
                        .enumerate()
                        .map(|(depth, &ret)| record::call_site(depth, ret))
                        .skip_while(|&a| kernel.name(a).is_some_and(offcpu::is_tracing_frame))
                        .collect();
                    waits.start(
                        s.tid,
                        Waiting {
                            process,
                            thread_name: comm,
                            start_ns: s.boot_ns,
                            user: frames,
                            cut,
                            kernel,
                            trace: s.trace,
                        },
                    );
                }
                Record::OffCpuEnd(e) => {
                    let Some(w) = waits.end(e.tid, e.start_ns) else {
                        return;
                    };
                    let p = self.off_cpu.probability_of(w.trace.valid == 1);
                    let value = offcpu::scaled(e.end_ns.saturating_sub(e.start_ns), p);
                    kernel_frames.clear();
                    kernel_frames.extend(w.kernel.iter().map(|&a| (a, kernel.name(a))));
                    batch.add(
                        &Observed {
                            process: &w.process,
                            thread_name: &w.thread_name,
                            unix_ns: w.start_ns.saturating_add_signed(boot_to_unix),
                            user: &w.user,
                            cut: w.cut,
                            kernel: &kernel_frames,
                            trace: &w.trace,
                        },
                        Some(value),
                    );
                }
                Record::Alloc(a) => {
                    let s = &a.sample;
                    let raw = memory::raw_key(s);
                    let stack = match mem.cached(&raw) {
                        Some(stack) => stack,
                        None => {
                            let mut frames = Vec::new();
                            let comm = s.thread_name();
                            let (process, cut) =
                                resolve(&mut procs, offsets, s, None, &comm, &mut frames);
                            let stack = Arc::new(memory::Stack {
                                process,
                                user: frames,
                                cut,
                            });
                            mem.cache(s.pid, raw, &stack);
                            stack
                        }
                    };
                    mem.alloc(
                        s.pid,
                        &memory::Sampled {
                            stack: &stack,
                            comm: &s.comm,
                            trace: &s.trace,
                            unix_ns: s.boot_ns.saturating_add_signed(boot_to_unix),
                            ptr: a.ptr,
                            size: a.size,
                            weight: a.weight,
                            tracked: a.tracked == 1,
                        },
                    );
                }
                Record::Free(f) => mem.free(f.pid, f.ptr),
                Record::Exec(pid) | Record::Exit(pid) => {
                    if exited {
                        procs.exit(pid);
                    } else {
                        procs.exec(pid);
                    }
                    // Now, in record order: allocations of the new image
                    // later in this drain are its own.
                    let ptrs = mem.forget_process(pid);
                    if !ptrs.is_empty() || exited {
                        gone.push((pid, ptrs, exited));
                    }
                }
                }));
                if let Err(panic) = handled {
                    tracing::warn!(
                        pid,
                        "handling a record of this process panicked (contained: what the agent                          held of it is read anew): {}",
                        crate::jobs::panic_message(panic.as_ref())
                    );
                    procs.quarantine(pid);
                }
            });
            if more {
                next_drain = Instant::now(); // the rest right after a look at the wakeups
            }
            contained(&self.health, "offering hashed files", || {
                procs.offer_hashed()
            });
            // Processes named provisionally until their identity was read:
            // their samples so far are theirs.
            for (old, new) in procs.take_identified() {
                batch.identify(&old, &new);
            }
            for (pid, ptrs, exited) in gone.drain(..) {
                // Not those allocated again since (the same pointer in the
                // new image).
                let stale: Vec<u64> = ptrs.into_iter().filter(|&p| !mem.has(pid, p)).collect();
                self.sampler.forget_live(pid, &stale, exited);
            }
            contained(&self.health, "handing over to the BPF side", || {
                hand_over(&mut self.sampler, &mut procs);
            });
            let now = Instant::now();
            if now >= next_cpu_sync {
                next_cpu_sync = now + CPU_SYNC;
                if let Err(e) = self.sampler.sync_cpus() {
                    tracing::warn!("following CPU hotplug: {e:#}");
                }
            }
            if now >= next_flush
                && !(now < next_flush + HASH_HOLD
                    && (batch.awaits_contents(|file| procs.hash_under_way(file))
                        || procs.identity_under_way(now.checked_sub(HASH_HOLD).unwrap_or(now))))
            {
                for (old, new) in procs.take_identified() {
                    batch.identify(&old, &new);
                }
                late += now.saturating_duration_since(next_flush);
                next_flush = now + self.interval;
                let end = unix_now_ns();
                add_memory(&mut batch, &mut mem, end);
                let without = batch.settle_contents(|file| procs.content_of(file));
                tracing::debug!(without, "file mappings sent without a content hash");
                let done =
                    std::mem::replace(&mut batch, Batch::new(end, self.frequency, &self.host_name));
                self.flush(done, end);
                exported = true;
                boot_to_unix = boot_to_unix_ns();
                procs.age();
                let reading = self.reading();
                let gauges = self.gauges(&procs, &waits, &mem, &probes, late);
                self.health.set_metrics(stats::metrics(&reading, &gauges));
                if self.print_stats {
                    println!("{}", stats::line(&last, &reading, &gauges));
                    last = reading;
                }
            }
        }
        self.sampler.drain(None, |_, _| {});
        self.pool.close();
        let end = unix_now_ns();
        add_memory(&mut batch, &mut mem, end);
        batch.settle_contents(|file| procs.content_of(file));
        self.flush(batch, end);
        self.queue.close();
        let totals = Totals {
            first,
            last: self.reading(),
            gauges: self.gauges(&procs, &waits, &mem, &probes, late),
        };
        // While the last batch goes out: the probes still attached are
        // detached (each waits for RCU in the kernel, ~0.1 s a site: what
        // a user's share of the sites costs a shutdown at most).
        probes.detach_all(&mut self.sampler);
        Ok(totals)
    }

    fn flush(&self, batch: Batch, end_ns: u64) {
        let samples = batch.samples() as u64;
        if let Some(request) = batch.finish(end_ns) {
            tracing::debug!(samples, "batch built");
            self.queue.push(request, samples);
        }
    }

    fn reading(&self) -> stats::Reading {
        let (bpf_time, bpf_runs) = self.sampler.run_time();
        stats::Reading {
            at: Instant::now(),
            counters: self.sampler.counters(),
            agent_cpu: stats::own_cpu(),
            bpf_time,
            bpf_runs,
        }
    }

    fn gauges<L>(
        &self,
        procs: &Processes,
        waits: &Waits,
        mem: &memory::Memory,
        probes: &MemoryProbes<L>,
        late: Duration,
    ) -> stats::Gauges {
        stats::Gauges {
            cpus: self.sampler.cpus(),
            frequency: self.frequency,
            processes: procs.len(),
            vanished: procs.vanished(),
            binaries: procs.binaries(),
            malformed: self.sampler.malformed,
            files_skipped: procs.files_skipped(),
            hashes: procs.hash_stats(),
            unwind: procs.unwind_stats(),
            cfi: procs.cfi_stats(),
            tables: procs.table_stats(),
            contained: procs.contained(),
            ctx_after_load: procs.ctx_after_load(),
            jobs: self.pool.stats(),
            waits_cut: procs.waits_cut(),
            late,
            bpf_measured: self.sampler.measures_run_time(),
            delivery: self.queue.stats(),
            waiting: waits.len(),
            waits_dropped: waits.dropped,
            waits_unmatched: waits.unmatched,
            live_allocs: mem.len(),
            unknown_frees: mem.unknown_frees,
            probes: probes.stats(),
            jit: procs.jit_stats(),
            uploads: self.uploads.as_ref().map(|(_, stats)| stats.snapshot()),
        }
    }
}

/// How long the sampler thread waits to open a dynamic loader.
const LOADER_WAIT: Duration = Duration::from_millis(250);

/// Runs `work` (something the collector does beside handling records),
/// containing a panic in it: logged and counted, and the loop goes on.
fn contained(health: &Health, what: &str, work: impl FnOnce()) {
    let _ = health;
    if let Err(panic) = std::panic::catch_unwind(std::panic::AssertUnwindSafe(work)) {
        tracing::warn!(
            "{what} panicked (contained): {}",
            crate::jobs::panic_message(panic.as_ref())
        );
    }
}

/// Hands the BPF side what reading processes found: trace-context
/// locations, the processes whose dlopens are to wake us, and dynamic
/// loaders to hook (attached through a descriptor of the very file the
/// process maps). Returns how many processes now publish contexts.
fn hand_over(sampler: &mut Sampler, procs: &mut Processes) -> usize {
    use std::os::fd::AsRawFd;
    let changes = procs.take_tls_changes();
    let publishing = changes.iter().filter(|(_, loc)| loc.is_some()).count();
    for (pid, loc) in changes {
        sampler.set_thread_ctx_offset(pid, loc);
    }
    for pid in procs.take_new_processes() {
        sampler.watch_link_map(pid);
    }
    for (pid, map, offset) in procs.take_new_loaders() {
        // Opened in a job (the file is the process's to name).
        let m = map.clone();
        let opened = procs
            .pool()
            .run(About { pid, dev: map.dev }, LOADER_WAIT, move || {
                crate::files::open::open_mapped(Path::new("/proc"), pid, &m)
            })
            .unwrap_or(Err(crate::files::Skip::Hung));
        let attached = opened
            .map_err(|why| anyhow::anyhow!("not opened: {why:?}"))
            .and_then(|opened| {
                let path = format!("/proc/self/fd/{}", opened.file.as_raw_fd());
                sampler.attach_dl_hook(Path::new(&path), offset)
            });
        match attached {
            Ok(()) => tracing::debug!(path = %map.path, "dlopen hook attached"),
            Err(e) => {
                tracing::warn!(path = %map.path, "dlopen hook not attached: libraries loaded later are found only when the mappings are read again: {e:#}");
                procs.loader_not_hooked(&map);
            }
        }
    }
    publishing
}

/// Resolves a record's user stack into `out` (see `Processes::resolve`),
/// and hands the BPF program the trace-context offsets of any process read
/// for it, so its next records carry their spans.
/// The stack snapshots read, one per CPU at most, until the sample
/// written after each (same CPU, same time) takes it: a snapshot and its
/// sample are written by one run of the BPF program, which nothing else on
/// its CPU interrupts.
#[derive(Default)]
struct Snapshots(Vec<StackSnapshot>);

impl Snapshots {
    fn keep(&mut self, snap: StackSnapshot) {
        match self.0.iter_mut().find(|s| s.cpu == snap.cpu) {
            Some(old) => *old = snap,
            // At most one per CPU the BPF program runs on.
            None => self.0.push(snap),
        }
    }

    /// The snapshot of sample `s`, when it has one (a snapshot whose
    /// sample was lost, the ring full, is replaced by its CPU's next).
    fn take(&mut self, s: &CpuSample) -> Option<StackSnapshot> {
        if self.0.is_empty() {
            return None;
        }
        let i = self
            .0
            .iter()
            .position(|snap| snap.cpu == s.cpu && snap.boot_ns == s.boot_ns)?;
        Some(self.0.swap_remove(i))
    }
}

fn resolve(
    procs: &mut Processes,
    offsets: &mut CtxOffsets<'_>,
    s: &CpuSample,
    snapshot: Option<&StackSnapshot>,
    comm: &str,
    out: &mut Vec<UserFrame>,
) -> (Arc<ProcessInfo>, Option<Cut>) {
    let stack = UserStack {
        chain: s.user_stack(),
        end: s.user_end,
        bp: s.user_bp,
        window: s.window(),
        snapshot: snapshot.map(|snap| (snap.sp, snap.data.as_slice())),
    };
    let resolved = procs.resolve(s.pid, comm, &stack, out);
    for (pid, offset) in procs.take_tls_changes() {
        offsets.set(pid, offset);
    }
    resolved
}

/// The interval's memory profiles into its batch: what was allocated per
/// site, and a snapshot of what is live at `end_ns`.
fn add_memory(batch: &mut Batch, memory: &mut memory::Memory, end_ns: u64) {
    let (allocated, live) = memory.take();
    for (site, latest_ns, bytes, objects) in allocated {
        batch.add_site(&site, latest_ns, Memory::Alloc { bytes, objects });
    }
    for (site, bytes, objects) in live {
        batch.add_site(&site, end_ns, Memory::InUse { bytes, objects });
    }
}

fn clock_ns(clock: libc::clockid_t) -> i64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes the timespec it is given.
    unsafe { libc::clock_gettime(clock, &mut ts) };
    ts.tv_sec * 1_000_000_000 + ts.tv_nsec
}

fn unix_now_ns() -> u64 {
    clock_ns(libc::CLOCK_REALTIME) as u64
}

/// What to add to a `bpf_ktime_get_boot_ns()` time to get a Unix time.
fn boot_to_unix_ns() -> i64 {
    clock_ns(libc::CLOCK_REALTIME) - clock_ns(libc::CLOCK_BOOTTIME)
}
