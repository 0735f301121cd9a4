//! Symbolized names of native frames, kept across queries: per build-ID,
//! address → frames (innermost first), valid as long as the symbolizer
//! would still answer from the same files (its source key; a later upload
//! changes the key and the entry starts over). Names are shared `Arc<str>`s,
//! so a query maps them to its own string table by pointer, without
//! hashing the text again.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use rustc_hash::{FxHashMap, FxHashSet};

use symtrace_profiles::resolved::{BuildIdStatus, Frames, Named};

/// A symbolizer's answer for one address: (function, file, line) per
/// frame, innermost first.
pub type Answer = (u64, Vec<(String, String, u32)>);

struct Entry {
    key: String,
    /// Ok, SymbolsOnly or NoSymbols.
    status: BuildIdStatus,
    addresses: FxHashMap<u64, Frames>,
    strings: FxHashSet<Arc<str>>,
    last_used: AtomicU64,
}

pub struct NameCache {
    /// Most addresses kept over all build-IDs.
    budget: usize,
    clock: AtomicU64,
    entries: Mutex<HashMap<String, Entry>>,
}

impl NameCache {
    pub fn new(budget: usize) -> Self {
        Self {
            budget,
            clock: AtomicU64::new(0),
            entries: Mutex::new(HashMap::new()),
        }
    }

    /// The cached frames of `addresses` (None where missing), and the
    /// status, if the entry is for `key`.
    pub fn get(
        &self,
        build_id: &str,
        key: &str,
        addresses: &[u64],
    ) -> (Vec<Option<Frames>>, Option<BuildIdStatus>) {
        let entries = self.entries.lock().expect("name cache");
        match entries.get(build_id).filter(|e| e.key == key) {
            Some(e) => {
                e.last_used.store(
                    self.clock.fetch_add(1, Ordering::Relaxed),
                    Ordering::Relaxed,
                );
                (
                    addresses
                        .iter()
                        .map(|a| e.addresses.get(a).cloned())
                        .collect(),
                    Some(e.status.clone()),
                )
            }
            None => (vec![None; addresses.len()], None),
        }
    }

    /// Stores answers (function, file, line per frame) for `build_id` under
    /// `key`, replacing an entry for other files; returns them as shared
    /// frames.
    pub fn insert(
        &self,
        build_id: &str,
        key: &str,
        status: BuildIdStatus,
        answers: Vec<Answer>,
    ) -> Vec<Frames> {
        let mut entries = self.entries.lock().expect("name cache");
        let used: usize = entries.values().map(|e| e.addresses.len()).sum();
        if used + answers.len() > self.budget {
            // Least recently used build-IDs go first.
            let mut order: Vec<(u64, String)> = entries
                .iter()
                .map(|(k, e)| (e.last_used.load(Ordering::Relaxed), k.clone()))
                .collect();
            order.sort_unstable();
            let mut used = used;
            for (_, k) in order {
                if used + answers.len() <= self.budget {
                    break;
                }
                used -= entries.remove(&k).map_or(0, |e| e.addresses.len());
            }
        }
        let tick = self.clock.fetch_add(1, Ordering::Relaxed);
        let entry = entries.entry(build_id.to_owned()).or_insert_with(|| Entry {
            key: key.to_owned(),
            status: status.clone(),
            addresses: FxHashMap::default(),
            strings: FxHashSet::default(),
            last_used: AtomicU64::new(tick),
        });
        if entry.key != key {
            entry.key = key.to_owned();
            entry.addresses.clear();
            entry.strings.clear();
        }
        entry.status = status;
        let mut share = |s: String| -> Arc<str> {
            match entry.strings.get(s.as_str()) {
                Some(a) => a.clone(),
                None => {
                    let a: Arc<str> = Arc::from(s);
                    entry.strings.insert(a.clone());
                    a
                }
            }
        };
        let mut out = Vec::with_capacity(answers.len());
        let mut stored = Vec::with_capacity(answers.len());
        for (address, frames) in answers {
            let frames: Frames = frames
                .into_iter()
                .map(|(function, file, line)| Named {
                    function: share(function),
                    file: share(file),
                    line,
                })
                .collect();
            stored.push((address, frames.clone()));
            out.push(frames);
        }
        if entries.values().map(|e| e.addresses.len()).sum::<usize>() < self.budget {
            let entry = entries.get_mut(build_id).expect("just inserted");
            entry.addresses.extend(stored);
        }
        out
    }
}
