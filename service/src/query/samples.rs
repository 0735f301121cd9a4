//! A selection's stored samples, raw (frames as stored: native ones
//! unsymbolized), for export, debugging and tests
//! (`GET /api/v1/profiles/samples`). Flamegraphs come from [`super::run`].

use serde::Deserialize;
use serde_json::{json, Value};
use symtrace_profiles::selection::{DefaultRange, RawSelection};

use super::{segments_of, within_bytes, Engine, QueryError};
use crate::profiles::model::{BuildIdKind, SegmentData};
use crate::store::model::SegmentRef;

/// Most samples one answer holds.
const MAX_SAMPLES: usize = 100_000;

/// What a samples listing selects.
#[derive(Debug, Default, Deserialize)]
pub struct SamplesQuery {
    pub service: Option<String>,
    #[serde(rename = "type")]
    pub profile_type: Option<String>,
    /// Inclusive: Unix nanoseconds, `now` or `now-<n><unit>`, as every
    /// selecting endpoint takes it (default: all time).
    pub from: Option<String>,
    /// Exclusive: the same forms (default: all time).
    pub to: Option<String>,
    /// 32 hex digits: only samples linked to this trace.
    pub trace_id: Option<String>,
    pub limit: Option<usize>,
}

/// The stored samples of tenant `tenant` that `q` selects, raw, as JSON
/// (`tenant`, `segments`, `samples`, `truncated`), within the engine's
/// limits (bytes read, time).
pub async fn samples(
    engine: &Engine,
    tenant: String,
    q: SamplesQuery,
) -> Result<Value, QueryError> {
    let timeout = engine.limits.timeout;
    tokio::time::timeout(timeout, samples_of(engine, tenant, q))
        .await
        .map_err(|_| QueryError::Timeout(timeout))?
}

async fn samples_of(engine: &Engine, tenant: String, q: SamplesQuery) -> Result<Value, QueryError> {
    // The selection's forms, limits and errors are every query's; all
    // time by default.
    let sel = RawSelection {
        service: q.service.as_deref(),
        profile_type: q.profile_type.as_deref(),
        from: q.from.as_deref(),
        to: q.to.as_deref(),
        trace_id: q.trace_id.as_deref(),
        ..Default::default()
    }
    .parse_with(&tenant, DefaultRange::AllTime)?;
    let (from, to) = (sel.from_ns, sel.to_ns);
    let limit = q.limit.unwrap_or(MAX_SAMPLES).min(MAX_SAMPLES);
    let trace = sel.trace_id.map(|t| t.to_vec());
    let segments = segments_of(engine, &sel).await?;
    within_bytes(engine, &segments)?;
    let mut out = Vec::new();
    let mut truncated = false;
    // Each reference's own parts (a one-service or trace listing names
    // parts; reading their segment whole would give its samples once per
    // part), read as they are needed.
    'segments: for listed in &segments {
        for part in engine.reader.listed(listed).await? {
            let data = &part.data;
            for sample in &data.samples {
                let series = &data.series[sample.series as usize];
                if sel
                    .service
                    .as_deref()
                    .is_some_and(|s| s != data.str(series.service))
                    || sel
                        .profile_type
                        .as_deref()
                        .is_some_and(|t| t != data.profile_type(series))
                    || trace.as_deref().is_some_and(|t| {
                        sample.link == 0 || data.links[sample.link as usize][..16] != *t
                    })
                {
                    continue;
                }
                let keep: Vec<usize> = if sample.timestamps.is_empty() {
                    let inside = (series.start_ns as i64) < to && series.end_ns as i64 >= from;
                    if !inside {
                        continue;
                    }
                    (0..sample.values.len()).collect()
                } else {
                    (0..sample.timestamps.len())
                        .filter(|&i| (from..to).contains(&(sample.timestamps[i] as i64)))
                        .collect()
                };
                if keep.is_empty() {
                    continue;
                }
                if out.len() == limit {
                    truncated = true;
                    break 'segments;
                }
                out.push(sample_json(data, sample, &keep));
            }
        }
    }
    // A segment once, however many of its parts were listed.
    let mut seen = std::collections::HashSet::new();
    let listed: Vec<&SegmentRef> = segments
        .iter()
        .filter(|s| seen.insert(s.sha256.as_str()))
        .collect();
    Ok(json!({
        "tenant": tenant,
        "segments": listed.iter().map(|s| json!({
            "sha256": s.sha256,
            "level": s.level,
            "start_ns": s.start_ns,
            "end_ns": s.end_ns,
            "points": s.points,
            "size": s.size,
        })).collect::<Vec<_>>(),
        "samples": out,
        "truncated": truncated,
    }))
}

fn labels(data: &SegmentData, set: u32) -> Value {
    data.label_sets[set as usize]
        .iter()
        .map(|&(k, v)| {
            (
                data.str(k).to_owned(),
                Value::String(data.str(v).to_owned()),
            )
        })
        .collect::<serde_json::Map<_, _>>()
        .into()
}

fn sample_json(
    data: &SegmentData,
    sample: &crate::profiles::model::Sample,
    keep: &[usize],
) -> Value {
    let series = &data.series[sample.series as usize];
    let stack: Vec<Value> = data.stacks[sample.stack as usize]
        .iter()
        .map(|&f| {
            let frame = &data.frames[f as usize];
            let mapping = &data.mappings[frame.mapping as usize];
            let mut v = json!({
                "type": data.str(frame.frame_type),
                "address": format!("{:#x}", frame.address),
                "lines": frame.lines.iter().map(|l| json!({
                    "function": data.str(l.function),
                    "system_name": data.str(l.system_name),
                    "file": data.str(l.file),
                    "line": l.line,
                    "column": l.column,
                })).collect::<Vec<_>>(),
            });
            if frame.mapping != 0 {
                v["mapping"] = json!({
                    "build_id": data.str(mapping.build_id),
                    "build_id_kind": BuildIdKind::as_str(mapping.build_id_kind),
                    "file": data.str(mapping.file),
                    "memory_start": format!("{:#x}", mapping.memory_start),
                    "memory_limit": format!("{:#x}", mapping.memory_limit),
                    "file_offset": format!("{:#x}", mapping.file_offset),
                });
            }
            v
        })
        .collect();
    let link = &data.links[sample.link as usize];
    let mut v = json!({
        "service": data.str(series.service),
        "profile_type": data.profile_type(series),
        "period": series.period,
        "resource": labels(data, series.labels),
        "labels": labels(data, sample.labels),
        "stack": stack,
        "timestamps": keep.iter().filter_map(|&i| sample.timestamps.get(i).map(|t| t.to_string())).collect::<Vec<_>>(),
        "values": keep.iter().filter_map(|&i| sample.values.get(i)).collect::<Vec<_>>(),
    });
    if sample.link != 0 {
        v["trace_id"] = hex::encode(&link[..16]).into();
        v["span_id"] = hex::encode(&link[16..]).into();
    }
    v
}
