//! The orphan collector.
//!
//! A blob becomes an orphan when no artifact or source row references it
//! (after a delete, or after a crash between the object put and the database
//! commit). Collection is two-phase so that it can never race an upload that
//! is about to reuse a blob:
//!
//! 1. unreferenced blob rows are *marked* (`orphaned_at = now`); an upload
//!    that references the blob again clears the mark in its transaction;
//! 2. each row still marked and unreferenced after the grace period is
//!    deleted together with its object, in one transaction that re-checks
//!    it (an upload claims a blob's row *before* writing its object, and that
//!    claim waits for, or wins over, this transaction);
//! 3. objects with no row at all (a crash before the commit) are deleted once
//!    older than the grace period, which is far longer than any upload takes.
//!
//! Every replica may run it; all its steps are idempotent.

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use futures::TryStreamExt;

use super::model::now_ms;
use super::SymbolStore;

/// What one pass did.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct GcReport {
    pub marked: u64,
    pub deleted_rows: usize,
    pub deleted_unreferenced_objects: usize,
    /// Agents' claims that ran out, deleted.
    pub expired_claims: u64,
}

/// One collection pass.
pub async fn collect(store: &SymbolStore, grace: Duration) -> super::Result<GcReport> {
    let mut report = GcReport::default();
    let now = now_ms();
    let cutoff = now - grace.as_millis() as i64;
    report.marked = store.meta.mark_orphans(now).await?;
    report.expired_claims = store.meta.delete_expired_claims(now).await?;
    for sha in store.meta.expired_orphans(cutoff).await? {
        let blobs = store.blobs.clone();
        let object = sha.clone();
        let delete = Box::pin(async move { blobs.delete(&object).await });
        if store.meta.delete_orphan(&sha, cutoff, delete).await? {
            report.deleted_rows += 1;
        }
    }

    let old_before = SystemTime::now() - grace;
    let candidates: Vec<String> = store
        .blobs
        .list()
        .try_filter_map(|(sha, modified)| async move { Ok((modified < old_before).then_some(sha)) })
        .try_collect()
        .await?;
    for chunk in candidates.chunks(1000) {
        let known = store.meta.known_blobs(chunk).await?;
        for (sha, known) in chunk.iter().zip(known) {
            if !known {
                store.blobs.delete(sha).await?;
                report.deleted_unreferenced_objects += 1;
            }
        }
    }
    Ok(report)
}

/// Runs [`collect`] every `interval` until the process ends.
pub fn spawn(store: Arc<SymbolStore>, interval: Duration, grace: Duration) {
    tokio::spawn(async move {
        let mut ticker = tokio::time::interval(interval);
        ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            ticker.tick().await;
            match collect(&store, grace).await {
                Ok(r) if r == GcReport::default() => {
                    tracing::debug!("orphan collection: nothing to do")
                }
                Ok(r) => tracing::info!(?r, "orphan collection"),
                Err(e) => tracing::warn!(error = %e, "orphan collection failed"),
            }
        }
    });
}
