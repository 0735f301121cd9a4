//! The profile index: segments, their series, label pairs and trace IDs,
//! and the lease that lets one replica at a time compact.

use async_trait::async_trait;

use super::{trace_index, MetaResult, Pool, SqlMetadata};
use crate::store::model::{NewSegment, SegmentRef, SeriesInfo, SeriesQuery, TraceRef};

/// Rows per multi-row INSERT (at most 11 binds each; below both databases'
/// parameter limits).
const ROWS_PER_INSERT: usize = 1000;

#[async_trait]
pub trait ProfileMetadata {
    /// Makes an ingested segment visible with its series, labels and trace
    /// IDs, in one transaction. Returns false if the tenant already stored
    /// this export (a retry), even if its segment has since been compacted;
    /// `Error::NotFound` (nothing committed) if the collector took the segment's
    /// claimed blob meanwhile.
    async fn commit_segment(&self, segment: &NewSegment) -> MetaResult<bool>;
    /// Segments with series matching the query, oldest first.
    async fn segments(&self, query: &SeriesQuery) -> MetaResult<Vec<SegmentRef>>;
    /// The series rows of segments overlapping the query's range (service
    /// and profile type filters apply when set), for the label and service
    /// lists.
    async fn series_rows(&self, query: &SeriesQuery) -> MetaResult<Vec<SeriesInfo>>;
    /// Whether the tenant has ever stored a series of this service.
    async fn has_service(&self, tenant: &str, service: &str) -> MetaResult<bool>;
    /// Segments holding samples linked to a trace.
    async fn trace_segments(&self, tenant: &str, trace_id: &[u8]) -> MetaResult<Vec<SegmentRef>>;
    /// Takes or renews a named lease until `now + ttl_ms`; false if another
    /// holder has it.
    async fn acquire_lease(
        &self,
        name: &str,
        holder: &str,
        now: i64,
        ttl_ms: i64,
    ) -> MetaResult<bool>;
    /// Gives a lease up (if `holder` still has it): its row is deleted, so
    /// one lease per (tenant, window) leaves no rows behind.
    async fn release_lease(&self, name: &str, holder: &str) -> MetaResult<()>;
    /// Tenants with level-0 segments (not quarantined) that started before
    /// `before_ns`.
    async fn uncompacted_tenants(&self, before_ns: i64) -> MetaResult<Vec<String>>;
    /// A tenant's level-0 segments (not quarantined) that started before
    /// `before_ns`, oldest first.
    async fn uncompacted(
        &self,
        tenant: &str,
        before_ns: i64,
        limit: i64,
    ) -> MetaResult<Vec<SegmentRef>>;
    /// Leaves a segment out of compaction from now on, saying why.
    async fn quarantine_segment(&self, tenant: &str, sha256: &str, why: &str) -> MetaResult<()>;
    /// Forgets the idempotency keys of exports stored before `cutoff_ms`.
    /// Returns how many.
    async fn expire_export_keys(&self, cutoff_ms: i64) -> MetaResult<u64>;
    /// Replaces `inputs` by `outputs` in one transaction; false (and nothing
    /// changed) if any input is already gone, or an output's blob was
    /// collected meanwhile.
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

const SEGMENT_COLUMNS: &str = "g.sha256, g.size, g.start_ns, g.end_ns, g.points, g.level";

/// Inserts a segment with its series and trace rows; evaluates to false if
/// the tenant already has it.
macro_rules! insert_segment {
    ($tx:expr, $s:expr) => {{
        let s = $s;
        let id: Option<i64> = sqlx::query_scalar(
            "INSERT INTO profile_segments \
             (tenant, sha256, size, start_ns, end_ns, points, level, created_at, trace_ids, \
             trace_parts) \
             VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10) ON CONFLICT DO NOTHING RETURNING id",
        )
        .bind(&s.tenant)
        .bind(&s.sha256)
        .bind(s.size)
        .bind(s.start_ns)
        .bind(s.end_ns)
        .bind(s.points)
        .bind(s.level)
        .bind(s.created_at)
        .bind((s.level == 0).then(|| trace_ids(&s.traces)))
        .bind((s.level == 0).then(|| trace_parts(&s.traces)).flatten())
        .fetch_optional(&mut *$tx)
        .await?;
        if let Some(id) = id {
            for chunk in s.series.chunks(ROWS_PER_INSERT) {
                let mut q = sqlx::QueryBuilder::new(
                    "INSERT INTO profile_series (segment_id, tenant, service, profile_type, \
                     start_ns, end_ns, points, total, labels, part_offset, part_size) ",
                );
                q.push_values(chunk, |mut b, r| {
                    b.push_bind(id)
                        .push_bind(&s.tenant)
                        .push_bind(&r.service)
                        .push_bind(&r.profile_type)
                        .push_bind(r.start_ns)
                        .push_bind(r.end_ns)
                        .push_bind(r.points)
                        .push_bind(r.total)
                        .push_bind(&r.labels)
                        .push_bind(r.part.as_ref().map(|p| p.start as i64))
                        .push_bind(r.part.as_ref().map(|p| (p.end - p.start) as i64));
                });
                q.build().execute(&mut *$tx).await?;
            }
            let rows = if s.level == 0 {
                Vec::new()
            } else {
                trace_rows(&s.traces)
            };
            for chunk in rows.chunks(ROWS_PER_INSERT) {
                let mut q = sqlx::QueryBuilder::new(
                    "INSERT INTO profile_traces (trace_id, segment_id, parts) ",
                );
                q.push_values(chunk, |mut b, (trace_id, parts)| {
                    b.push_bind(&trace_id[..]).push_bind(id).push_bind(parts);
                });
                q.build().execute(&mut *$tx).await?;
            }
        }
        id.is_some()
    }};
}

#[async_trait]
impl ProfileMetadata for SqlMetadata {
    async fn commit_segment(&self, segment: &NewSegment) -> MetaResult<bool> {
        let key = "INSERT INTO profile_exports (tenant, sha256, created_at) VALUES ($1, $2, $3) \
                   ON CONFLICT DO NOTHING";
        on_pool!(self, p => {
            let mut tx = p.begin().await?;
            // The blob row claimed when the object was written: gone means
            // the collector took it (an export stalled past its grace), and
            // the object may be gone too — commit nothing; the sender retries.
            if !blob_kept!(tx, &segment.sha256) {
                tx.rollback().await?;
                return Err(crate::store::Error::NotFound(
                    "the blob row claimed for the segment is gone".into(),
                ));
            }
            let new = sqlx::query(key)
                .bind(&segment.tenant)
                .bind(&segment.sha256)
                .bind(segment.created_at)
                .execute(&mut *tx)
                .await?
                .rows_affected()
                == 1;
            let inserted = new && insert_segment!(tx, segment);
            tx.commit().await?;
            Ok::<_, sqlx::Error>(inserted)
        })
    }

    async fn segments(&self, q: &SeriesQuery) -> MetaResult<Vec<SegmentRef>> {
        if q.service.is_some() {
            // One service: the parts of its series (a version-1 segment,
            // whose rows have no part, is read whole, once).
            let sql = format!(
                "SELECT DISTINCT {SEGMENT_COLUMNS}, s.part_offset, s.part_size \
                 FROM profile_segments g JOIN profile_series s ON s.segment_id = g.id \
                 WHERE g.tenant = $1 AND g.start_ns < $2 AND g.end_ns >= $3 \
                 AND s.service = $4 AND ($5 = '' OR s.profile_type = $5) \
                 AND s.start_ns < $2 AND s.end_ns >= $3 \
                 ORDER BY g.start_ns, g.sha256, s.part_offset"
            );
            return on_pool!(self, p => sqlx::query_as::<_, SegmentRef>(&sql)
                .bind(&q.tenant)
                .bind(q.to_ns)
                .bind(q.from_ns)
                .bind(q.service.as_deref().unwrap_or(""))
                .bind(q.profile_type.as_deref().unwrap_or(""))
                .fetch_all(p)
                .await);
        }
        let sql = format!(
            "SELECT {SEGMENT_COLUMNS} FROM profile_segments g WHERE g.tenant = $1 \
             AND g.start_ns < $2 AND g.end_ns >= $3 AND EXISTS (SELECT 1 FROM profile_series s \
             WHERE s.segment_id = g.id \
             AND ($4 = '' OR s.profile_type = $4) \
             AND s.start_ns < $2 AND s.end_ns >= $3) ORDER BY g.start_ns, g.sha256"
        );
        on_pool!(self, p => sqlx::query_as::<_, SegmentRef>(&sql)
            .bind(&q.tenant)
            .bind(q.to_ns)
            .bind(q.from_ns)
            .bind(q.profile_type.as_deref().unwrap_or(""))
            .fetch_all(p)
            .await)
    }

    async fn series_rows(&self, q: &SeriesQuery) -> MetaResult<Vec<SeriesInfo>> {
        let sql = "SELECT service, profile_type, labels FROM profile_series \
                   WHERE tenant = $1 AND start_ns < $2 AND end_ns >= $3 \
                   AND ($4 = '' OR service = $4) AND ($5 = '' OR profile_type = $5)";
        on_pool!(self, p => sqlx::query_as::<_, SeriesInfo>(sql)
            .bind(&q.tenant)
            .bind(q.to_ns)
            .bind(q.from_ns)
            .bind(q.service.as_deref().unwrap_or(""))
            .bind(q.profile_type.as_deref().unwrap_or(""))
            .fetch_all(p)
            .await)
    }

    async fn has_service(&self, tenant: &str, service: &str) -> MetaResult<bool> {
        let sql = "SELECT 1 FROM profile_series WHERE tenant = $1 AND service = $2 LIMIT 1";
        on_pool!(self, p => sqlx::query(sql)
            .bind(tenant)
            .bind(service)
            .fetch_optional(p)
            .await
            .map(|r| r.is_some()))
    }

    async fn trace_segments(&self, tenant: &str, trace_id: &[u8]) -> MetaResult<Vec<SegmentRef>> {
        // Compacted segments through the profile_traces index, with the
        // parts that hold the trace.
        let sql = format!(
            "SELECT {SEGMENT_COLUMNS}, t.parts FROM profile_segments g JOIN profile_traces t \
             ON t.segment_id = g.id WHERE t.trace_id = $1 AND g.tenant = $2"
        );
        let compacted: Vec<TraceRow> = on_pool!(self, p => sqlx::query_as::<_, TraceRow>(&sql)
            .bind(trace_id)
            .bind(tenant)
            .fetch_all(p)
            .await)?;
        let mut found: Vec<SegmentRef> = Vec::new();
        for row in compacted {
            let hit = match row.parts.as_deref().and_then(trace_index::decode_ranges) {
                Some(parts) if !parts.is_empty() => trace_index::Hit::Parts(parts),
                _ => trace_index::Hit::Whole,
            };
            found.extend(hit.refs(&row.segment));
        }
        // Uncompacted ones (the last window or two) through the in-memory
        // index of their trace lists, each list read once.
        let live_sql = "SELECT id, sha256 FROM profile_segments WHERE tenant = $1 AND level = 0";
        let live: Vec<(i64, String)> = on_pool!(self, p => sqlx::query_as::<_, (i64, String)>(live_sql)
            .bind(tenant)
            .fetch_all(p)
            .await)?;
        let missing = self.traces.missing(tenant, &live);
        for chunk in missing.chunks(ROWS_PER_INSERT) {
            for (id, segment, ids, parts) in self.level0_rows(chunk).await? {
                self.traces
                    .insert(tenant, id, segment, ids.as_deref(), parts.as_deref());
            }
        }
        let (hits, unknown) = self.traces.lookup(tenant, &live, trace_id);
        found.extend(hits);
        // Rows the index could not keep (it started over): checked here.
        for chunk in unknown.chunks(ROWS_PER_INSERT) {
            for (_, segment, ids, parts) in self.level0_rows(chunk).await? {
                if let Some(hit) = trace_index::find_in(ids.as_deref(), parts.as_deref(), trace_id)
                {
                    found.extend(hit.refs(&segment));
                }
            }
        }
        let key = |s: &SegmentRef| (s.start_ns, s.sha256.clone(), s.part_offset);
        found.sort_by_key(key);
        found.dedup_by(|a, b| a.sha256 == b.sha256 && a.part_offset == b.part_offset);
        Ok(found)
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

    async fn release_lease(&self, name: &str, holder: &str) -> MetaResult<()> {
        let sql = "DELETE FROM leases WHERE name = $1 AND holder = $2";
        on_pool!(self, p => sqlx::query(sql).bind(name).bind(holder).execute(p).await.map(|_| ()))
    }

    async fn uncompacted_tenants(&self, before_ns: i64) -> MetaResult<Vec<String>> {
        let sql = "SELECT DISTINCT tenant FROM profile_segments \
                   WHERE level = 0 AND start_ns < $1 AND quarantined IS NULL ORDER BY tenant";
        on_pool!(self, p => sqlx::query_scalar::<_, String>(sql)
            .bind(before_ns)
            .fetch_all(p)
            .await)
    }

    async fn uncompacted(
        &self,
        tenant: &str,
        before_ns: i64,
        limit: i64,
    ) -> MetaResult<Vec<SegmentRef>> {
        let sql = format!(
            "SELECT {SEGMENT_COLUMNS} FROM profile_segments g \
             WHERE g.level = 0 AND g.tenant = $1 AND g.start_ns < $2 AND g.quarantined IS NULL \
             ORDER BY g.start_ns, g.sha256 LIMIT $3"
        );
        on_pool!(self, p => sqlx::query_as::<_, SegmentRef>(&sql)
            .bind(tenant)
            .bind(before_ns)
            .bind(limit)
            .fetch_all(p)
            .await)
    }

    async fn quarantine_segment(&self, tenant: &str, sha256: &str, why: &str) -> MetaResult<()> {
        let sql = "UPDATE profile_segments SET quarantined = $3 WHERE tenant = $1 AND sha256 = $2";
        on_pool!(self, p => sqlx::query(sql)
            .bind(tenant)
            .bind(sha256)
            .bind(why)
            .execute(p)
            .await
            .map(|_| ()))
    }

    async fn expire_export_keys(&self, cutoff_ms: i64) -> MetaResult<u64> {
        let sql = "DELETE FROM profile_exports WHERE created_at < $1";
        on_pool!(self, p => sqlx::query(sql)
            .bind(cutoff_ms)
            .execute(p)
            .await
            .map(|r| r.rows_affected()))
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
                if !blob_kept!(tx, &segment.sha256) || !insert_segment!(tx, segment) {
                    // The output exists already: keep everything as it was.
                    tx.rollback().await?;
                    return Ok(false);
                }
            }
            tx.commit().await?;
            Ok::<_, sqlx::Error>(true)
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

/// A level-0 segment's row: its ID, its reference, its sorted trace-ID
/// list and their parts.
type Level0Row = (i64, SegmentRef, Option<Vec<u8>>, Option<Vec<u8>>);

/// A compacted segment holding a trace, and the parts that do.
#[derive(sqlx::FromRow)]
struct TraceRow {
    #[sqlx(flatten)]
    segment: SegmentRef,
    parts: Option<Vec<u8>>,
}

/// A level-0 row's trace list: the IDs, sorted, once per part.
fn trace_ids(traces: &[TraceRef]) -> Vec<u8> {
    traces.iter().flat_map(|t| t.trace_id).collect()
}

/// A level-0 row's parts of its trace list (None unless every entry has
/// one: a segment of one part is read whole).
fn trace_parts(traces: &[TraceRef]) -> Option<Vec<u8>> {
    let parts: Option<Vec<(u64, u64)>> = traces.iter().map(|t| t.part).collect();
    parts.and_then(|p| trace_index::encode_entry_parts(&p))
}

/// A compacted segment's profile_traces rows: each trace once, with its
/// parts (None unless every one of its entries has one).
fn trace_rows(traces: &[TraceRef]) -> Vec<([u8; 16], Option<Vec<u8>>)> {
    traces
        .chunk_by(|a, b| a.trace_id == b.trace_id)
        .map(|same| {
            let parts: Option<Vec<(u64, u64)>> = same.iter().map(|t| t.part).collect();
            (same[0].trace_id, parts.map(trace_index::encode_ranges))
        })
        .collect()
}

impl SqlMetadata {
    /// The rows of these level-0 segment IDs (those still there).
    async fn level0_rows(&self, ids: &[i64]) -> MetaResult<Vec<Level0Row>> {
        type Row = (
            i64,
            String,
            i64,
            i64,
            i64,
            i64,
            i32,
            Option<Vec<u8>>,
            Option<Vec<u8>>,
        );
        if ids.is_empty() {
            return Ok(Vec::new());
        }
        // Row IDs from this database, formatted as integers: nothing of a
        // client's reaches this text.
        let list: Vec<String> = ids.iter().map(i64::to_string).collect();
        let sql = format!(
            "SELECT id, sha256, size, start_ns, end_ns, points, level, trace_ids, trace_parts \
             FROM profile_segments WHERE level = 0 AND id IN ({})",
            list.join(", ")
        );
        let rows: Vec<Row> =
            on_pool!(self, p => sqlx::query_as::<_, Row>(&sql).fetch_all(p).await)?;
        Ok(rows
            .into_iter()
            .map(
                |(id, sha256, size, start_ns, end_ns, points, level, ids, parts)| {
                    let segment = SegmentRef {
                        sha256,
                        size,
                        start_ns,
                        end_ns,
                        points,
                        level,
                        part_offset: None,
                        part_size: None,
                    };
                    (id, segment, ids, parts)
                },
            )
            .collect())
    }
}
