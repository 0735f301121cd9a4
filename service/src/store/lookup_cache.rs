//! A short-lived cache of "which file is served for (build-ID, kind)".
//!
//! Profiling the small-file path showed most of its time in the hand-off to
//! the database (sqlx runs SQLite on its own thread: a channel send, a futex
//! wake and two context switches per query). Hot build-IDs are asked for
//! thousands of times a second by a fleet of debuggers and profilers, so the
//! answer is kept for a moment (`SYMTRACE_LOOKUP_CACHE_MS`, 1000 ms by
//! default; 0 disables it).
//!
//! Hits are cached for everyone: what the cache can delay — on *other*
//! replicas, by at most the TTL — is a replacement by a better file or a
//! delete; this replica's own uploads and deletes invalidate its entries
//! immediately. Misses are cached for symbolization only (a flamegraph asks
//! about every build-ID in it, and binaries without debug info are common:
//! two statements per unknown build-ID per query otherwise); debuginfod
//! clients cache a 404 for ten minutes, so their lookups never use a cached
//! miss and a file uploaded through any replica is served at once.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use super::model::{ArtifactKind, ServedArtifact};

/// Entries kept at most; beyond it expired entries are dropped, then all.
const MAX_ENTRIES: usize = 100_000;

/// When looked up, and what is served (None when nothing).
type Entry = (Instant, Option<Arc<ServedArtifact>>);

/// Build-ID → (agent content, "" for the served file; kind) → entry: all
/// of a build-ID's entries go at once, whatever the contents asked.
#[derive(Default)]
struct Entries {
    by_build_id: HashMap<String, HashMap<(String, ArtifactKind), Entry>>,
    len: usize,
}

/// A key's build-ID and agent content (see [`LookupCache::agent_key`]).
fn split(key: &str) -> (&str, &str) {
    key.split_once('@').unwrap_or((key, ""))
}

pub struct LookupCache {
    ttl: Duration,
    entries: Mutex<Entries>,
    /// Bumped by every invalidation; a lookup that read the database before
    /// an invalidation must not store its (possibly stale) answer after it.
    generation: AtomicU64,
}

impl LookupCache {
    pub fn new(ttl: Duration) -> Self {
        Self {
            ttl,
            entries: Mutex::new(Entries::default()),
            generation: AtomicU64::new(0),
        }
    }

    /// The answer looked up less than the TTL ago: `Some(Some(file))`, or
    /// `Some(None)` when the database had no file (see the module comment
    /// for who may use a cached miss); None when nothing fresh is known.
    pub fn get(&self, build_id: &str, kind: ArtifactKind) -> Option<Option<Arc<ServedArtifact>>> {
        if self.ttl.is_zero() {
            return None;
        }
        let entries = self.entries.lock().expect("lookup cache lock");
        let (build_id, content) = split(build_id);
        let (at, found) = entries
            .by_build_id
            .get(build_id)?
            .get(&(content.to_owned(), kind))?;
        (at.elapsed() < self.ttl).then(|| found.clone())
    }

    /// The generation to pass to [`Self::put`], read before the database.
    pub fn generation(&self) -> u64 {
        self.generation.load(Ordering::SeqCst)
    }

    /// Records what the database answered (None: no file) at `generation`.
    pub fn put(
        &self,
        build_id: &str,
        kind: ArtifactKind,
        found: Option<Arc<ServedArtifact>>,
        generation: u64,
    ) {
        if self.ttl.is_zero() {
            return;
        }
        let mut entries = self.entries.lock().expect("lookup cache lock");
        if self.generation.load(Ordering::SeqCst) != generation {
            return;
        }
        if entries.len >= MAX_ENTRIES {
            let ttl = self.ttl;
            for of_build in entries.by_build_id.values_mut() {
                of_build.retain(|_, (at, _)| at.elapsed() < ttl);
            }
            entries
                .by_build_id
                .retain(|_, of_build| !of_build.is_empty());
            entries.len = entries.by_build_id.values().map(HashMap::len).sum();
            if entries.len >= MAX_ENTRIES {
                *entries = Entries::default();
            }
        }
        let (build_id, content) = split(build_id);
        let new = entries
            .by_build_id
            .entry(build_id.to_owned())
            .or_default()
            .insert((content.to_owned(), kind), (Instant::now(), found))
            .is_none();
        entries.len += usize::from(new);
    }

    /// Forgets everything about a build-ID (after an upload or a delete
    /// here), the agents' files of every content included.
    pub fn invalidate(&self, build_id: &str) {
        let mut entries = self.entries.lock().expect("lookup cache lock");
        self.generation.fetch_add(1, Ordering::SeqCst);
        if let Some(gone) = entries.by_build_id.remove(build_id) {
            entries.len -= gone.len();
        }
    }

    /// The key under which an agent's file of `content` for `build_id` is
    /// cached (forgotten with the build-ID's).
    pub fn agent_key(build_id: &str, content: &str) -> String {
        format!("{build_id}@{content}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::model::Artifact;

    fn served(sha: &str) -> Arc<ServedArtifact> {
        Arc::new(ServedArtifact {
            artifact: Artifact {
                build_id: "ab".into(),
                kind: "debuginfo".into(),
                sha256: sha.into(),
                size: 1,
                quality: 3,
                has_dwarf: true,
                has_symtab: true,
                has_dynsym: false,
                architecture: "x86_64".into(),
                file_name: "f".into(),
                origin: "upload".into(),
                created_at: 0,
                owner: String::new(),
                content_sha256: String::new(),
            },
            sections: None,
        })
    }

    #[test]
    fn hits_expire_and_invalidate() {
        let cache = LookupCache::new(Duration::from_millis(50));
        cache.put(
            "ab",
            ArtifactKind::Debuginfo,
            Some(served("1")),
            cache.generation(),
        );
        assert_eq!(
            cache
                .get("ab", ArtifactKind::Debuginfo)
                .flatten()
                .unwrap()
                .artifact
                .sha256,
            "1"
        );
        assert!(cache.get("ab", ArtifactKind::Executable).is_none());
        cache.invalidate("ab");
        assert!(cache.get("ab", ArtifactKind::Debuginfo).is_none());
        // An agent's file of some content goes with its build-ID.
        let agent = LookupCache::agent_key("ab", "c0");
        cache.put(
            &agent,
            ArtifactKind::Debuginfo,
            Some(served("4")),
            cache.generation(),
        );
        assert!(cache.get(&agent, ArtifactKind::Debuginfo).is_some());
        cache.invalidate("ab");
        assert!(cache.get(&agent, ArtifactKind::Debuginfo).is_none());
        // A lookup that began before an invalidation does not store its answer.
        let before = cache.generation();
        cache.invalidate("cd");
        cache.put("ab", ArtifactKind::Debuginfo, Some(served("stale")), before);
        assert!(cache.get("ab", ArtifactKind::Debuginfo).is_none());
        cache.put(
            "ab",
            ArtifactKind::Debuginfo,
            Some(served("2")),
            cache.generation(),
        );
        std::thread::sleep(Duration::from_millis(60));
        assert!(cache.get("ab", ArtifactKind::Debuginfo).is_none());
        let off = LookupCache::new(Duration::ZERO);
        off.put(
            "ab",
            ArtifactKind::Debuginfo,
            Some(served("3")),
            off.generation(),
        );
        assert!(off.get("ab", ArtifactKind::Debuginfo).is_none());
    }

    /// A fresh cached miss for build-ID "ab".
    fn absent(cache: &LookupCache, kind: ArtifactKind) -> bool {
        matches!(cache.get("ab", kind), Some(None))
    }

    #[test]
    fn misses_expire_and_invalidate() {
        let cache = LookupCache::new(Duration::from_millis(50));
        cache.put("ab", ArtifactKind::Debuginfo, None, cache.generation());
        assert!(absent(&cache, ArtifactKind::Debuginfo));
        assert!(!absent(&cache, ArtifactKind::Executable));
        // An upload here forgets the miss at once.
        cache.invalidate("ab");
        assert!(!absent(&cache, ArtifactKind::Debuginfo));
        // A miss read before an upload here is not stored after it.
        let before = cache.generation();
        cache.invalidate("ab");
        cache.put("ab", ArtifactKind::Debuginfo, None, before);
        assert!(!absent(&cache, ArtifactKind::Debuginfo));
        cache.put("ab", ArtifactKind::Debuginfo, None, cache.generation());
        std::thread::sleep(Duration::from_millis(60));
        assert!(!absent(&cache, ArtifactKind::Debuginfo));
        let off = LookupCache::new(Duration::ZERO);
        off.put("ab", ArtifactKind::Debuginfo, None, off.generation());
        assert!(!absent(&off, ArtifactKind::Debuginfo));
    }
}
