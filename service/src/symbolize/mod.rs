//! Symbolization for the query path and `/api/v1/symbolize`.
//!
//! For a build-ID the service picks its files from the store (the best
//! debuginfo candidate, which may be an unstripped executable; the
//! executable's symbol tables when the debug file has none; the dwz
//! supplementary file by its own build-ID), asking upstream debuginfod
//! servers on a miss. Then, in order:
//!
//! 1. an open index in memory ([`cache::IndexCache`], LRU by bytes), if it
//!    was built from exactly these files — a debug file uploaded after the
//!    first query changes the files, so the next query uses it;
//! 2. an index stored earlier (table `symbol_indexes`, a blob like any
//!    other), mapped and validated;
//! 3. otherwise the request is answered straight from DWARF, and one
//!    background task per build-ID builds the index and stores it.
//!
//! CPU work runs on the blocking pool, at most one task per core; no lock is
//! held across I/O.

mod cache;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use symtrace_elf::BuildId;
use symtrace_symbolize::{index, DwarfSymbolizer, Frame, Inputs, Miss, Source, SymbolIndex};
use tokio::sync::Semaphore;

use crate::cpu::CpuPool;
use crate::federation::{find_or_fetch, Federation, Forwarding};
use crate::store::model::{now_ms, ArtifactKind, ServedArtifact};
use crate::store::{Misses, SymbolStore};
use cache::IndexCache;

/// One address's answer.
pub type Answer = Result<(Source, Vec<Frame>), Miss>;

/// A build-ID's status from the best source its files have.
pub fn status_of(best: Option<Source>) -> symtrace_profiles::resolved::BuildIdStatus {
    use symtrace_profiles::resolved::BuildIdStatus;
    match best {
        Some(Source::Dwarf) => BuildIdStatus::Ok,
        Some(_) => BuildIdStatus::SymbolsOnly,
        None => BuildIdStatus::NoSymbols,
    }
}

/// What a build-ID's answers came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Tier {
    /// A prebuilt index (memory or storage).
    Index,
    /// DWARF parsed for this request (the index is being built).
    Dwarf,
}

/// Answers for one build-ID, or why there are none.
#[derive(Debug)]
pub enum Outcome {
    Unknown,
    Answered {
        tier: Tier,
        /// The best source the files have (`None`: no symbols at all).
        best: Option<Source>,
        answers: Vec<Answer>,
    },
}

#[derive(Debug, thiserror::Error)]
pub enum SymbolizeError {
    #[error(transparent)]
    Store(#[from] crate::store::Error),
    #[error("{0}")]
    Symbolize(#[from] symtrace_symbolize::Error),
    #[error("symbolization task failed: {0}")]
    Task(String),
    #[error(transparent)]
    Busy(#[from] crate::limits::Busy),
}

impl From<crate::federation::FindError> for SymbolizeError {
    fn from(e: crate::federation::FindError) -> Self {
        match e {
            crate::federation::FindError::Store(e) => Self::Store(e),
            crate::federation::FindError::Busy(e) => Self::Busy(e),
        }
    }
}

/// The files one build-ID's answers come from, mapped.
struct Files {
    /// Identifies the index built from exactly these files.
    key: String,
    primary_sha256: String,
    primary: Bytes,
    executable: Option<Bytes>,
    supplementary: Option<Bytes>,
    /// Decompressed bytes the DWARF sections may take
    /// (`SYMTRACE_MAX_DECOMPRESSED_BYTES`).
    max_decompressed_bytes: u64,
}

impl Files {
    fn inputs(&self) -> Inputs<'_> {
        Inputs {
            primary: &self.primary,
            executable: self.executable.as_deref(),
            supplementary: self.supplementary.as_deref(),
            max_decompressed_bytes: self.max_decompressed_bytes,
        }
    }
}

pub struct SymbolizeService {
    store: Arc<SymbolStore>,
    federation: Option<Arc<Federation>>,
    cache: IndexCache,
    /// The files of the indexes being built, by key.
    building: Mutex<HashMap<String, Arc<Files>>>,
    /// Keys whose build failed, and when: not retried for [`RETRY_FAILED`].
    failed: Mutex<HashMap<String, Instant>>,
    /// `.gnu_debugaltlink` build-IDs by the sha256 of the file naming them.
    alt_links: Mutex<HashMap<String, Option<String>>>,
    /// One permit per core for CPU-bound work.
    cpu: Arc<Semaphore>,
    cores: usize,
    /// Where index builds run: `max_builds` nicer threads, so that beside
    /// a request's work, which a client waits for, a build (which nobody
    /// waits for: requests meanwhile are answered from DWARF) takes the
    /// CPU the request leaves.
    builds: CpuPool,
    /// Index builds at once; a request that would start one more is
    /// answered from DWARF, and a later one builds.
    max_builds: usize,
}

/// How long a failed index build is not retried (requests meanwhile are
/// answered from DWARF).
const RETRY_FAILED: Duration = Duration::from_secs(600);

/// Remembered `.gnu_debugaltlink` answers (the memo starts over beyond it).
const MAX_ALT_LINKS: usize = 100_000;

/// How much nicer than the server the index builds' threads run.
const BUILD_NICE: i32 = 10;

impl SymbolizeService {
    pub fn new(
        store: Arc<SymbolStore>,
        federation: Option<Arc<Federation>>,
        cache_bytes: u64,
        max_builds: usize,
    ) -> std::io::Result<Arc<Self>> {
        let cores = std::thread::available_parallelism().map_or(2, |n| n.get());
        let max_builds = max_builds.max(1);
        Ok(Arc::new(Self {
            store,
            federation,
            cache: IndexCache::new(cache_bytes),
            building: Mutex::new(HashMap::new()),
            failed: Mutex::new(HashMap::new()),
            alt_links: Mutex::new(HashMap::new()),
            cpu: Arc::new(Semaphore::new(cores)),
            cores,
            builds: CpuPool::background("index-build", max_builds, BUILD_NICE)?,
            max_builds,
        }))
    }

    /// Answers for `addresses` (any order, repeats allowed) of `build_id`,
    /// of a mapping whose content hash is `content` when known (what an
    /// agent's files of that content may name).
    pub async fn symbolize(
        self: &Arc<Self>,
        build_id: &BuildId,
        content: Option<&str>,
        addresses: Vec<u64>,
        from: &Forwarding,
    ) -> Result<Outcome, SymbolizeError> {
        let Some(candidates) = self.candidates(build_id, content, from).await? else {
            return Ok(Outcome::Unknown);
        };
        let key = source_key(&candidates);
        if let Some(index) = self.cache.get(build_id.as_str(), &key) {
            return self.answer_from_index(index, addresses).await;
        }
        if let Some((sha256, _)) = self.store.meta.symbol_index(&key).await? {
            match self.open_stored(&sha256).await {
                Ok(index) => {
                    let index = self.cache.insert(build_id.as_str(), &key, index);
                    return self.answer_from_index(index, addresses).await;
                }
                // A damaged or foreign index is rebuilt below.
                Err(e) => tracing::warn!(%build_id, error = %e, "stored symbol index unusable"),
            }
        }
        // Files being indexed are shared with the requests that come
        // meanwhile (no second download from a remote store).
        let building = self
            .building
            .lock()
            .expect("building set")
            .get(&key)
            .cloned();
        let files = match building {
            Some(files) => files,
            None => {
                let files = Arc::new(self.load(&candidates, key).await?);
                self.spawn_build(build_id, files.clone());
                files
            }
        };
        // A first request is latency-bound: it may use every core.
        let threads = self.cores;
        let (best, answers) = self
            .on_cpu(threads, move || {
                let symbolizer = DwarfSymbolizer::new(&files.inputs())?;
                let mut answers: Vec<Answer> = vec![Err(Miss::NoSymbols); addresses.len()];
                symbolizer.symbolize_on(&addresses, threads, |i, answer, frames| {
                    answers[i] = answer.map(|s| (s, frames.iter().map(|f| f.to_owned()).collect()));
                })?;
                Ok::<_, symtrace_symbolize::Error>((symbolizer.best_source(), answers))
            })
            .await??;
        metrics::counter!("symtrace_symbolize_requests_total", "tier" => "dwarf").increment(1);
        Ok(Outcome::Answered {
            tier: Tier::Dwarf,
            best,
            answers,
        })
    }

    /// Names the files a build-ID's answers would come from right now
    /// (None: the store has none). Answers cached under this key stay
    /// right until a new upload changes it.
    /// The symbol store it reads.
    pub fn store(&self) -> &Arc<SymbolStore> {
        &self.store
    }

    pub async fn source_key(
        &self,
        build_id: &BuildId,
        content: Option<&str>,
        from: &Forwarding,
    ) -> Result<Option<String>, SymbolizeError> {
        Ok(self
            .candidates(build_id, content, from)
            .await?
            .map(|c| source_key(&c)))
    }

    async fn answer_from_index(
        &self,
        index: Arc<cache::CachedIndex>,
        addresses: Vec<u64>,
    ) -> Result<Outcome, SymbolizeError> {
        metrics::counter!("symtrace_symbolize_requests_total", "tier" => "index").increment(1);
        let best = index.index.best_source();
        // Small batches are cheaper inline than a trip to the pool.
        let small = addresses.len() <= 1024;
        let work = move || {
            let mut answers: Vec<Answer> = vec![Err(Miss::NoSymbols); addresses.len()];
            index.index.lookup_batch(&addresses, |i, answer, frames| {
                answers[i] = answer.map(|s| (s, frames.iter().map(|f| f.to_owned()).collect()));
            });
            answers
        };
        let answers = if small {
            work()
        } else {
            self.on_cpu(1, work).await?
        };
        Ok(Outcome::Answered {
            tier: Tier::Index,
            best,
            answers,
        })
    }

    /// The stored candidates for a build-ID: primary, executable (for its
    /// symbol tables) and supplementary, fetched upstream on a miss — CI's
    /// and upstream files; only when there are none, an agent's taken from
    /// a file of `content` (never another's: a forged file under a real
    /// build-ID names only its own frames).
    async fn candidates(
        &self,
        build_id: &BuildId,
        content: Option<&str>,
        from: &Forwarding,
    ) -> Result<Option<Candidates>, SymbolizeError> {
        let mut debug = self.find(build_id, ArtifactKind::Debuginfo, from).await?;
        let mut exe = match &debug {
            Some(d) if d.artifact.has_symtab => None,
            _ => self.find(build_id, ArtifactKind::Executable, from).await?,
        };
        if let (None, None, Some(content)) = (&debug, &exe, content) {
            // The whole file an agent sent is that content (the server
            // hashed it); a symbol-table extract only says it was taken
            // from it, so it is used only when no whole file is stored.
            let store = &self.store;
            exe = store
                .agent_artifact(build_id, ArtifactKind::Executable, content)
                .await?;
            if exe.is_none() {
                debug = store
                    .agent_artifact(build_id, ArtifactKind::Debuginfo, content)
                    .await?;
            }
        }
        if debug.is_none() {
            debug = exe.clone();
        }
        let Some(primary) = debug else {
            return Ok(None);
        };
        let executable = exe.filter(|e| e.artifact.sha256 != primary.artifact.sha256);
        let supplementary = match self.alt_link(&primary).await? {
            Some(alt) => match alt.parse::<BuildId>() {
                Ok(alt) => self.find(&alt, ArtifactKind::Debuginfo, from).await?,
                Err(_) => None,
            },
            None => None,
        };
        Ok(Some(Candidates {
            primary,
            executable,
            supplementary,
        }))
    }

    async fn find(
        &self,
        build_id: &BuildId,
        kind: ArtifactKind,
        from: &Forwarding,
    ) -> Result<Option<Arc<ServedArtifact>>, SymbolizeError> {
        let federation = self.federation.as_ref();
        Ok(find_or_fetch(
            &self.store,
            federation,
            build_id,
            kind,
            from,
            Misses::Cached,
        )
        .await?)
    }

    /// Runs CPU-bound work on the blocking pool, holding `cores` of the
    /// per-core permits.
    async fn on_cpu<T: Send + 'static>(
        &self,
        cores: usize,
        work: impl FnOnce() -> T + Send + 'static,
    ) -> Result<T, SymbolizeError> {
        let permit = self
            .cpu
            .clone()
            .acquire_many_owned(cores as u32)
            .await
            .expect("never closed");
        tokio::task::spawn_blocking(move || {
            let _permit = permit;
            work()
        })
        .await
        .map_err(|e| SymbolizeError::Task(e.to_string()))
    }

    /// The build-ID of the dwz supplementary file the primary refers to.
    async fn alt_link(&self, primary: &ServedArtifact) -> Result<Option<String>, SymbolizeError> {
        let Some((offset, size)) = primary.section_range(".gnu_debugaltlink") else {
            return Ok(None);
        };
        let sha256 = &primary.artifact.sha256;
        // Blobs are content-addressed: the answer for a sha256 never changes,
        // and remembering it saves a (remote) read on every request.
        if let Some(known) = self.alt_links.lock().expect("alt links").get(sha256) {
            return Ok(known.clone());
        }
        let bytes = self.store.blob_range(sha256, offset..offset + size).await?;
        // A NUL-terminated path, then the build-ID bytes.
        let build_id = bytes
            .iter()
            .position(|&b| b == 0)
            .map(|nul| hex::encode(&bytes[nul + 1..]))
            .filter(|id| !id.is_empty());
        let mut known = self.alt_links.lock().expect("alt links");
        if known.len() >= MAX_ALT_LINKS {
            known.clear();
        }
        known.insert(sha256.clone(), build_id.clone());
        Ok(build_id)
    }

    async fn load(&self, c: &Candidates, key: String) -> Result<Files, SymbolizeError> {
        let primary = self.store.blob_bytes(&c.primary.artifact.sha256).await?;
        let executable = match &c.executable {
            Some(e) => Some(self.store.blob_bytes(&e.artifact.sha256).await?),
            None => None,
        };
        let supplementary = match &c.supplementary {
            Some(s) => Some(self.store.blob_bytes(&s.artifact.sha256).await?),
            None => None,
        };
        Ok(Files {
            key,
            primary_sha256: c.primary.artifact.sha256.clone(),
            primary,
            executable,
            supplementary,
            max_decompressed_bytes: self.store.max_decompressed_bytes(),
        })
    }

    async fn open_stored(&self, sha256: &str) -> Result<SymbolIndex, SymbolizeError> {
        let bytes = self.store.blob_bytes(sha256).await?;
        let index = tokio::task::spawn_blocking(move || SymbolIndex::new(bytes))
            .await
            .map_err(|e| SymbolizeError::Task(e.to_string()))??;
        Ok(index)
    }

    /// Builds, stores and caches the index for `files`, once per key at a
    /// time; requests meanwhile are answered from DWARF.
    fn spawn_build(self: &Arc<Self>, build_id: &BuildId, files: Arc<Files>) {
        {
            let mut failed = self.failed.lock().expect("failed builds");
            failed.retain(|_, at| at.elapsed() < RETRY_FAILED);
            if failed.contains_key(&files.key) {
                return;
            }
        }
        {
            let mut building = self.building.lock().expect("building set");
            if building.contains_key(&files.key) {
                return;
            }
            if building.len() >= self.max_builds {
                metrics::counter!("symtrace_busy_refusals_total", "work" => "index builds")
                    .increment(1);
                return;
            }
            building.insert(files.key.clone(), files.clone());
        }
        let this = self.clone();
        let build_id = build_id.as_str().to_owned();
        tokio::spawn(async move {
            let key = files.key.clone();
            let result = this.build(&build_id, files).await;
            this.building.lock().expect("building set").remove(&key);
            match result {
                Ok(()) => metrics::counter!("symtrace_symbol_index_builds_total", "result" => "ok")
                    .increment(1),
                Err(e) => {
                    this.failed
                        .lock()
                        .expect("failed builds")
                        .insert(key, Instant::now());
                    metrics::counter!("symtrace_symbol_index_builds_total", "result" => "error")
                        .increment(1);
                    tracing::warn!(%build_id, error = %e, "building the symbol index failed");
                }
            }
        });
    }

    async fn build(&self, build_id: &str, files: Arc<Files>) -> Result<(), SymbolizeError> {
        crate::store::pause_point("index-build").await;
        let started = std::time::Instant::now();
        // No per-core permit: those order the work requests wait for, and
        // a request answered from DWARF meanwhile must not wait behind the
        // build. The builds are bounded by their pool (`max_builds`
        // threads) and run nicer than the requests.
        let built = files.clone();
        let bytes = self
            .builds
            .run("building a symbol index", move || {
                index::build(&built.inputs())
            })
            .await
            .map_err(|e| SymbolizeError::Task(e.to_string()))??;
        let size = bytes.len();
        let spooled = self.store.store_derived(bytes).await?;
        self.store
            .meta
            .commit_symbol_index(
                &files.key,
                &files.primary_sha256,
                &spooled.sha256,
                size as i64,
                now_ms(),
            )
            .await?;
        let index = self.open_stored(&spooled.sha256).await?;
        self.cache.insert(build_id, &files.key, index);
        tracing::info!(
            build_id,
            bytes = size,
            seconds = started.elapsed().as_secs_f64(),
            "symbol index built"
        );
        Ok(())
    }
}

struct Candidates {
    primary: Arc<ServedArtifact>,
    executable: Option<Arc<ServedArtifact>>,
    supplementary: Option<Arc<ServedArtifact>>,
}

fn source_key(c: &Candidates) -> String {
    let sha = |a: &Option<Arc<ServedArtifact>>| {
        a.as_ref()
            .map_or_else(|| "-".to_owned(), |a| a.artifact.sha256.clone())
    };
    format!(
        "v{}:{}:{}:{}",
        index::format::VERSION,
        c.primary.artifact.sha256,
        sha(&c.executable),
        sha(&c.supplementary)
    )
}
