//! A map of weighted values (bytes), least recently used dropped first once
//! the total weight exceeds a budget. Shared by the caches of open symbol
//! indexes and of decoded profile segments.

use std::collections::{BTreeMap, HashMap};
use std::sync::Mutex;

struct Slot<V> {
    value: V,
    weight: u64,
    /// When it was last used (a key of `order`).
    used: u64,
}

struct Inner<V> {
    entries: HashMap<String, Slot<V>>,
    /// Keys by last use, oldest first: eviction and use are O(log n) (a
    /// scan per insert was quadratic once segments were cached by part).
    order: BTreeMap<u64, String>,
    total: u64,
    clock: u64,
}

pub struct WeightedLru<V> {
    budget: u64,
    inner: Mutex<Inner<V>>,
}

impl<V: Clone> WeightedLru<V> {
    pub fn new(budget: u64) -> Self {
        Self {
            budget,
            inner: Mutex::new(Inner {
                entries: HashMap::new(),
                order: BTreeMap::new(),
                total: 0,
                clock: 0,
            }),
        }
    }

    pub fn budget(&self) -> u64 {
        self.budget
    }

    /// The value under `key` if `usable` accepts it (which makes it the most
    /// recently used).
    pub fn get_if(&self, key: &str, usable: impl FnOnce(&V) -> bool) -> Option<V> {
        let mut guard = self.inner.lock().expect("lru");
        let inner = &mut *guard;
        inner.clock += 1;
        let slot = inner.entries.get_mut(key).filter(|s| usable(&s.value))?;
        let name = inner
            .order
            .remove(&slot.used)
            .expect("an order entry per slot");
        slot.used = inner.clock;
        inner.order.insert(slot.used, name);
        Some(slot.value.clone())
    }

    /// Adds (or replaces) `key`'s value, then drops the least recently used
    /// others while the total is over the budget. Returns the total weight.
    /// What is dropped is freed after the lock is released.
    pub fn insert(&self, key: &str, value: V, weight: u64) -> u64 {
        let mut dropped = Vec::new();
        let total = {
            let mut guard = self.inner.lock().expect("lru");
            let inner = &mut *guard;
            inner.clock += 1;
            let used = inner.clock;
            if let Some(old) = inner.entries.insert(
                key.to_owned(),
                Slot {
                    value,
                    weight,
                    used,
                },
            ) {
                inner.order.remove(&old.used);
                inner.total -= old.weight;
                dropped.push(old.value);
            }
            inner.order.insert(used, key.to_owned());
            inner.total += weight;
            while inner.total > self.budget {
                let Some(entry) = inner.order.first_entry() else {
                    break;
                };
                if entry.get() == key {
                    break; // the newest, alone over the budget: it stays
                }
                let oldest = entry.remove();
                if let Some(slot) = inner.entries.remove(&oldest) {
                    inner.total -= slot.weight;
                    dropped.push(slot.value);
                }
            }
            inner.total
        };
        drop(dropped);
        total
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn drops_least_recently_used_beyond_the_budget() {
        let lru = WeightedLru::new(10);
        assert_eq!(lru.insert("a", 1, 4), 4);
        assert_eq!(lru.insert("b", 2, 4), 8);
        assert_eq!(lru.get_if("a", |_| true), Some(1), "a is now the newest");
        assert_eq!(lru.insert("c", 3, 4), 8, "b dropped");
        assert_eq!(lru.get_if("b", |_| true), None);
        assert_eq!(lru.get_if("a", |v| *v == 2), None, "not usable");
        assert_eq!(lru.insert("a", 5, 4), 8, "replaced, not added");
        assert_eq!(lru.insert("big", 9, 20), 20, "the new one stays");
        assert_eq!(lru.get_if("c", |_| true), None);
    }

    #[test]
    fn many_entries_keep_the_newest_within_the_budget() {
        let lru = WeightedLru::new(1_000);
        for i in 0..20_000u64 {
            assert!(lru.insert(&i.to_string(), i, 10) <= 1_000);
        }
        assert!((19_900..20_000).all(|i| lru.get_if(&i.to_string(), |_| true).is_some()));
        assert_eq!(
            lru.get_if("19899", |_| true),
            None,
            "the 101st newest is gone"
        );
        // The check above used 19900 … 19999 in order; 19900 used again
        // outlives 19901 and 19902.
        lru.get_if("19900", |_| true);
        lru.insert("a", 0, 10);
        lru.insert("b", 0, 10);
        assert_eq!(lru.get_if("19901", |_| true), None);
        assert_eq!(lru.get_if("19902", |_| true), None);
        assert_eq!(lru.get_if("19900", |_| true), Some(19_900));
    }
}
