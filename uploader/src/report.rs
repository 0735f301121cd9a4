//! The summary: one line per file on stderr (progress bars on a terminal,
//! plain lines in CI logs), and with `--json` a machine-readable document on
//! stdout.

use std::path::PathBuf;

use serde::Serialize;

use crate::discover::Failure;
use crate::framepointers::FramePointerReport;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Status {
    /// Sent, and the server stored it.
    Uploaded,
    /// The server already had it (or something better); nothing sent.
    Present,
    /// `--dry-run`: would be sent.
    WouldUpload,
    Failed,
}

#[derive(Debug, Clone, Serialize)]
pub struct ItemReport {
    pub kind: &'static str,
    /// The source path (for sources) or the local file.
    pub path: String,
    pub bytes: u64,
    pub status: Status,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
}

/// A source the DWARF names that was not read.
#[derive(Debug, Clone, Serialize)]
pub struct SkippedSource {
    pub path: String,
    pub reason: String,
}

#[derive(Debug, Clone, Serialize)]
pub struct FileReport {
    pub path: PathBuf,
    pub build_id: String,
    pub items: Vec<ItemReport>,
    pub missing_sources: Vec<String>,
    /// Sources the DWARF names that were not read, and why.
    pub skipped_sources: Vec<SkippedSource>,
    pub errors: Vec<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub frame_pointers: Option<FramePointerReport>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub frame_pointer_gate_failed: Option<bool>,
}

#[derive(Debug, Clone, Serialize)]
pub struct Summary {
    pub server: String,
    pub files: Vec<FileReport>,
    pub failures: Vec<Failure>,
    pub non_elf_files: usize,
    /// Relocatable objects (`.o`) without a build-ID, skipped.
    pub objects_ignored: usize,
    pub uploaded: usize,
    pub present: usize,
    pub failed: usize,
    pub bytes_uploaded: u64,
    pub exit_code: u8,
}

fn human(bytes: u64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut v = bytes as f64;
    let mut u = 0;
    while v >= 1024.0 && u + 1 < UNITS.len() {
        v /= 1024.0;
        u += 1;
    }
    if u == 0 {
        format!("{bytes} B")
    } else {
        format!("{v:.1} {}", UNITS[u])
    }
}

/// The human-readable lines.
pub fn print_human(summary: &Summary) {
    for f in &summary.failures {
        eprintln!("symtrace-upload: FAILED {}: {}", f.path.display(), f.reason);
    }
    for file in &summary.files {
        let mut parts = Vec::new();
        for kind in ["debuginfo", "executable"] {
            for item in file.items.iter().filter(|i| i.kind == kind) {
                parts.push(match item.status {
                    Status::Uploaded => format!("{kind} uploaded ({})", human(item.bytes)),
                    Status::Present => format!("{kind} already present"),
                    Status::WouldUpload => {
                        format!("{kind} would be uploaded ({})", human(item.bytes))
                    }
                    Status::Failed => {
                        format!("{kind} FAILED: {}", item.reason.as_deref().unwrap_or("?"))
                    }
                });
            }
        }
        let sources: Vec<&ItemReport> = file.items.iter().filter(|i| i.kind == "source").collect();
        if !sources.is_empty()
            || !file.missing_sources.is_empty()
            || !file.skipped_sources.is_empty()
        {
            let count = |s: Status| sources.iter().filter(|i| i.status == s).count();
            let mut line = format!(
                "sources: {} uploaded, {} present",
                count(Status::Uploaded) + count(Status::WouldUpload),
                count(Status::Present)
            );
            if count(Status::Failed) > 0 {
                line.push_str(&format!(", {} FAILED", count(Status::Failed)));
            }
            if !file.missing_sources.is_empty() {
                line.push_str(&format!(
                    ", {} not found on disk",
                    file.missing_sources.len()
                ));
            }
            if !file.skipped_sources.is_empty() {
                line.push_str(&format!(
                    ", {} skipped (outside the source roots; see skipped_sources)",
                    file.skipped_sources.len()
                ));
            }
            parts.push(line);
        }
        eprintln!(
            "symtrace-upload: {} ({}): {}",
            file.path.display(),
            file.build_id,
            parts.join("; ")
        );
        for item in sources.iter().filter(|i| i.status == Status::Failed) {
            eprintln!(
                "  source FAILED {}: {}",
                item.path,
                item.reason.as_deref().unwrap_or("?")
            );
        }
        for e in &file.errors {
            eprintln!("  FAILED {e}");
        }
        if let Some(fp) = &file.frame_pointers {
            let verdict = if file.frame_pointer_gate_failed == Some(true) {
                "FAILED"
            } else {
                "ok"
            };
            eprintln!(
                "  frame pointers {verdict}: {} of {} functions that call others lack them; {} leaf functions without ({}); {:.1}% of all function code counted against the gate{}",
                fp.without,
                fp.functions,
                fp.leaves_without,
                if fp.eh_frame {
                    "not counted: symtrace-agent recovers their callers from .eh_frame"
                } else {
                    "counted: the file has no .eh_frame, so their callers are lost"
                },
                fp.share_without_percent,
                if fp.examples.is_empty() {
                    String::new()
                } else {
                    format!(
                        "; largest: {}",
                        fp.examples.iter().take(5).map(|(n, s)| format!("{n} ({s} B)")).collect::<Vec<_>>().join(", ")
                    )
                }
            );
        }
    }
    eprintln!(
        "symtrace-upload: {} uploaded ({} sent), {} already present, {} failed{}{}",
        summary.uploaded,
        human(summary.bytes_uploaded),
        summary.present,
        summary.failed,
        if summary.objects_ignored > 0 {
            format!(
                "; {} object files without build-ID ignored",
                summary.objects_ignored
            )
        } else {
            String::new()
        },
        if summary.non_elf_files > 0 {
            format!("; {} non-ELF files ignored", summary.non_elf_files)
        } else {
            String::new()
        }
    );
}
