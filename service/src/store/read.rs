//! What the edges read of the symbol store, in the store's own errors:
//! the debuginfo API's listings and details, sources by path, `/metadata`
//! searches, blob ranges and the health of both backends. The metadata and
//! blob stores themselves stay inside the engine.

use std::collections::BTreeMap;
use std::ops::Range;

use serde::Serialize;
use symtrace_elf::BuildId;

use super::blobs::BlobBody;
use super::model::{Artifact, ArtifactKind, FileQuery, ListFilter, SourceFile};
use super::{Result, SymbolStore};

/// What is stored for one build-ID, as one reader sees it.
#[derive(Debug, Serialize)]
pub struct Details {
    pub build_id: String,
    /// The file served for each kind (its SHA-256), whoever published it.
    pub served: BTreeMap<&'static str, String>,
    pub artifacts: Vec<Artifact>,
    pub sources: Vec<SourceFile>,
    /// Source paths the build-ID's DWARF names.
    pub source_names: i64,
}

/// Whether each backend answers.
#[derive(Debug)]
pub struct Health {
    pub database: Result<()>,
    pub objects: Result<()>,
}

impl SymbolStore {
    /// Asks the database and the object store (each once).
    pub async fn health(&self) -> Health {
        let (database, objects) = futures::join!(self.meta.ping(), self.blobs.ping());
        Health { database, objects }
    }

    /// The build-ID's files and sources that `sees` an owner of; `None`
    /// when it sees no file of it.
    pub async fn details(
        &self,
        build_id: &BuildId,
        sees: impl Fn(&str) -> bool,
    ) -> Result<Option<Details>> {
        let id = build_id.as_str();
        let mut artifacts = self.meta.artifacts_of(id).await?;
        artifacts.retain(|a| sees(&a.owner));
        if artifacts.is_empty() {
            return Ok(None);
        }
        let mut served = BTreeMap::new();
        for kind in [ArtifactKind::Executable, ArtifactKind::Debuginfo] {
            if let Some(best) = self.meta.best_artifact(id, kind).await? {
                served.insert(kind.as_str(), best.artifact.sha256);
            }
        }
        let mut sources = self.meta.sources_of(id).await?;
        sources.retain(|s| sees(&s.owner));
        Ok(Some(Details {
            build_id: id.to_owned(),
            served,
            artifacts,
            sources,
            source_names: self.meta.source_name_count(id).await?,
        }))
    }

    /// The first owner of the build-ID's files (of `kind`, or all with its
    /// sources) that `allows` refuses (the empty owner: shared by every
    /// tenant).
    pub async fn foreign_owner(
        &self,
        build_id: &BuildId,
        kind: Option<ArtifactKind>,
        allows: impl Fn(&str) -> bool,
    ) -> Result<Option<String>> {
        let id = build_id.as_str();
        let artifacts = self.meta.artifacts_of(id).await?;
        let sources = match kind {
            None => self.meta.sources_of(id).await?,
            Some(_) => Vec::new(),
        };
        Ok(artifacts
            .iter()
            .filter(|a| kind.is_none_or(|k| a.kind == k.as_str()))
            .map(|a| a.owner.as_str())
            .chain(sources.iter().map(|s| s.owner.as_str()))
            .find(|owner| owner.is_empty() || !allows(owner))
            .map(str::to_owned))
    }

    /// The source file stored at `path` (canonical) for `build_id`.
    pub async fn source(&self, build_id: &str, path: &str) -> Result<Option<SourceFile>> {
        self.meta.source(build_id, path).await
    }

    /// Artifacts matching `filter`, newest first.
    pub async fn list(&self, filter: &ListFilter) -> Result<Vec<Artifact>> {
        self.meta.list(filter).await
    }

    /// Artifacts for debuginfod's `/metadata`, at most `limit`.
    pub async fn find_files(&self, query: &FileQuery, limit: i64) -> Result<Vec<Artifact>> {
        self.meta.find_files(query, limit).await
    }

    /// Bytes `range` (all without one) of blob `sha256`.
    pub async fn blob(&self, sha256: &str, range: Option<Range<u64>>) -> Result<BlobBody> {
        self.blobs.get(sha256, range).await
    }
}
