//! Which uncompacted segments — and which of their parts — hold a trace,
//! answered in memory. Ingest stores each level-0 segment's linked trace
//! IDs in its row, sorted (one column write, no row per trace: a row per
//! trace and export was most of the ingest cost when measured), an ID once
//! per part holding it, and beside them each entry's part as a byte range
//! (`trace_parts`, 2 bytes per trace). A replica reads each segment's lists once, keeps them
//! here as sorted 64-bit prefixes with a part number each, and answers a
//! lookup by binary search — never by searching blobs or columns in the
//! database — with the parts to read: a trace of three services in a
//! 200-service export reads three parts, not the export.
//! Compacted segments are found through the `profile_traces` table, whose
//! `parts` column holds the same ranges.
//!
//! The lists of segments compacted or expired away are dropped on the next
//! lookup of their tenant (the caller passes the tenant's live level-0
//! segments); past [`TraceIndex::budget`] bytes the index starts over.

use std::collections::HashMap;
use std::sync::Mutex;

use crate::store::model::SegmentRef;

/// Bytes of trace-ID prefixes and part numbers kept over all tenants (16
/// per trace and part).
pub const DEFAULT_BUDGET: usize = 256 << 20;

/// An entry's part number meaning "the whole segment".
const WHOLE: u32 = u32::MAX;

/// One level-0 segment: its reference and its traces.
struct Entry {
    sha256: String,
    segment: SegmentRef,
    list: TraceList,
}

/// The first 8 bytes of a trace ID as a number. Trace IDs are random (W3C
/// Trace Context), so two distinct IDs share a prefix with probability
/// 2^-64: in practice the check is exact, and a collision would only cost
/// reading one part that holds no sample of the trace.
fn prefix(trace_id: &[u8]) -> u64 {
    let mut b = [0u8; 8];
    let n = trace_id.len().min(8);
    b[..n].copy_from_slice(&trace_id[..n]);
    u64::from_be_bytes(b)
}

/// Byte ranges as stored: (offset, length), each two u64 little-endian.
pub fn encode_ranges(ranges: impl IntoIterator<Item = (u64, u64)>) -> Vec<u8> {
    ranges
        .into_iter()
        .flat_map(|(offset, len)| offset.to_le_bytes().into_iter().chain(len.to_le_bytes()))
        .collect()
}

/// Stored byte ranges; None when the bytes are not whole ranges.
pub fn decode_ranges(bytes: &[u8]) -> Option<Vec<(u64, u64)>> {
    if bytes.len() % 16 != 0 {
        return None;
    }
    Some(
        bytes
            .chunks_exact(16)
            .map(|c| {
                let n = |b: &[u8]| u64::from_le_bytes(b.try_into().expect("8 bytes"));
                (n(&c[..8]), n(&c[8..]))
            })
            .collect(),
    )
}

/// A level-0 row's `trace_parts`: each entry's part, as a part count (u16
/// LE), the parts' (offset, length) (u64 LE each), then each entry's part
/// number (u16 LE) — 2 bytes per trace rather than 16. None (read the
/// segment whole) for more than 65,535 parts.
pub fn encode_entry_parts(entries: &[(u64, u64)]) -> Option<Vec<u8>> {
    let mut parts: Vec<(u64, u64)> = entries.to_vec();
    parts.sort_unstable();
    parts.dedup();
    let count = u16::try_from(parts.len()).ok()?;
    let mut out = Vec::with_capacity(2 + 16 * parts.len() + 2 * entries.len());
    out.extend_from_slice(&count.to_le_bytes());
    out.extend(encode_ranges(parts.iter().copied()));
    for e in entries {
        let n = parts.binary_search(e).expect("a part of the list") as u16;
        out.extend_from_slice(&n.to_le_bytes());
    }
    Some(out)
}

/// Each of `n` entries' part from [`encode_entry_parts`]' bytes; None when
/// they are not `n` entries' parts.
pub fn decode_entry_parts(bytes: &[u8], n: usize) -> Option<Vec<(u64, u64)>> {
    let count = u16::from_le_bytes(bytes.get(..2)?.try_into().ok()?) as usize;
    let ranges = decode_ranges(bytes.get(2..2 + 16 * count)?)?;
    let numbers = bytes.get(2 + 16 * count..)?;
    if numbers.len() != 2 * n {
        return None;
    }
    numbers
        .chunks_exact(2)
        .map(|c| {
            ranges
                .get(u16::from_le_bytes([c[0], c[1]]) as usize)
                .copied()
        })
        .collect()
}

/// Where a segment holds a trace.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Hit {
    /// Read it whole (one part, or parts not recorded).
    Whole,
    /// Read these parts (offset, length).
    Parts(Vec<(u64, u64)>),
}

impl Hit {
    /// The references to read for this hit of `segment`.
    pub fn refs(self, segment: &SegmentRef) -> Vec<SegmentRef> {
        match self {
            Hit::Whole => vec![segment.clone()],
            Hit::Parts(parts) => parts.into_iter().map(|p| segment.with_part(p)).collect(),
        }
    }
}

/// A segment's traces: sorted (prefix, part number) entries and the parts.
#[derive(Debug, Default)]
pub struct TraceList {
    entries: Box<[(u64, u32)]>,
    parts: Box<[(u64, u64)]>,
}

impl TraceList {
    /// A row's lists: `ids` 16 bytes each, `parts` each one's part
    /// ([`encode_entry_parts`]; None, or not one per ID: the whole segment
    /// for each). None when `ids` is damaged (not whole IDs): the segment
    /// may hold any trace.
    pub fn parse(ids: &[u8], parts: Option<&[u8]>) -> Option<Self> {
        if ids.len() % 16 != 0 {
            return None;
        }
        let n = ids.len() / 16;
        let ranges = parts.and_then(|p| decode_entry_parts(p, n));
        let mut table: Vec<(u64, u64)> = Vec::new();
        let mut numbers: HashMap<(u64, u64), u32> = HashMap::new();
        let mut entries: Vec<(u64, u32)> = Vec::with_capacity(n);
        for (i, id) in ids.chunks_exact(16).enumerate() {
            let part = match &ranges {
                Some(r) => *numbers.entry(r[i]).or_insert_with(|| {
                    table.push(r[i]);
                    table.len() as u32 - 1
                }),
                None => WHOLE,
            };
            entries.push((prefix(id), part));
        }
        entries.sort_unstable();
        entries.dedup();
        Some(Self {
            entries: entries.into_boxed_slice(),
            parts: table.into_boxed_slice(),
        })
    }

    /// "May hold any trace, anywhere" (a damaged list).
    fn any() -> Self {
        Self {
            entries: Box::new([(u64::MAX, WHOLE)]),
            parts: Box::default(),
        }
    }

    fn is_any(&self) -> bool {
        self.entries.len() == 1 && self.entries[0] == (u64::MAX, WHOLE)
    }

    /// Where the segment holds `trace_id`, if it does.
    pub fn find(&self, trace_id: &[u8]) -> Option<Hit> {
        if self.is_any() {
            return Some(Hit::Whole);
        }
        let want = prefix(trace_id);
        let start = self.entries.partition_point(|&(p, _)| p < want);
        let found = &self.entries[start..];
        let found = &found[..found.partition_point(|&(p, _)| p == want)];
        if found.is_empty() {
            return None;
        }
        let mut parts = Vec::with_capacity(found.len());
        for &(_, part) in found {
            match self.parts.get(part as usize) {
                Some(&range) => parts.push(range),
                None => return Some(Hit::Whole),
            }
        }
        Some(Hit::Parts(parts))
    }

    /// Bytes held.
    fn bytes(&self) -> usize {
        self.entries.len() * 16 + self.parts.len() * 16
    }
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
                *bytes -= e.list.bytes();
            }
            keep
        });
        live.iter()
            .filter(|(id, _)| !known.contains_key(id))
            .map(|(id, _)| *id)
            .collect()
    }

    /// Adds a segment's lists (from its row: trace IDs and their parts); a
    /// list that does not parse is kept as "may hold any trace".
    pub fn insert(
        &self,
        tenant: &str,
        id: i64,
        segment: SegmentRef,
        ids: Option<&[u8]>,
        parts: Option<&[u8]>,
    ) {
        let list = match ids {
            Some(ids) => TraceList::parse(ids, parts).unwrap_or_else(TraceList::any),
            None => TraceList::default(),
        };
        let mut inner = self.inner.lock().expect("trace index");
        let size = list.bytes();
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
            list,
        };
        if let Some(old) = inner
            .tenants
            .entry(tenant.to_owned())
            .or_default()
            .insert(id, entry)
        {
            inner.bytes -= old.list.bytes();
        }
    }

    /// What to read of `tenant`'s indexed segments among `live` for
    /// `trace_id` (a part, or a whole segment, each), and the live ones not
    /// indexed (the index started over meanwhile: the caller fetches and
    /// checks those itself).
    pub fn lookup(
        &self,
        tenant: &str,
        live: &[(i64, String)],
        trace_id: &[u8],
    ) -> (Vec<SegmentRef>, Vec<i64>) {
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
                    if let Some(hit) = e.list.find(trace_id) {
                        hits.extend(hit.refs(&e.segment));
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

/// Where a row's lists hold `trace_id` (for rows the index could not
/// keep).
pub fn find_in(ids: Option<&[u8]>, parts: Option<&[u8]>, trace_id: &[u8]) -> Option<Hit> {
    match TraceList::parse(ids?, parts) {
        Some(list) => list.find(trace_id),
        None => Some(Hit::Whole),
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
        index.insert("t", 1, segment("s1"), Some(&list(&[a, b])), None);
        index.insert("t", 2, segment("s2"), Some(&list(&[c])), None);
        index.insert("t", 3, segment("s3"), None, None);
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
        assert_eq!(index.bytes(), 3 * 16);
        assert!(index.missing("t", &live2).is_empty());
        assert_eq!(index.bytes(), 16);
        assert!(shas(index.lookup("t", &live2, &a)).is_empty());
        // A reused row ID with another segment is not taken for the old one.
        let live3 = vec![(2, "other".to_owned())];
        assert_eq!(index.missing("t", &live3), vec![2]);
    }

    #[test]
    fn lookups_name_the_parts_that_hold_a_trace() {
        let index = TraceIndex::new(1 << 20);
        let (a, b) = ([1u8; 16], [2u8; 16]);
        // a in parts (100, 10) and (300, 5); b in (100, 10).
        let ids = [a, a, b].concat();
        let parts = encode_entry_parts(&[(100, 10), (300, 5), (100, 10)]).unwrap();
        // Two parts, three entries: 2 + 2 × 16 + 3 × 2 bytes.
        assert_eq!(parts.len(), 40);
        index.insert("t", 1, segment("s1"), Some(&ids), Some(&parts));
        let live = vec![(1, "s1".to_owned())];
        let ranges = |t: &[u8; 16]| -> Vec<Option<std::ops::Range<u64>>> {
            let mut r: Vec<_> = index
                .lookup("t", &live, t)
                .0
                .iter()
                .map(SegmentRef::part)
                .collect();
            r.sort_by_key(|r| r.as_ref().map(|r| r.start));
            r
        };
        assert_eq!(ranges(&a), [Some(100..110), Some(300..305)]);
        assert_eq!(ranges(&b), [Some(100..110)]);
        assert!(ranges(&[7; 16]).is_empty());
        // Parts that are not one range per ID: the whole segment.
        assert_eq!(
            find_in(Some(&ids), Some(&parts[..38]), &a),
            Some(Hit::Whole)
        );
        assert_eq!(find_in(Some(&ids), Some(&[1, 2, 3]), &b), Some(Hit::Whole));
        assert_eq!(
            find_in(Some(&ids), Some(&parts), &b),
            Some(Hit::Parts(vec![(100, 10)]))
        );
        assert_eq!(decode_entry_parts(&parts, 3).unwrap()[1], (300, 5));
        assert_eq!(decode_ranges(&encode_ranges([(1, 2)])), Some(vec![(1, 2)]));
    }

    #[test]
    fn a_damaged_list_may_hold_any_trace_and_the_budget_starts_over() {
        let index = TraceIndex::new(32);
        let live = vec![(1, "s1".to_owned())];
        index.insert("t", 1, segment("s1"), Some(&[0u8; 15]), None);
        assert_eq!(index.lookup("t", &live, &[7; 16]).0.len(), 1);
        index.insert(
            "t",
            2,
            segment("s2"),
            Some(&list(&[[1; 16], [2; 16]])),
            None,
        );
        index.insert(
            "t",
            3,
            segment("s3"),
            Some(&list(&[[3; 16], [4; 16]])),
            None,
        );
        assert!(index.bytes() <= 32, "over the budget: started over");
        let holds = |ids: Option<&[u8]>, t: &[u8; 16]| find_in(ids, None, t).is_some();
        assert!(holds(Some(&list(&[[1; 16], [5; 16]])), &[5; 16]));
        assert!(!holds(Some(&list(&[[1; 16]])), &[5; 16]));
        assert!(!holds(None, &[5; 16]));
        assert!(holds(Some(&[0; 3]), &[5; 16]));
    }
}
