//! A trace's profile per span: which spans have samples linked to them,
//! how many, how much CPU time they stand for, and how long they waited
//! off the CPU, on what.

use std::collections::{BTreeMap, HashMap};

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
    /// Nanoseconds off the CPU, when the type measures waits
    /// (`off_cpu:nanoseconds`).
    pub off_cpu_ns: Option<i64>,
    /// Of those, by what was waited on ([`crate::waits::classify`]).
    pub waiting: BTreeMap<String, i64>,
    /// Bytes allocated, when the type counts them (`alloc_space:bytes`).
    pub alloc_bytes: Option<i64>,
    /// For a gauge type (in-use memory): the time of the latest snapshot,
    /// the only one `value` holds.
    pub snapshot_ns: Option<u64>,
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
        // What each stack waited on, found once per stack.
        let mut waited_on: HashMap<u32, Option<String>> = HashMap::new();
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
            if crate::gauge::is_gauge(data.str(series.sample_type)) {
                // Not a sum over snapshots: the latest one's value.
                for (i, &t) in sample.timestamps.iter().enumerate() {
                    let v = sample.values.get(i).copied().unwrap_or(1);
                    if row.snapshot_ns.is_none_or(|l| t > l) {
                        row.snapshot_ns = Some(t);
                        row.value = 0;
                        row.samples = 0;
                    }
                    if row.snapshot_ns == Some(t) {
                        row.value = row.value.saturating_add(v);
                        row.samples += 1;
                    }
                }
                continue;
            }
            let total = sample.total();
            row.samples += sample.points() as u64;
            row.value = row.value.saturating_add(total);
            if let Some(ns) = cpu_ns(data, series, total) {
                let sum = row.cpu_ns.get_or_insert(0);
                *sum = sum.saturating_add(ns);
            }
            if data.str(series.sample_type) == "alloc_space"
                && data.str(series.sample_unit) == "bytes"
            {
                let sum = row.alloc_bytes.get_or_insert(0);
                *sum = sum.saturating_add(total);
            }
            if is_off_cpu(data, series) {
                let sum = row.off_cpu_ns.get_or_insert(0);
                *sum = sum.saturating_add(total);
                let on = waited_on
                    .entry(sample.stack)
                    .or_insert_with(|| crate::waits::classify(kernel_names(data, sample.stack)))
                    .clone()
                    .unwrap_or_else(|| "unknown".to_owned());
                let w = row.waiting.entry(on).or_insert(0);
                *w = w.saturating_add(total);
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

/// Whether a series measures time off the CPU: `off_cpu:nanoseconds`
/// (the OpenTelemetry eBPF profiler's, ours), or `events:nanoseconds`
/// without a period (that profiler's earlier name for it).
pub fn is_off_cpu(data: &SegmentData, series: &Series) -> bool {
    let (ty, unit) = (data.str(series.sample_type), data.str(series.sample_unit));
    unit == "nanoseconds"
        && (ty == "off_cpu" || (ty == "events" && data.str(series.period_type).is_empty()))
}

/// The kernel functions of a stack, leaf first.
fn kernel_names(data: &SegmentData, stack: u32) -> Vec<&str> {
    let Some(frames) = data.stacks.get(stack as usize) else {
        return Vec::new();
    };
    frames
        .iter()
        .filter_map(|&f| data.frames.get(f as usize))
        .filter(|f| data.str(f.frame_type) == "kernel")
        .filter_map(|f| f.lines.first().map(|l| data.str(l.function)))
        .collect()
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{Frame, Line, Sample, SegmentBuilder};

    #[test]
    fn a_span_has_its_cpu_time_and_its_waits_by_what_it_waited_on() {
        let mut b = SegmentBuilder::default();
        let kernel = b.string("kernel");
        let frame = |b: &mut SegmentBuilder, name: &str| {
            let function = b.string(name);
            b.frame(Frame {
                frame_type: kernel,
                lines: vec![Line {
                    function,
                    ..Line::default()
                }],
                ..Frame::default()
            })
        };
        let sleeping = [frame(&mut b, "schedule"), frame(&mut b, "do_nanosleep")];
        let reading = [frame(&mut b, "schedule"), frame(&mut b, "pipe_read")];
        let (sleep_stack, read_stack) = (b.stack(sleeping.to_vec()), b.stack(reading.to_vec()));
        let svc = b.string("svc");
        let series = |b: &mut SegmentBuilder, ty: &str, unit: &str, pty: &str, punit: &str| {
            let s = Series {
                service: svc,
                sample_type: b.string(ty),
                sample_unit: b.string(unit),
                period_type: b.string(pty),
                period_unit: b.string(punit),
                period: 10_000_000,
                ..Series::default()
            };
            b.series(s)
        };
        let cpu = series(&mut b, "samples", "count", "cpu", "nanoseconds");
        let off = series(&mut b, "off_cpu", "nanoseconds", "", "");
        let alloc = series(&mut b, "alloc_space", "bytes", "", "");
        let inuse = series(&mut b, "inuse_space", "bytes", "", "");
        let mut link = [1u8; 24];
        link[16..].copy_from_slice(&[2; 8]);
        let link = b.link(link);
        for (series, stack, values, timestamps) in [
            (cpu, sleep_stack, vec![], vec![5, 6, 7]),
            (off, sleep_stack, vec![30_000_000, 30_000_000], vec![1, 2]),
            (off, read_stack, vec![10_000_000], vec![3]),
            (alloc, read_stack, vec![4096, 8192], vec![1, 2]),
            (inuse, read_stack, vec![100, 200, 50], vec![10, 20, 20]),
        ] {
            b.add_sample(Sample {
                series,
                stack,
                link,
                values,
                timestamps,
                ..Sample::default()
            });
        }
        let data = b.finish();
        let mut spans = TraceSpans::default();
        spans.add_segment(&data, &[1; 16]);
        let rows: Vec<&SpanRow> = spans.rows.values().collect();
        assert_eq!(rows.len(), 4);
        let alloc_row = rows.iter().find(|r| r.alloc_bytes.is_some()).unwrap();
        assert_eq!(alloc_row.alloc_bytes, Some(12288));
        // In use: the latest snapshot (time 20), not the sum of both.
        let inuse_row = rows.iter().find(|r| r.snapshot_ns.is_some()).unwrap();
        assert_eq!((inuse_row.value, inuse_row.snapshot_ns), (250, Some(20)));
        let cpu_row = rows.iter().find(|r| r.cpu_ns.is_some()).unwrap();
        assert_eq!(
            (cpu_row.cpu_ns, cpu_row.off_cpu_ns),
            (Some(30_000_000), None)
        );
        let off_row = rows.iter().find(|r| r.off_cpu_ns.is_some()).unwrap();
        assert_eq!(off_row.off_cpu_ns, Some(70_000_000));
        assert_eq!(off_row.waiting.get("sleep"), Some(&60_000_000));
        assert_eq!(off_row.waiting.get("pipe"), Some(&10_000_000));
        // Another trace sees none of it.
        let mut other = TraceSpans::default();
        other.add_segment(&data, &[9; 16]);
        assert!(other.rows.is_empty());
    }
}
