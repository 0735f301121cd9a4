//! Compaction and retention.
//!
//! Ingest writes one small segment per export. Once a time window (an hour
//! by default) has ended, the compactor merges a tenant's segments of that
//! window into one (tables deduplicated across exports, samples of the same
//! identity merged, zstd at a higher level), swaps the index rows in one
//! transaction and leaves the inputs' objects to the orphan collector.
//!
//! Replicas coordinate through a database lease per (tenant, window): N
//! replicas compact N windows at once, a window is merged by one of them,
//! and the swap itself re-checks that every input is still there, so even a
//! holder whose lease ran out cannot double-count data. A window is merged
//! in jobs of at most `SYMTRACE_COMPACTION_JOB_BYTES` of input (a large
//! window becomes several segments): memory is bounded by that setting,
//! not by a window's data.
//!
//! Compaction is invisible to queries: samples with timestamps are filtered
//! one by one, and samples without keep the exact time range ingest gave
//! them (`SegmentBuilder::series_exact`), so every query answers the same
//! before and after. A sender's retry of an export that was compacted away
//! is still recognised through the export's idempotency key.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use super::model::SegmentBuilder;
use super::reader::SegmentReader;
use super::store::{Content, ProfileStore, ProfileStoreError};
use crate::cpu::CpuPool;
use crate::store::model::{now_ms, SegmentRef};

/// Longest one window's compaction may take before another replica may
/// take it over (renewed before each job).
const LEASE_TTL_MS: i64 = 10 * 60 * 1000;
/// Compressed input bytes merged into one output at most, by default.
pub const DEFAULT_JOB_BYTES: i64 = 64 << 20;
/// Segments considered per pass, shared among the tenants that have any.
const MAX_SEGMENTS_PER_PASS: i64 = 10_000;
/// A tenant's share of a pass is never below this.
const MIN_SEGMENTS_PER_TENANT: i64 = 100;
/// How long an export's idempotency key is kept: a sender retrying an
/// acknowledged export later than this stores it again.
pub const EXPORT_KEY_TTL_MS: i64 = 24 * 3600 * 1000;

#[derive(Debug, Clone)]
pub struct Settings {
    pub window_ns: i64,
    pub delay_ns: i64,
    /// `None` keeps profiles forever.
    pub retention_ns: Option<i64>,
    /// Idempotency keys older than this are forgotten.
    pub export_key_ttl_ms: i64,
    /// Compressed input bytes one job merges at most.
    pub job_bytes: i64,
}

/// The lease of one tenant's window.
fn lease_name(tenant: &str, window: i64) -> String {
    format!("compact/{window}/{tenant}")
}

/// What one pass did.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Report {
    /// Windows left to the replica that holds their lease.
    pub skipped: usize,
    pub inputs: usize,
    pub outputs: usize,
    /// Jobs whose inputs were already gone (someone else compacted them).
    pub lost_races: usize,
    /// Inputs that could not be read, left out from now on.
    pub quarantined: usize,
}

/// One compaction pass: every closed window of every tenant whose lease
/// this replica gets (tenants take turns window by window).
pub async fn run_once(
    profiles: &ProfileStore,
    holder: &str,
    settings: &Settings,
) -> Result<Report, ProfileStoreError> {
    pass(profiles, holder, settings).await
}

/// One retention pass: segments past the retention, and idempotency keys
/// past [`EXPORT_KEY_TTL_MS`] (any replica may run it; deletes are
/// idempotent). Returns the number of segments expired.
pub async fn expire_once(
    profiles: &ProfileStore,
    settings: &Settings,
) -> Result<u64, ProfileStoreError> {
    let meta = &profiles.store.meta;
    let now = now_ms();
    meta.expire_export_keys(now - settings.export_key_ttl_ms)
        .await?;
    let Some(retention) = settings.retention_ns else {
        return Ok(0);
    };
    Ok(meta
        .expire_segments(now.saturating_mul(1_000_000) - retention)
        .await?)
}

async fn pass(
    profiles: &ProfileStore,
    holder: &str,
    settings: &Settings,
) -> Result<Report, ProfileStoreError> {
    let meta = &profiles.store.meta;
    let mut report = Report::default();
    let now_ns = now_ms().saturating_mul(1_000_000);
    // Windows that ended at least `delay` ago.
    let closed = now_ns - settings.delay_ns;
    let before = closed - closed.rem_euclid(settings.window_ns);
    // Every tenant gets its share of the pass, so one tenant's backlog
    // cannot starve the others; tenants take turns job by job.
    let tenants = meta.uncompacted_tenants(before).await?;
    let share = (MAX_SEGMENTS_PER_PASS / tenants.len().max(1) as i64).max(MIN_SEGMENTS_PER_TENANT);
    let mut queues = Vec::with_capacity(tenants.len());
    for tenant in tenants {
        let segments = meta.uncompacted(&tenant, before, share).await?;
        let mut windows: BTreeMap<i64, Vec<SegmentRef>> = BTreeMap::new();
        for s in segments {
            windows
                .entry(s.start_ns.div_euclid(settings.window_ns))
                .or_default()
                .push(s);
        }
        let windows: std::collections::VecDeque<(i64, Vec<SegmentRef>)> =
            windows.into_iter().collect();
        queues.push((tenant, windows));
    }
    if queues.is_empty() {
        return Ok(report);
    }
    // The pass's inputs are decoded and merged on a thread of its own
    // (one core at most, however many windows wait), never cached.
    let cpu = CpuPool::new("compaction", 1)
        .map_err(|e| ProfileStoreError::Internal(format!("starting a compaction thread: {e}")))?;
    let inputs = Inputs {
        profiles,
        reader: SegmentReader::new(profiles.store.clone(), cpu, 0),
    };
    while !queues.is_empty() {
        for (tenant, windows) in &mut queues {
            let Some((window, segments)) = windows.pop_front() else {
                continue;
            };
            let lease = lease_name(tenant, window);
            if !meta
                .acquire_lease(&lease, holder, now_ms(), LEASE_TTL_MS)
                .await?
            {
                report.skipped += 1;
                continue;
            }
            let result = compact_window(
                &inputs,
                tenant,
                &lease,
                holder,
                segments,
                settings,
                &mut report,
            )
            .await;
            meta.release_lease(&lease, holder).await?;
            result?;
        }
        queues.retain(|(_, windows)| !windows.is_empty());
    }
    Ok(report)
}

/// Where a pass's inputs are listed and read.
struct Inputs<'a> {
    profiles: &'a ProfileStore,
    reader: SegmentReader,
}

/// Merges one window, under its lease, job by job.
async fn compact_window(
    inputs: &Inputs<'_>,
    tenant: &str,
    lease: &str,
    holder: &str,
    segments: Vec<SegmentRef>,
    settings: &Settings,
    report: &mut Report,
) -> Result<(), ProfileStoreError> {
    let meta = &inputs.profiles.store.meta;
    crate::store::pause_point("compaction-window").await;
    for job in split_by_size(segments, settings.job_bytes) {
        // Renewed before each job: a window of many jobs keeps its lease.
        if !meta
            .acquire_lease(lease, holder, now_ms(), LEASE_TTL_MS)
            .await?
        {
            report.skipped += 1;
            return Ok(());
        }
        compact_job(inputs, tenant, job, report).await?;
    }
    Ok(())
}

/// Merges one job's segments into one. An input that cannot be read or
/// decoded is quarantined (left out from now on, and reported) and the
/// rest are merged; a database or object-store outage ends the pass.
async fn compact_job(
    Inputs { profiles, reader }: &Inputs<'_>,
    tenant: &str,
    job: Vec<SegmentRef>,
    report: &mut Report,
) -> Result<(), ProfileStoreError> {
    let meta = &profiles.store.meta;
    let mut builder = SegmentBuilder::default();
    let mut inputs: Vec<String> = Vec::with_capacity(job.len());
    for input in &job {
        match reader.parts_uncached(&input.sha256).await {
            Ok(parts) => {
                // Merging is CPU work: off the async workers, part by part
                // (a merged copy of the input would be built for nothing).
                builder = reader
                    .cpu()
                    .run("merging segments", move || {
                        for part in &parts {
                            builder.merge(part);
                        }
                        builder
                    })
                    .await?;
                inputs.push(input.sha256.clone());
            }
            Err(e) if unreadable(&e) => {
                let why = e.to_string();
                tracing::error!(tenant, sha256 = %input.sha256, error = %why,
                    "compaction: quarantining an unreadable segment");
                metrics::counter!("symtrace_compaction_quarantined_total").increment(1);
                meta.quarantine_segment(tenant, &input.sha256, &why).await?;
                report.quarantined += 1;
            }
            Err(e) => return Err(e),
        }
    }
    if inputs.is_empty() {
        return Ok(());
    }
    let merged = reader
        .cpu()
        .run("merging segments", move || builder.finish())
        .await?;
    let row = profiles
        .put(reader.cpu(), tenant, Content::Whole(merged), 1)
        .await?;
    crate::store::crash_point("compaction-before-swap");
    if meta.swap_segments(tenant, &inputs, &[row]).await? {
        report.inputs += inputs.len();
        report.outputs += 1;
    } else {
        report.lost_races += 1;
    }
    Ok(())
}

/// Whether an error reading a segment is the segment's own (it will never
/// read), not an outage.
fn unreadable(e: &ProfileStoreError) -> bool {
    matches!(
        e,
        ProfileStoreError::Segment { .. }
            | ProfileStoreError::Store(crate::store::Error::NotFound(_))
    )
}

/// Consecutive runs of segments of at most `max_bytes` together (one
/// larger segment is a job of its own).
fn split_by_size(group: Vec<SegmentRef>, max_bytes: i64) -> Vec<Vec<SegmentRef>> {
    let mut jobs: Vec<Vec<SegmentRef>> = Vec::new();
    let mut bytes = 0;
    for s in group {
        if jobs.is_empty() || bytes + s.size > max_bytes {
            jobs.push(Vec::new());
            bytes = 0;
        }
        bytes += s.size;
        jobs.last_mut().expect("a job").push(s);
    }
    jobs
}

/// Runs [`run_once`] every `compaction_every` (none: never) and
/// [`expire_once`] every `retention_every`, as two
/// supervised tasks: turning compaction off leaves retention on, and a
/// pass that fails or panics is logged and the next one runs on time.
pub fn spawn(
    profiles: Arc<ProfileStore>,
    settings: Settings,
    compaction_every: Option<Duration>,
    retention_every: Duration,
) {
    if let Some(compaction_every) = compaction_every {
        let holder = format!(
            "{}:{}:{:x}",
            std::fs::read_to_string("/proc/sys/kernel/hostname")
                .unwrap_or_default()
                .trim(),
            std::process::id(),
            now_ms()
        );
        let (profiles, settings) = (profiles.clone(), settings.clone());
        supervise("compaction", compaction_every, move || {
            let (profiles, settings, holder) = (profiles.clone(), settings.clone(), holder.clone());
            async move {
                match run_once(&profiles, &holder, &settings).await {
                    Ok(r) if r.inputs == 0 && r.quarantined == 0 => {
                        tracing::debug!(?r, "compaction: nothing to do")
                    }
                    Ok(r) => tracing::info!(?r, "compaction"),
                    Err(e) => tracing::warn!(error = %e, "compaction failed"),
                }
            }
        });
    }
    supervise("retention", retention_every, move || {
        let (profiles, settings) = (profiles.clone(), settings.clone());
        async move {
            match expire_once(&profiles, &settings).await {
                Ok(0) => {}
                Ok(n) => tracing::info!(expired = n, "retention: segments expired"),
                Err(e) => tracing::warn!(error = %e, "retention failed"),
            }
        }
    });
}

/// Runs `pass` every `interval`, each in a task of its own so that a panic
/// ends that pass only.
fn supervise<F, Fut>(name: &'static str, interval: Duration, pass: F)
where
    F: Fn() -> Fut + Send + 'static,
    Fut: std::future::Future<Output = ()> + Send + 'static,
{
    tokio::spawn(async move {
        let mut ticker = tokio::time::interval(interval);
        ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            ticker.tick().await;
            if let Err(e) = tokio::spawn(pass()).await {
                tracing::error!(task = name, error = %e, "background pass panicked; the next runs on time");
            }
        }
    });
}

#[cfg(test)]
#[path = "compact_tests.rs"]
mod tests;
