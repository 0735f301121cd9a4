//! From stored frames to the frames a flamegraph shows. Native frames left
//! for the symbolizer are grouped by build-ID ([`native_jobs`]); the caller
//! asks its symbolizer (that is I/O, not here) and hands the answers back
//! to [`Resolved::build`], which expands inline frames, keeps the names the
//! sender gave, and shows what cannot be named as `module+0xaddress` with
//! its build-ID — never dropped.

use std::fmt;
use std::sync::Arc;

use indexmap::IndexSet;
use rustc_hash::{FxBuildHasher, FxHashMap};

use crate::aggregate::{Aggregate, RawFrame};
use crate::model::BuildIdKind;

/// A frame as shown. Lines are not part of the identity, so a function
/// is one node whatever line of it was sampled.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Shown {
    /// The function's name (a string index of the aggregate).
    pub name: u32,
    /// The source file (a string index, 0 = none).
    pub file: u32,
    /// `native`, `inlined`, `kernel`, `unsymbolized`, … (a string index).
    pub kind: u32,
    /// For native frames: the build-ID (a string index, 0 = none).
    pub build_id: u32,
}

/// How a build-ID's frames were named: the status the query answers with
/// per build-ID, and the one `/api/v1/symbolize` gives.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum BuildIdStatus {
    /// Named from DWARF: functions, files, lines, inline frames.
    Ok,
    /// Only a symbol table: function names without files or lines.
    SymbolsOnly,
    /// The stored files have neither DWARF nor a symbol table.
    NoSymbols,
    /// No file of this ID (GNU build-ID, htlhash or Go build-ID), here or
    /// upstream.
    UnknownBuildId,
    /// Nothing stored yet, but an agent has claimed the file and is
    /// publishing it.
    UploadPending,
    /// The symbolizer failed (the message says why).
    Error(String),
}

impl BuildIdStatus {
    /// The stable name (`ok`, `symbols_only`, …, `error`).
    pub fn as_str(&self) -> &'static str {
        match self {
            Self::Ok => "ok",
            Self::SymbolsOnly => "symbols_only",
            Self::NoSymbols => "no_symbols",
            Self::UnknownBuildId => "unknown_build_id",
            Self::UploadPending => "upload_pending",
            Self::Error(_) => "error",
        }
    }
}

impl BuildIdStatus {
    /// Why frames of a module with this status are named as they are, or
    /// not at all, and what would name them: for people.
    pub fn reason(&self) -> String {
        match self {
            Self::Ok => "named from DWARF: functions, inlined calls, files and lines".into(),
            Self::SymbolsOnly => "a symbol table only: functions without files or lines; an \
                address outside every symbol stays unnamed (upload its debug info to name it)"
                .into(),
            Self::NoSymbols => "the stored files have no symbols (a stripped binary, a Go \
                binary built with -ldflags=-s): publish its unstripped build, or use an \
                upstream debuginfod server that has its debug info"
                .into(),
            Self::UnknownBuildId => "no file with this ID is stored here or upstream: publish it \
                with symtrace-upload, or let symtrace-agent publish it (a file an agent \
                published names only the frames of samples of its own content, from an agent \
                that sends content hashes: not another profiler's)"
                .into(),
            Self::UploadPending => {
                "an agent is publishing the file; the next query names it".into()
            }
            Self::Error(message) => format!("symbolizing failed: {message}"),
        }
    }
}

impl fmt::Display for BuildIdStatus {
    /// The name, and for errors `error: <message>`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Error(message) => write!(f, "error: {message}"),
            other => f.write_str(other.as_str()),
        }
    }
}

/// One frame of a symbolized address.
#[derive(Debug)]
pub struct Named {
    /// The function (demangled).
    pub function: Arc<str>,
    /// The source file, empty when unknown.
    pub file: Arc<str>,
    /// The line, 0 when unknown.
    pub line: u32,
}

/// An address's frames, innermost first; empty when it is in no function.
/// Shared: names cached across queries are mapped to a query's strings by
/// pointer.
pub type Frames = Arc<[Named]>;

/// The native frames of one build-ID that need names.
#[derive(Debug, Clone)]
pub struct NativeJob {
    /// The build-ID's string index in the aggregate.
    pub build_id: u32,
    /// The build-ID as text.
    pub build_id_text: String,
    /// Its kind (only GNU build-IDs can be looked up).
    pub kind: BuildIdKind,
    /// The content hash of the frames' file (what an agent's published
    /// file must have been taken from to name them), when the sender gave
    /// one.
    pub content: Option<String>,
    /// (raw frame, ELF address) pairs.
    pub frames: Vec<(u32, u64)>,
}

impl NativeJob {
    /// The addresses, in the order of [`NativeJob::frames`].
    pub fn addresses(&self) -> Vec<u64> {
        self.frames.iter().map(|&(_, a)| a).collect()
    }
}

/// A job's answer: its status and per frame its names (None: unnamed).
#[derive(Debug)]
pub struct NativeAnswer {
    /// The job answered.
    pub job: NativeJob,
    /// How the build-ID answered.
    pub status: BuildIdStatus,
    /// Per frame of the job, in its order.
    pub found: Vec<Option<Frames>>,
}

/// The native frames of an aggregate left for the symbolizer, one job per
/// build-ID and content hash.
pub fn native_jobs(agg: &Aggregate) -> Vec<NativeJob> {
    let mut by_build_id: FxHashMap<(u32, u32), Vec<(u32, u64)>> = FxHashMap::default();
    for (i, f) in agg.frames.iter().enumerate() {
        if f.is_native_unsymbolized() {
            by_build_id
                .entry((f.build_id, f.content))
                .or_default()
                .push((i as u32, f.address));
        }
    }
    let mut jobs: Vec<NativeJob> = by_build_id
        .into_iter()
        .map(|((b, content), frames)| NativeJob {
            build_id: b,
            build_id_text: agg.str(b).to_owned(),
            kind: agg.frames[frames[0].0 as usize].build_id_kind,
            content: (content != 0).then(|| agg.str(content).to_owned()),
            frames,
        })
        .collect();
    jobs.sort_unstable_by(|a, b| (a.build_id, &a.content).cmp(&(b.build_id, &b.content)));
    jobs
}

/// Every raw frame of an aggregate, resolved.
pub struct Resolved {
    /// The distinct shown frames.
    pub shown: IndexSet<Shown, FxBuildHasher>,
    /// The first line seen per shown frame.
    pub lines: Vec<u32>,
    /// Per raw frame: its run of `expansion_items`.
    expansion_spans: Vec<(u32, u32)>,
    /// Shown frames of each raw frame, leaf (innermost) first.
    expansion_items: Vec<u32>,
    /// Build-IDs asked and how they answered.
    pub build_ids: Vec<ModuleStatus>,
}

/// How one module's (build-ID's) frames were named.
#[derive(Debug, Clone)]
pub struct ModuleStatus {
    /// The ID the frames came with.
    pub build_id: String,
    /// Which kind of ID it is.
    pub kind: BuildIdKind,
    /// The mapping's file name.
    pub module: String,
    /// The content hash the frames came with (their file's SHA-256), if
    /// any: frames of one build-ID but other contents are asked apart.
    pub content: Option<String>,
    /// How the ID answered.
    pub status: BuildIdStatus,
    /// Distinct addresses asked.
    pub addresses: usize,
    /// Of those, the ones left unnamed.
    pub unnamed: usize,
}

impl Resolved {
    /// Nothing resolved yet, for `raw_frames` frames.
    pub fn new(raw_frames: usize) -> Self {
        Self {
            shown: IndexSet::default(),
            lines: Vec::new(),
            expansion_spans: vec![(0, 0); raw_frames],
            expansion_items: Vec::with_capacity(raw_frames * 2),
            build_ids: Vec::new(),
        }
    }

    /// Resolves every frame of `agg`: native ones from `answers` (the
    /// symbolizer's answers to [`native_jobs`]), the others from the names
    /// the sender gave.
    pub fn build(agg: &mut Aggregate, answers: Vec<NativeAnswer>) -> Self {
        let native = agg.intern("native");
        let inlined = agg.intern("inlined");
        let unsymbolized = agg.intern("unsymbolized");
        let mut out = Resolved::new(agg.frames.len());
        // (function, file) of the shared names, by pointer, with the kind
        // and build-ID → shown frame: one lookup per frame, no hashing of
        // the text.
        let mut by_pointer: FxHashMap<(*const u8, *const u8, u32, u32), u32> = FxHashMap::default();
        for answer in answers {
            let b = answer.job.build_id;
            let module = answer
                .job
                .frames
                .first()
                .map(|&(f, _)| agg.str(agg.frames[f as usize].module).to_owned())
                .unwrap_or_default();
            out.build_ids.push(ModuleStatus {
                build_id: answer.job.build_id_text.clone(),
                kind: answer.job.kind,
                module,
                content: answer.job.content.clone(),
                status: answer.status.clone(),
                addresses: answer.job.frames.len(),
                unnamed: answer
                    .found
                    .iter()
                    .filter(|f| f.as_ref().is_none_or(|f| f.is_empty()))
                    .count(),
            });
            by_pointer.reserve(answer.job.frames.len());
            for ((frame, _), named) in answer.job.frames.iter().zip(answer.found) {
                if *frame as usize >= out.expansion_spans.len() {
                    continue;
                }
                let start = out.expansion_items.len();
                if let Some(named) = named {
                    let n = named.len();
                    for (depth, fr) in named.iter().enumerate() {
                        let kind = if depth + 1 < n { inlined } else { native };
                        let key = (fr.function.as_ptr(), fr.file.as_ptr(), kind, b);
                        let shown = match by_pointer.get(&key) {
                            Some(&shown) => shown,
                            None => {
                                let shown = Shown {
                                    name: agg.intern(&fr.function),
                                    file: agg.intern(&fr.file),
                                    kind,
                                    build_id: b,
                                };
                                let id = out.add(shown, fr.line);
                                by_pointer.insert(key, id);
                                id
                            }
                        };
                        out.expansion_items.push(shown);
                    }
                }
                if out.expansion_items.len() == start {
                    let raw = agg.frames[*frame as usize].clone();
                    let shown = unnamed(agg, &mut out, &raw, unsymbolized);
                    out.expansion_items.push(shown);
                }
                out.expand(*frame, start);
            }
        }
        // Frames the sender named, and native frames without a build-ID
        // (or left out of the answers).
        for i in 0..agg.frames.len() {
            if out.expansion_spans[i].1 != 0 {
                continue;
            }
            let raw = agg.frames[i].clone();
            let mut shown = Vec::new();
            for &(function, system_name, file, line) in raw.lines.iter() {
                let name = if agg.str(function).is_empty() {
                    system_name
                } else {
                    function
                };
                if agg.str(name).is_empty() {
                    continue;
                }
                shown.push(out.add(
                    Shown {
                        name,
                        file,
                        kind: raw.kind,
                        build_id: raw.build_id,
                    },
                    line.clamp(0, u32::MAX as i64) as u32,
                ));
            }
            if shown.is_empty() {
                shown.push(unnamed(agg, &mut out, &raw, unsymbolized));
            }
            let start = out.expansion_items.len();
            out.expansion_items.extend(shown);
            out.expand(i as u32, start);
        }
        out
    }

    /// The shown frames of a raw frame, leaf first.
    pub fn expansion(&self, raw: u32) -> &[u32] {
        let (start, len) = self.expansion_spans[raw as usize];
        &self.expansion_items[start as usize..(start + len) as usize]
    }

    #[cfg(test)]
    pub(crate) fn push_expansion(&mut self, raw: u32, shown: &[u32]) {
        let start = self.expansion_items.len();
        self.expansion_items.extend_from_slice(shown);
        self.expand(raw, start);
    }

    /// Sets a raw frame's shown frames to what was pushed since `start`.
    fn expand(&mut self, raw: u32, start: usize) {
        self.expansion_spans[raw as usize] =
            (start as u32, (self.expansion_items.len() - start) as u32);
    }

    fn add(&mut self, shown: Shown, line: u32) -> u32 {
        let (i, new) = self.shown.insert_full(shown);
        if new {
            self.lines.push(line);
        }
        i as u32
    }
}

/// `module+0xaddress`: the mapping's file name (or the build-ID when the
/// sender gave no name) and the ELF virtual address.
fn unnamed(agg: &mut Aggregate, out: &mut Resolved, raw: &RawFrame, kind: u32) -> u32 {
    let module = agg.str(raw.module);
    let module = module.rsplit('/').next().unwrap_or(module);
    let module = if !module.is_empty() {
        module.to_owned()
    } else if raw.build_id != 0 {
        let b = agg.str(raw.build_id);
        b[..b.len().min(16)].to_owned()
    } else {
        agg.str(raw.kind).to_owned()
    };
    let name = agg.intern(&format!("{module}+{:#x}", raw.address));
    out.add(
        Shown {
            name,
            file: 0,
            kind,
            build_id: raw.build_id,
        },
        0,
    )
}
