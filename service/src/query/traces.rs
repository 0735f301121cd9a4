//! A trace's CPU profile per span: which spans have samples linked to
//! them, how many, and how much CPU time they stand for.

use std::collections::BTreeMap;

use serde_json::{json, Value};
use symtrace_profiles::trace::TraceSpans;

use super::{Engine, QueryError};
use crate::store::model::SegmentRef;

pub async fn trace(state: &Engine, tenant: &str, trace_id: [u8; 16]) -> Result<Value, QueryError> {
    let segments = state.meta.trace_segments(tenant, &trace_id).await?;
    let bytes: u64 = segments.iter().map(SegmentRef::read_bytes).sum();
    let limit = state.limits.max_bytes;
    if bytes > limit {
        return Err(QueryError::TooLarge { bytes, limit });
    }
    let mut spans = TraceSpans::default();
    for segment in &segments {
        for part in state.reader.listed(segment).await? {
            spans.add_segment(&part.data, &trace_id);
        }
    }
    let trace_hex = hex::encode(trace_id);
    let total_cpu = spans.total_cpu_ns();
    let by_span = span_summaries(&spans, &trace_hex);
    let total_off_cpu: i64 = by_span
        .iter()
        .filter_map(|s| s["off_cpu_ns"].as_i64())
        .fold(0, i64::saturating_add);
    let total_alloc: i64 = by_span
        .iter()
        .filter_map(|s| s["alloc_bytes"].as_i64())
        .fold(0, i64::saturating_add);
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
                "off_cpu_ns": r.off_cpu_ns,
                "alloc_bytes": r.alloc_bytes,
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
        "off_cpu_ns": total_off_cpu,
        "alloc_bytes": total_alloc,
        "spans": spans,
        "by_span": by_span,
        "flamegraph": format!("/api/v1/flamegraph?trace_id={trace_hex}"),
    }))
}

/// Per (span, service): its running time (CPU) and waiting time (off-CPU),
/// their split, what it waited on, and the flamegraph of each; heaviest
/// first.
fn span_summaries(spans: &TraceSpans, trace_hex: &str) -> Vec<Value> {
    #[derive(Default)]
    struct Summary {
        cpu_ns: Option<i64>,
        off_cpu_ns: Option<i64>,
        waiting: BTreeMap<String, i64>,
        cpu_type: Option<String>,
        off_cpu_type: Option<String>,
        alloc_bytes: Option<i64>,
        alloc_type: Option<String>,
    }
    let add = |a: Option<i64>, b: Option<i64>| match (a, b) {
        (None, None) => None,
        (a, b) => Some(a.unwrap_or(0).saturating_add(b.unwrap_or(0))),
    };
    let mut by_span: BTreeMap<([u8; 8], &str), Summary> = BTreeMap::new();
    for ((span, service, ty), r) in &spans.rows {
        let s = by_span.entry((*span, service.as_str())).or_default();
        if r.cpu_ns.is_some() {
            s.cpu_ns = add(s.cpu_ns, r.cpu_ns);
            s.cpu_type.get_or_insert_with(|| ty.clone());
        }
        if r.alloc_bytes.is_some() {
            s.alloc_bytes = add(s.alloc_bytes, r.alloc_bytes);
            s.alloc_type.get_or_insert_with(|| ty.clone());
        }
        if r.off_cpu_ns.is_some() {
            s.off_cpu_ns = add(s.off_cpu_ns, r.off_cpu_ns);
            s.off_cpu_type.get_or_insert_with(|| ty.clone());
            for (on, ns) in &r.waiting {
                let w = s.waiting.entry(on.clone()).or_insert(0);
                *w = w.saturating_add(*ns);
            }
        }
    }
    let mut out: Vec<Value> = by_span
        .into_iter()
        .map(|((span, service), s)| {
            let span_hex = hex::encode(span);
            let wall = s.cpu_ns.unwrap_or(0).saturating_add(s.off_cpu_ns.unwrap_or(0));
            let share = |ns: Option<i64>| {
                ns.filter(|_| wall > 0 && s.off_cpu_ns.is_some())
                    .map(|ns| ns as f64 / wall as f64)
            };
            let flamegraph = |ty: &Option<String>| {
                ty.as_ref().map(|ty| {
                    format!("/api/v1/flamegraph?trace_id={trace_hex}&span_id={span_hex}&type={ty}")
                })
            };
            let mut waiting: Vec<(String, i64)> = s.waiting.into_iter().collect();
            waiting.sort_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
            json!({
                "span_id": span_hex,
                "service": service,
                "cpu_ns": s.cpu_ns,
                "off_cpu_ns": s.off_cpu_ns,
                "wall_ns": wall,
                "running_share": share(s.cpu_ns.or(Some(0))),
                "waiting_share": share(s.off_cpu_ns),
                "waiting": waiting.into_iter().map(|(on, ns)| json!({"on": on, "ns": ns})).collect::<Vec<_>>(),
                "flamegraph": flamegraph(&s.cpu_type),
                "off_cpu_flamegraph": flamegraph(&s.off_cpu_type),
                "alloc_bytes": s.alloc_bytes,
                "alloc_flamegraph": flamegraph(&s.alloc_type),
            })
        })
        .collect();
    out.sort_by_key(|v| std::cmp::Reverse(v["wall_ns"].as_i64().unwrap_or(0)));
    out
}
