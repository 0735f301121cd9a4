//! The code ranges of one process's JIT symbols: an interval map in which a
//! later entry wins over the earlier ones it overlaps (the code there was
//! freed or moved, and the range reused), bounded in bytes by evicting the
//! oldest entries first — but not one looked up since the read before
//! (it goes to the back of the queue: a second chance, as in CLOCK, but
//! by read rather than by pass, since one read may cycle the queue
//! several times): the hot code of a process whose perf map grows without
//! end stays named.

use std::collections::{BTreeMap, VecDeque};
use std::sync::Arc;

use super::{Named, Symbol};

/// What an entry costs beyond its name: the tree's node share, the
/// eviction queue's slot and the `Arc`'s header, rounded up.
pub const ENTRY_OVERHEAD: usize = 96;

struct Entry {
    end: u64,
    /// Insertion number (its place in the eviction queue).
    seq: u64,
    symbol: Arc<Named>,
    /// The epoch of its last lookup (0: never).
    used: u64,
}

#[derive(Default)]
pub struct Table {
    by_start: BTreeMap<u64, Entry>,
    /// (start, seq) in insertion order; stale when the entry at `start`
    /// has another seq (it was replaced or trimmed away).
    order: VecDeque<(u64, u64)>,
    next_seq: u64,
    bytes: usize,
    /// Advanced at every read of the files (`new_epoch`).
    epoch: u64,
}

fn cost(named: &Named) -> usize {
    ENTRY_OVERHEAD + named.heap_bytes()
}

impl Table {
    /// Bytes held (an estimate: see `ENTRY_OVERHEAD`).
    pub fn bytes(&self) -> usize {
        self.bytes
    }

    pub fn len(&self) -> usize {
        self.by_start.len()
    }

    /// The symbol whose range holds `address` (a name as the runtime
    /// wrote it is parsed now, once).
    pub fn lookup(&mut self, address: u64) -> Option<&Arc<Symbol>> {
        let (_, e) = self.by_start.range_mut(..=address).next_back()?;
        if address >= e.end {
            return None;
        }
        e.used = self.epoch.max(1);
        Some(e.symbol.symbol())
    }

    /// Inserts `[start, start + size)`, cutting away what it overlaps.
    /// Empty ranges (and ones wrapping past the address space) are
    /// refused.
    pub fn insert(&mut self, start: u64, size: u64, symbol: Arc<Named>) -> bool {
        let Some(end) = start.checked_add(size).filter(|_| size > 0) else {
            return false;
        };
        // An entry starting before `start` that reaches into the range:
        // trimmed, and its part past `end` kept as a piece of its own.
        let before = self
            .by_start
            .range_mut(..start)
            .next_back()
            .filter(|(_, e)| e.end > start)
            .map(|(_, e)| {
                let old_end = e.end;
                e.end = start;
                (old_end, e.symbol.clone(), e.seq)
            });
        if let Some((old_end, sym, seq)) = before {
            if old_end > end {
                self.place(end, old_end, sym, Some(seq));
            }
        }
        // Entries starting inside the range: removed, a tail past `end`
        // kept.
        let inside: Vec<u64> = self.by_start.range(start..end).map(|(&s, _)| s).collect();
        for s in inside {
            let e = self.by_start.remove(&s).expect("listed above");
            self.bytes -= cost(&e.symbol);
            if e.end > end {
                self.place(end, e.end, e.symbol, Some(e.seq));
            }
        }
        self.place(start, end, symbol, None);
        true
    }

    /// Puts an entry in; `seq` is kept for a piece of an older one (it
    /// stays as old as it was).
    fn place(&mut self, start: u64, end: u64, symbol: Arc<Named>, seq: Option<u64>) {
        let seq = seq.unwrap_or_else(|| {
            self.next_seq += 1;
            self.next_seq
        });
        self.order.push_back((start, seq));
        self.bytes += cost(&symbol);
        let entry = Entry {
            end,
            seq,
            symbol,
            used: 0,
        };
        if let Some(old) = self.by_start.insert(start, entry) {
            self.bytes -= cost(&old.symbol);
        }
        // Pieces of old entries sit behind newer ones in the queue: keep it
        // from filling with stale slots.
        if self.order.len() > 2 * self.by_start.len() + 64 {
            let live = &self.by_start;
            self.order
                .retain(|(s, q)| live.get(s).is_some_and(|e| e.seq == *q));
            let mut sorted: Vec<(u64, u64)> = self.order.drain(..).collect();
            sorted.sort_unstable_by_key(|&(_, q)| q);
            self.order.extend(sorted);
        }
    }

    /// Removes `[start, start + size)` if an entry starts exactly there
    /// (code freed or moved away); returns its symbol.
    pub fn remove(&mut self, start: u64) -> Option<Arc<Named>> {
        let e = self.by_start.remove(&start)?;
        self.bytes -= cost(&e.symbol);
        Some(e.symbol)
    }

    /// Code moved: every entry in `[from, from + size)` (a piece of one
    /// straddling an edge) goes to the same offset from `to`. A runtime
    /// moves one function at a time: a move over more than `max_entries`
    /// entries is refused (false), so that no record can make the table
    /// move whole.
    pub fn move_range(&mut self, from: u64, to: u64, size: u64, max_entries: usize) -> bool {
        let Some(end) = from.checked_add(size).filter(|_| size > 0) else {
            return false;
        };
        let first = match self.by_start.range(..=from).next_back() {
            Some((&s, e)) if e.end > from => s,
            _ => from,
        };
        if self.by_start.range(first..end).nth(max_entries).is_some() {
            return false;
        }
        let moved: Vec<(u64, u64, Arc<Named>)> = self
            .by_start
            .range(first..end)
            .map(|(&s, e)| (s.max(from), e.end.min(end), e.symbol.clone()))
            .collect();
        for (s, e, symbol) in moved {
            // Cut out of the old place (an empty insert would be refused:
            // trim through a placeholder, then drop it).
            if self.insert(s, e - s, symbol.clone()) {
                self.remove(s);
            }
            if let Some(at) = (s - from).checked_add(to) {
                self.insert(at, e - s, symbol);
            }
        }
        true
    }

    /// Starts an epoch (a read of the files): entries looked up in this
    /// one or the one before are spared by eviction.
    pub fn new_epoch(&mut self) {
        self.epoch = self.epoch.max(1) + 1;
    }

    /// Drops the oldest entry not looked up in this epoch or the one before
    /// (those go to the back of the queue; when every entry was, the
    /// oldest goes anyway); false when there is none.
    pub fn evict_oldest(&mut self) -> bool {
        let mut spared = 0;
        let spare_max = self.order.len();
        while let Some((start, seq)) = self.order.pop_front() {
            let Some(e) = self.by_start.get_mut(&start).filter(|e| e.seq == seq) else {
                continue; // stale
            };
            if e.used != 0 && e.used + 1 >= self.epoch && spared < spare_max {
                spared += 1;
                self.next_seq += 1;
                e.seq = self.next_seq;
                self.order.push_back((start, e.seq));
                continue;
            }
            let e = self.by_start.remove(&start).expect("checked");
            self.bytes -= cost(&e.symbol);
            return true;
        }
        false
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sym(name: &str) -> Arc<Named> {
        Arc::new(Named::parsed(Symbol::named(name)))
    }

    fn name(t: &mut Table, a: u64) -> Option<String> {
        t.lookup(a).map(|s| s.function.to_string())
    }

    #[test]
    fn later_entries_win_over_what_they_overlap() {
        let mut t = Table::default();
        assert!(t.insert(0x1000, 0x100, sym("a")));
        assert!(t.insert(0x1100, 0x100, sym("b")));
        assert_eq!(name(&mut t, 0x10ff).as_deref(), Some("a"));
        assert_eq!(name(&mut t, 0x1100).as_deref(), Some("b"));
        assert_eq!(name(&mut t, 0x1200), None);
        assert_eq!(name(&mut t, 0xfff), None);
        // Inside a: a splits around c.
        t.insert(0x1040, 0x20, sym("c"));
        assert_eq!(name(&mut t, 0x103f).as_deref(), Some("a"));
        assert_eq!(name(&mut t, 0x1040).as_deref(), Some("c"));
        assert_eq!(name(&mut t, 0x1060).as_deref(), Some("a"));
        // Over the end of a and the start of b.
        t.insert(0x1080, 0x100, sym("d"));
        assert_eq!(name(&mut t, 0x107f).as_deref(), Some("a"));
        assert_eq!(name(&mut t, 0x1100).as_deref(), Some("d"));
        assert_eq!(name(&mut t, 0x1180).as_deref(), Some("b"));
        // Exactly over b's rest.
        t.insert(0x1180, 0x80, sym("e"));
        assert_eq!(name(&mut t, 0x11ff).as_deref(), Some("e"));
        assert!(!t.insert(0x2000, 0, sym("empty")));
        assert!(!t.insert(u64::MAX - 1, 4, sym("wraps")));
        assert_eq!(
            t.remove(0x1180)
                .map(|s| s.symbol().function.to_string())
                .as_deref(),
            Some("e")
        );
        assert_eq!(name(&mut t, 0x11ff), None);
    }

    #[test]
    fn eviction_takes_the_oldest_and_bytes_add_up() {
        let mut t = Table::default();
        for i in 0..1000u64 {
            t.insert(0x10_0000 + i * 0x100, 0x100, sym(&format!("f{i}")));
        }
        let per = t.bytes() / 1000;
        assert!(per >= ENTRY_OVERHEAD);
        // Overwrite the middle: the old ones there are gone, not counted.
        for i in 400..600u64 {
            t.insert(0x10_0000 + i * 0x100, 0x100, sym(&format!("g{i}")));
        }
        assert_eq!(t.len(), 1000);
        for _ in 0..500 {
            assert!(t.evict_oldest());
        }
        // f0..f399 and f600..f699 were the oldest 500.
        assert_eq!(name(&mut t, 0x10_0000), None);
        assert_eq!(name(&mut t, 0x10_0000 + 650 * 0x100), None);
        assert_eq!(
            name(&mut t, 0x10_0000 + 500 * 0x100).as_deref(),
            Some("g500")
        );
        assert_eq!(
            name(&mut t, 0x10_0000 + 800 * 0x100).as_deref(),
            Some("f800")
        );
        while t.evict_oldest() {}
        assert_eq!((t.len(), t.bytes()), (0, 0));
    }

    #[test]
    fn moved_code_keeps_its_pieces() {
        let mut t = Table::default();
        t.insert(0x1000, 0x10, sym("line10"));
        t.insert(0x1010, 0x10, sym("line11"));
        t.insert(0x0ff0, 0x14, sym("before")); // straddles the start
        assert!(!t.move_range(0x1000, 0x9000, 0x20, 2), "3 entries");
        assert!(t.move_range(0x1000, 0x9000, 0x20, 3));
        assert_eq!(name(&mut t, 0x9000).as_deref(), Some("before"));
        assert_eq!(name(&mut t, 0x9004).as_deref(), Some("line10"));
        assert_eq!(name(&mut t, 0x9018).as_deref(), Some("line11"));
        assert_eq!(name(&mut t, 0x9020), None);
        assert_eq!(name(&mut t, 0x1008), None);
        assert_eq!(name(&mut t, 0x1018), None);
        assert_eq!(name(&mut t, 0x0ff8).as_deref(), Some("before"));
        let bytes = t.bytes();
        while t.evict_oldest() {}
        assert!(bytes > 0 && t.bytes() == 0);
    }

    #[test]
    fn code_looked_up_gets_a_second_chance() {
        let mut t = Table::default();
        t.insert(0x1000, 0x10, sym("hot"));
        assert!(name(&mut t, 0x1008).is_some(), "sampled once read");
        for i in 0..100u64 {
            // A read: many entries at once, the queue cycled several times
            // without a lookup in between.
            t.new_epoch();
            for k in 0..50u64 {
                t.insert(0x10_0000 + (i * 50 + k) * 0x10, 0x10, sym("cold"));
                while t.len() > 10 {
                    assert!(t.evict_oldest());
                }
            }
            // Sampled between reads; the cold entries never.
            assert!(name(&mut t, 0x1008).is_some());
        }
        assert_eq!(name(&mut t, 0x1000).as_deref(), Some("hot"));
        assert_eq!(name(&mut t, 0x10_0000 + 50 * 0x10), None);
        // Not looked up for two reads: evicted like any other.
        t.new_epoch();
        t.new_epoch();
        for k in 0..20u64 {
            t.insert(0x20_0000 + k * 0x10, 0x10, sym("cold"));
            while t.len() > 10 {
                assert!(t.evict_oldest());
            }
        }
        assert_eq!(name(&mut t, 0x1000), None);
    }
}
