//! The one way a stored segment is read: fetched from the blob store
//! (whole, or one part by a ranged read), decoded on a [`CpuPool`] (never
//! on the async workers, never on tokio's blocking pool), kept in the
//! [`SegmentCache`] by sha256 or part, and counted
//! (`symtrace_segment_cache_total{result}`). Queries read through a cached
//! reader; compaction through one with no cache (its inputs are read once
//! and then replaced).

use std::ops::Range;
use std::sync::Arc;

use super::cache::{Segment, SegmentCache};
use super::model::SegmentData;
use super::segment;
use super::store::ProfileStoreError;
use crate::cpu::CpuPool;
use crate::store::model::{part_key, SegmentRef};
use crate::store::SymbolStore;

/// Reads, decodes and caches segments.
pub struct SegmentReader {
    store: Arc<SymbolStore>,
    cpu: CpuPool,
    cache: SegmentCache,
}

fn count(result: &'static str, n: usize) {
    metrics::counter!("symtrace_segment_cache_total", "result" => result).increment(n as u64);
}

impl SegmentReader {
    /// A reader keeping up to `cache_bytes` of decoded segments (0: none).
    pub fn new(store: Arc<SymbolStore>, cpu: CpuPool, cache_bytes: u64) -> Self {
        Self {
            store,
            cpu,
            cache: SegmentCache::new(cache_bytes),
        }
    }

    /// The pool the reader decodes on (its callers' CPU work goes there
    /// too).
    pub fn cpu(&self) -> &CpuPool {
        &self.cpu
    }

    /// What a query reads of a segment it lists: its one part, or (a
    /// segment listed whole, as queries without a service and trace
    /// lookups list them) each of its parts apart, never merged: merging a
    /// 200-service export's parts costs more than decoding them. Each part
    /// is cached under the key a one-service query of it uses; once the
    /// segment's part directory is known, only the parts not cached are
    /// fetched (ranged).
    pub async fn listed(
        &self,
        listed: &SegmentRef,
    ) -> Result<Vec<Arc<Segment>>, ProfileStoreError> {
        if listed.part().is_some() {
            return Ok(vec![self.part(listed).await?]);
        }
        let sha256 = &listed.sha256;
        // A one-part (version 1) segment is cached whole.
        if let Some(hit) = self.cache.get(sha256) {
            count("hit", 1);
            return Ok(vec![hit]);
        }
        if let Some(ranges) = self.cache.parts_of(sha256) {
            let cached = self.cached_parts(sha256, &ranges);
            let missing = cached.iter().filter(|c| c.is_none()).count();
            if missing < ranges.len() {
                // Some are cached: fetch the others alone.
                count("hit", ranges.len() - missing);
                let mut parts = Vec::with_capacity(ranges.len());
                for (part, range) in cached.into_iter().zip(ranges.iter()) {
                    parts.push(match part {
                        Some(part) => part,
                        None => self.ranged(sha256, range.clone()).await?,
                    });
                }
                return Ok(parts);
            }
        }
        let bytes = self.store.blob_bytes(sha256).await?;
        let ranges = segment::part_ranges(&bytes).map_err(|e| broken(sha256, e))?;
        if ranges.len() == 1 && ranges[0].start == 0 {
            count("miss", 1);
            let data = self
                .cpu
                .run("decoding a segment", move || segment::decode(&bytes))
                .await?
                .map_err(|e| broken(sha256, e))?;
            let data = Arc::new(Segment::new(data));
            self.cache.insert(sha256, data.clone());
            return Ok(vec![data]);
        }
        self.cache.set_parts_of(sha256, Arc::new(ranges.clone()));
        let mut parts = self.cached_parts(sha256, &ranges);
        let missing: Vec<(usize, Range<u64>)> = parts
            .iter()
            .zip(&ranges)
            .enumerate()
            .filter(|(_, (part, _))| part.is_none())
            .map(|(i, (_, range))| (i, range.clone()))
            .collect();
        count("hit", ranges.len() - missing.len());
        count("miss", missing.len());
        let decoded = self
            .cpu
            .run("decoding a segment", move || {
                missing
                    .into_iter()
                    .map(|(i, r)| {
                        segment::decode_part(&bytes[r.start as usize..r.end as usize])
                            .map(|data| (i, r.start, Arc::new(Segment::new(data))))
                    })
                    .collect::<Result<Vec<_>, _>>()
            })
            .await?
            .map_err(|e| broken(sha256, e))?;
        for (i, offset, data) in decoded {
            self.cache.insert(&part_key(sha256, offset), data.clone());
            parts[i] = Some(data);
        }
        Ok(parts.into_iter().flatten().collect())
    }

    /// A segment's part (one service's), or the whole segment merged, through
    /// the cache.
    pub async fn part(&self, listed: &SegmentRef) -> Result<Arc<Segment>, ProfileStoreError> {
        let sha256 = &listed.sha256;
        match listed.part() {
            None => {
                let fetch = self.store.blob_bytes(sha256);
                self.through_cache(sha256, sha256, fetch, segment::decode)
                    .await
            }
            Some(range) => self.ranged(sha256, range).await,
        }
    }

    /// Every part of a segment, decoded apart and not cached (compaction's
    /// inputs: read once, then replaced).
    pub async fn parts_uncached(
        &self,
        sha256: &str,
    ) -> Result<Vec<SegmentData>, ProfileStoreError> {
        let bytes = self.store.blob_bytes(sha256).await?;
        self.cpu
            .run("decoding a segment", move || segment::decode_parts(&bytes))
            .await?
            .map_err(|e| broken(sha256, e))
    }

    /// One part by a ranged read, through the cache.
    async fn ranged(
        &self,
        sha256: &str,
        range: Range<u64>,
    ) -> Result<Arc<Segment>, ProfileStoreError> {
        let key = part_key(sha256, range.start);
        let fetch = self.store.blob_range(sha256, range);
        self.through_cache(sha256, &key, fetch, segment::decode_part)
            .await
    }

    /// `key`'s cached segment, else `fetch`'s bytes decoded by `decode`
    /// and cached under `key`.
    async fn through_cache(
        &self,
        sha256: &str,
        key: &str,
        fetch: impl std::future::Future<Output = crate::store::Result<bytes::Bytes>>,
        decode: fn(&[u8]) -> Result<SegmentData, segment::SegmentError>,
    ) -> Result<Arc<Segment>, ProfileStoreError> {
        if let Some(hit) = self.cache.get(key) {
            count("hit", 1);
            return Ok(hit);
        }
        count("miss", 1);
        let bytes = fetch.await?;
        let data = self
            .cpu
            .run("decoding a segment", move || decode(&bytes))
            .await?
            .map_err(|e| broken(sha256, e))?;
        let data = Arc::new(Segment::new(data));
        self.cache.insert(key, data.clone());
        Ok(data)
    }

    fn cached_parts(&self, sha256: &str, ranges: &[Range<u64>]) -> Vec<Option<Arc<Segment>>> {
        ranges
            .iter()
            .map(|r| self.cache.get(&part_key(sha256, r.start)))
            .collect()
    }
}

fn broken(sha256: &str, source: segment::SegmentError) -> ProfileStoreError {
    ProfileStoreError::Segment {
        sha256: sha256.to_owned(),
        source,
    }
}
