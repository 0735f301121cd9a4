//! Writing and reading segments: the object first (durably), then the
//! index rows in one transaction. A crash in between leaves an orphan
//! object, never a row without its object; the collector removes it.

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::sync::Arc;

use super::model::SegmentData;
use super::segment;
use crate::store::model::{now_ms, NewSegment, SeriesRow, TraceRef};
use crate::store::SymbolStore;
use symtrace_profiles::parts::PartKey;
use symtrace_wire::labels::LabelIndex;

/// zstd level of segments written at ingest (fast) and by the compactor.
pub const INGEST_LEVEL: i32 = 1;
pub const COMPACT_LEVEL: i32 = 12;

#[derive(Debug, thiserror::Error)]
pub enum ProfileStoreError {
    #[error(transparent)]
    Store(#[from] crate::store::Error),
    #[error("segment {sha256}: {source}")]
    Segment {
        sha256: String,
        source: segment::SegmentError,
    },
    /// A task that encodes or decodes failed (a bug, never the input's fault).
    #[error("internal: {0}")]
    Internal(String),
    /// A job of the CPU pool did not finish (a panic, logged).
    #[error(transparent)]
    Cpu(#[from] crate::cpu::Panicked),
}

/// Profiles on top of the symbol store's blobs and database.
pub struct ProfileStore {
    pub store: Arc<SymbolStore>,
    /// Most distinct values of one label name per (segment, service) that
    /// go into the label index; beyond that the name is indexed as "many".
    pub max_label_values: usize,
    /// Level-0 segments by series too, as compacted ones always are
    /// (the default; `--ingest-layout whole` turns it off).
    pub ingest_parts: bool,
}

/// What a segment is written from: its data whole (split by series unless
/// it is an ingested segment under `--ingest-layout whole`), or already
/// laid out by series ([`symtrace_profiles::normalize::normalize_by_series`]).
pub enum Content {
    Whole(SegmentData),
    Parts(Vec<(PartKey, SegmentData)>),
}

impl Content {
    /// Whether it holds no sample.
    pub fn is_empty(&self) -> bool {
        match self {
            Content::Whole(data) => data.samples.is_empty(),
            Content::Parts(parts) => parts.iter().all(|(_, p)| p.samples.is_empty()),
        }
    }
}

/// What a write stored.
#[derive(Debug, Clone)]
pub struct Written {
    pub sha256: String,
    pub size: u64,
    pub points: u64,
    /// False when the tenant already had this exact segment (a retry).
    pub new: bool,
}

impl ProfileStore {
    pub fn new(store: Arc<SymbolStore>, max_label_values: usize) -> Self {
        Self {
            store,
            max_label_values,
            ingest_parts: true,
        }
    }

    /// Whether ingested (level-0) segments are laid out by series too.
    pub fn with_ingest_parts(mut self, on: bool) -> Self {
        self.ingest_parts = on;
        self
    }

    /// Encodes `data` (on the blocking pool) and stores it as one segment
    /// (ingest encodes on its own pool, then calls [`Self::write_encoded`]).
    #[cfg(test)]
    pub async fn write(
        &self,
        tenant: &str,
        data: Content,
        level: i32,
    ) -> Result<Written, ProfileStoreError> {
        let encoder = self.encoder(level);
        let tenant = tenant.to_owned();
        let (bytes, row) = tokio::task::spawn_blocking(move || encoder.encode(&tenant, data))
            .await
            .map_err(|e| ProfileStoreError::Internal(format!("encoding a segment: {e}")))?;
        self.write_encoded(bytes, row).await
    }

    /// Stores an encoded segment durably, then commits its index rows.
    pub async fn write_encoded(
        &self,
        bytes: Vec<u8>,
        mut row: NewSegment,
    ) -> Result<Written, ProfileStoreError> {
        row.size = bytes.len() as i64;
        let spooled = self.store.store_derived(bytes).await?;
        row.sha256 = spooled.sha256.clone();
        drop(spooled);
        crate::store::crash_point("segment-before-commit");
        let new = self.store.meta.commit_segment(&row).await?;
        Ok(Written {
            sha256: row.sha256,
            size: row.size as u64,
            points: row.points as u64,
            new,
        })
    }

    /// Encodes (on `cpu`) and durably stores a segment's object; the
    /// returned row is not yet committed (an uncommitted object is an
    /// orphan).
    pub async fn put(
        &self,
        cpu: &crate::cpu::CpuPool,
        tenant: &str,
        data: Content,
        level: i32,
    ) -> Result<NewSegment, ProfileStoreError> {
        let encoder = self.encoder(level);
        let tenant = tenant.to_owned();
        let (bytes, mut row) = cpu
            .run("encoding a segment", move || encoder.encode(&tenant, data))
            .await?;
        row.size = bytes.len() as i64;
        let spooled = self.store.store_derived(bytes).await?;
        row.sha256 = spooled.sha256.clone();
        Ok(row)
    }

    /// How segments of `level` are encoded (a value for a blocking thread).
    pub fn encoder(&self, level: i32) -> SegmentEncoder {
        SegmentEncoder {
            level,
            max_label_values: self.max_label_values,
            by_series: self.ingest_parts,
        }
    }
}

/// Encodes segments of one level (CPU only: run it on a blocking thread).
#[derive(Debug, Clone, Copy)]
pub struct SegmentEncoder {
    level: i32,
    max_label_values: usize,
    by_series: bool,
}

impl SegmentEncoder {
    /// The segment's bytes and its index row (sha256 and size not yet set).
    pub fn encode(&self, tenant: &str, data: Content) -> (Vec<u8>, NewSegment) {
        let (level, max) = (self.level, self.max_label_values);
        let zstd_level = if level == 0 {
            INGEST_LEVEL
        } else {
            COMPACT_LEVEL
        };
        // One part per (service, profile type): a query of one service
        // reads only its parts.
        let parts = match data {
            Content::Whole(data) if level == 0 && !self.by_series => {
                let row = index_row(&[&data], None, tenant, level, max);
                return (segment::encode(&data, zstd_level), row);
            }
            Content::Whole(data) => symtrace_profiles::parts::split(data),
            Content::Parts(parts) => parts,
        };
        let (keys, datas): (Vec<_>, Vec<_>) = parts.into_iter().unzip();
        let (bytes, ranges) = segment::encode_parts(&datas, zstd_level);
        let parts: Vec<&SegmentData> = datas.iter().collect();
        let mut row = index_row(&parts, Some(&ranges), tenant, level, max);
        let by_key: HashMap<PartKey, std::ops::Range<u64>> = keys.into_iter().zip(ranges).collect();
        for series in &mut row.series {
            series.part = by_key
                .get(&(series.service.clone(), series.profile_type.clone()))
                .cloned();
        }
        (bytes, row)
    }
}

/// The index rows describing a segment of these parts (one for a segment
/// laid out whole, `ranges` None); sha256 and size are filled in later.
fn index_row(
    parts: &[&SegmentData],
    ranges: Option<&[std::ops::Range<u64>]>,
    tenant: &str,
    level: i32,
    max_label_values: usize,
) -> NewSegment {
    let mut series: BTreeMap<(String, String), SeriesRow> = BTreeMap::new();
    // Label values per (service, name), from series and sample labels.
    let mut labels: HashMap<(&str, &str), BTreeSet<&str>> = HashMap::new();
    let mut traces = BTreeSet::new();
    for (ordinal, data) in parts.iter().enumerate() {
        let part = ranges
            .and_then(|r| r.get(ordinal))
            .map(|r| (r.start, r.end - r.start));
        let mut keys = Vec::with_capacity(data.series.len());
        for s in &data.series {
            let key = (data.str(s.service).to_owned(), data.profile_type(s));
            let row = series.entry(key.clone()).or_insert_with(|| SeriesRow {
                service: key.0.clone(),
                profile_type: key.1.clone(),
                start_ns: s.start_ns as i64,
                end_ns: s.end_ns as i64,
                points: 0,
                total: 0,
                labels: String::new(),
                part: None,
            });
            row.start_ns = row.start_ns.min(s.start_ns as i64);
            row.end_ns = row.end_ns.max(s.end_ns as i64);
            keys.push(key);
        }
        let mut add = |service: u32, set: u32| {
            for &(k, v) in &data.label_sets[set as usize] {
                labels
                    .entry((data.str(service), data.str(k)))
                    .or_default()
                    .insert(data.str(v));
            }
        };
        for s in &data.series {
            add(s.service, s.labels);
        }
        let mut used_sets: HashSet<(u32, u32)> = HashSet::new();
        for sample in &data.samples {
            let row = series
                .get_mut(&keys[sample.series as usize])
                .expect("series row");
            row.points += sample.points() as i64;
            row.total = row.total.saturating_add(sample.total());
            let service = data.series[sample.series as usize].service;
            if used_sets.insert((service, sample.labels)) {
                add(service, sample.labels);
            }
            if sample.link != 0 {
                let link = &data.links[sample.link as usize];
                let trace_id: [u8; 16] = link[..16].try_into().expect("16 bytes");
                traces.insert(TraceRef { trace_id, part });
            }
        }
    }
    // Label values per (service, type): from (service, name) sets.
    let mut by_service: HashMap<&str, LabelIndex> = HashMap::new();
    for ((service, name), values) in labels {
        let values =
            (values.len() <= max_label_values).then(|| values.into_iter().map(str::to_owned));
        by_service.entry(service).or_default().add(name, values);
    }
    let mut series: Vec<SeriesRow> = series.into_values().collect();
    for row in &mut series {
        row.labels = by_service
            .get(row.service.as_str())
            .map_or_else(|| LabelIndex::default().encode(), LabelIndex::encode);
    }
    NewSegment {
        tenant: tenant.to_owned(),
        sha256: String::new(),
        size: 0,
        start_ns: series.iter().map(|s| s.start_ns).min().unwrap_or(0),
        end_ns: series.iter().map(|s| s.end_ns).max().unwrap_or(0),
        points: series.iter().map(|s| s.points).sum(),
        level,
        created_at: now_ms(),
        series,
        traces: traces.into_iter().collect(),
    }
}
