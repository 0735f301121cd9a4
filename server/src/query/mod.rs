//! The query path: selections of stored samples become flamegraphs (JSON
//! tree, flamebearer, folded, pprof, SVG), diffs, and a trace's span
//! breakdown. Native frames are symbolized here, at query time, through
//! the symbolizer's indexes — so debug info uploaded after a profile still
//! names its frames.
//!
//! A query lists its segments in the index, reads them (decoded segments
//! are cached by sha256), aggregates their stacks on the blocking pool,
//! symbolizes the distinct native frames once per build-ID, and renders.
//! It is bounded: at most [`QueryLimits::max_bytes`] of segments,
//! [`aggregate::MAX_STACKS`] distinct stacks and [`QueryLimits::timeout`].

pub mod aggregate;
pub mod api;
mod cache;
mod frame_table;
pub mod frames;
mod names;
pub mod params;
mod pprof;
mod render;
pub mod selector;
mod strings;
mod svg;
mod traces;
pub mod tree;

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use futures::stream::{self, StreamExt};

use crate::app::AppState;
use crate::federation::Forwarding;
use crate::store::model::{SegmentRef, SeriesQuery};
use aggregate::Aggregate;
use frames::Resolved;
use params::Selection;

pub use cache::{Segment, SegmentCache};
pub use frame_table::FrameTable;
pub use names::NameCache;

/// The CPU profile type agents send; chosen when a selection has several
/// types and the query named none.
pub const DEFAULT_TYPE: &str = "samples:count:cpu:nanoseconds";

/// Symbolized addresses kept across queries (about 100 bytes each).
pub const NAME_CACHE_ADDRESSES: usize = 4_000_000;

/// Segments read ahead while the previous one is aggregated.
const READ_AHEAD: usize = 8;

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
    #[error(
        "the selection reads {bytes} bytes of profile segments, over the limit of \
         {limit} (SYMTRACE_QUERY_MAX_BYTES); narrow the time range or add a selector"
    )]
    TooLarge { bytes: u64, limit: u64 },
    #[error("the query took longer than {0:?} (SYMTRACE_QUERY_TIMEOUT); narrow the time range")]
    Timeout(Duration),
    #[error("{0}")]
    Internal(String),
    /// Run the aggregation again (the frame table started over).
    #[error("the query was interrupted; retry it")]
    Retry,
}

impl From<QueryError> for crate::error::ApiError {
    fn from(e: QueryError) -> Self {
        use axum::http::StatusCode;
        match e {
            QueryError::BadRequest(_) | QueryError::TooLarge { .. } => {
                Self::bad_request(e.to_string())
            }
            QueryError::Timeout(_) => {
                Self::new(StatusCode::SERVICE_UNAVAILABLE, "timeout", e.to_string())
            }
            QueryError::Internal(_) | QueryError::Retry => Self::internal(e.to_string()),
        }
    }
}

fn internal(e: impl std::fmt::Display) -> QueryError {
    QueryError::Internal(e.to_string())
}

/// A query's result before rendering.
pub struct Answer {
    pub agg: Aggregate,
    pub resolved: Resolved,
    /// The profile type shown (None when nothing matched).
    pub profile_type: Option<String>,
}

impl Answer {
    /// The shown profile type's number in the aggregate's strings.
    fn type_id(&self) -> Option<u32> {
        self.agg.strings.find(self.profile_type.as_deref()?)
    }

    pub fn type_info(&self) -> aggregate::TypeInfo {
        self.type_id()
            .and_then(|t| self.agg.types.get(&t))
            .cloned()
            .unwrap_or_default()
    }

    /// Events of the shown type, per side.
    pub fn points(&self) -> [u64; 2] {
        self.type_id()
            .and_then(|t| self.agg.points.get(&t))
            .copied()
            .unwrap_or_default()
    }
}

/// Runs one selection (`sides` = 1) or a baseline and a comparison.
pub async fn run(
    state: &AppState,
    sides: &[Selection],
    from: &Forwarding,
) -> Result<Answer, QueryError> {
    let limits = state.query_limits.clone();
    tokio::time::timeout(limits.timeout, run_unbounded(state, sides, from))
        .await
        .map_err(|_| QueryError::Timeout(limits.timeout))?
}

async fn run_unbounded(
    state: &AppState,
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
            if seen.insert(s.sha256.clone()) {
                segments.push(s);
            }
        }
    }
    let bytes: u64 = segments.iter().map(|s| s.size as u64).sum();
    let limit = state.query_limits.max_bytes;
    if bytes > limit {
        return Err(QueryError::TooLarge { bytes, limit });
    }
    let started = std::time::Instant::now();
    let sides: Arc<Vec<Selection>> = Arc::new(sides.to_vec());
    let (mut agg, profile_type) = match aggregate(state, &segments, &sides).await {
        // The frame table started over meanwhile (rare): once more.
        Err(QueryError::Retry) => aggregate(state, &segments, &sides).await?,
        other => other?,
    };
    let aggregated = started.elapsed();
    let resolved = frames::resolve(&mut agg, &state.symbolizer, &state.name_cache, from).await;
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
    state: &AppState,
    segments: &[SegmentRef],
    sides: &Arc<Vec<Selection>>,
) -> Result<(Aggregate, Option<String>), QueryError> {
    let mut agg = Aggregate::default();
    let owned: Vec<(String, i64)> = segments
        .iter()
        .map(|s| (s.sha256.clone(), s.size))
        .collect();
    // Reading, decoding and numbering a segment's frames run ahead (on
    // the other cores) while the previous segment is aggregated.
    let mut reads = stream::iter(owned)
        .map(|(sha256, size)| async move {
            let segment = read(state, &sha256).await?;
            let table = state.frame_table.clone();
            if let Some(frames) = segment.mapped_frames(&table) {
                return Ok((size, segment, frames));
            }
            tokio::task::spawn_blocking(move || {
                let frames = segment.frames(&table);
                (size, segment, frames)
            })
            .await
            .map_err(internal)
        })
        .buffered(READ_AHEAD)
        // Segments ready together are aggregated in one trip to the pool.
        .ready_chunks(READ_AHEAD);
    let aggregate_error = |e: aggregate::AggregateError| match e {
        aggregate::AggregateError::GenerationChanged => QueryError::Retry,
        e => QueryError::BadRequest(e.to_string()),
    };
    while let Some(ready) = reads.next().await {
        let ready = ready.into_iter().collect::<Result<Vec<_>, _>>()?;
        let sides = sides.clone();
        agg = tokio::task::spawn_blocking(move || {
            for (size, segment, frames) in ready {
                for (side, sel) in sides.iter().enumerate() {
                    agg.add_segment(&segment.data, &frames, sel, side)?;
                }
                agg.segments_read += 1;
                agg.bytes_read += size as u64;
            }
            Ok::<_, aggregate::AggregateError>(agg)
        })
        .await
        .map_err(internal)?
        .map_err(aggregate_error)?;
    }
    let profile_type = choose_type(&mut agg, sides[0].profile_type.as_deref())?;
    let table = state.frame_table.clone();
    let agg = tokio::task::spawn_blocking(move || agg.finish(&table).map(|()| agg))
        .await
        .map_err(internal)?
        .map_err(aggregate_error)?;
    Ok((agg, profile_type))
}

/// An unknown service is a mistake worth naming (a typo), unlike a known
/// one with no samples in the range.
async fn check_service(state: &AppState, sel: &Selection) -> Result<(), QueryError> {
    let Some(service) = &sel.service else {
        return Ok(());
    };
    if !state
        .store
        .meta
        .has_service(&sel.tenant, service)
        .await
        .map_err(internal)?
    {
        return Err(QueryError::BadRequest(format!(
            "unknown service {service:?}: tenant {:?} has no profiles of it \
             (GET /api/v1/services lists the known ones)",
            sel.tenant
        )));
    }
    Ok(())
}

async fn segments_of(state: &AppState, sel: &Selection) -> Result<Vec<SegmentRef>, QueryError> {
    let meta = &state.store.meta;
    let found = match &sel.trace_id {
        Some(trace) => meta
            .trace_segments(&sel.tenant, trace)
            .await
            .map_err(internal)?
            .into_iter()
            .filter(|s| s.start_ns < sel.to_ns && s.end_ns >= sel.from_ns)
            .collect(),
        None => meta
            .segments(&SeriesQuery {
                tenant: sel.tenant.clone(),
                service: sel.service.clone(),
                profile_type: sel.profile_type.clone(),
                from_ns: sel.from_ns,
                to_ns: sel.to_ns,
            })
            .await
            .map_err(internal)?,
    };
    Ok(found)
}

pub async fn read(state: &AppState, sha256: &str) -> Result<Arc<Segment>, QueryError> {
    if let Some(hit) = state.segment_cache.get(sha256) {
        metrics::counter!("symtrace_segment_cache_total", "result" => "hit").increment(1);
        return Ok(hit);
    }
    metrics::counter!("symtrace_segment_cache_total", "result" => "miss").increment(1);
    let data = Arc::new(Segment::new(
        state.profiles.read(sha256).await.map_err(internal)?,
    ));
    state.segment_cache.insert(sha256, data.clone());
    Ok(data)
}

/// Keeps one profile type: the requested one, the only one, or the CPU
/// default; several others are a question only the caller can answer.
fn choose_type(agg: &mut Aggregate, requested: Option<&str>) -> Result<Option<String>, QueryError> {
    if let Some(t) = requested {
        return Ok(Some(t.to_owned()));
    }
    let present = agg.pending_types();
    let chosen = match present.len() {
        0 => return Ok(None),
        1 => *present.first().expect("one"),
        _ => match present.iter().find(|&&t| agg.str(t) == DEFAULT_TYPE) {
            Some(&t) => t,
            None => {
                let names: Vec<&str> = present.iter().map(|&t| agg.str(t)).collect();
                return Err(QueryError::BadRequest(format!(
                    "the selection has several profile types ({}); pick one with type=",
                    names.join(", ")
                )));
            }
        },
    };
    if present.len() > 1 {
        agg.retain_type(chosen);
    }
    Ok(Some(agg.str(chosen).to_owned()))
}
