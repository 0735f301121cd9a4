//! A trace's CPU profile per span: which spans have samples linked to
//! them, how many, and how much CPU time they stand for.

use std::collections::BTreeMap;

use serde_json::{json, Value};

use crate::app::AppState;
use crate::profiles::model::SegmentData;
use crate::profiles::store::profile_type;

use super::{internal, read, QueryError};

#[derive(Default)]
struct SpanRow {
    samples: u64,
    value: i64,
    cpu_ns: Option<i64>,
    first_ns: Option<u64>,
    last_ns: Option<u64>,
}

/// CPU nanoseconds a sample value stands for, when the type says so:
/// counted samples with a CPU-time period, or CPU time itself.
fn cpu_ns(data: &SegmentData, series: &crate::profiles::model::Series, value: i64) -> Option<i64> {
    let (ty, unit) = (data.str(series.sample_type), data.str(series.sample_unit));
    let (pty, punit) = (data.str(series.period_type), data.str(series.period_unit));
    if unit == "nanoseconds" && (ty == "cpu" || ty == "on_cpu") {
        Some(value)
    } else if unit == "count" && pty == "cpu" && punit == "nanoseconds" && series.period > 0 {
        Some(value.saturating_mul(series.period))
    } else {
        None
    }
}

pub async fn trace(
    state: &AppState,
    tenant: &str,
    trace_id: [u8; 16],
) -> Result<Value, QueryError> {
    let segments = state
        .store
        .meta
        .trace_segments(tenant, &trace_id)
        .await
        .map_err(internal)?;
    let bytes: u64 = segments.iter().map(|s| s.size as u64).sum();
    let limit = state.query_limits.max_bytes;
    if bytes > limit {
        return Err(QueryError::TooLarge { bytes, limit });
    }
    // (span, service, profile type) → row.
    let mut rows: BTreeMap<([u8; 8], String, String), SpanRow> = BTreeMap::new();
    for segment in &segments {
        let segment = read(state, &segment.sha256).await?;
        let data = &segment.data;
        for sample in &data.samples {
            let link = &data.links[sample.link as usize];
            if sample.link == 0 || link[..16] != trace_id {
                continue;
            }
            let series = &data.series[sample.series as usize];
            let span: [u8; 8] = link[16..].try_into().expect("8 bytes");
            let key = (
                span,
                data.str(series.service).to_owned(),
                profile_type(data, series),
            );
            let row = rows.entry(key).or_default();
            let total = sample.total();
            row.samples += sample.points() as u64;
            row.value += total;
            if let Some(ns) = cpu_ns(data, series, total) {
                *row.cpu_ns.get_or_insert(0) += ns;
            }
            if let (Some(&lo), Some(&hi)) = (
                sample.timestamps.iter().min(),
                sample.timestamps.iter().max(),
            ) {
                row.first_ns = Some(row.first_ns.map_or(lo, |f| f.min(lo)));
                row.last_ns = Some(row.last_ns.map_or(hi, |l| l.max(hi)));
            }
        }
    }
    let trace_hex = hex::encode(trace_id);
    let total_cpu: i64 = rows.values().filter_map(|r| r.cpu_ns).sum();
    let mut spans: Vec<Value> = rows
        .into_iter()
        .map(|((span, service, ty), r)| {
            let span_hex = hex::encode(span);
            json!({
                "span_id": span_hex,
                "service": service,
                "profile_type": ty,
                "samples": r.samples,
                "value": r.value,
                "cpu_ns": r.cpu_ns,
                "cpu_share": r.cpu_ns.filter(|_| total_cpu > 0)
                    .map(|ns| ns as f64 / total_cpu as f64),
                "first_ns": r.first_ns.map(|t| t.to_string()),
                "last_ns": r.last_ns.map(|t| t.to_string()),
                "flamegraph": format!(
                    "/api/v1/flamegraph?trace_id={trace_hex}&span_id={span_hex}&type={ty}"
                ),
            })
        })
        .collect();
    spans.sort_by(|a, b| {
        let k = |v: &Value| {
            (
                v["cpu_ns"].as_i64().unwrap_or(0),
                v["value"].as_i64().unwrap_or(0),
            )
        };
        k(b).cmp(&k(a))
    });
    Ok(json!({
        "trace_id": trace_hex,
        "tenant": tenant,
        "segments_read": segments.len(),
        "cpu_ns": total_cpu,
        "spans": spans,
        "flamegraph": format!("/api/v1/flamegraph?trace_id={trace_hex}"),
    }))
}
