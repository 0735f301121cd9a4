//! The symbol store: metadata ([`meta`]) plus content-addressed blobs
//! ([`blobs`]), and the one ingest path every upload and every federated
//! fetch goes through.
//!
//! Write order, which is what makes a crash harmless:
//! 1. the body is spooled to a temporary file, hashed and counted ([`spool`]);
//! 2. it is validated (ELF, build-ID, kind) from an mmap of that file;
//! 3. the blob's row is claimed (live, unreferenced), then its object is
//!    written under its SHA-256 (atomic put) unless a committed reference
//!    proves it exists;
//! 4. one database transaction makes it visible.
//!
//! A crash before 4 leaves at most an unreferenced blob, which the collector
//! ([`gc`]) removes; readers only follow committed rows.

pub mod blobs;
mod counted;
pub mod error;
pub mod gc;
pub mod lookup_cache;
pub mod meta;
pub mod model;
mod read;
pub mod spool;

use std::path::{Path, PathBuf};
use std::sync::Arc;

use serde::Serialize;
use symtrace_elf::{Budget, BuildId, DecompressionKind, ElfInfo};
use symtrace_profiles::model::BuildIdKind;

use blobs::BlobStore;
use lookup_cache::LookupCache;
use meta::MetadataStore;
use model::{now_ms, Artifact, ArtifactKind, NewArtifact, ServedArtifact, SourceFile};
use spool::Spooled;

pub use error::{Error, Result};
pub use read::{Details, Health};

/// Who publishes: the owning tenant (empty: shared by every tenant), and
/// whether the publisher is bound to tenants (then it may not replace what
/// it does not own).
#[derive(Debug, Clone, Copy)]
pub struct Publisher<'a> {
    pub owner: &'a str,
    pub bound: bool,
}

impl Publisher<'_> {
    /// A fetch from an upstream server, or a writer of every tenant.
    pub const SHARED: Publisher<'static> = Publisher {
        owner: "",
        bound: false,
    };

    fn may_replace(&self, owner: &str) -> bool {
        !self.bound || owner == self.owner
    }
}

fn owned_elsewhere(what: &str, owner: &str) -> Error {
    let by = if owner.is_empty() {
        "a publisher of every tenant".to_owned()
    } else {
        format!("another tenant ({owner:?})")
    };
    Error::Conflict(format!(
        "{what} was published by {by}; a token bound to tenants may not replace it"
    ))
}

/// Where an uploaded file comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Origin<'a> {
    /// CI (`symtrace-upload`, any script): served to debuginfod clients,
    /// names every frame of its build-ID.
    Upload,
    /// An upstream debuginfod server (its URL, credentials left out): as
    /// CI's.
    Upstream(&'a str),
    /// An agent, from what it found on a host: never served to debuginfod
    /// clients, ranked below any other file, and naming only frames of
    /// mappings whose content hash is the one of the file it was taken
    /// from — the upload's own hash for an executable sent whole, else
    /// the hash the agent declares (`content`) for a symbol-table extract.
    Agent { content: Option<&'a str> },
}

impl Origin<'_> {
    /// As stored (`upload`, `agent`, `upstream:URL`).
    pub fn name(&self) -> String {
        match self {
            Origin::Upload => "upload".to_owned(),
            Origin::Upstream(url) => format!("upstream:{url}"),
            Origin::Agent { .. } => "agent".to_owned(),
        }
    }

    /// For metrics' labels (`upload`, `upstream`, `agent`).
    pub fn as_str(&self) -> &'static str {
        match self {
            Origin::Upload => "upload",
            Origin::Upstream(_) => "upstream",
            Origin::Agent { .. } => "agent",
        }
    }
}

/// What an upload did.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum UploadStatus {
    /// Stored, and it is what the server now serves.
    Created,
    /// These exact bytes were already stored; nothing was written.
    Unchanged,
    /// Stored as a candidate, but a better file stays served.
    Superseded,
}

/// The answer to an artifact upload.
#[derive(Debug, Serialize)]
pub struct UploadOutcome {
    pub status: UploadStatus,
    pub build_id: String,
    pub kind: ArtifactKind,
    pub sha256: String,
    pub size: u64,
    pub quality: &'static str,
    /// The hash of the file now served for this (build-ID, kind).
    pub served_sha256: String,
    /// How many source paths the file's DWARF names.
    pub source_files: usize,
}

/// Whether a lookup may be answered by a recently cached miss.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Misses {
    /// Ask the database (debuginfod: clients cache a 404 for ten minutes).
    Recheck,
    /// A miss less than the lookup TTL old answers (symbolization).
    Cached,
}

/// Metadata and blobs together.
pub struct SymbolStore {
    // The engine's alone: the edges read through the store's methods.
    pub(crate) meta: Arc<dyn MetadataStore>,
    pub(crate) blobs: Arc<dyn BlobStore>,
    spool_dir: PathBuf,
    lookups: LookupCache,
    /// Decompressed bytes one file's compressed debug sections may produce
    /// (`SYMTRACE_MAX_DECOMPRESSED_BYTES`).
    max_decompressed_bytes: u64,
}

impl SymbolStore {
    pub fn new(
        meta: Arc<dyn MetadataStore>,
        blobs: Arc<dyn BlobStore>,
        spool_dir: PathBuf,
        lookup_ttl: std::time::Duration,
    ) -> Self {
        Self {
            meta,
            blobs,
            spool_dir,
            lookups: LookupCache::new(lookup_ttl),
            max_decompressed_bytes: symtrace_elf::DEFAULT_MAX_DECOMPRESSED_BYTES,
        }
    }

    /// Sets how many bytes one file's compressed debug sections may
    /// decompress to, at ingest and when symbolizing.
    pub fn with_max_decompressed_bytes(mut self, bytes: u64) -> Self {
        self.max_decompressed_bytes = bytes;
        self
    }

    /// See [`Self::with_max_decompressed_bytes`].
    pub fn max_decompressed_bytes(&self) -> u64 {
        self.max_decompressed_bytes
    }

    /// The file served for (build-ID, kind), through the short-lived lookup
    /// cache (see `lookup_cache`; `misses` says whether a cached miss may
    /// answer: for symbolization, never for debuginfod clients).
    pub async fn best_artifact(
        &self,
        build_id: &BuildId,
        kind: ArtifactKind,
        misses: Misses,
    ) -> Result<Option<Arc<ServedArtifact>>> {
        match self.lookups.get(build_id.as_str(), kind) {
            Some(Some(hit)) => return Ok(Some(hit)),
            Some(None) if misses == Misses::Cached => return Ok(None),
            _ => {}
        }
        let generation = self.lookups.generation();
        let found = self
            .meta
            .best_artifact(build_id.as_str(), kind)
            .await?
            .map(Arc::new);
        self.lookups
            .put(build_id.as_str(), kind, found.clone(), generation);
        Ok(found)
    }

    /// The best file an agent published for `build_id` from a file of
    /// content `content` (cached like [`Self::best_artifact`]'s misses).
    pub async fn agent_artifact(
        &self,
        build_id: &BuildId,
        kind: ArtifactKind,
        content: &str,
    ) -> Result<Option<Arc<ServedArtifact>>> {
        let key = LookupCache::agent_key(build_id.as_str(), content);
        if let Some(found) = self.lookups.get(&key, kind) {
            return Ok(found);
        }
        let generation = self.lookups.generation();
        let found = self
            .meta
            .agent_artifact(build_id.as_str(), kind, content)
            .await?
            .map(Arc::new);
        self.lookups.put(&key, kind, found.clone(), generation);
        Ok(found)
    }

    /// Deletes a build-ID's artifacts (one kind, or all with sources).
    pub async fn delete(&self, build_id: &BuildId, kind: Option<ArtifactKind>) -> Result<u64> {
        let removed = self.meta.delete(build_id.as_str(), kind).await?;
        self.lookups.invalidate(build_id.as_str());
        Ok(removed)
    }

    /// Where request bodies are spooled.
    pub fn spool_dir(&self) -> &Path {
        &self.spool_dir
    }

    /// Validates a spooled ELF and, if it is new, stores it as a candidate for
    /// (build-ID, kind).
    pub async fn ingest_artifact(
        &self,
        build_id: &BuildId,
        kind: ArtifactKind,
        body: &Spooled,
        file_name: Option<&str>,
        origin: Origin<'_>,
        publisher: Publisher<'_>,
    ) -> Result<UploadOutcome> {
        // An agent's file is bound to a content, and shared by every
        // tenant (it names only frames of that content, whoever's).
        let content = match origin {
            Origin::Upload | Origin::Upstream(_) => String::new(),
            Origin::Agent { content } => match (kind, content) {
                (ArtifactKind::Executable, None) => body.sha256.clone(),
                (ArtifactKind::Executable, Some(c)) if c == body.sha256 => c.to_owned(),
                (ArtifactKind::Executable, Some(_)) => {
                    return Err(Error::Rejected(
                        "an agent's executable is bound to its own content: the content \
                         hash given is not the upload's"
                            .into(),
                    ))
                }
                (ArtifactKind::Debuginfo, Some(c)) if is_sha256_hex(c) => c.to_owned(),
                (ArtifactKind::Debuginfo, _) => {
                    return Err(Error::Rejected(
                        "an agent's debug file needs content_sha256: the SHA-256 of the file \
                         it was taken from (64 lowercase hex digits)"
                            .into(),
                    ))
                }
            },
        };
        let agent = matches!(origin, Origin::Agent { .. });
        let publisher = if agent { Publisher::SHARED } else { publisher };
        let path = body.path.to_path_buf();
        let budget = self.max_decompressed_bytes;
        let (info, source_names) = tokio::task::spawn_blocking(move || inspect_file(&path, budget))
            .await
            .map_err(std::io::Error::other)??;
        validate(&info, build_id, kind)?;
        let quality = info.quality();
        let outcome = |status, served_sha256: String, source_files| UploadOutcome {
            status,
            build_id: build_id.to_string(),
            kind,
            sha256: body.sha256.clone(),
            size: body.size,
            quality: quality.as_str(),
            served_sha256,
            source_files,
        };

        let existing = self.meta.artifacts_of(build_id.as_str()).await?;
        let same = existing.iter().any(|a| {
            a.kind == kind.as_str()
                && a.sha256 == body.sha256
                && (a.origin == "agent") == agent
                && a.content_sha256 == content
        });
        if same {
            let served = self
                .served_sha(build_id, kind, agent.then_some(&content))
                .await?;
            return Ok(outcome(UploadStatus::Unchanged, served, source_names.len()));
        }
        if publisher.bound {
            // Any kind: a debuginfo request may be served an executable
            // with DWARF and the other way round. Agents' files are never a
            // reason to refuse: CI's replace them.
            if let Some(theirs) = existing
                .iter()
                .find(|a| a.origin != "agent" && !publisher.may_replace(&a.owner))
            {
                return Err(owned_elsewhere(
                    &format!("build-ID {build_id}'s {}", theirs.kind),
                    &theirs.owner,
                ));
            }
        }
        self.store_blob(body).await?;
        crash_point("after_blob_put");
        pause_point("after_blob_put").await;
        let default_name = match kind {
            ArtifactKind::Executable => build_id.to_string(),
            ArtifactKind::Debuginfo => format!("{build_id}.debug"),
        };
        let sections: Vec<(&str, u64, u64)> = info
            .sections
            .iter()
            .filter(|s| !s.nobits)
            .map(|s| (s.name.as_str(), s.offset, s.size))
            .collect();
        let new = NewArtifact {
            artifact: Artifact {
                build_id: build_id.to_string(),
                kind: kind.as_str().to_owned(),
                sha256: body.sha256.clone(),
                size: body.size as i64,
                quality: quality.rank(),
                has_dwarf: info.has_dwarf,
                has_symtab: info.has_symtab,
                has_dynsym: info.has_dynsym,
                architecture: info.architecture.clone(),
                file_name: file_name.map(str::to_owned).unwrap_or(default_name),
                origin: origin.name(),
                created_at: now_ms(),
                owner: publisher.owner.to_owned(),
                content_sha256: content.clone(),
            },
            sections: serde_json::to_string(&sections).unwrap_or_else(|_| "[]".into()),
            source_names,
            file_ids: std::iter::once((BuildIdKind::Htlhash, info.htlhash.clone()))
                .chain(info.go_build_id.clone().map(|id| (BuildIdKind::Go, id)))
                .collect(),
        };
        match self.meta.commit_artifact(&new).await {
            // The collector took the claimed blob meanwhile: store it again.
            Err(Error::NotFound(_)) => {
                self.store_blob(body).await?;
                self.meta.commit_artifact(&new).await?;
            }
            other => {
                other?;
            }
        }
        self.lookups.invalidate(build_id.as_str());
        let served = self
            .served_sha(build_id, kind, agent.then_some(&content))
            .await?;
        let status = if served == body.sha256 {
            UploadStatus::Created
        } else {
            UploadStatus::Superseded
        };
        tracing::info!(
            build_id = %build_id, kind = kind.as_str(), sha256 = %body.sha256, size = body.size,
            quality = quality.as_str(), ?status, origin = origin.name(), "artifact stored"
        );
        Ok(outcome(status, served, new.source_names.len()))
    }

    /// The hash of the file served for (build-ID, kind): to debuginfod
    /// clients, or — `agent_content` — for frames of that content when no
    /// other file is there (an agent's file is what names them then).
    async fn served_sha(
        &self,
        build_id: &BuildId,
        kind: ArtifactKind,
        agent_content: Option<&str>,
    ) -> Result<String> {
        let served = self.meta.best_artifact(build_id.as_str(), kind).await?;
        let served = match (served, agent_content) {
            (Some(a), _) => Some(a),
            (None, Some(content)) => {
                self.meta
                    .agent_artifact(build_id.as_str(), kind, content)
                    .await?
            }
            (None, None) => None,
        };
        Ok(served.map(|a| a.artifact.sha256).unwrap_or_default())
    }

    /// Claims the body's blob, then writes its object unless a committed
    /// reference proves it is already stored (see `gc` for why the claim
    /// comes first).
    async fn store_blob(&self, body: &Spooled) -> Result<()> {
        let referenced = self
            .meta
            .claim_blob(&body.sha256, body.size as i64, now_ms())
            .await?;
        if !referenced {
            self.blobs.put_file(&body.sha256, &body.path).await?;
        }
        Ok(())
    }

    /// Stores bytes derived from stored files (a symbol index) as a blob,
    /// durably, and returns its hash. The caller records the reference.
    pub async fn store_derived(&self, bytes: Vec<u8>) -> Result<Spooled> {
        let dir = self.spool_dir.clone();
        let spooled = tokio::task::spawn_blocking(move || spool::spool_bytes(&bytes, &dir))
            .await
            .map_err(std::io::Error::other)??;
        self.store_blob(&spooled).await?;
        Ok(spooled)
    }

    /// A whole blob's bytes: mapped in place from a local store; from a
    /// remote one, downloaded into the spool directory and mapped there.
    pub async fn blob_bytes(&self, sha256: &str) -> Result<bytes::Bytes> {
        match self.blobs.get(sha256, None).await? {
            blobs::BlobBody::Bytes(bytes) => Ok(bytes),
            blobs::BlobBody::Stream(stream) => {
                let file = tempfile::tempfile_in(&self.spool_dir)?;
                let mut writer = tokio::fs::File::from_std(file.try_clone()?);
                let mut reader = tokio_util::io::StreamReader::new(stream);
                tokio::io::copy(&mut reader, &mut writer).await?;
                let mapping = crate::zerocopy::FileMapping::new(file)?;
                Ok(bytes::Bytes::from_owner(mapping))
            }
        }
    }

    /// A small byte range of a blob, in memory (a section, a header).
    pub async fn blob_range(
        &self,
        sha256: &str,
        range: std::ops::Range<u64>,
    ) -> Result<bytes::Bytes> {
        use futures::TryStreamExt;
        match self.blobs.get(sha256, Some(range)).await? {
            blobs::BlobBody::Bytes(bytes) => Ok(bytes),
            blobs::BlobBody::Stream(stream) => {
                let parts: Vec<bytes::Bytes> = stream.try_collect().await?;
                Ok(parts.concat().into())
            }
        }
    }

    /// Stores a source file at a path the build-ID's DWARF names. `trusted`
    /// (federated fetches) skips that check and records the name.
    pub async fn ingest_source(
        &self,
        build_id: &BuildId,
        path: &str,
        body: &Spooled,
        trusted: bool,
        publisher: Publisher<'_>,
    ) -> Result<UploadStatus> {
        let path = checked_source_path(path)?;
        if !trusted && !self.meta.source_is_named(build_id.as_str(), &path).await? {
            let named = self.meta.source_name_count(build_id.as_str()).await?;
            return Err(Error::Rejected(if named == 0 {
                format!(
                    "no DWARF naming source files is stored for build-ID {build_id}: upload its \
                     debuginfo first"
                )
            } else {
                format!(
                    "source path {path:?} is not among the {named} files the DWARF of build-ID \
                     {build_id} names"
                )
            }));
        }
        if let Some(existing) = self.meta.source(build_id.as_str(), &path).await? {
            let same_owner = existing.owner == publisher.owner || !publisher.bound;
            if existing.sha256 == body.sha256 && same_owner {
                return Ok(UploadStatus::Unchanged);
            }
            if !publisher.may_replace(&existing.owner) {
                return Err(owned_elsewhere(
                    &format!("source {path:?} of build-ID {build_id}"),
                    &existing.owner,
                ));
            }
        }
        self.store_blob(body).await?;
        let source = SourceFile {
            build_id: build_id.to_string(),
            path,
            sha256: body.sha256.clone(),
            size: body.size as i64,
            created_at: now_ms(),
            owner: publisher.owner.to_owned(),
        };
        match self.meta.commit_source(&source, trusted).await {
            // The collector took the claimed blob meanwhile: store it again.
            Err(Error::NotFound(_)) => {
                self.store_blob(body).await?;
                self.meta.commit_source(&source, trusted).await?;
            }
            other => other?,
        }
        Ok(UploadStatus::Created)
    }
}

/// Test hook: `SYMTRACE_CRASH_AT=<name>` aborts the process at that point,
/// the way a power cut or an OOM kill would. The crash-safety tests use it to
/// stop between the blob write and the metadata commit.
pub fn crash_point(name: &str) {
    static AT: std::sync::OnceLock<Option<String>> = std::sync::OnceLock::new();
    if AT
        .get_or_init(|| std::env::var("SYMTRACE_CRASH_AT").ok())
        .as_deref()
        == Some(name)
    {
        tracing::error!(point = name, "SYMTRACE_CRASH_AT: aborting");
        std::process::abort();
    }
}

/// Test hook: `SYMTRACE_PAUSE_AT=<name>:<ms>` waits that long at that point
/// (the race tests use it to let the orphan collector run in between).
pub async fn pause_point(name: &str) {
    static AT: std::sync::OnceLock<Option<(String, u64)>> = std::sync::OnceLock::new();
    let at = AT.get_or_init(|| {
        let v = std::env::var("SYMTRACE_PAUSE_AT").ok()?;
        let (point, ms) = v.rsplit_once(':')?;
        Some((point.to_owned(), ms.parse().ok()?))
    });
    if let Some((point, ms)) = at {
        if point == name {
            tracing::warn!(point = name, ms, "SYMTRACE_PAUSE_AT: pausing");
            tokio::time::sleep(std::time::Duration::from_millis(*ms)).await;
        }
    }
}

/// 64 lowercase hex digits.
pub fn is_sha256_hex(s: &str) -> bool {
    s.len() == 64
        && s.bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
}

/// A source path as stored: absolute and canonical. Relative paths are
/// refused (their meaning depends on a directory the server cannot know).
pub fn checked_source_path(path: &str) -> Result<String> {
    if path.contains('\0') {
        return Err(Error::Rejected("source path contains a NUL byte".into()));
    }
    let canonical = symtrace_elf::canonical_path(path);
    if !canonical.starts_with('/') || canonical == "/" {
        return Err(Error::Rejected(format!(
            "source path {path:?} must be absolute, as the DWARF names it (comp_dir + file)"
        )));
    }
    Ok(canonical)
}

/// Validates a spooled file (compressed debug sections must decompress to
/// what they claim within `max_decompressed` bytes) and lists its sources.
fn inspect_file(path: &Path, max_decompressed: u64) -> Result<(ElfInfo, Vec<String>)> {
    let file = std::fs::File::open(path)?;
    // SAFETY: the spool file is private to this request and not modified
    // while mapped.
    let map = unsafe { memmap2::Mmap::map(&file)? };
    let info = symtrace_elf::inspect_with(&map, &mut Budget::new(max_decompressed))
        .map_err(|e| Error::Rejected(rejection(e)))?;
    let names = if info.has_dwarf {
        match symtrace_elf::source_files_with(&map, &mut Budget::new(max_decompressed)) {
            Ok(files) => files
                .paths
                .into_iter()
                .filter(|p| p.starts_with('/'))
                .collect(),
            Err(e) => {
                tracing::warn!(error = %e, "could not list the DWARF's source files");
                Vec::new()
            }
        }
    } else {
        Vec::new()
    };
    Ok((info, names))
}

/// Why inspection refused a file, as the uploader is told.
fn rejection(e: symtrace_elf::Error) -> String {
    match e {
        symtrace_elf::Error::Decompression {
            kind: DecompressionKind::OverBudget,
            ..
        } => format!("{e} (SYMTRACE_MAX_DECOMPRESSED_BYTES)"),
        e => e.to_string(),
    }
}

fn validate(info: &ElfInfo, claimed: &BuildId, kind: ArtifactKind) -> Result<()> {
    match &info.build_id {
        // A file without a GNU build-ID: under the key of its Go build-ID,
        // else under its own htlhash.
        None if info.storage_key() == *claimed || info.htlhash == claimed.as_str() => {}
        None => {
            return Err(Error::Rejected(format!(
                "the ELF file has no GNU build-ID note, so it is stored under {} ({}), not \
                 {claimed}; a stripped copy of a file without a GNU or Go build-ID has another \
                 htlhash and cannot be tied to it (link with -Wl,--build-id)",
                info.storage_key(),
                if info.go_build_id.is_some() {
                    "the key of its Go build-ID"
                } else {
                    "its htlhash"
                }
            )))
        }
        Some(found) if found != claimed => {
            return Err(Error::Rejected(format!(
                "the ELF file's build-ID is {found}, not {claimed} as the URL says"
            )))
        }
        Some(_) => {}
    }
    match kind {
        ArtifactKind::Debuginfo if !info.has_dwarf && !info.has_symtab => Err(Error::Rejected(
            "the file has neither DWARF (.debug_info) nor a symbol table (.symtab), so it \
                 is not debuginfo; upload it as executable"
                .into(),
        )),
        ArtifactKind::Executable if !info.has_code => Err(Error::Rejected(
            "the file has no code (its .text has no contents): it looks like a debuginfo file \
             made by --only-keep-debug; upload it as debuginfo"
                .into(),
        )),
        _ => Ok(()),
    }
}
