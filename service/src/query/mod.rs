//! The query path: selections of stored samples become flamegraphs (JSON
//! tree, flamebearer, folded, pprof, SVG), diffs, and a trace's span
//! breakdown. Native frames are symbolized here, at query time, through
//! the symbolizer's indexes — so debug info uploaded after a profile still
//! names its frames.
//!
//! A query lists its segments in the index, reads them through the
//! [`SegmentReader`] (decoded on the engine's CPU pool, cached by sha256 or
//! part), aggregates their stacks on the same pool,
//! symbolizes the distinct native frames once per build-ID, and renders.
//! It is bounded: at most [`QueryLimits::max_bytes`] of segments,
//! [`aggregate::MAX_STACKS`] distinct stacks and [`QueryLimits::timeout`].

mod frames;
mod names;
pub mod samples;
pub mod traces;

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use futures::stream::{self, StreamExt};
use symtrace_profiles::aggregate::{self, Aggregate};
use symtrace_profiles::answer::{Answer, DEFAULT_TYPE};
use symtrace_profiles::frame_table::FrameTable;
use symtrace_profiles::selection::Selection;

use crate::cpu::CpuPool;
use crate::federation::Forwarding;
use crate::profiles::reader::SegmentReader;
use crate::store::meta::MetadataStore;
use crate::store::model::{SegmentRef, SeriesQuery};
use crate::store::SymbolStore;
use crate::symbolize::SymbolizeService;

pub use crate::profiles::cache::{Segment, SegmentCache};
pub use names::NameCache;

/// Symbolized addresses kept across queries (about 100 bytes each).
pub const NAME_CACHE_ADDRESSES: usize = 4_000_000;

/// Segments read ahead while the previous one is aggregated.
const READ_AHEAD: usize = 8;
/// Parts read ahead when a query lists only small parts (one service's):
/// each is a small ranged read, and on an object store the time of a query of
/// hundreds of them is their round trips, not their bytes.
const PART_READ_AHEAD: usize = 32;
/// Parts this small are read `PART_READ_AHEAD` at a time (larger ones, a
/// compacted hour of a busy service, `READ_AHEAD`: memory, not round trips).
const SMALL_PART: u64 = 4 << 20;

#[derive(Debug, Clone)]
pub struct QueryLimits {
    /// Most bytes of (compressed) segments one query reads.
    pub max_bytes: u64,
    /// Longest a query runs.
    pub timeout: Duration,
}

#[derive(Debug, thiserror::Error)]
pub enum QueryError {
    #[error("{0}")]
    BadRequest(String),
    /// The selection's parameters (times, IDs, selector, type, gauge).
    #[error(transparent)]
    Selection(#[from] symtrace_profiles::selection::SelectionError),
    #[error(
        "the selection reads {bytes} bytes of profile segments, over the limit of \
         {limit} (SYMTRACE_QUERY_MAX_BYTES); narrow the time range or add a selector"
    )]
    TooLarge { bytes: u64, limit: u64 },
    #[error("the query took longer than {0:?} (SYMTRACE_QUERY_TIMEOUT); narrow the time range")]
    Timeout(Duration),
    /// The segment index or the blobs failed (unavailable, or a broken
    /// invariant: the store says which).
    #[error("reading profiles: {0}")]
    Store(#[from] crate::store::Error),
    /// A stored segment could not be read or decoded.
    #[error(transparent)]
    Segment(#[from] crate::profiles::store::ProfileStoreError),
    /// A stored segment's bytes are not a segment.
    #[error("decoding a segment: {0}")]
    Decode(#[from] symtrace_profiles::segment::SegmentError),
    /// A job of the CPU pool did not finish (a panic, logged).
    #[error(transparent)]
    Cpu(#[from] crate::cpu::Panicked),
    /// Run the aggregation again (the frame table started over).
    #[error("the query was interrupted; retry it")]
    Retry,
}

/// The query engine: what a flamegraph, diff, trace or samples query
/// needs — the segment index, the segments, the symbolizer, the caches and
/// the limits — and nothing of HTTP.
pub struct Engine {
    meta: Arc<dyn MetadataStore>,
    symbolizer: Arc<SymbolizeService>,
    /// Where segments are read, decoded and cached.
    pub(crate) reader: SegmentReader,
    names: NameCache,
    frame_table: Arc<FrameTable>,
    /// Where a query's CPU work runs (decoding, aggregation, rendering).
    cpu: CpuPool,
    /// The bounds of every query.
    pub limits: QueryLimits,
}

impl Engine {
    /// An engine over `store` with empty caches: `segment_cache_bytes` of
    /// decoded segments, [`NAME_CACHE_ADDRESSES`] symbolized addresses.
    pub fn new(
        store: Arc<SymbolStore>,
        symbolizer: Arc<SymbolizeService>,
        segment_cache_bytes: u64,
        limits: QueryLimits,
        cpu: CpuPool,
    ) -> Self {
        Self {
            meta: store.meta.clone(),
            reader: SegmentReader::new(store, cpu.clone(), segment_cache_bytes),
            symbolizer,
            names: NameCache::new(NAME_CACHE_ADDRESSES),
            frame_table: Arc::default(),
            cpu,
            limits,
        }
    }

    /// Runs CPU work `f` of a query on the engine's CPU pool (its long-lived
    /// threads, one per CPU: not tokio's blocking pool, which starts a
    /// thread per task and lets them time-slice the cores).
    pub async fn on_cpu<T: Send + 'static>(
        &self,
        what: &'static str,
        f: impl FnOnce() -> T + Send + 'static,
    ) -> Result<T, QueryError> {
        Ok(self.cpu.run(what, f).await?)
    }

    /// The label index of the series `sel` selects (its other selectors
    /// aside), merged.
    pub async fn labels(
        &self,
        sel: &Selection,
    ) -> Result<symtrace_wire::labels::LabelIndex, QueryError> {
        let mut index = symtrace_wire::labels::LabelIndex::default();
        for row in self.series(sel).await? {
            index.merge(symtrace_wire::labels::LabelIndex::decode(&row.labels));
        }
        Ok(index)
    }

    /// The series the selection's tenant, service, type and time range
    /// select (its other selectors aside), from the segment index.
    pub async fn series(
        &self,
        sel: &Selection,
    ) -> Result<Vec<crate::store::model::SeriesInfo>, QueryError> {
        Ok(self.meta.series_rows(&series_query(sel)).await?)
    }
}

/// Runs one selection (`sides` = 1) or a baseline and a comparison.
pub async fn run(
    state: &Engine,
    sides: &[Selection],
    from: &Forwarding,
) -> Result<Answer, QueryError> {
    let limits = state.limits.clone();
    tokio::time::timeout(limits.timeout, run_unbounded(state, sides, from))
        .await
        .map_err(|_| QueryError::Timeout(limits.timeout))?
}

async fn run_unbounded(
    state: &Engine,
    sides: &[Selection],
    from: &Forwarding,
) -> Result<Answer, QueryError> {
    for sel in sides {
        check_service(state, sel).await?;
    }
    let mut segments: Vec<SegmentRef> = Vec::new();
    let mut seen = BTreeSet::new();
    for sel in sides {
        for s in segments_of(state, sel).await? {
            if seen.insert(s.key()) {
                segments.push(s);
            }
        }
    }
    // A segment one side lists whole is read whole (every part): the other
    // side's parts of it would be read, and counted, twice.
    let whole: BTreeSet<String> = segments
        .iter()
        .filter(|s| s.part().is_none())
        .map(|s| s.sha256.clone())
        .collect();
    segments.retain(|s| s.part().is_none() || !whole.contains(&s.sha256));
    within_bytes(state, &segments)?;
    let started = std::time::Instant::now();
    let sides: Arc<Vec<Selection>> = Arc::new(sides.to_vec());
    let (mut agg, profile_type) = match aggregate(state, &segments, &sides).await {
        // The frame table started over meanwhile (rare): once more.
        Err(QueryError::Retry) => aggregate(state, &segments, &sides).await?,
        other => other?,
    };
    let aggregated = started.elapsed();
    let resolved = frames::resolve(&mut agg, &state.symbolizer, &state.names, from).await;
    tracing::debug!(
        segments = agg.segments_read,
        bytes = agg.bytes_read,
        stacks = agg.stacks.len(),
        frames = agg.frames.len(),
        shown = resolved.shown.len(),
        aggregate_ms = aggregated.as_millis() as u64,
        resolve_ms = (started.elapsed() - aggregated).as_millis() as u64,
        "query selection read"
    );
    Ok(Answer {
        agg,
        resolved,
        profile_type,
    })
}

/// Reads the segments (a few ahead) and adds each to the aggregate on the
/// blocking pool; keeps one profile type; copies the frames out.
async fn aggregate(
    state: &Engine,
    segments: &[SegmentRef],
    sides: &Arc<Vec<Selection>>,
) -> Result<(Aggregate, Option<String>), QueryError> {
    let mut agg = Aggregate::default();
    let owned: Vec<(SegmentRef, u64)> = segments
        .iter()
        .map(|s| (s.clone(), s.read_bytes()))
        .collect();
    // Reading, decoding and numbering a segment's frames run ahead (on
    // the other cores) while the previous segment is aggregated.
    let small_parts = segments
        .iter()
        .all(|s| s.part().is_some() && s.read_bytes() <= SMALL_PART);
    let ahead = if small_parts {
        PART_READ_AHEAD
    } else {
        READ_AHEAD
    };
    let mut reads = stream::iter(owned)
        .map(|(segment, size)| async move {
            let mut parts = Vec::new();
            for segment in state.reader.listed(&segment).await? {
                let table = state.frame_table.clone();
                let frames = match segment.mapped_frames(&table) {
                    Some(frames) => frames,
                    None => {
                        let segment = segment.clone();
                        state
                            .on_cpu("segment frames", move || segment.frames(&table))
                            .await?
                    }
                };
                parts.push((segment, frames));
            }
            Ok::<_, QueryError>((size, parts))
        })
        .buffered(ahead)
        // Segments ready together are aggregated in one trip to the pool.
        .ready_chunks(ahead);
    let aggregate_error = |e: aggregate::AggregateError| match e {
        aggregate::AggregateError::GenerationChanged => QueryError::Retry,
        e => QueryError::BadRequest(e.to_string()),
    };
    while let Some(ready) = reads.next().await {
        let ready = ready.into_iter().collect::<Result<Vec<_>, _>>()?;
        let sides = sides.clone();
        agg = state
            .on_cpu("aggregation", move || {
                for (size, parts) in ready {
                    for (segment, frames) in parts {
                        for (side, sel) in sides.iter().enumerate() {
                            agg.add_segment(&segment.data, &frames, sel, side)?;
                        }
                    }
                    agg.segments_read += 1;
                    agg.bytes_read += size;
                }
                Ok::<_, aggregate::AggregateError>(agg)
            })
            .await?
            .map_err(aggregate_error)?;
    }
    let profile_type = agg
        .choose_type(sides[0].profile_type.as_deref(), DEFAULT_TYPE)
        .map_err(aggregate_error)?;
    let table = state.frame_table.clone();
    let agg = state
        .on_cpu("aggregation", move || agg.finish(&table).map(|()| agg))
        .await?
        .map_err(aggregate_error)?;
    Ok((agg, profile_type))
}

/// An unknown service is a mistake worth naming (a typo), unlike a known
/// one with no samples in the range.
async fn check_service(state: &Engine, sel: &Selection) -> Result<(), QueryError> {
    let Some(service) = &sel.service else {
        return Ok(());
    };
    if !state.meta.has_service(&sel.tenant, service).await? {
        return Err(QueryError::BadRequest(format!(
            "unknown service {service:?}: tenant {:?} has no profiles of it \
             (GET /api/v1/services lists the known ones)",
            sel.tenant
        )));
    }
    Ok(())
}

async fn segments_of(state: &Engine, sel: &Selection) -> Result<Vec<SegmentRef>, QueryError> {
    let meta = &state.meta;
    let found = match &sel.trace_id {
        Some(trace) => meta
            .trace_segments(&sel.tenant, trace)
            .await?
            .into_iter()
            .filter(|s| s.start_ns < sel.to_ns && s.end_ns >= sel.from_ns)
            .collect(),
        None => meta.segments(&series_query(sel)).await?,
    };
    Ok(found)
}

/// The index query of a selection's tenant, service, type and range.
fn series_query(sel: &Selection) -> SeriesQuery {
    SeriesQuery {
        tenant: sel.tenant.clone(),
        service: sel.service.clone(),
        profile_type: sel.profile_type.clone(),
        from_ns: sel.from_ns,
        to_ns: sel.to_ns,
    }
}

/// Refuses a listing over the bytes one query may read.
fn within_bytes(state: &Engine, segments: &[SegmentRef]) -> Result<(), QueryError> {
    let bytes: u64 = segments.iter().map(SegmentRef::read_bytes).sum();
    let limit = state.limits.max_bytes;
    if bytes > limit {
        return Err(QueryError::TooLarge { bytes, limit });
    }
    Ok(())
}
