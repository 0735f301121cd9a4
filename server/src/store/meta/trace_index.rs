//! Which uncompacted segments hold a trace, answered in memory. Ingest
//! stores each level-0 segment's linked trace IDs in its row, sorted (one
//! column write, no row per trace: a row per trace and export was most of
//! the ingest cost when measured). A replica reads each segment's list
//! once, keeps it here as sorted 64-bit prefixes, and answers a lookup by
//! binary search — never by searching blobs or columns in the database.
//! Compacted segments are found through the `profile_traces` table.
//!
//! The lists of segments compacted or expired away are dropped on the next
//! lookup of their tenant (the caller passes the tenant's live level-0
//! segments); past [`TraceIndex::budget`] bytes the index starts over.

use std::collections::HashMap;
use std::sync::Mutex;

use crate::store::model::SegmentRef;

/// Bytes of trace-ID prefixes kept over all tenants (8 per trace).
pub const DEFAULT_BUDGET: usize = 256 << 20;

/// One level-0 segment: its reference and its traces' prefixes, sorted.
struct Entry {
    sha256: String,
    segment: SegmentRef,
    prefixes: Box<[u64]>,
}

/// The first 8 bytes of a trace ID as a number. Trace IDs are random (W3C
/// Trace Context), so two distinct IDs share a prefix with probability
/// 2^-64: in practice the check is exact, and a collision would only cost
/// reading one segment that holds no sample of the trace.
fn prefix(trace_id: &[u8]) -> u64 {
    let mut b = [0u8; 8];
    let n = trace_id.len().min(8);
    b[..n].copy_from_slice(&trace_id[..n]);
    u64::from_be_bytes(b)
}

/// A segment's sorted 16-byte trace IDs as sorted prefixes; None when the
/// column is not a whole number of IDs (a damaged row: read the segment).
pub fn prefixes(list: &[u8]) -> Option<Box<[u64]>> {
    if list.len() % 16 != 0 {
        return None;
    }
    let mut out: Vec<u64> = list.chunks_exact(16).map(prefix).collect();
    out.sort_unstable();
    out.dedup();
    Some(out.into_boxed_slice())
}

/// Trace IDs of level-0 segments, per tenant and segment row ID.
pub struct TraceIndex {
    budget: usize,
    inner: Mutex<Inner>,
}

#[derive(Default)]
struct Inner {
    tenants: HashMap<String, HashMap<i64, Entry>>,
    bytes: usize,
}

impl Default for TraceIndex {
    fn default() -> Self {
        Self::new(DEFAULT_BUDGET)
    }
}

impl TraceIndex {
    /// An empty index keeping at most `budget` bytes of prefixes.
    pub fn new(budget: usize) -> Self {
        Self {
            budget,
            inner: Mutex::default(),
        }
    }

    /// Of a tenant's live level-0 segments (row ID, sha256), those not
    /// indexed yet; forgets the tenant's segments that are not live any
    /// more.
    pub fn missing(&self, tenant: &str, live: &[(i64, String)]) -> Vec<i64> {
        let mut inner = self.inner.lock().expect("trace index");
        let Inner { tenants, bytes } = &mut *inner;
        let Some(known) = tenants.get_mut(tenant) else {
            return live.iter().map(|(id, _)| *id).collect();
        };
        let live_ids: HashMap<i64, &str> = live.iter().map(|(id, s)| (*id, s.as_str())).collect();
        known.retain(|id, e| {
            let keep = live_ids.get(id) == Some(&e.sha256.as_str());
            if !keep {
                *bytes -= e.prefixes.len() * 8;
            }
            keep
        });
        live.iter()
            .filter(|(id, _)| !known.contains_key(id))
            .map(|(id, _)| *id)
            .collect()
    }

    /// Adds a segment's list (from its row); a list that does not parse is
    /// kept as "may hold any trace".
    pub fn insert(&self, tenant: &str, id: i64, segment: SegmentRef, list: Option<&[u8]>) {
        let prefixes = match list {
            Some(list) => prefixes(list),
            None => Some(Box::default()),
        };
        let prefixes = prefixes.unwrap_or_else(|| Box::new([u64::MAX]));
        let mut inner = self.inner.lock().expect("trace index");
        let size = prefixes.len() * 8;
        if inner.bytes + size > self.budget {
            tracing::info!(
                budget = self.budget,
                "trace index over its budget: starting over"
            );
            *inner = Inner::default();
        }
        inner.bytes += size;
        let entry = Entry {
            sha256: segment.sha256.clone(),
            segment,
            prefixes,
        };
        if let Some(old) = inner
            .tenants
            .entry(tenant.to_owned())
            .or_default()
            .insert(id, entry)
        {
            inner.bytes -= old.prefixes.len() * 8;
        }
    }

    /// The indexed segments of `tenant` among `live` that may hold
    /// `trace_id`, and the live ones not indexed (the index started over
    /// meanwhile: the caller fetches and checks those itself).
    pub fn lookup(
        &self,
        tenant: &str,
        live: &[(i64, String)],
        trace_id: &[u8],
    ) -> (Vec<SegmentRef>, Vec<i64>) {
        let want = prefix(trace_id);
        let inner = self.inner.lock().expect("trace index");
        let known = inner.tenants.get(tenant);
        let mut hits = Vec::new();
        let mut unknown = Vec::new();
        for (id, sha256) in live {
            match known
                .and_then(|k| k.get(id))
                .filter(|e| &e.sha256 == sha256)
            {
                Some(e) => {
                    // A damaged list (u64::MAX alone) may hold anything.
                    let damaged = e.prefixes.len() == 1 && e.prefixes[0] == u64::MAX;
                    if damaged || e.prefixes.binary_search(&want).is_ok() {
                        hits.push(e.segment.clone());
                    }
                }
                None => unknown.push(*id),
            }
        }
        (hits, unknown)
    }

    /// Bytes of prefixes held.
    #[cfg(test)]
    pub fn bytes(&self) -> usize {
        self.inner.lock().expect("trace index").bytes
    }
}

/// Whether a row's list holds `trace_id` (for rows the index could not
/// keep).
pub fn list_holds(list: Option<&[u8]>, trace_id: &[u8]) -> bool {
    match list {
        None => false,
        Some(list) if list.len() % 16 != 0 => true,
        Some(list) => list
            .chunks_exact(16)
            .collect::<Vec<_>>()
            .binary_search(&trace_id)
            .is_ok(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn segment(sha: &str) -> SegmentRef {
        SegmentRef {
            sha256: sha.into(),
            size: 1,
            start_ns: 0,
            end_ns: 1,
            points: 1,
            level: 0,
            part_offset: None,
            part_size: None,
        }
    }

    fn list(ids: &[[u8; 16]]) -> Vec<u8> {
        let mut ids = ids.to_vec();
        ids.sort();
        ids.concat()
    }

    #[test]
    fn lookups_find_exactly_the_segments_of_a_trace() {
        let index = TraceIndex::new(1 << 20);
        let (a, b, c) = ([1u8; 16], [2u8; 16], [3u8; 16]);
        let live = vec![
            (1, "s1".to_owned()),
            (2, "s2".to_owned()),
            (3, "s3".to_owned()),
        ];
        assert_eq!(index.missing("t", &live), vec![1, 2, 3]);
        index.insert("t", 1, segment("s1"), Some(&list(&[a, b])));
        index.insert("t", 2, segment("s2"), Some(&list(&[c])));
        index.insert("t", 3, segment("s3"), None);
        assert!(index.missing("t", &live).is_empty());
        let shas = |r: (Vec<SegmentRef>, Vec<i64>)| -> Vec<String> {
            assert!(r.1.is_empty());
            r.0.into_iter().map(|s| s.sha256).collect()
        };
        assert_eq!(shas(index.lookup("t", &live, &a)), ["s1"]);
        assert_eq!(shas(index.lookup("t", &live, &c)), ["s2"]);
        assert!(shas(index.lookup("t", &live, &[9; 16])).is_empty());
        // Another tenant sees none of them.
        assert_eq!(index.lookup("u", &live, &a).1, vec![1, 2, 3]);
        // s1 compacted away: forgotten, its bytes given back.
        let live2 = vec![(2, "s2".to_owned()), (3, "s3".to_owned())];
        assert_eq!(index.bytes(), 3 * 8);
        assert!(index.missing("t", &live2).is_empty());
        assert_eq!(index.bytes(), 8);
        assert!(shas(index.lookup("t", &live2, &a)).is_empty());
        // A reused row ID with another segment is not taken for the old one.
        let live3 = vec![(2, "other".to_owned())];
        assert_eq!(index.missing("t", &live3), vec![2]);
    }

    #[test]
    fn a_damaged_list_may_hold_any_trace_and_the_budget_starts_over() {
        let index = TraceIndex::new(16);
        let live = vec![(1, "s1".to_owned())];
        index.insert("t", 1, segment("s1"), Some(&[0u8; 15]));
        assert_eq!(index.lookup("t", &live, &[7; 16]).0.len(), 1);
        index.insert("t", 2, segment("s2"), Some(&list(&[[1; 16], [2; 16]])));
        index.insert("t", 3, segment("s3"), Some(&list(&[[3; 16], [4; 16]])));
        assert!(index.bytes() <= 16, "over the budget: started over");
        assert!(list_holds(Some(&list(&[[1; 16], [5; 16]])), &[5; 16]));
        assert!(!list_holds(Some(&list(&[[1; 16]])), &[5; 16]));
        assert!(!list_holds(None, &[5; 16]));
        assert!(list_holds(Some(&[0; 3]), &[5; 16]));
    }
}
