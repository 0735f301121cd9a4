//! A trace's profile per span: which spans have samples linked to them,
//! how many, and how much CPU time they stand for.

use std::collections::BTreeMap;

use crate::model::{SegmentData, Series};

/// One span's samples of one service and profile type.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct SpanRow {
    /// Events (each timestamp counts).
    pub samples: u64,
    /// The samples' values summed.
    pub value: i64,
    /// CPU nanoseconds, when the type measures CPU time.
    pub cpu_ns: Option<i64>,
    /// The earliest and latest sample time, when samples have times.
    pub first_ns: Option<u64>,
    /// See `first_ns`.
    pub last_ns: Option<u64>,
}

/// (span ID, service, profile type).
pub type SpanKey = ([u8; 8], String, String);

/// The spans of one trace, filled segment by segment.
#[derive(Debug, Default)]
pub struct TraceSpans {
    /// Per (span, service, profile type), in that order.
    pub rows: BTreeMap<SpanKey, SpanRow>,
}

impl TraceSpans {
    /// Adds the samples of `data` linked to `trace_id`.
    pub fn add_segment(&mut self, data: &SegmentData, trace_id: &[u8; 16]) {
        for sample in &data.samples {
            let Some(link) = data.links.get(sample.link as usize) else {
                continue;
            };
            if sample.link == 0 || link[..16] != trace_id[..] {
                continue;
            }
            let Some(series) = data.series.get(sample.series as usize) else {
                continue;
            };
            let span: [u8; 8] = link[16..].try_into().expect("8 bytes");
            let key = (
                span,
                data.str(series.service).to_owned(),
                data.profile_type(series),
            );
            let row = self.rows.entry(key).or_default();
            let total = sample.total();
            row.samples += sample.points() as u64;
            row.value = row.value.saturating_add(total);
            if let Some(ns) = cpu_ns(data, series, total) {
                let sum = row.cpu_ns.get_or_insert(0);
                *sum = sum.saturating_add(ns);
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

    /// CPU nanoseconds over every span.
    pub fn total_cpu_ns(&self) -> i64 {
        self.rows
            .values()
            .filter_map(|r| r.cpu_ns)
            .fold(0i64, i64::saturating_add)
    }
}

/// CPU nanoseconds a sample value stands for, when the type says so:
/// counted samples with a CPU-time period, or CPU time itself.
pub fn cpu_ns(data: &SegmentData, series: &Series, value: i64) -> Option<i64> {
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
