//! Compaction over a real SQLite database and a local blob directory: a
//! closed window's segments become one whose samples are theirs; one that
//! cannot be read is quarantined and the rest merged; jobs are cut by size.

use std::sync::Arc;
use std::time::Duration;

use symtrace_profiles::model::SegmentData;
use symtrace_profiles::normalize::{normalize, Limits};
use symtrace_profiles::testing;
use symtrace_proto::profiles::Sample;

use super::*;
use crate::store::blobs::ObjectBlobStore;
use crate::store::meta::SqlMetadata;
use crate::store::model::SeriesQuery;
use crate::store::SymbolStore;

const HOUR_NS: i64 = 3_600_000_000_000;

async fn profile_store(dir: &std::path::Path) -> ProfileStore {
    let meta = SqlMetadata::open_sqlite(&dir.join("db.sqlite"))
        .await
        .unwrap();
    let blobs = ObjectBlobStore::local(&dir.join("objects")).unwrap();
    let store = SymbolStore::new(
        Arc::new(meta),
        Arc::new(blobs),
        dir.join("spool"),
        Duration::ZERO,
    );
    ProfileStore::new(Arc::new(store), 100)
}

/// A stored segment of one series, decoded (through the one reader).
async fn read(p: &ProfileStore, sha256: &str) -> Result<SegmentData, ProfileStoreError> {
    let cpu = crate::cpu::CpuPool::new("compact-test", 1).unwrap();
    let mut parts = SegmentReader::new(p.store.clone(), cpu, 0)
        .parts_uncached(sha256)
        .await?;
    assert_eq!(parts.len(), 1, "one series, one part");
    Ok(parts.pop().unwrap())
}

/// One export: `n` events of frame `f0`, at `time_ns` + i µs.
fn export(time_ns: u64, n: usize) -> Content {
    let samples = vec![Sample {
        stack_index: 1,
        timestamps_unix_nano: (0..n as u64).map(|i| time_ns + i * 1_000).collect(),
        ..Default::default()
    }];
    let request = testing::request(
        Some("svc"),
        vec![testing::cpu_profile(time_ns, samples)],
        testing::named_frames(1),
    );
    let data: SegmentData = normalize(request, time_ns + 10 * HOUR_NS as u64, &Limits::default())
        .unwrap()
        .data;
    Content::Whole(data)
}

fn settings() -> Settings {
    Settings {
        window_ns: HOUR_NS,
        delay_ns: 0,
        retention_ns: None,
        export_key_ttl_ms: EXPORT_KEY_TTL_MS,
        job_bytes: DEFAULT_JOB_BYTES,
    }
}

async fn segments(p: &ProfileStore, tenant: &str) -> Vec<SegmentRef> {
    p.store
        .meta
        .segments(&SeriesQuery {
            tenant: tenant.into(),
            service: None,
            profile_type: None,
            from_ns: 0,
            to_ns: i64::MAX,
        })
        .await
        .unwrap()
}

/// The start of the hour two hours ago.
fn closed_window() -> u64 {
    let now = now_ms() * 1_000_000;
    (now - now.rem_euclid(HOUR_NS) - 2 * HOUR_NS) as u64
}

#[tokio::test]
async fn a_closed_window_becomes_one_segment_with_every_event() {
    let dir = tempfile::tempdir().unwrap();
    let p = profile_store(dir.path()).await;
    let t0 = closed_window();
    for (i, n) in [3, 5, 7].into_iter().enumerate() {
        p.write("t", export(t0 + i as u64 * 1_000_000_000, n), 0)
            .await
            .unwrap();
    }
    // Another tenant's window is its own.
    p.write("u", export(t0, 2), 0).await.unwrap();
    let report = run_once(&p, "test", &settings()).await.unwrap();
    assert_eq!((report.inputs, report.outputs), (4, 2), "{report:?}");
    let after = segments(&p, "t").await;
    assert_eq!(after.len(), 1);
    let merged = read(&p, &after[0].sha256).await.unwrap();
    assert_eq!(merged.points(), 15, "every event of the three exports");
    assert_eq!(merged.samples.len(), 1, "one identity: merged");
    assert_eq!(segments(&p, "u").await.len(), 1);
    // Nothing left to do.
    let again = run_once(&p, "test", &settings()).await.unwrap();
    assert_eq!((again.inputs, again.outputs), (0, 0), "{again:?}");
}

#[tokio::test]
async fn an_unreadable_segment_is_quarantined_and_the_rest_merged() {
    let dir = tempfile::tempdir().unwrap();
    let p = profile_store(dir.path()).await;
    let t0 = closed_window();
    let kept = p.write("t", export(t0, 4), 0).await.unwrap();
    let lost = p
        .write("t", export(t0 + 1_000_000_000, 6), 0)
        .await
        .unwrap();
    let more = p
        .write("t", export(t0 + 2_000_000_000, 1), 0)
        .await
        .unwrap();
    p.store.blobs.delete(&lost.sha256).await.unwrap();
    let report = run_once(&p, "test", &settings()).await.unwrap();
    assert_eq!(report.quarantined, 1, "{report:?}");
    let after = segments(&p, "t").await;
    let shas: Vec<&str> = after.iter().map(|s| s.sha256.as_str()).collect();
    assert!(!shas.contains(&kept.sha256.as_str()) && !shas.contains(&more.sha256.as_str()));
    let merged: u64 = futures::future::join_all(after.iter().map(|s| read(&p, &s.sha256)))
        .await
        .into_iter()
        .filter_map(Result::ok)
        .map(|d| d.points())
        .sum();
    assert_eq!(merged, 5, "the readable inputs' events, once");
}

#[tokio::test]
async fn a_window_over_the_job_budget_becomes_several_segments() {
    let dir = tempfile::tempdir().unwrap();
    let p = profile_store(dir.path()).await;
    let t0 = closed_window();
    let mut size = 0;
    for i in 0..4u64 {
        let w = p
            .write("t", export(t0 + i * 1_000_000_000, 3), 0)
            .await
            .unwrap();
        // Segments differ by a byte or two with their times: the budget
        // is two of the largest (pairs fit, three never do).
        size = size.max(w.size as i64);
    }
    let small = Settings {
        job_bytes: 2 * size,
        ..settings()
    };
    let report = run_once(&p, "test", &small).await.unwrap();
    assert_eq!((report.inputs, report.outputs), (4, 2), "{report:?}");
    let after = segments(&p, "t").await;
    assert_eq!(after.len(), 2);
    assert!(after.iter().all(|s| s.level == 1));
}

#[tokio::test]
async fn a_window_leased_by_another_replica_is_left_to_it() {
    let dir = tempfile::tempdir().unwrap();
    let p = profile_store(dir.path()).await;
    let t0 = closed_window();
    p.write("t", export(t0, 3), 0).await.unwrap();
    p.write("u", export(t0, 3), 0).await.unwrap();
    let window = t0 as i64 / HOUR_NS;
    assert!(p
        .store
        .meta
        .acquire_lease(&lease_name("t", window), "other", now_ms(), 60_000)
        .await
        .unwrap());
    let report = run_once(&p, "test", &settings()).await.unwrap();
    assert_eq!(report.skipped, 1, "{report:?}");
    assert_eq!((report.inputs, report.outputs), (1, 1), "u's window only");
    assert_eq!(segments(&p, "t").await[0].level, 0, "t's window untouched");
    assert_eq!(segments(&p, "u").await[0].level, 1);
    // Released (expired) leases are taken: t's window is merged next.
    p.store
        .meta
        .release_lease(&lease_name("t", window), "other")
        .await
        .unwrap();
    let report = run_once(&p, "test", &settings()).await.unwrap();
    assert_eq!((report.skipped, report.inputs), (0, 1), "{report:?}");
}

#[test]
fn jobs_are_cut_by_size() {
    let seg = |size: i64| SegmentRef {
        sha256: String::new(),
        size,
        start_ns: 0,
        end_ns: 0,
        points: 0,
        level: 0,
        part_offset: None,
        part_size: None,
    };
    let sizes = |jobs: Vec<Vec<SegmentRef>>| -> Vec<Vec<i64>> {
        jobs.into_iter()
            .map(|j| j.into_iter().map(|s| s.size).collect())
            .collect()
    };
    assert_eq!(
        sizes(split_by_size(
            vec![seg(5), seg(5), seg(1), seg(10), seg(30)],
            10
        )),
        vec![vec![5, 5], vec![1], vec![10], vec![30]]
    );
    assert!(split_by_size(Vec::new(), 10).is_empty());
}
