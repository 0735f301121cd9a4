//! Self-observation: what the agent costs and what it saw, per interval.

use std::time::{Duration, Instant};

use crate::cfi::CacheStats;
use crate::export::Delivery;
use crate::files::Skip;
use crate::jobs::JobStats;
use crate::process::budget::Contained;
use crate::sampler::Counters;
use crate::unwind::{Cut, UnwindStats};

/// This process's CPU time (user + system) so far.
pub fn own_cpu() -> Duration {
    // SAFETY: getrusage writes the struct it is given.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut usage) };
    let tv = |t: libc::timeval| Duration::new(t.tv_sec as u64, t.tv_usec as u32 * 1000);
    tv(usage.ru_utime) + tv(usage.ru_stime)
}

/// A reading of every counter at one instant.
#[derive(Clone, Copy)]
pub struct Reading {
    pub at: Instant,
    pub counters: Counters,
    pub agent_cpu: Duration,
    pub bpf_time: Duration,
    pub bpf_runs: u64,
}

/// What the stats line shows besides the deltas.
pub struct Gauges {
    pub cpus: usize,
    pub frequency: u64,
    pub processes: usize,
    /// Processes gone before the agent could read them (short-lived).
    pub vanished: u64,
    pub binaries: usize,
    /// Mapped files not read, by `files::Skip::index`.
    pub files_skipped: [u64; Skip::ALL.len()],
    /// Content hashes computed (once per file).
    pub hashes: crate::files::hash::HashStats,
    /// Ring-buffer records of an unknown kind or size (a layout mismatch).
    pub malformed: u64,
    pub unwind: UnwindStats,
    pub cfi: CacheStats,
    /// The BPF walk's unwind tables.
    pub tables: crate::cfi::tables::TableStats,
    pub delivery: Delivery,
    /// Off-CPU waits open (recorded switch-out, no switch-in yet), dropped
    /// unfinished, and ends without their start.
    pub waiting: usize,
    pub waits_dropped: u64,
    pub waits_unmatched: u64,
    /// The kernel's BPF run-time statistics are on (`--stats`).
    pub bpf_measured: bool,
    /// Memory profiling: live sampled allocations held, frees of ones not
    /// held, and the probes attached.
    pub live_allocs: usize,
    pub unknown_frees: u64,
    pub probes: crate::usdt::ProbeStats,
    pub jit: crate::jit::JitStats,
    /// Publishing the binaries no CI uploaded (`None`: turned off).
    pub uploads: Option<crate::upload::Snapshot>,
    /// What budgets and bounds refused, by cause.
    pub contained: Contained,
    /// [`crate::process::Processes::ctx_after_load`].
    pub ctx_after_load: (u64, u64),
    /// What the jobs did (panics and hangs contained in them).
    pub jobs: JobStats,
    /// Waits of the sampler thread for jobs cut short by its budget.
    pub waits_cut: u64,
    /// How long batches went out after their interval, in all.
    pub late: Duration,
}

/// One line: rates and shares over `[before, now]`, totals since start.
pub fn line(before: &Reading, now: &Reading, g: &Gauges) -> String {
    let wall = now.at.duration_since(before.at).as_secs_f64().max(1e-9);
    let machine = wall * g.cpus.max(1) as f64;
    let share = |d: Duration| 100.0 * d.as_secs_f64() / machine;
    let agent = now.agent_cpu.saturating_sub(before.agent_cpu);
    let bpf = now.bpf_time.saturating_sub(before.bpf_time);
    let d = &g.delivery;
    format!(
        "stats: {cpus} CPUs at {hz} Hz | samples {rate:.1}/s, lost {lost} (total {lost_total}), \
         kernel-thread samples skipped {kt}, exec/exit events lost {ev}, malformed records {malformed}, trace contexts read {ctx}, unreadable {bad}, \
         publishers found after their library's load {ctx_loads} (slowest {ctx_late_ms:.1} ms) | \
         off-CPU waits {off_total} ({off:.1}/s), lost {off_lost}, no storage for the start {off_full}, open {waiting}, given up {waits_dropped}, unmatched {unmatched}, preempted switches {preempted} | processes {procs} ({vanished} gone before read), binaries {bins}, files skipped {skipped} ({skips}), \
         content hashes {hashed} ({hashed_mib:.1} MiB, {hashed_ms:.1} ms CPU), not needed {vouched} ({vouched_mib:.1} MiB: CI's) | \
         unwinding: leaf callers recovered {recovered}, frameless callers stepped through {frameless}, leaves without CFI {no_cfi}, beyond the stack window {beyond}, \
         stacks cut {cut} ({cuts}), CFI cache {cfi_files} files {cfi_kb} KiB ({cfi_resets} resets) | \
         unwind tables: frames stepped by frame pointer {steps_fp}, by CFI {steps_cfi}, rule lookups answered by the memo {memo_hits}, leaves stepped in BPF {leaf_bpf}, stacks walked before their process's ranges {walks_early} ({snapshots} with their stack copied: {snap_whole} walked whole from it, {snap_cut} not; {snap_skipped} not copied, the ring buffer behind), files {t_files}, rows {t_rows}, rules {t_rules}, \
         {t_kib} of {t_cap_kib} KiB, processes {t_procs} ({t_early} read at their first sample's wakeup), builds {t_builds} (failed {t_failed}: no CFI {t_no_cfi}, too large {t_too_large}, unreadable {t_unreadable}, jobs refused or hung {t_jobs}), evictions {t_evicted} ({t_framed} of mapped files keeping frame pointers), refused for room {t_full}, mappings left out {t_dropped} | \
         memory: sampled allocations {allocs}, allocations lost {allocs_lost}, throttled {throttled}, untracked (live map full) {live_full}, \
         frees {frees}, frees lost {frees_lost}, unreadable probe arguments {usdt_bad}, live {live}, frees unknown {unknown_frees}, \
         probe files {probe_files} ({probe_idle} mapped by none), probe sites {probe_sites}, detaching {detaching}, sites refused {refused} | \
         jit: symbols {jit_symbols} ({jit_kb} KiB), evicted {jit_dropped}, rescued {jit_rescued}, bad lines {jit_bad}, files {jit_files} | \
         {uploads} | \
         contained: {contained}, jobs {jobs_run} (panicked {jobs_panicked}, hung {jobs_hung}, refused {jobs_refused}, workers abandoned {abandoned}), waits cut {waits_cut}, \
         live allocations over their process's share {live_process_full}, off-CPU records over their process's rate {off_cpu_throttled} | \
         delivered {delivered} samples in {batches} batches ({late_ms} ms late in all), buffered {queued} batches \
         ({queued_bytes} B), dropped {dropped} samples, rejected {rejected}, failed exports {failed} | \
         agent CPU {agent_ms:.1} ms = {agent_pct:.3}% of machine, {bpf_text}",
        cpus = g.cpus,
        hz = g.frequency,
        rate = (now.counters.samples - before.counters.samples) as f64 / wall,
        lost = now.counters.lost - before.counters.lost,
        lost_total = now.counters.lost,
        kt = now.counters.kernel_thread,
        ev = now.counters.events_lost,
        ctx = now.counters.ctx_read,
        bad = now.counters.ctx_unreadable,
        ctx_loads = g.ctx_after_load.0,
        ctx_late_ms = g.ctx_after_load.1 as f64 / 1e6,
        off = (now.counters.off_cpu - before.counters.off_cpu) as f64 / wall,
        off_total = now.counters.off_cpu,
        off_lost = now.counters.off_cpu_lost,
        off_full = now.counters.off_cpu_full,
        waiting = g.waiting,
        waits_dropped = g.waits_dropped,
        unmatched = g.waits_unmatched,
        preempted = now.counters.preempted,
        procs = g.processes,
        vanished = g.vanished,
        bins = g.binaries,
        malformed = g.malformed,
        skipped = g.files_skipped.iter().sum::<u64>(),
        skips = Skip::ALL
            .iter()
            .map(|s| format!("{s:?} {}", g.files_skipped[s.index()]))
            .collect::<Vec<_>>()
            .join(", "),
        hashed = g.hashes.files,
        hashed_mib = g.hashes.bytes as f64 / (1 << 20) as f64,
        hashed_ms = g.hashes.cpu.as_secs_f64() * 1e3,
        vouched = g.hashes.vouched,
        vouched_mib = g.hashes.vouched_bytes as f64 / (1 << 20) as f64,
        recovered = g.unwind.callers_recovered,
        frameless = g.unwind.frameless_callers,
        no_cfi = g.unwind.leaf_without_cfi,
        beyond = g.unwind.out_of_window,
        cut = g.unwind.cut_total(),
        cuts = Cut::ALL
            .iter()
            .map(|c| format!("{c:?} {}", g.unwind.cut[c.index()]))
            .collect::<Vec<_>>()
            .join(", "),
        cfi_files = g.cfi.files,
        cfi_kb = g.cfi.bytes / 1024,
        cfi_resets = g.cfi.resets,
        steps_fp = now.counters.steps_fp,
        steps_cfi = now.counters.steps_cfi,
        memo_hits = now.counters.rule_memo_hits,
        walks_early = now.counters.walks_early,
        snapshots = now.counters.snapshots,
        snap_whole = g.unwind.snapshots_whole,
        snap_cut = g.unwind.snapshots_cut,
        snap_skipped = now.counters.snapshots_skipped,
        leaf_bpf = g.unwind.leaf_in_bpf,
        t_files = g.tables.files,
        t_rows = g.tables.rows,
        t_rules = g.tables.rules,
        t_kib = g.tables.bytes / 1024,
        t_cap_kib = g.tables.capacity_bytes / 1024,
        t_procs = g.tables.processes,
        t_early = g.unwind.read_early,
        t_builds = g.tables.builds,
        t_failed = g.tables.build_failures,
        t_no_cfi = g.tables.no_cfi,
        t_too_large = g.tables.too_large,
        t_unreadable = g.tables.unreadable,
        t_jobs = g.tables.jobs_failed,
        t_evicted = g.tables.evictions,
        t_framed = g.tables.framed_given_up,
        t_full = g.tables.refused_full,
        t_dropped = g.tables.ranges_dropped,
        allocs = now.counters.allocs,
        allocs_lost = now.counters.allocs_lost,
        throttled = now.counters.allocs_throttled,
        live_full = now.counters.live_full,
        frees = now.counters.frees,
        frees_lost = now.counters.frees_lost,
        usdt_bad = now.counters.usdt_unreadable,
        live = g.live_allocs,
        unknown_frees = g.unknown_frees,
        probe_files = g.probes.files,
        probe_sites = g.probes.sites,
        probe_idle = g.probes.idle,
        detaching = g.probes.detaching,
        refused = g.probes.refused,
        jit_symbols = g.jit.symbols,
        jit_kb = g.jit.bytes / 1024,
        jit_dropped = g.jit.dropped,
        jit_bad = g.jit.bad,
        jit_files = g.jit.files,
        jit_rescued = g.jit.rescued,
        contained = g
            .contained
            .pairs()
            .iter()
            .map(|(k, v)| format!("{} {v}", k.replace('_', " ")))
            .collect::<Vec<_>>()
            .join(", "),
        jobs_run = g.jobs.run,
        jobs_panicked = g.jobs.panicked,
        jobs_hung = g.jobs.hung,
        jobs_refused = g.jobs.refused,
        abandoned = g.jobs.abandoned,
        waits_cut = g.waits_cut,
        live_process_full = now.counters.live_process_full,
        off_cpu_throttled = now.counters.off_cpu_throttled,
        uploads = match &g.uploads {
            Some(u) => format!(
                "binaries published {} ({} KiB), offered {}, unpublishable {}, upload errors {}",
                u.uploaded,
                u.uploaded_bytes / 1024,
                u.offered,
                u.skipped,
                u.failed
            ),
            None => "binaries published: off".to_owned(),
        },
        delivered = d.delivered_samples,
        batches = d.delivered_batches,
        late_ms = g.late.as_millis(),
        queued = d.queued_batches,
        queued_bytes = d.queued_bytes,
        dropped = d.dropped_samples,
        rejected = d.rejected_samples,
        failed = d.failed_attempts,
        agent_ms = agent.as_secs_f64() * 1e3,
        agent_pct = share(agent),
        bpf_text = if g.bpf_measured {
            format!(
                "BPF {:.1} ms over {} runs = {:.3}%",
                bpf.as_secs_f64() * 1e3,
                now.bpf_runs - before.bpf_runs,
                share(bpf)
            )
        } else {
            "BPF run time not measured (--stats)".to_string()
        },
    )
}

/// Every counter and gauge of `now` and `g` in Prometheus' text format
/// (the agent's `/metrics`); drops are labelled by cause.
pub fn metrics(now: &Reading, g: &Gauges) -> String {
    use std::fmt::Write;
    let mut out = String::new();
    let mut metric = |name: &str, kind: &str, help: &str, values: &[(&str, u64)]| {
        let _ = writeln!(out, "# HELP symtrace_agent_{name} {help}");
        let _ = writeln!(out, "# TYPE symtrace_agent_{name} {kind}");
        for (labels, v) in values {
            if labels.is_empty() {
                let _ = writeln!(out, "symtrace_agent_{name} {v}");
            } else {
                let _ = writeln!(out, "symtrace_agent_{name}{{{labels}}} {v}");
            }
        }
    };
    let c = &now.counters;
    metric(
        "samples_total",
        "counter",
        "CPU samples recorded by the BPF program",
        &[("", c.samples)],
    );
    metric(
        "samples_lost_total",
        "counter",
        "records the BPF program could not write, by what",
        &[
            ("kind=\"cpu\"", c.lost),
            ("kind=\"off_cpu\"", c.off_cpu_lost),
            ("kind=\"alloc\"", c.allocs_lost),
            ("kind=\"free\"", c.frees_lost),
            ("kind=\"process_event\"", c.events_lost),
        ],
    );
    let contained: Vec<(String, u64)> = g
        .contained
        .pairs()
        .iter()
        .map(|(k, v)| (format!("cause=\"{k}\""), *v))
        .chain(Skip::ALL.iter().map(|s| {
            (
                format!("cause=\"file_{}\"", format!("{s:?}").to_lowercase()),
                g.files_skipped[s.index()],
            )
        }))
        .chain([
            ("cause=\"job_panicked\"".to_owned(), g.jobs.panicked),
            ("cause=\"job_hung\"".to_owned(), g.jobs.hung),
            ("cause=\"job_refused\"".to_owned(), g.jobs.refused),
            ("cause=\"waits_cut\"".to_owned(), g.waits_cut),
            (
                "cause=\"live_allocations_over_process_share\"".to_owned(),
                c.live_process_full,
            ),
            (
                "cause=\"live_allocations_map_full\"".to_owned(),
                c.live_full,
            ),
            (
                "cause=\"off_cpu_over_process_rate\"".to_owned(),
                c.off_cpu_throttled,
            ),
            (
                "cause=\"allocations_thinned\"".to_owned(),
                c.allocs_throttled,
            ),
            ("cause=\"jit_evicted\"".to_owned(), g.jit.dropped),
            ("cause=\"jit_bad\"".to_owned(), g.jit.bad),
            ("cause=\"usdt_sites_refused\"".to_owned(), g.probes.refused),
        ])
        .chain(g.uploads.iter().flat_map(|u| {
            [
                ("cause=\"upload_unpublishable\"".to_owned(), u.skipped),
                ("cause=\"upload_over_budget\"".to_owned(), u.over_budget),
                ("cause=\"upload_failed\"".to_owned(), u.failed),
            ]
        }))
        .collect();
    let contained: Vec<(&str, u64)> = contained.iter().map(|(k, v)| (k.as_str(), *v)).collect();
    metric(
        "contained_total",
        "counter",
        "work refused or given up to contain what one process or file costs, by cause",
        &contained,
    );
    metric(
        "processes",
        "gauge",
        "processes tracked",
        &[("", g.processes as u64)],
    );
    metric(
        "binaries",
        "gauge",
        "mapped files known",
        &[("", g.binaries as u64)],
    );
    metric(
        "content_hashes_total",
        "counter",
        "files whose content was hashed (once per file), their bytes, and the CPU time taken",
        &[
            ("unit=\"files\"", g.hashes.files),
            ("unit=\"bytes\"", g.hashes.bytes),
            (
                "unit=\"cpu_microseconds\"",
                u64::try_from(g.hashes.cpu.as_micros()).unwrap_or(u64::MAX),
            ),
        ],
    );
    metric(
        "content_hashes_not_needed_total",
        "counter",
        "files not hashed because the server holds a CI or upstream file of their ID, and their bytes",
        &[
            ("unit=\"files\"", g.hashes.vouched),
            ("unit=\"bytes\"", g.hashes.vouched_bytes),
        ],
    );
    metric(
        "jit_bytes",
        "gauge",
        "bytes of JIT symbols held",
        &[("", g.jit.bytes as u64)],
    );
    metric(
        "cfi_bytes",
        "gauge",
        "bytes of call-frame information held",
        &[("", g.cfi.bytes as u64)],
    );
    let t = &g.tables;
    metric(
        "unwind_tables",
        "gauge",
        "the BPF walk's unwind tables: files, rows, bytes (of the capacity), processes with ranges",
        &[
            ("unit=\"files\"", t.files),
            ("unit=\"rows\"", t.rows),
            ("unit=\"rules\"", t.rules),
            ("unit=\"bytes\"", t.bytes),
            ("unit=\"capacity_bytes\"", t.capacity_bytes),
            ("unit=\"processes\"", t.processes),
        ],
    );
    metric(
        "unwind_table_events_total",
        "counter",
        "unwind tables built, failed to build, evicted (of which mapped files keeping frame pointers), refused for room; mappings left out",
        &[
            ("event=\"built\"", t.builds),
            ("event=\"failed\"", t.build_failures),
            ("event=\"evicted\"", t.evictions),
            ("event=\"framed_given_up\"", t.framed_given_up),
            ("event=\"refused\"", t.refused_full),
            ("event=\"mapping_left_out\"", t.ranges_dropped),
        ],
    );
    let d = &g.delivery;
    metric(
        "delivered_samples_total",
        "counter",
        "samples delivered to the server",
        &[("", d.delivered_samples)],
    );
    metric(
        "dropped_samples_total",
        "counter",
        "samples dropped undelivered",
        &[("", d.dropped_samples)],
    );
    metric(
        "queued_batches",
        "gauge",
        "batches waiting for the server",
        &[("", d.queued_batches as u64)],
    );
    metric(
        "cpu_milliseconds_total",
        "counter",
        "the agent's own CPU time",
        &[("", now.agent_cpu.as_millis() as u64)],
    );
    if let Some(u) = &g.uploads {
        metric(
            "binaries_published_total",
            "counter",
            "binaries published",
            &[("", u.uploaded)],
        );
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shares_are_of_the_whole_machine() {
        let t0 = Instant::now();
        let before = Reading {
            at: t0,
            counters: Counters::default(),
            agent_cpu: Duration::from_millis(100),
            bpf_time: Duration::ZERO,
            bpf_runs: 0,
        };
        let now = Reading {
            at: t0 + Duration::from_secs(10),
            counters: Counters {
                samples: 1940,
                lost: 2,
                ..Default::default()
            },
            agent_cpu: Duration::from_millis(140),
            bpf_time: Duration::from_millis(20),
            bpf_runs: 1940,
        };
        let g = Gauges {
            cpus: 2,
            frequency: 97,
            processes: 3,
            vanished: 0,
            binaries: 5,
            malformed: 0,
            files_skipped: [0, 1, 0, 0, 0, 0, 0, 0, 0],
            hashes: crate::files::hash::HashStats {
                files: 2,
                bytes: 3 << 20,
                cpu: Duration::from_millis(2),
                vouched: 1,
                vouched_bytes: 1 << 20,
            },
            unwind: UnwindStats {
                callers_recovered: 7,
                cut: [1, 0, 2, 0, 0],
                ..Default::default()
            },
            cfi: CacheStats {
                files: 2,
                bytes: 4096,
                resets: 0,
            },
            tables: crate::cfi::tables::TableStats {
                files: 3,
                rows: 1000,
                ..Default::default()
            },
            delivery: Delivery::default(),
            waiting: 4,
            waits_dropped: 0,
            waits_unmatched: 1,
            bpf_measured: true,
            live_allocs: 12,
            unknown_frees: 0,
            probes: crate::usdt::ProbeStats {
                files: 1,
                sites: 2,
                detaching: 0,
                refused: 0,
                idle: 0,
            },
            jit: crate::jit::JitStats {
                symbols: 3000,
                bytes: 3 << 20,
                dropped: 5,
                bad: 2,
                files: 1,
                rescued: 4,
            },
            uploads: Some(crate::upload::Snapshot {
                offered: 6,
                uploaded: 2,
                uploaded_bytes: 3 << 20,
                skipped: 1,
                failed: 0,
                over_budget: 0,
            }),
            contained: Contained {
                over_budget: 3,
                ..Default::default()
            },
            ctx_after_load: (2, 12_500_000),
            jobs: JobStats::default(),
            waits_cut: 0,
            late: Duration::from_millis(1500),
        };
        let text = line(&before, &now, &g);
        assert!(
            text.contains(
                "binaries published 2 (3072 KiB), offered 6, unpublishable 1, upload errors 0"
            ),
            "{text}"
        );
        assert!(text.contains("off-CPU waits 0 (0.0/s), lost 0"), "{text}");
        assert!(text.contains("open 4, given up 0, unmatched 1"), "{text}");
        // 40 ms of 20 CPU-seconds = 0.2%; 20 ms = 0.1%.
        assert!(text.contains("samples 194.0/s"), "{text}");
        assert!(
            text.contains("agent CPU 40.0 ms = 0.200% of machine"),
            "{text}"
        );
        assert!(
            text.contains("BPF 20.0 ms over 1940 runs = 0.100%"),
            "{text}"
        );
        assert!(text.contains("lost 2 (total 2)"), "{text}");
        assert!(
            text.contains("unwind tables: frames stepped by frame pointer 0, by CFI 0, rule lookups answered by the memo 0, leaves stepped in BPF 0, stacks walked before their process's ranges 0 (0 with their stack copied: 0 walked whole from it, 0 not; 0 not copied, the ring buffer behind), files 3, rows 1000,"),
            "{text}"
        );
        assert!(
            text.contains(
                "jit: symbols 3000 (3072 KiB), evicted 5, rescued 4, bad lines 2, files 1 |"
            ),
            "{text}"
        );
        assert!(
            text.contains(
                "live 12, frees unknown 0, probe files 1 (0 mapped by none), probe sites 2"
            ),
            "{text}"
        );
        // Without --stats the kernel's statistics are off: no made-up zero.
        let unmeasured = line(
            &before,
            &now,
            &Gauges {
                bpf_measured: false,
                ..g
            },
        );
        assert!(
            unmeasured.ends_with("BPF run time not measured (--stats)"),
            "{unmeasured}"
        );
        assert!(text.contains("leaf callers recovered 7"), "{text}");
        assert!(
            text.contains("files skipped 1 (Unreachable 0, NotRegular 1"),
            "{text}"
        );
        assert!(
            text.contains("stacks cut 3 (OutsideCode 1, NotAfterCall 0, NotIncreasing 2"),
            "{text}"
        );
        assert!(text.contains("CFI cache 2 files 4 KiB"), "{text}");
        assert!(
            text.contains("content hashes 2 (3.0 MiB, 2.0 ms CPU)"),
            "{text}"
        );
        assert!(
            text.contains("publishers found after their library's load 2 (slowest 12.5 ms)"),
            "{text}"
        );
        assert!(
            text.contains("contained: over budget 3, maps truncated 0"),
            "{text}"
        );
        let m = metrics(&now, &g);
        assert!(
            m.contains("symtrace_agent_contained_total{cause=\"over_budget\"} 3"),
            "{m}"
        );
        assert!(
            m.contains("symtrace_agent_contained_total{cause=\"file_notregular\"} 1"),
            "{m}"
        );
        assert!(m.contains("symtrace_agent_samples_total 1940"), "{m}");
        assert!(
            m.contains("symtrace_agent_content_hashes_total{unit=\"bytes\"} 3145728"),
            "{m}"
        );
    }
}
