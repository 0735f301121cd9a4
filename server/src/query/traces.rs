//! A trace's CPU profile per span: which spans have samples linked to
//! them, how many, and how much CPU time they stand for.

use serde_json::{json, Value};
use symtrace_profiles::trace::TraceSpans;

use super::{internal, read_segment, Engine, QueryError};
use crate::store::model::SegmentRef;

pub async fn trace(state: &Engine, tenant: &str, trace_id: [u8; 16]) -> Result<Value, QueryError> {
    let segments = state
        .meta
        .trace_segments(tenant, &trace_id)
        .await
        .map_err(internal)?;
    let bytes: u64 = segments.iter().map(SegmentRef::read_bytes).sum();
    let limit = state.limits.max_bytes;
    if bytes > limit {
        return Err(QueryError::TooLarge { bytes, limit });
    }
    let mut spans = TraceSpans::default();
    for segment in &segments {
        for part in read_segment(state, segment).await? {
            spans.add_segment(&part.data, &trace_id);
        }
    }
    let trace_hex = hex::encode(trace_id);
    let total_cpu = spans.total_cpu_ns();
    let mut spans: Vec<Value> = spans
        .rows
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
        "bytes_read": bytes,
        "cpu_ns": total_cpu,
        "spans": spans,
        "flamegraph": format!("/api/v1/flamegraph?trace_id={trace_hex}"),
    }))
}
