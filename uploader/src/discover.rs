//! Finding ELF files and grouping them by build-ID (or, for files without
//! one, by the key the store keeps them under: see `ElfInfo::storage_key`).

use std::collections::{BTreeMap, HashSet};
use std::io::Read;
use std::path::{Path, PathBuf};

use symtrace_elf::{BuildId, ElfInfo};

/// An ELF file with a build-ID.
#[derive(Debug, Clone)]
pub struct ElfFile {
    pub path: PathBuf,
    pub info: ElfInfo,
}

impl ElfFile {
    /// A runnable binary or library (code with contents), as opposed to a
    /// debug-only file (`*.debug`, a dwz supplementary file).
    pub fn is_binary(&self) -> bool {
        self.info.has_code
    }
}

/// Everything found for one build-ID.
#[derive(Debug, Default)]
pub struct Group {
    pub binaries: Vec<ElfFile>,
    pub debug_files: Vec<ElfFile>,
}

/// A file that could not be used, and why.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Failure {
    pub path: PathBuf,
    pub reason: String,
}

#[derive(Debug, Default)]
pub struct Discovery {
    pub groups: BTreeMap<BuildId, Group>,
    pub failures: Vec<Failure>,
    pub non_elf: usize,
    /// Relocatable objects without a build-ID.
    pub objects_ignored: usize,
}

/// Walks `paths`, reads every ELF file once (symlinks and hard links count
/// once) and groups them by build-ID.
pub fn discover(paths: &[PathBuf]) -> Discovery {
    let mut found = Discovery::default();
    let mut seen = HashSet::new();
    for root in paths {
        if !root.exists() {
            found.failures.push(Failure {
                path: root.clone(),
                reason: "no such file or directory".into(),
            });
            continue;
        }
        for entry in walkdir::WalkDir::new(root).follow_links(true) {
            let entry = match entry {
                Ok(e) => e,
                Err(e) => {
                    let path = e
                        .path()
                        .map(Path::to_path_buf)
                        .unwrap_or_else(|| root.clone());
                    found.failures.push(Failure {
                        path,
                        reason: format!("cannot read: {e}"),
                    });
                    continue;
                }
            };
            if !entry.file_type().is_file() {
                continue;
            }
            // Symlinks and hard links (cargo's target/release/app and
            // deps/app-HASH) are one file.
            let id = entry.metadata().map(|m| {
                use std::os::unix::fs::MetadataExt;
                (m.dev(), m.ino())
            });
            if id.is_ok_and(|id| !seen.insert(id)) {
                continue;
            }
            add_file(&mut found, entry.path());
        }
    }
    found
}

/// Reads one file into the discovery (used for dwz supplementary files too).
pub fn add_file(found: &mut Discovery, path: &Path) {
    match read_elf(path) {
        Ok(None) => found.non_elf += 1,
        // Object files (`.o` left by build scripts) have no build-ID and
        // nothing to publish.
        Ok(Some(file))
            if file.info.build_id.is_none()
                && file.info.file_kind == symtrace_elf::FileKind::Relocatable =>
        {
            found.objects_ignored += 1
        }
        // Grouped by the key the store keeps them under: the GNU build-ID,
        // else (a plain `go build`) the Go build-ID's key, else the htlhash.
        Ok(Some(file)) => {
            let group = found.groups.entry(file.info.storage_key()).or_default();
            if file.is_binary() {
                group.binaries.push(file);
            } else {
                group.debug_files.push(file);
            }
        }
        Err(reason) => found.failures.push(Failure {
            path: path.to_path_buf(),
            reason,
        }),
    }
}

fn read_elf(path: &Path) -> Result<Option<ElfFile>, String> {
    let mut magic = [0u8; 4];
    let mut file = std::fs::File::open(path).map_err(|e| format!("cannot read: {e}"))?;
    if file
        .read(&mut magic)
        .map_err(|e| format!("cannot read: {e}"))?
        < 4
        || &magic != b"\x7fELF"
    {
        return Ok(None);
    }
    let map = map_file(path).map_err(|e| format!("cannot read: {e}"))?;
    let info = symtrace_elf::inspect(&map).map_err(|e| e.to_string())?;
    Ok(Some(ElfFile {
        path: path.to_path_buf(),
        info,
    }))
}

/// A read-only mapping of a file.
pub fn map_file(path: &Path) -> std::io::Result<memmap2::Mmap> {
    let file = std::fs::File::open(path)?;
    // SAFETY: build outputs are not modified while we publish them; a change
    // under us would at worst upload bytes the server then rejects.
    unsafe { memmap2::Mmap::map(&file) }
}
