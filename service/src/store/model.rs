//! The rows the symbol store keeps, shared by the metadata backends and the
//! HTTP layers.

use serde::{Deserialize, Serialize};

/// Which half of a build an artifact is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ArtifactKind {
    /// The runnable ELF (stripped or not).
    Executable,
    /// A file with DWARF or a symbol table: a split `.debug` file, a dwz
    /// supplementary file, or an unstripped binary.
    Debuginfo,
}

impl ArtifactKind {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Executable => "executable",
            Self::Debuginfo => "debuginfo",
        }
    }

    pub fn parse(s: &str) -> Option<Self> {
        match s {
            "executable" => Some(Self::Executable),
            "debuginfo" => Some(Self::Debuginfo),
            _ => None,
        }
    }
}

/// One stored candidate for a (build-ID, kind).
#[derive(Debug, Clone, Serialize, sqlx::FromRow)]
pub struct Artifact {
    pub build_id: String,
    pub kind: String,
    pub sha256: String,
    pub size: i64,
    pub quality: i32,
    pub has_dwarf: bool,
    pub has_symtab: bool,
    pub has_dynsym: bool,
    pub architecture: String,
    pub file_name: String,
    pub origin: String,
    /// Unix milliseconds.
    pub created_at: i64,
    /// The tenant that published it; empty: shared by every tenant.
    pub owner: String,
    /// For an agent's file: the SHA-256 of the file it was taken from (it
    /// names only frames of mappings with that content hash). Empty for
    /// CI's and upstream files.
    #[serde(skip_serializing_if = "String::is_empty")]
    pub content_sha256: String,
}

/// An artifact together with its blob's section table, as the debuginfod
/// handlers need it.
#[derive(Debug, Clone, sqlx::FromRow)]
pub struct ServedArtifact {
    #[sqlx(flatten)]
    pub artifact: Artifact,
    /// JSON `[[name, offset, size], ...]`.
    pub sections: Option<String>,
}

impl ServedArtifact {
    /// The file range of a section with contents, from the stored table.
    pub fn section_range(&self, name: &str) -> Option<(u64, u64)> {
        let table: Vec<(String, u64, u64)> =
            serde_json::from_str(self.sections.as_deref()?).ok()?;
        table
            .into_iter()
            .find(|(n, _, _)| n == name)
            .map(|(_, off, size)| (off, size))
    }
}

/// An uploaded source file.
#[derive(Debug, Clone, Serialize, sqlx::FromRow)]
pub struct SourceFile {
    pub build_id: String,
    pub path: String,
    pub sha256: String,
    pub size: i64,
    pub created_at: i64,
    /// The tenant that published it; empty: shared by every tenant.
    pub owner: String,
}

/// A new artifact to commit, with what inspection found.
#[derive(Debug, Clone)]
pub struct NewArtifact {
    pub artifact: Artifact,
    /// JSON section table of the blob.
    pub sections: String,
    /// Source paths its DWARF names.
    pub source_names: Vec<String>,
    /// The file's other IDs (its htlhash, its Go build-ID), which lead to
    /// `artifact.build_id`.
    pub file_ids: Vec<(symtrace_profiles::model::BuildIdKind, String)>,
}

/// One entry of a `missing` query (the wire type the uploader and the
/// agent send).
pub use symtrace_wire::missing::WantedItem;

/// Filters of the list API.
#[derive(Debug, Clone, Default, Deserialize)]
pub struct ListFilter {
    /// Build-ID prefix.
    pub build_id: Option<String>,
    pub kind: Option<String>,
    /// Substring of the file name.
    pub file: Option<String>,
    pub limit: Option<i64>,
    pub offset: Option<i64>,
    /// Only files these tenants published, and shared ones (`None`: all).
    /// Set by the server from the reader's token, never from the query.
    #[serde(skip)]
    pub owners: Option<Vec<String>>,
}

/// How a file name is matched by `/metadata`.
#[derive(Debug, Clone)]
pub enum FileQuery {
    Exact(String),
    /// SQL LIKE prefix to narrow the scan before fnmatch filtering.
    Prefix(String),
    BuildId(String),
}

/// Current time in unix milliseconds.
pub fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or(0)
}

/// A profile segment to record (see migrations/*/0003_profiles.sql).
#[derive(Debug, Clone)]
pub struct NewSegment {
    pub tenant: String,
    pub sha256: String,
    pub size: i64,
    pub start_ns: i64,
    pub end_ns: i64,
    pub points: i64,
    pub level: i32,
    pub created_at: i64,
    pub series: Vec<SeriesRow>,
    /// Linked traces, sorted, each once per part holding it.
    pub traces: Vec<TraceRef>,
}

/// A trace linked from a segment's samples, and the part holding them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct TraceRef {
    pub trace_id: [u8; 16],
    /// The part's (offset, length) in the segment; None: the segment is
    /// one part, read whole.
    pub part: Option<(u64, u64)>,
}

impl SegmentRef {
    /// The part of this segment at (offset, length).
    pub fn with_part(&self, (offset, size): (u64, u64)) -> Self {
        Self {
            part_offset: i64::try_from(offset).ok(),
            part_size: i64::try_from(size).ok(),
            ..self.clone()
        }
    }
}

/// One (service, profile type) of a segment.
#[derive(Debug, Clone)]
pub struct SeriesRow {
    pub service: String,
    pub profile_type: String,
    pub start_ns: i64,
    pub end_ns: i64,
    pub points: i64,
    pub total: i64,
    /// JSON: label name → its values, or null when there were too many.
    pub labels: String,
    /// The byte range of this series' part in the segment (format version
    /// 2); None: the segment is one part.
    pub part: Option<std::ops::Range<u64>>,
}

/// A stored segment, or one part of it (a query of one service reads only
/// its parts).
#[derive(Debug, Clone, sqlx::FromRow)]
pub struct SegmentRef {
    pub sha256: String,
    pub size: i64,
    pub start_ns: i64,
    pub end_ns: i64,
    pub points: i64,
    pub level: i32,
    /// Where the part starts in the segment (None: the whole segment).
    #[sqlx(default)]
    pub part_offset: Option<i64>,
    /// The part's length in bytes.
    #[sqlx(default)]
    pub part_size: Option<i64>,
}

impl SegmentRef {
    /// The byte range to read: the part's, or None for the whole segment.
    pub fn part(&self) -> Option<std::ops::Range<u64>> {
        match (self.part_offset, self.part_size) {
            (Some(o), Some(n)) if o >= 0 && n >= 0 => Some(o as u64..(o + n) as u64),
            _ => None,
        }
    }

    /// The bytes a read of it fetches.
    pub fn read_bytes(&self) -> u64 {
        self.part_size.unwrap_or(self.size).max(0) as u64
    }

    /// A cache key: the segment, and the part's offset if it is one.
    pub fn key(&self) -> String {
        match self.part_offset {
            Some(o) => part_key(&self.sha256, o),
            None => self.sha256.clone(),
        }
    }
}

/// The cache key of the part of segment `sha256` at byte `offset`.
pub fn part_key(sha256: &str, offset: impl std::fmt::Display) -> String {
    format!("{sha256}@{offset}")
}

/// A stored series row, as the label and service lists read it.
#[derive(Debug, Clone, sqlx::FromRow)]
pub struct SeriesInfo {
    pub service: String,
    pub profile_type: String,
    /// JSON: label name → its values, or null when there were too many.
    pub labels: String,
}

/// Which segments a query reads: time range `[from_ns, to_ns)`.
#[derive(Debug, Clone, Default)]
pub struct SeriesQuery {
    pub tenant: String,
    pub service: Option<String>,
    pub profile_type: Option<String>,
    pub from_ns: i64,
    pub to_ns: i64,
}
