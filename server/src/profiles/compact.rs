//! Compaction and retention.
//!
//! Ingest writes one small segment per export. Once a time window (an hour
//! by default) has ended, the compactor merges a tenant's segments of that
//! window into one (tables deduplicated across exports, samples of the same
//! identity merged, zstd at a higher level), swaps the index rows in one
//! transaction and leaves the inputs' objects to the orphan collector.
//!
//! Replicas coordinate through a database lease: one compacts at a time,
//! and the swap itself re-checks that every input is still there, so even a
//! holder whose lease ran out cannot double-count data.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use super::model::SegmentBuilder;
use super::store::{ProfileStore, ProfileStoreError};
use crate::config::Config;
use crate::store::model::{now_ms, SegmentRef};

const LEASE: &str = "profile-compactor";
/// Longest a pass may take before another replica may take over.
const LEASE_TTL_MS: i64 = 10 * 60 * 1000;
/// Compressed input bytes merged into one output at most.
const MAX_JOB_BYTES: i64 = 64 << 20;
/// Segments considered per pass.
const MAX_SEGMENTS_PER_PASS: i64 = 10_000;

#[derive(Debug, Clone)]
pub struct Settings {
    pub window_ns: i64,
    pub delay_ns: i64,
    /// `None` keeps profiles forever.
    pub retention_ns: Option<i64>,
}

impl Settings {
    pub fn from_config(config: &Config) -> Self {
        Self {
            window_ns: (config.compaction_window_secs.max(1) as i64).saturating_mul(1_000_000_000),
            delay_ns: (config.compaction_delay_secs as i64).saturating_mul(1_000_000_000),
            retention_ns: (config.profile_retention_hours > 0)
                .then(|| (config.profile_retention_hours as i64).saturating_mul(3_600_000_000_000)),
        }
    }
}

/// What one pass did.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Report {
    /// Another replica holds the lease.
    pub skipped: bool,
    pub expired: u64,
    pub inputs: usize,
    pub outputs: usize,
    /// Jobs whose inputs were already gone (someone else compacted them).
    pub lost_races: usize,
}

/// One compaction and retention pass, under the lease (given up at the
/// end, so any replica may run the next pass).
pub async fn run_once(
    profiles: &ProfileStore,
    holder: &str,
    settings: &Settings,
) -> Result<Report, ProfileStoreError> {
    let meta = &profiles.store.meta;
    if !meta
        .acquire_lease(LEASE, holder, now_ms(), LEASE_TTL_MS)
        .await?
    {
        return Ok(Report {
            skipped: true,
            ..Report::default()
        });
    }
    let result = pass(profiles, holder, settings).await;
    meta.release_lease(LEASE, holder).await?;
    result
}

async fn pass(
    profiles: &ProfileStore,
    holder: &str,
    settings: &Settings,
) -> Result<Report, ProfileStoreError> {
    let meta = &profiles.store.meta;
    let mut report = Report::default();
    let now_ns = now_ms().saturating_mul(1_000_000);
    if let Some(retention) = settings.retention_ns {
        report.expired = meta.expire_segments(now_ns - retention).await?;
    }
    // Windows that ended at least `delay` ago.
    let closed = now_ns - settings.delay_ns;
    let before = closed - closed.rem_euclid(settings.window_ns);
    let segments = meta.uncompacted(before, MAX_SEGMENTS_PER_PASS).await?;
    let mut groups: BTreeMap<(String, i64), Vec<SegmentRef>> = BTreeMap::new();
    for s in segments {
        let window = s.start_ns.div_euclid(settings.window_ns);
        groups
            .entry((s.tenant.clone(), window))
            .or_default()
            .push(s);
    }
    for ((tenant, _), group) in groups {
        for job in split_by_size(group) {
            if !meta
                .acquire_lease(LEASE, holder, now_ms(), LEASE_TTL_MS)
                .await?
            {
                report.skipped = true;
                return Ok(report);
            }
            let mut builder = SegmentBuilder::default();
            for input in &job {
                let data = profiles.read(&input.sha256).await?;
                builder.merge(&data);
            }
            let merged = tokio::task::spawn_blocking(move || builder.finish())
                .await
                .expect("finishing a merge does not panic");
            let row = profiles.put(&tenant, merged, 1).await?;
            let inputs: Vec<String> = job.iter().map(|s| s.sha256.clone()).collect();
            crate::store::crash_point("compaction-before-swap");
            if meta.swap_segments(&tenant, &inputs, &[row]).await? {
                report.inputs += inputs.len();
                report.outputs += 1;
            } else {
                report.lost_races += 1;
            }
        }
    }
    Ok(report)
}

/// Consecutive runs of segments of at most [`MAX_JOB_BYTES`] together.
fn split_by_size(group: Vec<SegmentRef>) -> Vec<Vec<SegmentRef>> {
    let mut jobs: Vec<Vec<SegmentRef>> = Vec::new();
    let mut bytes = 0;
    for s in group {
        if jobs.is_empty() || bytes + s.size > MAX_JOB_BYTES {
            jobs.push(Vec::new());
            bytes = 0;
        }
        bytes += s.size;
        jobs.last_mut().expect("a job").push(s);
    }
    jobs
}

/// Runs [`run_once`] every `SYMTRACE_COMPACTION_INTERVAL` seconds.
pub fn spawn(profiles: Arc<ProfileStore>, config: &Config) {
    if config.compaction_interval_secs == 0 {
        return;
    }
    let interval = Duration::from_secs(config.compaction_interval_secs);
    let settings = Settings::from_config(config);
    let holder = format!(
        "{}:{}:{:x}",
        std::fs::read_to_string("/proc/sys/kernel/hostname")
            .unwrap_or_default()
            .trim(),
        std::process::id(),
        now_ms()
    );
    tokio::spawn(async move {
        let mut ticker = tokio::time::interval(interval);
        ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            ticker.tick().await;
            match run_once(&profiles, &holder, &settings).await {
                Ok(r) if r.skipped || r == Report::default() => {
                    tracing::debug!(?r, "compaction: nothing to do")
                }
                Ok(r) => tracing::info!(?r, "compaction"),
                Err(e) => tracing::warn!(error = %e, "compaction failed"),
            }
        }
    });
}
