//! Query parameters shared by the flamegraph, diff and trace endpoints,
//! validated into a [`Selection`] with messages that say what was wrong.

use std::time::{SystemTime, UNIX_EPOCH};

use crate::gauge::{GaugeError, GaugeMode};
use crate::selector::{Selector, SelectorError};

/// Default time range when `from` is absent: the last hour.
const DEFAULT_RANGE_NS: i64 = 3600 * 1_000_000_000;
/// The default `max_nodes`.
pub const DEFAULT_MAX_NODES: usize = 8192;
/// The largest `max_nodes`.
pub const MAX_MAX_NODES: usize = 100_000;

/// Why a selection's parameters were refused: the message says what was
/// wrong (a 400 at every edge).
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum SelectionError {
    /// A time given as negative Unix nanoseconds.
    #[error("{name} ({ns}) is negative")]
    Negative {
        /// The parameter (`from`, `to`).
        name: &'static str,
        /// Its value.
        ns: i64,
    },
    /// A time in neither form.
    #[error(
        "{name} {text:?} is neither unix nanoseconds nor now-<n><unit> \
         (unit s, m, h or d, e.g. now-1h)"
    )]
    Time {
        /// The parameter.
        name: &'static str,
        /// Its text.
        text: String,
    },
    /// `from` not before `to`.
    #[error("the time range is empty or inverted: from ({from}) must be before to ({to})")]
    EmptyRange {
        /// Unix nanoseconds.
        from: i64,
        /// Unix nanoseconds.
        to: i64,
    },
    /// An ID that is not `digits` hex digits.
    #[error("{name} {text:?} is not {digits} hex digits")]
    NotHex {
        /// The parameter (`trace_id`, `span_id`).
        name: &'static str,
        /// Its text.
        text: String,
        /// The digits it must have.
        digits: usize,
    },
    /// An ID of zeros (no trace or span has it).
    #[error("{name} is all zeros (not a valid ID)")]
    ZeroId {
        /// The parameter.
        name: &'static str,
    },
    /// A span without its trace.
    #[error("span_id needs a trace_id")]
    SpanWithoutTrace,
    /// A profile type not of four parts.
    #[error(
        "type {0:?} is not sample_type:unit:period_type:unit \
         (for example samples:count:cpu:nanoseconds)"
    )]
    ProfileType(String),
    /// A `max_nodes` out of its range.
    #[error("max_nodes {0:?} must be a whole number from 1 to {MAX_MAX_NODES}")]
    MaxNodes(String),
    /// The label selector.
    #[error(transparent)]
    Selector(#[from] SelectorError),
    /// The gauge mode.
    #[error(transparent)]
    Gauge(#[from] GaugeError),
}

/// What samples a query aggregates.
#[derive(Debug, Clone, Default)]
pub struct Selection {
    /// The tenant whose samples are selected.
    pub tenant: String,
    /// Only this service (`service.name`).
    pub service: Option<String>,
    /// Only this profile type (`sample_type:unit:period_type:unit`).
    pub profile_type: Option<String>,
    /// Unix nanoseconds, `[from, to)`.
    pub from_ns: i64,
    /// See `from_ns`.
    pub to_ns: i64,
    /// Label matchers.
    pub selector: Selector,
    /// Only samples linked to this trace.
    pub trace_id: Option<[u8; 16]>,
    /// Only samples linked to this span (needs `trace_id`).
    pub span_id: Option<[u8; 8]>,
    /// How gauge types' (in-use memory) snapshots in the range combine.
    pub gauge: GaugeMode,
}

/// The raw parameters of one selection.
#[derive(Debug, Default, Clone)]
pub struct RawSelection<'a> {
    /// `service`.
    pub service: Option<&'a str>,
    /// `type`.
    pub profile_type: Option<&'a str>,
    /// `from`: Unix nanoseconds or `now-<n><unit>`.
    pub from: Option<&'a str>,
    /// `to`: the same forms.
    pub to: Option<&'a str>,
    /// `selector`: `{name="value", …}`.
    pub selector: Option<&'a str>,
    /// `trace_id`: 32 hex digits.
    pub trace_id: Option<&'a str>,
    /// `span_id`: 16 hex digits.
    pub span_id: Option<&'a str>,
    /// `gauge`: `latest` (default) or `average`.
    pub gauge: Option<&'a str>,
}

/// What a selection without `from` (or `to`) covers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DefaultRange {
    /// The hour before `to` (before now without one): the query API's.
    LastHour,
    /// All time: the raw samples listing's, and any selection of a trace.
    AllTime,
}

impl RawSelection<'_> {
    /// Validates the parameters into a selection of `tenant`'s samples; the
    /// error says what was wrong. Without `from`, the last hour.
    pub fn parse(&self, tenant: &str) -> Result<Selection, SelectionError> {
        self.parse_with(tenant, DefaultRange::LastHour)
    }

    /// [`Self::parse`], with `default` as the range a missing `from` or
    /// `to` leaves.
    pub fn parse_with(
        &self,
        tenant: &str,
        default: DefaultRange,
    ) -> Result<Selection, SelectionError> {
        let now = now_ns();
        // A trace is found through the index whenever it ran: its default
        // range is all time.
        let by_trace =
            self.trace_id.is_some_and(|t| !t.is_empty()) || default == DefaultRange::AllTime;
        let to = match self.to.filter(|t| !t.is_empty()) {
            Some(t) => parse_time("to", t, now)?,
            None if by_trace => i64::MAX,
            None => now,
        };
        let from = match self.from.filter(|t| !t.is_empty()) {
            Some(f) => parse_time("from", f, now)?,
            None if by_trace => 0,
            None => to.saturating_sub(DEFAULT_RANGE_NS),
        };
        if from >= to {
            return Err(SelectionError::EmptyRange { from, to });
        }
        let trace_id = self
            .trace_id
            .filter(|t| !t.is_empty())
            .map(|t| hex_id::<16>("trace_id", t))
            .transpose()?;
        let span_id = self
            .span_id
            .filter(|t| !t.is_empty())
            .map(|t| hex_id::<8>("span_id", t))
            .transpose()?;
        if span_id.is_some() && trace_id.is_none() {
            return Err(SelectionError::SpanWithoutTrace);
        }
        Ok(Selection {
            tenant: tenant.to_owned(),
            service: self.service.filter(|s| !s.is_empty()).map(str::to_owned),
            profile_type: self
                .profile_type
                .filter(|s| !s.is_empty())
                .map(|t| {
                    if t.split(':').count() == 4 {
                        Ok(t.to_owned())
                    } else {
                        Err(SelectionError::ProfileType(t.to_owned()))
                    }
                })
                .transpose()?,
            from_ns: from,
            to_ns: to,
            selector: Selector::parse(self.selector.unwrap_or(""))?,
            trace_id,
            span_id,
            gauge: GaugeMode::parse(self.gauge.unwrap_or(""))?,
        })
    }
}

/// Now, in Unix nanoseconds.
pub fn now_ns() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_nanos() as i64)
        .unwrap_or(0)
}

/// Unix nanoseconds, `now`, or `now-<n><unit>` with unit s, m, h or d.
pub fn parse_time(name: &'static str, text: &str, now: i64) -> Result<i64, SelectionError> {
    let text = text.trim();
    if let Ok(ns) = text.parse::<i64>() {
        if ns < 0 {
            return Err(SelectionError::Negative { name, ns });
        }
        return Ok(ns);
    }
    if text == "now" {
        return Ok(now);
    }
    let bad = || SelectionError::Time {
        name,
        text: text.to_owned(),
    };
    let ago = text.strip_prefix("now-").ok_or_else(bad)?;
    let (n, unit) = ago.split_at(ago.len().saturating_sub(1));
    let n: i64 = n.parse().map_err(|_| bad())?;
    let unit: i64 = match unit {
        "s" => 1,
        "m" => 60,
        "h" => 3600,
        "d" => 86400,
        _ => return Err(bad()),
    };
    n.checked_mul(unit * 1_000_000_000)
        .filter(|d| *d >= 0)
        .map(|d| now.saturating_sub(d).max(0))
        .ok_or_else(bad)
}

fn hex_id<const N: usize>(name: &'static str, text: &str) -> Result<[u8; N], SelectionError> {
    let bytes = hex::decode(text.trim())
        .ok()
        .and_then(|b| <[u8; N]>::try_from(b).ok())
        .ok_or_else(|| SelectionError::NotHex {
            name,
            text: text.to_owned(),
            digits: N * 2,
        })?;
    if bytes == [0; N] {
        return Err(SelectionError::ZeroId { name });
    }
    Ok(bytes)
}

/// A trace ID from 32 hex digits (not all zeros).
pub fn parse_trace_id(text: &str) -> Result<[u8; 16], SelectionError> {
    hex_id::<16>("trace_id", text)
}

/// `max_nodes` (default [`DEFAULT_MAX_NODES`], 1 to [`MAX_MAX_NODES`]).
pub fn parse_max_nodes(value: Option<&str>) -> Result<usize, SelectionError> {
    let Some(v) = value.filter(|v| !v.is_empty()) else {
        return Ok(DEFAULT_MAX_NODES);
    };
    match v.parse::<usize>() {
        Ok(n) if (1..=MAX_MAX_NODES).contains(&n) => Ok(n),
        _ => Err(SelectionError::MaxNodes(v.to_owned())),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn times() {
        let now = 10_000 * 1_000_000_000;
        assert_eq!(parse_time("from", "123", now), Ok(123));
        assert_eq!(parse_time("from", "now", now), Ok(now));
        assert_eq!(
            parse_time("from", "now-1h", now),
            Ok(now - 3600 * 1_000_000_000)
        );
        assert_eq!(parse_time("from", "now-1000d", now), Ok(0));
        for bad in ["yesterday", "now-1y", "now-h", "-5", "now--1h"] {
            assert!(parse_time("from", bad, now).is_err(), "{bad}");
        }
    }

    #[test]
    fn a_missing_range_is_the_last_hour_or_all_time() {
        let none = RawSelection::default();
        let hour = none.parse("t").unwrap();
        assert_eq!(hour.to_ns - hour.from_ns, DEFAULT_RANGE_NS);
        let all = none.parse_with("t", DefaultRange::AllTime).unwrap();
        assert_eq!((all.from_ns, all.to_ns), (0, i64::MAX));
        // A bound given is kept; the other stays open.
        let from = RawSelection {
            from: Some("5"),
            ..Default::default()
        };
        let all = from.parse_with("t", DefaultRange::AllTime).unwrap();
        assert_eq!((all.from_ns, all.to_ns), (5, i64::MAX));
    }

    #[test]
    fn selections() {
        let raw = RawSelection {
            from: Some("200"),
            to: Some("100"),
            ..Default::default()
        };
        assert!(matches!(
            raw.parse("t").unwrap_err(),
            SelectionError::EmptyRange { from: 200, to: 100 }
        ));
        let raw = RawSelection {
            span_id: Some("0102030405060708"),
            ..Default::default()
        };
        assert!(matches!(
            raw.parse("t").unwrap_err(),
            SelectionError::SpanWithoutTrace
        ));
        let raw = RawSelection {
            trace_id: Some("abc"),
            ..Default::default()
        };
        assert!(matches!(
            raw.parse("t").unwrap_err(),
            SelectionError::NotHex { digits: 32, .. }
        ));
        let raw = RawSelection {
            profile_type: Some("cpu"),
            ..Default::default()
        };
        assert!(matches!(
            raw.parse("t").unwrap_err(),
            SelectionError::ProfileType(_)
        ));
        assert_eq!(parse_max_nodes(None), Ok(DEFAULT_MAX_NODES));
        assert!(parse_max_nodes(Some("0")).is_err());
        assert!(parse_max_nodes(Some("100000000")).is_err());
    }
}
