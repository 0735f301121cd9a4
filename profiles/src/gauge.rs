//! Gauge profile types: what a sample says is a level at its time (bytes
//! in use), not an amount that happened (bytes allocated). Summing a
//! gauge's snapshots over a range would count the same live memory once
//! per snapshot, so a query answers, per series (a process: the same
//! service and resource labels), its latest snapshot in the range — or the
//! average of its snapshots, when asked — and adds the series up.

use rustc_hash::{FxHashMap, FxHashSet};

use crate::model::Side;

/// How a gauge type's snapshots in a range become one value per stack.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum GaugeMode {
    /// Each series' latest snapshot in the range (the default).
    #[default]
    Latest,
    /// The mean over each series' snapshots in the range (a stack missing
    /// from a snapshot counts 0 there).
    Average,
}

impl GaugeMode {
    /// `latest` or `average`.
    pub fn parse(text: &str) -> Result<GaugeMode, GaugeError> {
        match text {
            "" | "latest" => Ok(GaugeMode::Latest),
            "average" | "avg" => Ok(GaugeMode::Average),
            other => Err(GaugeError(other.to_owned())),
        }
    }
}

/// A `gauge` parameter that is neither `latest` nor `average`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("gauge {0:?} is not latest or average (how in-use snapshots in the range are combined)")]
pub struct GaugeError(pub String);

/// Whether a sample type is a gauge: the in-use memory types
/// (`inuse_space`, `inuse_objects`, as pprof and the OpenTelemetry eBPF
/// profiler name them).
pub fn is_gauge(sample_type: &str) -> bool {
    sample_type.starts_with("inuse_")
}

#[derive(Default)]
struct Series {
    latest: Option<u64>,
    /// Stack → value at `latest` (Latest), or summed over every snapshot
    /// (Average).
    values: FxHashMap<u32, i64>,
    /// Events at `latest` (Latest) or in all (Average).
    points: u64,
    /// The snapshot times seen (Average).
    snapshots: FxHashSet<u64>,
}

/// The gauge samples of a query, per (side, type, series).
#[derive(Default)]
pub struct Gauges {
    /// By (side, type, series identity): the two numbers are strings of
    /// the caller's table.
    series: FxHashMap<(Side, u32, u32), Series>,
}

impl Gauges {
    /// One event of a gauge series: `value` for `stack` at time `t`.
    #[allow(clippy::too_many_arguments)]
    pub fn add(
        &mut self,
        mode: GaugeMode,
        side: Side,
        ty: u32,
        series: u32,
        stack: u32,
        t: u64,
        value: i64,
    ) {
        let s = self.series.entry((side, ty, series)).or_default();
        match mode {
            GaugeMode::Latest => {
                if s.latest.is_none_or(|l| t > l) {
                    s.latest = Some(t);
                    s.values.clear();
                    s.points = 0;
                }
                if s.latest != Some(t) {
                    return; // an older snapshot
                }
            }
            GaugeMode::Average => {
                s.snapshots.insert(t);
            }
        }
        let v = s.values.entry(stack).or_default();
        *v = v.saturating_add(value);
        s.points += 1;
    }

    /// What the series add up to: per (side, type, stack) its value, and
    /// per (side, type) the events that made it. The gauges are empty
    /// afterwards.
    #[allow(clippy::type_complexity)]
    pub fn settle(
        &mut self,
        mode: GaugeMode,
    ) -> (
        FxHashMap<(Side, u32, u32), i64>,
        FxHashMap<(Side, u32), u64>,
    ) {
        let mut values: FxHashMap<(Side, u32, u32), i64> = FxHashMap::default();
        let mut points: FxHashMap<(Side, u32), u64> = FxHashMap::default();
        for ((side, ty, _), s) in self.series.drain() {
            let n = match mode {
                GaugeMode::Latest => 1,
                GaugeMode::Average => s.snapshots.len().max(1),
            };
            *points.entry((side, ty)).or_default() += s.points;
            for (stack, v) in s.values {
                let value = if n == 1 {
                    v
                } else {
                    (v as f64 / n as f64).round() as i64
                };
                let e = values.entry((side, ty, stack)).or_default();
                *e = e.saturating_add(value);
            }
        }
        (values, points)
    }

    /// Whether nothing was added.
    pub fn is_empty(&self) -> bool {
        self.series.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn latest_snapshot_per_series_added_up() {
        let mut g = Gauges::default();
        let m = GaugeMode::Latest;
        // Process 1: snapshots at 10 and 20; process 2: at 15 only.
        g.add(m, 0, 1, 1, 7, 10, 100);
        g.add(m, 0, 1, 1, 8, 10, 50);
        g.add(m, 0, 1, 1, 7, 20, 300);
        g.add(m, 0, 1, 1, 8, 15, 999); // older than 20: ignored
        g.add(m, 0, 1, 2, 7, 15, 40);
        let (values, points) = g.settle(m);
        assert_eq!(
            values.into_iter().collect::<Vec<_>>(),
            vec![((0, 1, 7), 340)]
        );
        assert_eq!(points.into_iter().collect::<Vec<_>>(), vec![((0, 1), 2)]);
        assert!(g.is_empty());
    }

    #[test]
    fn average_of_snapshots() {
        let mut g = Gauges::default();
        let m = GaugeMode::Average;
        g.add(m, 0, 1, 9, 7, 10, 100);
        g.add(m, 0, 1, 9, 7, 20, 300);
        g.add(m, 0, 1, 9, 8, 20, 50); // absent at 10: counts 0 there
        let mut rows: Vec<(u32, i64)> = g
            .settle(m)
            .0
            .into_iter()
            .map(|((_, _, stack), v)| (stack, v))
            .collect();
        rows.sort();
        assert_eq!(rows, vec![(7, 200), (8, 25)]);
    }

    #[test]
    fn modes_and_types() {
        assert_eq!(GaugeMode::parse("").unwrap(), GaugeMode::Latest);
        assert_eq!(GaugeMode::parse("average").unwrap(), GaugeMode::Average);
        assert!(GaugeMode::parse("sum").is_err());
        assert!(is_gauge("inuse_space") && is_gauge("inuse_objects"));
        assert!(!is_gauge("alloc_space") && !is_gauge("samples"));
    }
}
