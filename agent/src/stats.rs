//! Self-observation: what the agent costs and what it saw, per interval.

use std::time::{Duration, Instant};

use crate::cfi::CacheStats;
use crate::export::Delivery;
use crate::safefile::Skip;
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
    /// Mapped files not read, by `safefile::Skip::index`.
    pub files_skipped: [u64; 6],
    /// Ring-buffer records of an unknown kind or size (a layout mismatch).
    pub malformed: u64,
    pub unwind: UnwindStats,
    pub cfi: CacheStats,
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
         kernel-thread samples skipped {kt}, exec/exit events lost {ev}, malformed records {malformed}, trace contexts read {ctx}, unreadable {bad} | \
         off-CPU waits {off_total} ({off:.1}/s), lost {off_lost}, no storage for the start {off_full}, open {waiting}, given up {waits_dropped}, unmatched {unmatched}, preempted switches {preempted} | processes {procs} ({vanished} gone before read), binaries {bins}, files skipped {skipped} ({skips}) | \
         unwinding: leaf callers recovered {recovered}, frameless callers stepped through {frameless}, leaves without CFI {no_cfi}, beyond the stack window {beyond}, \
         stacks cut {cut} ({cuts}), CFI cache {cfi_files} files {cfi_kb} KiB ({cfi_resets} resets) | \
         memory: sampled allocations {allocs}, allocations lost {allocs_lost}, throttled {throttled}, untracked (live map full) {live_full}, \
         frees {frees}, frees lost {frees_lost}, unreadable probe arguments {usdt_bad}, live {live}, frees unknown {unknown_frees}, \
         probe files {probe_files}, probe sites {probe_sites}, sites refused {refused} | \
         jit: symbols {jit_symbols} ({jit_kb} KiB), evicted {jit_dropped}, rescued {jit_rescued}, bad lines {jit_bad}, files {jit_files} | \
         {uploads} | \
         delivered {delivered} samples in {batches} batches, buffered {queued} batches \
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
        refused = g.probes.refused,
        jit_symbols = g.jit.symbols,
        jit_kb = g.jit.bytes / 1024,
        jit_dropped = g.jit.dropped,
        jit_bad = g.jit.bad,
        jit_files = g.jit.files,
        jit_rescued = g.jit.rescued,
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
            files_skipped: [0, 1, 0, 0, 0, 0],
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
                refused: 0,
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
            }),
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
            text.contains(
                "jit: symbols 3000 (3072 KiB), evicted 5, rescued 4, bad lines 2, files 1 |"
            ),
            "{text}"
        );
        assert!(
            text.contains("live 12, frees unknown 0, probe files 1, probe sites 2"),
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
    }
}
