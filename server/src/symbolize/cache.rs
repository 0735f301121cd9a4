//! Open symbol indexes by build-ID, least recently used dropped first once
//! their bytes exceed the budget. Each entry remembers which files it was
//! built from, so a newer debug file for the build-ID is never shadowed.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use symtrace_symbolize::SymbolIndex;

pub struct CachedIndex {
    pub key: String,
    pub index: SymbolIndex,
    last_used: AtomicU64,
}

pub struct IndexCache {
    budget: u64,
    clock: AtomicU64,
    entries: Mutex<HashMap<String, Arc<CachedIndex>>>,
}

impl IndexCache {
    pub fn new(budget: u64) -> Self {
        Self {
            budget,
            clock: AtomicU64::new(0),
            entries: Mutex::new(HashMap::new()),
        }
    }

    fn tick(&self) -> u64 {
        self.clock.fetch_add(1, Ordering::Relaxed)
    }

    /// The index for `build_id` if it was built from the files `key` names.
    pub fn get(&self, build_id: &str, key: &str) -> Option<Arc<CachedIndex>> {
        let hit = self
            .entries
            .lock()
            .expect("index cache")
            .get(build_id)
            .filter(|e| e.key == key)
            .cloned();
        if let Some(hit) = &hit {
            hit.last_used.store(self.tick(), Ordering::Relaxed);
        }
        metrics::counter!("symtrace_symbol_index_cache_total",
            "result" => if hit.is_some() { "hit" } else { "miss" })
        .increment(1);
        hit
    }

    /// Adds (or replaces) the index for `build_id`, evicting the least
    /// recently used others beyond the budget.
    pub fn insert(&self, build_id: &str, key: &str, index: SymbolIndex) -> Arc<CachedIndex> {
        let entry = Arc::new(CachedIndex {
            key: key.to_owned(),
            index,
            last_used: AtomicU64::new(self.tick()),
        });
        let mut entries = self.entries.lock().expect("index cache");
        entries.insert(build_id.to_owned(), entry.clone());
        let mut total: u64 = entries.values().map(|e| e.index.len() as u64).sum();
        while total > self.budget && entries.len() > 1 {
            let Some(oldest) = entries
                .iter()
                .filter(|(id, _)| id.as_str() != build_id)
                .min_by_key(|(_, e)| e.last_used.load(Ordering::Relaxed))
                .map(|(id, _)| id.clone())
            else {
                break;
            };
            if let Some(gone) = entries.remove(&oldest) {
                total -= gone.index.len() as u64;
            }
        }
        metrics::gauge!("symtrace_symbol_index_cache_bytes").set(total as f64);
        entry
    }
}
