//! The BPF side, from userspace: loads `bpf/profile.bpf.c` (CO-RE, relocated
//! against the running kernel's BTF), attaches the sampler to a CPU-clock
//! perf event on every online CPU (again as CPUs come and go), hooks exec and
//! exit, and the scheduler's switch when off-CPU sampling is on, attaches
//! the memory probes' program where `usdt` says, and drains the ring buffer.

use std::collections::BTreeMap;
use std::os::fd::OwnedFd;
use std::time::{Duration, Instant};

use anyhow::Context;
use aya::maps::{Array, MapData, PerCpuArray, RingBuf};
use aya::programs::perf_event::{
    PerfEvent, PerfEventConfig, PerfEventLinkId, PerfEventScope, SamplePolicy, SoftwareEvent,
};
use aya::programs::uprobe::{UProbeAttachLocation, UProbeAttachPoint, UProbeLinkId, UProbeScope};
use aya::programs::{BtfTracePoint, RawTracePoint, UProbe};
use aya::{Btf, Ebpf, EbpfLoader};

use crate::record::{self, Record};

static BPF_OBJECT: &[u8] = aya::include_bytes_aligned!(concat!(env!("OUT_DIR"), "/profile.bpf.o"));

const SAMPLER: &str = "on_cpu_sample";
const OFF_CPU: &str = "on_switch";
const MEMORY: &str = "on_usdt";
const DL_CHANGE: &str = "on_dl_change";
const PROGRAMS: [&str; 6] = [SAMPLER, "on_exec", "on_exit", OFF_CPU, MEMORY, DL_CHANGE];

/// `dl_watch`'s value for a process whose link-map changes wake the agent
/// (the BPF side sets 2 while a wakeup is outstanding).
const DL_WATCHED: u8 = 1;

/// Counters kept by the BPF program (summed over CPUs).
#[derive(Debug, Default, Clone, Copy)]
pub struct Counters {
    pub samples: u64,
    pub lost: u64,
    pub kernel_thread: u64,
    pub events_lost: u64,
    pub ctx_read: u64,
    pub ctx_unreadable: u64,
    /// Blocked switch-outs recorded.
    pub off_cpu: u64,
    /// ... dropped because the ring buffer was full.
    pub off_cpu_lost: u64,
    /// ... dropped because too many recorded threads were waiting.
    pub off_cpu_full: u64,
    /// Switch-outs of runnable threads (preempted; counted only).
    pub preempted: u64,
    /// Sampled allocations recorded, dropped (ring buffer full), and not
    /// tracked as live (the live map was full).
    pub allocs: u64,
    pub allocs_lost: u64,
    pub live_full: u64,
    /// Frees of tracked allocations recorded, and dropped.
    pub frees: u64,
    pub frees_lost: u64,
    /// Memory probes whose pointer argument could not be read.
    pub usdt_unreadable: u64,
    /// Sampled allocations thinned out over `--memory-max-rate`.
    pub allocs_throttled: u64,
    /// Sampled allocations not tracked as live: their process held its
    /// share of the live map (`--memory-max-live-per-process`).
    pub live_process_full: u64,
    /// Blocked switch-outs not recorded: their process was over its
    /// record rate (`--off-cpu-max-process-rate`).
    pub off_cpu_throttled: u64,
    /// User frames stepped out of by frame pointer, and by a CFI rule.
    pub steps_fp: u64,
    pub steps_cfi: u64,
    /// Rule lookups of CPU samples' walks answered by the CPU's memo.
    pub rule_memo_hits: u64,
    /// User stacks walked before their process's unwind ranges were set
    /// (a new process's first samples: by frame pointer alone).
    pub walks_early: u64,
    /// Of them, those whose stack was copied (`struct stack_snapshot`).
    pub snapshots: u64,
    /// ... and those whose stack was not copied: the ring buffer held a
    /// backlog of a quarter of its size or more.
    pub snapshots_skipped: u64,
}

pub struct Sampler {
    bpf: Ebpf,
    records: RingBuf<MapData>,
    /// Pids of processes that exec'd, each with a wakeup (memory profiling).
    exec_wakeups: RingBuf<MapData>,
    counters: PerCpuArray<MapData, u64>,
    thread_ctx: ThreadCtxMaps,
    frequency: u64,
    attached: BTreeMap<u32, PerfEventLinkId>,
    /// Held while the kernel's BPF run-time statistics are on (`--stats`).
    run_time_stats: Option<OwnedFd>,
    /// Records of an unknown kind (a BPF object of another layout: a bug).
    pub malformed: u64,
    /// Memory profiling's maps, when it is on.
    memory: Option<MemoryMaps>,
    /// The unwind tables' maps, until the collector takes them.
    unwind: Option<crate::unwind_maps::UnwindMaps>,
    unwind_rows: u32,
}

// SAFETY: plain old data (integers only, no padding: every field is
// written), as aya's maps need. (Here, not in record.rs: that file builds
// on its own, without aya, in tests/layout.rs.)
unsafe impl aya::Pod for record::UsdtSpec {}
// SAFETY: as above: integers only, no padding (record.rs checks the layout).
unsafe impl aya::Pod for record::ThreadCtxLoc {}
// SAFETY: integers only.
unsafe impl aya::Pod for record::LiveKey {}

/// The probe sites' specs and the live allocations (memory profiling).
struct MemoryMaps {
    specs: Array<MapData, record::UsdtSpec>,
    live: aya::maps::HashMap<MapData, record::LiveKey, u64>,
    /// Live allocations held per process.
    live_counts: aya::maps::HashMap<MapData, u32, u64>,
    /// Detaches probes off this thread (each waits for RCU in the kernel).
    reaper: crate::reaper::Reaper<aya::programs::uprobe::UProbeLink>,
}

/// The BPF maps of trace-context offsets by pid, and the filter the
/// scheduler program checks before looking a pid up: per slot (pid mod
/// PUBLISHING_SLOTS), how many publishing processes fall in it.
pub struct ThreadCtxMaps {
    offsets: aya::maps::HashMap<MapData, u32, record::ThreadCtxLoc>,
    publishing: Array<MapData, u32>,
    /// The processes whose link-map changes wake the agent (an LRU set).
    dl_watch: aya::maps::HashMap<MapData, u32, u8>,
}

/// The trace-context offsets, as `drain`'s callback updates them.
pub struct CtxOffsets<'a>(&'a mut ThreadCtxMaps);

impl CtxOffsets<'_> {
    pub fn set(&mut self, pid: u32, offset: Option<record::ThreadCtxLoc>) {
        if let Err(e) = self.update(pid, offset) {
            tracing::warn!(pid, "updating the trace-context offsets map: {e}");
        }
    }

    fn update(
        &mut self,
        pid: u32,
        offset: Option<record::ThreadCtxLoc>,
    ) -> Result<(), aya::maps::MapError> {
        let maps = &mut *self.0;
        let known = maps.offsets.get(&pid, 0).is_ok();
        let change: i64 = match offset {
            Some(off) => {
                maps.offsets.insert(pid, off, 0)?;
                if known {
                    0
                } else {
                    1
                }
            }
            None if known => {
                maps.offsets.remove(&pid)?;
                -1
            }
            None => 0,
        };
        if change != 0 {
            let slot = pid % record::PUBLISHING_SLOTS as u32;
            let n = maps.publishing.get(&slot, 0)?;
            let n = if change > 0 {
                n.saturating_add(1)
            } else {
                n.saturating_sub(1)
            };
            maps.publishing.set(slot, n, 0)?;
        }
        Ok(())
    }
}

/// What woke [`Sampler::wait`].
#[derive(Debug, Default)]
pub struct Wakeups {
    /// Processes that exec'd (only when memory profiling is on).
    pub execs: Vec<u32>,
    /// Processes whose link map changed (a dlopen or dlclose), once each,
    /// with when (CLOCK_MONOTONIC ns) the first change was reported.
    pub link_maps: Vec<(u32, u64)>,
    /// Processes whose stack walk found no unwind ranges (new to the
    /// agent, or exec'd), once each until they exec or exit.
    pub unwind_misses: Vec<u32>,
}

pub struct Options {
    pub frequency: u64,
    pub ring_buffer_bytes: u32,
    pub kernel_threads: bool,
    pub off_cpu: OffCpu,
    /// Turn on the kernel's run-time statistics of BPF programs (for
    /// `--stats`). They are machine-wide and cost two clock reads around
    /// every run of every BPF program (~35–55 ns here), so off otherwise.
    pub run_time_stats: bool,
    /// Memory allocation profiling: the live sampled allocations tracked at
    /// most (`None`: off, the probe program not loaded).
    pub memory_max_live: Option<u32>,
    /// Allocation records per second per CPU aimed at (0: unbounded).
    pub memory_max_rate: u32,
    /// Live sampled allocations one process may hold (0: no bound but the
    /// map's).
    pub memory_max_live_per_process: u32,
    /// Off-CPU records one process may write per second (0: unbounded),
    /// and at once: twice that.
    pub off_cpu_max_process_rate: u32,
    /// Bytes of BPF memory for unwind tables (`--unwind-table-bytes`).
    pub unwind_table_bytes: u64,
    /// Copy the user stack of samples of processes without unwind ranges
    /// (`struct stack_snapshot`).
    pub stack_snapshots: bool,
}

/// Off-CPU sampling: the probability that a blocked thread's switch-out is
/// recorded, outside any span and in one (0 and 0: off, nothing attached
/// to the scheduler), and how many recorded waits userspace keeps open at
/// once (the oldest beyond are given up).
#[derive(Debug, Clone, Copy)]
pub struct OffCpu {
    pub probability: f64,
    pub span_probability: f64,
    pub max_waiting: u32,
}

impl OffCpu {
    pub fn enabled(&self) -> bool {
        self.probability > 0.0 || self.span_probability > 0.0
    }

    /// The probability that recorded a switch-out of a thread in a span
    /// (`in_span`) or not: its wait stands for 1/p waits.
    pub fn probability_of(&self, in_span: bool) -> f64 {
        if in_span {
            self.span_probability
        } else {
            self.probability
        }
    }
}

/// A rate per second as the BPF program bounds it: records per window
/// (at least one when bounded).
fn alloc_window_max(per_second: u32) -> u32 {
    if per_second == 0 {
        return 0;
    }
    let windows = 1_000_000_000 / record::ALLOC_WINDOW_NS as u64;
    (u64::from(per_second) / windows).max(1) as u32
}

/// The BPF memory the unwind tables take besides their rows: the rules,
/// the files, and the per-process ranges at most.
pub const UNWIND_FIXED_BYTES: u64 =
    (record::UNWIND_RULES * std::mem::size_of::<record::UnwindRule>()
        + record::UNWIND_FILES * std::mem::size_of::<record::UnwindFile>()
        + record::UNWIND_PROCS * std::mem::size_of::<record::UnwindProc>()) as u64;

/// Rows of unwind tables that fit `bytes` of BPF memory with the rest
/// (at least one page of them).
pub fn unwind_rows(bytes: u64) -> u32 {
    let rows =
        bytes.saturating_sub(UNWIND_FIXED_BYTES) / std::mem::size_of::<record::UnwindRow>() as u64;
    rows.clamp(512, u64::from(u32::MAX / 2)) as u32
}

/// The kernel verifier's budget of instructions processed for one program
/// (BPF_COMPLEXITY_LIMIT_INSNS): a program past it does not load.
const VERIFIER_LIMIT: u32 = 1_000_000;

/// Logs how many instructions the verifier processed to check program
/// `name` (Linux ≥ 5.16 says), with a warning past a quarter of its
/// budget: the walk's paths multiply, and one branch more can take a
/// program that loads today past the limit (the sample program once took
/// 930,000).
fn log_verified(program: &aya::programs::Program, name: &str) {
    let Ok(Some(n)) = program.info().map(|i| i.verified_instruction_count()) else {
        return;
    };
    if n > VERIFIER_LIMIT / 4 {
        tracing::warn!(
            program = name,
            instructions = n,
            limit = VERIFIER_LIMIT,
            "BPF program verified near the verifier's limit"
        );
    } else {
        tracing::info!(program = name, instructions = n, "BPF program verified");
    }
}

/// One record per this many nanoseconds (0: unbounded).
fn record_interval_ns(per_second: u32) -> u64 {
    if per_second == 0 {
        0
    } else {
        1_000_000_000 / u64::from(per_second)
    }
}

/// A probability as the BPF program compares it with a random u32.
fn threshold(p: f64) -> u64 {
    (p.clamp(0.0, 1.0) * 4_294_967_296.0).round() as u64
}

impl Sampler {
    pub fn load(options: &Options) -> anyhow::Result<Sampler> {
        let btf = Btf::from_sys_fs()
            .context("reading the kernel's BTF (/sys/kernel/btf/vmlinux; CONFIG_DEBUG_INFO_BTF)")?;
        let kernel_threads = u32::from(options.kernel_threads);
        let off_cpu = options.off_cpu;
        let (plain, span) = (
            threshold(off_cpu.probability),
            threshold(off_cpu.span_probability),
        );
        let mut bpf = EbpfLoader::new()
            .btf(Some(&btf))
            // off_cpu_start is task storage, which aya has no typed map for;
            // it is created all the same and only the BPF side uses it.
            .allow_unsupported_maps()
            .map_max_entries("records", options.ring_buffer_bytes)
            .map_max_entries("live_allocs", options.memory_max_live.unwrap_or(1).max(1))
            .map_max_entries("unwind_rows", unwind_rows(options.unwind_table_bytes))
            .override_global("record_kernel_threads", &kernel_threads, true)
            .override_global("stack_snapshots", &u32::from(options.stack_snapshots), true)
            .override_global(
                "snapshot_backlog",
                &u64::from(options.ring_buffer_bytes / 4),
                true,
            )
            .override_global("off_cpu_threshold", &plain, true)
            .override_global("off_cpu_span_threshold", &span, true)
            .override_global(
                "wake_on_exec",
                &u32::from(options.memory_max_live.is_some()),
                true,
            )
            .override_global(
                "alloc_window_max",
                &alloc_window_max(options.memory_max_rate),
                true,
            )
            .override_global(
                "live_per_process",
                &options.memory_max_live_per_process,
                true,
            )
            .override_global(
                "record_interval_ns",
                &record_interval_ns(options.off_cpu_max_process_rate),
                true,
            )
            .override_global(
                "record_burst_ns",
                // Two seconds of records at once.
                &(u64::from(options.off_cpu_max_process_rate > 0) * 2_000_000_000),
                true,
            )
            .load(BPF_OBJECT)
            .context(
                "loading the BPF object (needs Linux ≥ 5.11: ring buffers, BTF, task storage)",
            )?;
        for name in PROGRAMS {
            if name == OFF_CPU && !off_cpu.enabled() {
                continue; // nothing runs at every context switch
            }
            if name == MEMORY {
                continue; // loaded below, where failing turns it off
            }
            let program = bpf.program_mut(name).expect("program in the object");
            match program {
                aya::programs::Program::PerfEvent(p) => p.load(),
                aya::programs::Program::RawTracePoint(p) => p.load(),
                aya::programs::Program::BtfTracePoint(p) => p.load("sched_switch", &btf),
                aya::programs::Program::UProbe(p) => p.load(),
                _ => unreachable!("{name}: unexpected program type"),
            }
            .with_context(|| format!("verifying BPF program {name}"))?;
            log_verified(bpf.program(name).expect("program in the object"), name);
        }
        for (name, tracepoint) in [
            ("on_exec", "sched_process_exec"),
            ("on_exit", "sched_process_exit"),
        ] {
            let program: &mut RawTracePoint = bpf.program_mut(name).unwrap().try_into()?;
            program
                .attach(tracepoint)
                .with_context(|| format!("attaching to raw tracepoint {tracepoint}"))?;
        }
        if off_cpu.enabled() {
            let program: &mut BtfTracePoint = bpf.program_mut(OFF_CPU).unwrap().try_into()?;
            program
                .attach()
                .context("attaching to tracepoint sched_switch (off-CPU sampling)")?;
        }
        let records = RingBuf::try_from(bpf.take_map("records").unwrap())?;
        let exec_wakeups = RingBuf::try_from(bpf.take_map("exec_wakeups").unwrap())?;
        let counters = PerCpuArray::try_from(bpf.take_map("counters").unwrap())?;
        let thread_ctx = ThreadCtxMaps {
            offsets: aya::maps::HashMap::try_from(bpf.take_map("thread_ctx_offsets").unwrap())?,
            publishing: Array::try_from(bpf.take_map("publishing").unwrap())?,
            dl_watch: aya::maps::HashMap::try_from(bpf.take_map("dl_watch").unwrap())?,
        };
        let memory = match options.memory_max_live {
            Some(_) => {
                let program: &mut UProbe = bpf.program_mut(MEMORY).unwrap().try_into()?;
                match program.load() {
                    Ok(()) => {
                        log_verified(bpf.program(MEMORY).unwrap(), MEMORY);
                        Some(MemoryMaps {
                            specs: Array::try_from(bpf.take_map("usdt_specs").unwrap())?,
                            live: aya::maps::HashMap::try_from(
                                bpf.take_map("live_allocs").unwrap(),
                            )?,
                            live_counts: aya::maps::HashMap::try_from(
                                bpf.take_map("live_counts").unwrap(),
                            )?,
                            reaper: crate::reaper::Reaper::new(),
                        })
                    }
                    Err(e) => {
                        // bpf_get_attach_cookie needs Linux 5.15: the rest
                        // of the agent works without it.
                        tracing::warn!(
                            "memory allocation profiling off: its BPF program does not load \
                             here (needs Linux ≥ 5.15): {e}"
                        );
                        None
                    }
                }
            }
            None => None,
        };
        let rows = unwind_rows(options.unwind_table_bytes);
        let unwind = Some(
            crate::unwind_maps::UnwindMaps::take(&mut bpf, rows)
                .context("the unwind tables' BPF maps")?,
        );
        let stats = if options.run_time_stats {
            aya::sys::enable_stats(aya::sys::Stats::RunTime)
                .map_err(|e| tracing::warn!("BPF run-time statistics unavailable: {e}"))
                .ok()
        } else {
            None
        };
        let mut sampler = Sampler {
            bpf,
            records,
            exec_wakeups,
            counters,
            thread_ctx,
            frequency: options.frequency,
            attached: BTreeMap::new(),
            run_time_stats: stats,
            malformed: 0,
            memory,
            unwind,
            unwind_rows: rows,
        };
        sampler.sync_cpus()?;
        Ok(sampler)
    }

    fn perf_program(&mut self) -> &mut PerfEvent {
        self.bpf
            .program_mut(SAMPLER)
            .unwrap()
            .try_into()
            .expect("perf_event program")
    }

    /// Attaches to CPUs that came online and detaches from those that went
    /// offline (their events are dead; they get new ones if they return).
    /// Returns the number of CPUs sampled.
    pub fn sync_cpus(&mut self) -> anyhow::Result<usize> {
        let online =
            aya::util::online_cpus().map_err(|(path, e)| anyhow::anyhow!("reading {path}: {e}"))?;
        let gone: Vec<u32> = self
            .attached
            .keys()
            .filter(|c| !online.contains(c))
            .copied()
            .collect();
        for cpu in gone {
            let link = self.attached.remove(&cpu).unwrap();
            let _ = self.perf_program().detach(link);
            tracing::info!(cpu, "CPU went offline: detached");
        }
        let frequency = self.frequency;
        for cpu in online {
            if self.attached.contains_key(&cpu) {
                continue;
            }
            let link = self
                .perf_program()
                .attach(
                    PerfEventConfig::Software(SoftwareEvent::CpuClock),
                    PerfEventScope::AllProcessesOneCpu { cpu },
                    SamplePolicy::Frequency(frequency),
                    false,
                )
                .with_context(|| format!("opening the CPU-clock perf event on CPU {cpu}"))?;
            self.attached.insert(cpu, link);
        }
        Ok(self.attached.len())
    }

    pub fn cpus(&self) -> usize {
        self.attached.len()
    }

    /// Waits up to `timeout`, less if a process execs (memory profiling
    /// wants a look at it within milliseconds), changes its link map (a
    /// dlopen) or is sampled without unwind ranges; returns those pids.
    /// The sample ring buffer never wakes us: it is drained on a timer.
    pub fn wait(&mut self, timeout: Duration) -> Wakeups {
        use std::os::fd::{AsFd, AsRawFd};
        let mut pfd = libc::pollfd {
            fd: self.exec_wakeups.as_fd().as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        };
        // Rounded up: truncated, the last millisecond before a drain would
        // be polled with 0 over and over (a busy loop: 2% of a CPU at one
        // drain every 50 ms).
        let ms = timeout.as_micros().div_ceil(1000).min(i32::MAX as u128) as i32;
        // SAFETY: poll reads and writes the one pollfd it is given.
        unsafe { libc::poll(&mut pfd, 1, ms) };
        let mut wakeups = Wakeups::default();
        while let Some(item) = self.exec_wakeups.next() {
            // 4 bytes (a pid), or 16 for a link-map change (its time too).
            if let Some(b) = item.get(..4).and_then(|b| <[u8; 4]>::try_from(b).ok()) {
                let pid = u32::from_ne_bytes(b);
                if pid & record::DL_CHANGE_BIT as u32 != 0 {
                    let pid = pid & !(record::DL_CHANGE_BIT as u32);
                    let at = item
                        .get(8..16)
                        .and_then(|b| <[u8; 8]>::try_from(b).ok())
                        .map_or(0, u64::from_ne_bytes);
                    if !wakeups.link_maps.iter().any(|&(p, _)| p == pid) {
                        wakeups.link_maps.push((pid, at));
                    }
                } else if pid & record::UNWIND_MISS_BIT as u32 != 0 {
                    wakeups
                        .unwind_misses
                        .push(pid & !(record::UNWIND_MISS_BIT as u32));
                } else {
                    wakeups.execs.push(pid);
                }
            }
        }
        wakeups
    }

    /// Process `pid`'s next link-map change wakes [`Sampler::wait`] again:
    /// one wakeup is outstanding per process, taken when its change was
    /// handled (a process whose changes wait for its budget wakes no one).
    pub fn rearm_link_map(&mut self, pid: u32) {
        let _ = self.thread_ctx.dl_watch.insert(pid, DL_WATCHED, 0);
    }

    /// Process `pid`'s link-map changes wake [`Sampler::wait`] from now on.
    pub fn watch_link_map(&mut self, pid: u32) {
        if let Err(e) = self.thread_ctx.dl_watch.insert(pid, DL_WATCHED, 0) {
            tracing::warn!(pid, "updating the link-map watch map: {e}");
        }
    }

    /// Attaches the link-map hook to a dynamic loader (`path`: a descriptor
    /// of the file itself, `offset`: `_dl_debug_state`'s file offset).
    pub fn attach_dl_hook(&mut self, path: &std::path::Path, offset: u64) -> anyhow::Result<()> {
        let program: &mut UProbe = self
            .bpf
            .program_mut(DL_CHANGE)
            .expect("program in the object")
            .try_into()?;
        let point = UProbeAttachPoint {
            location: UProbeAttachLocation::AbsoluteOffset(offset),
            cookie: None,
        };
        // Attached for the agent's life (one per loader file).
        program
            .attach(point, path, UProbeScope::AllProcesses)
            .with_context(|| format!("uprobe at {offset:#x} of {}", path.display()))?;
        Ok(())
    }

    /// Hands every record in the ring buffer to `each`, with the
    /// trace-context offsets map, so a process registered by its first
    /// sample has its contexts read from the next tick on, not from the
    /// next drain.
    /// Handles the records waiting, until `until` (`None`: all of them);
    /// how many it handled, and whether it stopped for the time (records
    /// may be waiting still).
    pub fn drain(
        &mut self,
        until: Option<Instant>,
        mut each: impl FnMut(Record, &mut CtxOffsets<'_>),
    ) -> (usize, bool) {
        let mut n = 0;
        let mut offsets = CtxOffsets(&mut self.thread_ctx);
        loop {
            if until.is_some_and(|t| Instant::now() >= t) {
                return (n, true);
            }
            let Some(item) = self.records.next() else {
                return (n, false);
            };
            n += 1;
            match Record::parse(&item) {
                Some(r) => each(r, &mut offsets),
                None => self.malformed += 1,
            }
        }
    }

    /// How process `pid`'s threads reach their trace-context pointer, or
    /// `None` to stop reading it.
    pub fn set_thread_ctx_offset(&mut self, pid: u32, offset: Option<record::ThreadCtxLoc>) {
        CtxOffsets(&mut self.thread_ctx).set(pid, offset);
    }

    /// Runs of the CPU sampler so far (one map read: the liveness check).
    pub fn ticks(&self) -> u64 {
        self.counters
            .get(&record::COUNTER_TICKS, 0)
            .map(|v| v.iter().sum())
            .unwrap_or(0)
    }

    pub fn counters(&self) -> Counters {
        let sum = |i: u32| -> u64 {
            self.counters
                .get(&i, 0)
                .map(|v| v.iter().sum())
                .unwrap_or(0)
        };
        Counters {
            samples: sum(record::COUNTER_SAMPLES),
            lost: sum(record::COUNTER_LOST),
            kernel_thread: sum(record::COUNTER_KERNEL_THREAD),
            events_lost: sum(record::COUNTER_EVENTS_LOST),
            ctx_read: sum(record::COUNTER_CTX_READ),
            ctx_unreadable: sum(record::COUNTER_CTX_UNREADABLE),
            off_cpu: sum(record::COUNTER_OFF_CPU),
            off_cpu_lost: sum(record::COUNTER_OFF_CPU_LOST),
            off_cpu_full: sum(record::COUNTER_OFF_CPU_FULL),
            preempted: sum(record::COUNTER_PREEMPTED),
            allocs: sum(record::COUNTER_ALLOCS),
            allocs_lost: sum(record::COUNTER_ALLOCS_LOST),
            live_full: sum(record::COUNTER_LIVE_FULL),
            frees: sum(record::COUNTER_FREES),
            frees_lost: sum(record::COUNTER_FREES_LOST),
            usdt_unreadable: sum(record::COUNTER_USDT_UNREADABLE),
            allocs_throttled: sum(record::COUNTER_ALLOCS_THROTTLED),
            live_process_full: sum(record::COUNTER_LIVE_PROCESS_FULL),
            off_cpu_throttled: sum(record::COUNTER_OFF_CPU_THROTTLED),
            steps_fp: sum(record::COUNTER_STEPS_FP),
            steps_cfi: sum(record::COUNTER_STEPS_CFI),
            rule_memo_hits: sum(record::COUNTER_RULE_MEMO_HITS),
            walks_early: sum(record::COUNTER_WALKS_EARLY),
            snapshots: sum(record::COUNTER_SNAPSHOTS),
            snapshots_skipped: sum(record::COUNTER_SNAPSHOTS_SKIPPED),
        }
    }

    /// Rows of the unwind tables' pool.
    pub fn unwind_rows(&self) -> u32 {
        self.unwind_rows
    }

    /// The unwind tables' maps (once: the collector owns them).
    pub fn take_unwind_maps(&mut self) -> Option<crate::unwind_maps::UnwindMaps> {
        self.unwind.take()
    }

    /// Whether memory allocation profiling is on.
    pub fn memory_enabled(&self) -> bool {
        self.memory.is_some()
    }

    /// A process is gone (`exited`) or exec'd: its live allocations leave
    /// the BPF side's map, and its count there goes (exit) or is lowered
    /// by those removed (exec: the new image's count goes on).
    pub fn forget_live(&mut self, pid: u32, ptrs: &[u64], exited: bool) {
        let Some(m) = &mut self.memory else {
            return;
        };
        let mut removed = 0u64;
        for &ptr in ptrs {
            if m.live.remove(&record::LiveKey { pid, pad: 0, ptr }).is_ok() {
                removed += 1;
            }
        }
        if exited {
            let _ = m.live_counts.remove(&pid);
        } else if removed > 0 {
            // Not atomic with the BPF side's updates: off by a record at
            // worst, and never below zero.
            if let Ok(held) = m.live_counts.get(&pid, 0) {
                let _ = m.live_counts.insert(pid, held.saturating_sub(removed), 0);
            }
        }
    }

    /// Total run time and runs of our BPF programs (kernel accounting).
    /// Whether [`Sampler::run_time`] counts: the statistics are on.
    pub fn measures_run_time(&self) -> bool {
        self.run_time_stats.is_some()
    }

    /// Our programs' run time and runs so far (zero unless measured).
    pub fn run_time(&self) -> (Duration, u64) {
        PROGRAMS
            .iter()
            .filter_map(|name| self.bpf.program(name)?.info().ok())
            .fold((Duration::ZERO, 0), |(t, n), info| {
                (t + info.run_time(), n + info.run_count())
            })
    }
}

impl crate::usdt::Attach for Sampler {
    type Link = UProbeLinkId;

    fn attach(
        &mut self,
        path: &std::path::Path,
        offset: u64,
        slot: u32,
        spec: &record::UsdtSpec,
    ) -> anyhow::Result<UProbeLinkId> {
        let Some(m) = &mut self.memory else {
            anyhow::bail!("memory profiling is off");
        };
        m.specs
            .set(slot, *spec, 0)
            .context("writing the probe's spec")?;
        let program: &mut UProbe = self
            .bpf
            .program_mut(MEMORY)
            .expect("program in the object")
            .try_into()?;
        let point = UProbeAttachPoint {
            location: UProbeAttachLocation::AbsoluteOffset(offset),
            cookie: Some(u64::from(slot)),
        };
        program
            .attach(point, path, UProbeScope::AllProcesses)
            .with_context(|| {
                format!(
                    "uprobe at {offset:#x} of {} (needs Linux ≥ 5.15 for its cookie)",
                    path.display()
                )
            })
    }

    fn detach(&mut self, link: UProbeLinkId, slot: u32) {
        let Ok(program) = <&mut UProbe>::try_from(self.bpf.program_mut(MEMORY).expect("program"))
        else {
            return;
        };
        // Owned now: dropped (detached) by the reaper; its slot comes back
        // through `reaped` once it is gone (its spec stays until then).
        match (program.take_link(link), &self.memory) {
            (Ok(link), Some(m)) => m.reaper.reap(link, slot),
            (Ok(link), None) => drop(link),
            (Err(_), _) => {}
        }
    }

    fn reaped(&mut self) -> Vec<u32> {
        self.memory
            .as_ref()
            .map_or_else(Vec::new, |m| m.reaper.reaped())
    }

    fn finish(&mut self) {
        if let Some(m) = &mut self.memory {
            std::mem::take(&mut m.reaper).finish();
        }
    }
}
