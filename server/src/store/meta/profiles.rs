//! The profile index: segments, their series, label pairs and trace IDs,
//! and the lease that lets one replica at a time compact.

use async_trait::async_trait;

use super::{MetaResult, Pool, SqlMetadata};
use crate::store::model::{NewSegment, SegmentRef, SeriesQuery};

/// Rows per multi-row INSERT (5 binds each; far below both databases'
/// parameter limits).
const ROWS_PER_INSERT: usize = 1000;

#[async_trait]
pub trait ProfileMetadata {
    /// Makes a segment visible with its series, labels and trace IDs, in one
    /// transaction. Returns false if the tenant already has this segment
    /// (a retried export).
    async fn commit_segment(&self, segment: &NewSegment) -> MetaResult<bool>;
    /// Segments with series matching the query, oldest first.
    async fn segments(&self, query: &SeriesQuery) -> MetaResult<Vec<SegmentRef>>;
    /// Segments holding samples linked to a trace.
    async fn trace_segments(&self, tenant: &str, trace_id: &str) -> MetaResult<Vec<SegmentRef>>;
    /// Takes or renews a named lease until `now + ttl_ms`; false if another
    /// holder has it.
    async fn acquire_lease(
        &self,
        name: &str,
        holder: &str,
        now: i64,
        ttl_ms: i64,
    ) -> MetaResult<bool>;
    /// Level-0 segments that started before `before_ns`, oldest first.
    async fn uncompacted(&self, before_ns: i64, limit: i64) -> MetaResult<Vec<SegmentRef>>;
    /// Replaces `inputs` by `outputs` in one transaction; false (and nothing
    /// changed) if any input is already gone.
    async fn swap_segments(
        &self,
        tenant: &str,
        inputs: &[String],
        outputs: &[NewSegment],
    ) -> MetaResult<bool>;
    /// Removes segments that ended before `cutoff_ns`; their blobs become
    /// orphans. Returns how many.
    async fn expire_segments(&self, cutoff_ns: i64) -> MetaResult<u64>;
}

const SEGMENT_COLUMNS: &str = "tenant, sha256, size, start_ns, end_ns, points, level";

macro_rules! insert_segment {
    ($tx:expr, $s:expr) => {{
        let s = $s;
        let inserted = sqlx::query(
            "INSERT INTO profile_segments \
             (tenant, sha256, size, start_ns, end_ns, points, level, created_at) \
             VALUES ($1, $2, $3, $4, $5, $6, $7, $8) ON CONFLICT DO NOTHING",
        )
        .bind(&s.tenant)
        .bind(&s.sha256)
        .bind(s.size)
        .bind(s.start_ns)
        .bind(s.end_ns)
        .bind(s.points)
        .bind(s.level)
        .bind(s.created_at)
        .execute(&mut *$tx)
        .await?
        .rows_affected()
            == 1;
        if inserted {
            for chunk in s.series.chunks(ROWS_PER_INSERT) {
                let mut q = sqlx::QueryBuilder::new(
                    "INSERT INTO profile_series \
                     (tenant, sha256, service, profile_type, start_ns, end_ns, points, total) ",
                );
                q.push_values(chunk, |mut b, r| {
                    b.push_bind(&s.tenant)
                        .push_bind(&s.sha256)
                        .push_bind(&r.service)
                        .push_bind(&r.profile_type)
                        .push_bind(r.start_ns)
                        .push_bind(r.end_ns)
                        .push_bind(r.points)
                        .push_bind(r.total);
                });
                q.build().execute(&mut *$tx).await?;
            }
            for chunk in s.labels.chunks(ROWS_PER_INSERT) {
                let mut q = sqlx::QueryBuilder::new(
                    "INSERT INTO profile_labels (tenant, sha256, service, name, value) ",
                );
                q.push_values(chunk, |mut b, (service, name, value)| {
                    b.push_bind(&s.tenant)
                        .push_bind(&s.sha256)
                        .push_bind(service)
                        .push_bind(name)
                        .push_bind(value);
                });
                q.build().execute(&mut *$tx).await?;
            }
            for chunk in s.trace_ids.chunks(ROWS_PER_INSERT) {
                let mut q = sqlx::QueryBuilder::new(
                    "INSERT INTO profile_traces (tenant, trace_id, sha256) ",
                );
                q.push_values(chunk, |mut b, trace_id| {
                    b.push_bind(&s.tenant)
                        .push_bind(trace_id)
                        .push_bind(&s.sha256);
                });
                q.build().execute(&mut *$tx).await?;
            }
        }
        inserted
    }};
}

#[async_trait]
impl ProfileMetadata for SqlMetadata {
    async fn commit_segment(&self, segment: &NewSegment) -> MetaResult<bool> {
        on_pool!(self, p => {
            let mut tx = p.begin().await?;
            let inserted = insert_segment!(tx, segment);
            tx.commit().await?;
            Ok(inserted)
        })
    }

    async fn segments(&self, q: &SeriesQuery) -> MetaResult<Vec<SegmentRef>> {
        let sql = format!(
            "SELECT {SEGMENT_COLUMNS} FROM profile_segments g WHERE g.tenant = $1 \
             AND g.start_ns < $2 AND g.end_ns >= $3 AND EXISTS (SELECT 1 FROM profile_series s \
             WHERE s.tenant = g.tenant AND s.sha256 = g.sha256 \
             AND ($4 = '' OR s.service = $4) AND ($5 = '' OR s.profile_type = $5) \
             AND s.start_ns < $2 AND s.end_ns >= $3) ORDER BY g.start_ns, g.sha256"
        );
        on_pool!(self, p => sqlx::query_as::<_, SegmentRef>(&sql)
            .bind(&q.tenant)
            .bind(q.to_ns)
            .bind(q.from_ns)
            .bind(q.service.as_deref().unwrap_or(""))
            .bind(q.profile_type.as_deref().unwrap_or(""))
            .fetch_all(p)
            .await)
    }

    async fn trace_segments(&self, tenant: &str, trace_id: &str) -> MetaResult<Vec<SegmentRef>> {
        let sql = format!(
            "SELECT {SEGMENT_COLUMNS} FROM profile_segments g WHERE g.tenant = $1 AND EXISTS \
             (SELECT 1 FROM profile_traces t WHERE t.tenant = $1 AND t.trace_id = $2 \
             AND t.sha256 = g.sha256) ORDER BY g.start_ns, g.sha256"
        );
        on_pool!(self, p => sqlx::query_as::<_, SegmentRef>(&sql)
            .bind(tenant)
            .bind(trace_id)
            .fetch_all(p)
            .await)
    }

    async fn acquire_lease(
        &self,
        name: &str,
        holder: &str,
        now: i64,
        ttl_ms: i64,
    ) -> MetaResult<bool> {
        let sql = "INSERT INTO leases (name, holder, expires_at) VALUES ($1, $2, $3) \
                   ON CONFLICT (name) DO UPDATE SET holder = excluded.holder, \
                   expires_at = excluded.expires_at \
                   WHERE leases.holder = excluded.holder OR leases.expires_at < $4";
        on_pool!(self, p => sqlx::query(sql)
            .bind(name)
            .bind(holder)
            .bind(now + ttl_ms)
            .bind(now)
            .execute(p)
            .await
            .map(|r| r.rows_affected() == 1))
    }

    async fn uncompacted(&self, before_ns: i64, limit: i64) -> MetaResult<Vec<SegmentRef>> {
        let sql = format!(
            "SELECT {SEGMENT_COLUMNS} FROM profile_segments WHERE level = 0 AND start_ns < $1 \
             ORDER BY tenant, start_ns, sha256 LIMIT $2"
        );
        on_pool!(self, p => sqlx::query_as::<_, SegmentRef>(&sql)
            .bind(before_ns)
            .bind(limit)
            .fetch_all(p)
            .await)
    }

    async fn swap_segments(
        &self,
        tenant: &str,
        inputs: &[String],
        outputs: &[NewSegment],
    ) -> MetaResult<bool> {
        let delete = "DELETE FROM profile_segments WHERE tenant = $1 AND sha256 = $2";
        on_pool!(self, p => {
            let mut tx = p.begin().await?;
            for sha in inputs {
                let gone = sqlx::query(delete)
                    .bind(tenant)
                    .bind(sha)
                    .execute(&mut *tx)
                    .await?
                    .rows_affected();
                if gone != 1 {
                    tx.rollback().await?;
                    return Ok(false);
                }
            }
            for segment in outputs {
                insert_segment!(tx, segment);
            }
            tx.commit().await?;
            Ok(true)
        })
    }

    async fn expire_segments(&self, cutoff_ns: i64) -> MetaResult<u64> {
        let sql = "DELETE FROM profile_segments WHERE end_ns < $1";
        on_pool!(self, p => sqlx::query(sql)
            .bind(cutoff_ns)
            .execute(p)
            .await
            .map(|r| r.rows_affected()))
    }
}
