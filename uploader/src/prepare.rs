//! Turning what was found into the files to publish: the debuginfo (an
//! existing debug file, or one split natively from the binary), the
//! executable (as built, or stripped in place with `--strip`), the sources
//! the DWARF names, and the frame-pointer report.

use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};

use sha2::{Digest, Sha256};
use symtrace_elf::{content_hash_file as hash_file, BuildId, FileKind};

use crate::discover::{map_file, ElfFile, Group};
use crate::framepointers::{self, FramePointerReport};

/// One file to publish.
#[derive(Debug, Clone)]
pub struct Item {
    pub build_id: BuildId,
    /// `executable`, `debuginfo` or `source`.
    pub kind: &'static str,
    /// The bytes to send.
    pub local: PathBuf,
    /// For sources: the path the DWARF names. For artifacts: the original path.
    pub name: String,
    pub sha256: String,
    pub size: u64,
    pub quality: Option<i32>,
}

/// What one build-ID publishes.
#[derive(Debug, Default)]
pub struct Plan {
    pub label: PathBuf,
    pub items: Vec<Item>,
    /// Source paths named by the DWARF but not found on disk.
    pub missing_sources: Vec<String>,
    /// Source paths named by the DWARF and not read: (path, why).
    pub skipped_sources: Vec<(String, String)>,
    pub frame_pointers: Option<FramePointerReport>,
    /// dwz supplementary files to publish under their own build-IDs.
    pub alt_files: Vec<PathBuf>,
    pub errors: Vec<String>,
    /// `--strip`: the stripped file, put in place of the binary only once
    /// its debuginfo and the stripped executable are published.
    pub replace: Option<Replacement>,
}

/// A stripped binary waiting to replace the original.
#[derive(Debug)]
pub struct Replacement {
    pub stripped: tempfile::NamedTempFile,
    /// The real file (symlinks resolved).
    pub target: PathBuf,
}

impl Replacement {
    /// Puts the stripped file in place: an atomic rename, or — when the
    /// binary has other hard links (cargo's `target/release/app` and
    /// `deps/app-HASH`) — a rewrite of the same inode so every name sees it.
    pub fn apply(self) -> std::io::Result<()> {
        use std::os::unix::fs::MetadataExt;
        self.stripped.as_file().sync_all()?;
        if std::fs::metadata(&self.target)?.nlink() > 1 {
            let mut from = std::fs::File::open(self.stripped.path())?;
            let mut to = std::fs::OpenOptions::new()
                .write(true)
                .truncate(true)
                .open(&self.target)?;
            std::io::copy(&mut from, &mut to)?;
            return to.sync_all();
        }
        self.stripped
            .persist(&self.target)
            .map(|_| ())
            .map_err(|e| e.error)
    }
}

pub struct Options<'a> {
    pub work_dir: &'a Path,
    pub strip: bool,
    pub sources: bool,
    pub prefix_map: &'a [(String, String)],
    /// `--source-root` directories, as given.
    pub source_roots: &'a [PathBuf],
    pub frame_pointers: bool,
}

/// Hashes (SHA-256 and CRC32) what passes through to a file.
struct HashingWriter<W> {
    inner: W,
    sha: Sha256,
    crc: crc32fast::Hasher,
    size: u64,
}

impl<W: Write> Write for HashingWriter<W> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let n = self.inner.write(buf)?;
        self.sha.update(&buf[..n]);
        self.crc.update(&buf[..n]);
        self.size += n as u64;
        Ok(n)
    }

    fn flush(&mut self) -> std::io::Result<()> {
        self.inner.flush()
    }
}

/// Writes `f(writer)` to `path`, returning (sha256, crc32, size).
fn write_hashed(
    path: &Path,
    f: impl FnOnce(&mut HashingWriter<BufWriter<std::fs::File>>) -> Result<u64, symtrace_elf::Error>,
) -> anyhow::Result<(String, u32, u64)> {
    let file = std::fs::File::create(path)?;
    let mut w = HashingWriter {
        inner: BufWriter::with_capacity(1 << 20, file),
        sha: Sha256::new(),
        crc: crc32fast::Hasher::new(),
        size: 0,
    };
    f(&mut w)?;
    w.flush()?;
    Ok((hex::encode(w.sha.finalize()), w.crc.finalize(), w.size))
}

pub fn plan(build_id: &BuildId, group: &Group, opts: &Options<'_>) -> Plan {
    let mut plan = Plan::default();
    // Of several files with the same build-ID (a copy stripped by hand, say),
    // the one with the most debug data.
    let binary = group
        .binaries
        .iter()
        .max_by_key(|b| (b.info.quality(), b.info.has_dwarf));
    let best_debug = group
        .debug_files
        .iter()
        .max_by_key(|f| (f.info.quality(), f.info.has_dwarf));
    plan.label = binary
        .or(best_debug)
        .map(|f| f.path.clone())
        .unwrap_or_default();

    // A file with neither a GNU nor a Go build-ID is known only by its
    // htlhash, which a split or stripped copy does not share: it is
    // published whole, DWARF and all.
    let whole_only =
        binary.is_some_and(|b| b.info.build_id.is_none() && b.info.go_build_id.is_none());
    if whole_only && opts.strip {
        plan.errors.push(format!(
            "{}: no GNU or Go build-ID, so its stripped copy could not be tied to its debug \
             info; neither stripped nor published (publish it without --strip, or link it \
             with -Wl,--build-id)",
            plan.label.display()
        ));
        return plan;
    }
    // The executable is hashed while its debug info is split (unless it is
    // about to be rewritten by --strip).
    let exe_hash = binary.filter(|_| !opts.strip).map(|b| {
        let path = b.path.clone();
        std::thread::spawn(move || hash_file(&path))
    });
    let mut dwarf_file: Option<&ElfFile> = None;
    // The debuginfo: an existing debug file at least as good as what the
    // binary carries, else one split from the binary.
    let binary_quality = binary.map(|b| b.info.quality());
    match (best_debug, binary) {
        (Some(d), b) if b.is_none_or(|b| d.info.quality() >= b.info.quality()) => {
            match hash_file(&d.path) {
                Ok((sha256, size)) => plan.items.push(Item {
                    build_id: build_id.clone(),
                    kind: "debuginfo",
                    local: d.path.clone(),
                    name: d.path.display().to_string(),
                    sha256,
                    size,
                    quality: Some(d.info.quality().rank()),
                }),
                Err(e) => plan
                    .errors
                    .push(format!("{}: cannot read: {e}", d.path.display())),
            }
            dwarf_file = Some(d);
        }
        (_, Some(b)) if whole_only => dwarf_file = Some(b),
        (_, Some(b)) if b.info.has_dwarf || b.info.has_symtab => {
            let out = opts.work_dir.join(format!("{build_id}.debug"));
            let split = std::fs::File::open(&b.path)
                .map_err(anyhow::Error::from)
                .and_then(|input| write_hashed(&out, |w| symtrace_elf::only_keep_debug(&input, w)));
            match split {
                Ok((sha256, _crc, size)) => plan.items.push(Item {
                    build_id: build_id.clone(),
                    kind: "debuginfo",
                    local: out,
                    name: format!("{}.debug", b.path.display()),
                    sha256,
                    size,
                    quality: binary_quality.map(|q| q.rank()),
                }),
                Err(e) => plan.errors.push(format!(
                    "{}: splitting debug info failed: {e:#}",
                    b.path.display()
                )),
            }
            dwarf_file = Some(b);
        }
        _ => {}
    }

    // Sources and dwz links are read before --strip rewrites the binary.
    if let Some(d) = dwarf_file {
        if let Some((alt, _)) = &d.info.debugaltlink {
            let alt = Path::new(alt);
            let alt = if alt.is_absolute() {
                alt.to_path_buf()
            } else {
                d.path.parent().unwrap_or(Path::new(".")).join(alt)
            };
            if alt.exists() {
                plan.alt_files.push(alt);
            } else {
                plan.errors.push(format!(
                    "{}: its dwz supplementary file {} was not found",
                    d.path.display(),
                    alt.display()
                ));
            }
        }
        if opts.sources && d.info.has_dwarf {
            collect_sources(build_id, d, opts, &mut plan);
        }
    }
    if let Some(b) = binary {
        if opts.frame_pointers {
            plan.frame_pointers = map_file(&b.path)
                .ok()
                .and_then(|m| framepointers::check(&m));
        }
        let hashed = exe_hash.map(|h| {
            h.join()
                .unwrap_or_else(|_| Err(std::io::Error::other("hashing thread panicked")))
        });
        match executable_item(build_id, b, &mut plan, hashed, opts) {
            Ok(item) => plan.items.push(item),
            Err(e) => plan.errors.push(format!("{}: {e:#}", b.path.display())),
        }
    }

    plan
}

fn executable_item(
    build_id: &BuildId,
    b: &ElfFile,
    plan: &mut Plan,
    hashed: Option<std::io::Result<(String, u64)>>,
    opts: &Options<'_>,
) -> anyhow::Result<Item> {
    let name = b.path.display().to_string();
    let strippable = matches!(b.info.file_kind, FileKind::Executable | FileKind::Dynamic);
    if opts.strip && b.info.has_dwarf && strippable {
        let Some(debug) = plan.items.iter().find(|i| i.kind == "debuginfo") else {
            anyhow::bail!("cannot strip: no debuginfo was produced to link to");
        };
        let crc = crc_of(&debug.local)?;
        // The debuglink names the debug file as it is published: an existing
        // one by its own name, a split one as `<binary>.debug`.
        let debug_name = if debug.local.starts_with(opts.work_dir) {
            format!("{}.debug", file_name(&b.path))
        } else {
            file_name(&debug.local)
        };
        let target = std::fs::canonicalize(&b.path)?;
        let dir = target.parent().unwrap_or(Path::new("."));
        let temp = tempfile::Builder::new()
            .prefix(".symtrace-strip-")
            .tempfile_in(dir)?;
        let input = std::fs::File::open(&target)?;
        let (sha256, _crc, size) = write_hashed(temp.path(), |w| {
            symtrace_elf::strip_debug(&input, &debug_name, crc, w)
        })?;
        drop(input);
        std::fs::set_permissions(temp.path(), std::fs::metadata(&target)?.permissions())?;
        let quality = symtrace_elf::inspect(&map_file(temp.path())?)?.quality();
        let mut item = executable(build_id, b, name, sha256, size, quality);
        item.local = temp.path().to_owned();
        plan.replace = Some(Replacement {
            stripped: temp,
            target,
        });
        return Ok(item);
    }
    let (sha256, size) = match hashed {
        Some(h) => h?,
        None => hash_file(&b.path)?,
    };
    Ok(executable(
        build_id,
        b,
        name,
        sha256,
        size,
        b.info.quality(),
    ))
}

fn executable(
    build_id: &BuildId,
    b: &ElfFile,
    name: String,
    sha256: String,
    size: u64,
    quality: symtrace_elf::Quality,
) -> Item {
    Item {
        build_id: build_id.clone(),
        kind: "executable",
        local: b.path.clone(),
        name,
        sha256,
        size,
        quality: Some(quality.rank()),
    }
}

fn file_name(path: &Path) -> String {
    path.file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default()
}

fn crc_of(path: &Path) -> std::io::Result<u32> {
    let mut file = std::fs::File::open(path)?;
    let mut crc = crc32fast::Hasher::new();
    let mut buf = vec![0u8; 1 << 20];
    loop {
        let n = std::io::Read::read(&mut file, &mut buf)?;
        if n == 0 {
            return Ok(crc.finalize());
        }
        crc.update(&buf[..n]);
    }
}

fn collect_sources(build_id: &BuildId, d: &ElfFile, opts: &Options<'_>, plan: &mut Plan) {
    let files = match map_file(&d.path)
        .map_err(|e| e.to_string())
        .and_then(|m| symtrace_elf::source_files(&m).map_err(|e| e.to_string()))
    {
        Ok(files) => files,
        Err(e) => {
            plan.errors.push(format!(
                "{}: reading the DWARF's source list failed: {e}",
                d.path.display()
            ));
            return;
        }
    };
    let on_disk = |name: &str| -> PathBuf {
        PathBuf::from(
            opts.prefix_map
                .iter()
                .find_map(|(old, new)| {
                    let old = old.trim_end_matches('/');
                    let rest = name.strip_prefix(old)?;
                    (rest.is_empty() || rest.starts_with('/')).then(|| format!("{new}{rest}"))
                })
                .unwrap_or_else(|| name.to_owned()),
        )
    };
    // The roots as they really are on disk (symlinks resolved), so a source
    // is checked by where it really is, not by the name the DWARF gives.
    let given: Vec<PathBuf> = opts
        .source_roots
        .iter()
        .filter_map(|root| std::fs::canonicalize(root).ok())
        .collect();
    // A compilation directory comes from the same DWARF as the names (a
    // prebuilt object can claim any), so it is a root only inside the
    // directory the uploader runs in or a --source-root, and never the home
    // directory or above it.
    let trusted: Vec<PathBuf> = std::env::current_dir()
        .ok()
        .and_then(|d| std::fs::canonicalize(d).ok())
        .filter(|d| d.parent().is_some())
        .into_iter()
        .chain(given.iter().cloned())
        .collect();
    let home = std::env::var_os("HOME").and_then(|h| std::fs::canonicalize(h).ok());
    let roots: Vec<PathBuf> = files
        .comp_dirs
        .iter()
        .filter_map(|dir| std::fs::canonicalize(on_disk(dir)).ok())
        .filter(|dir| dir.components().count() > 2) // not `/`, `/home`, `/root`, …
        .filter(|dir| home.as_ref().is_none_or(|h| !h.starts_with(dir)))
        .filter(|dir| trusted.iter().any(|t| dir.starts_with(t)))
        .chain(given)
        .collect();
    for name in files.paths.into_iter().filter(|n| n.starts_with('/')) {
        let path = on_disk(&name);
        match source_under_roots(&path, &roots) {
            Ok(real) => match hash_file(&real) {
                Ok((sha256, size)) => plan.items.push(Item {
                    build_id: build_id.clone(),
                    kind: "source",
                    local: real,
                    name,
                    sha256,
                    size,
                    quality: None,
                }),
                Err(_) => plan.missing_sources.push(name),
            },
            Err(Skip::Missing) => plan.missing_sources.push(name),
            Err(Skip::Outside(why)) => plan.skipped_sources.push((name, why)),
        }
    }
}

enum Skip {
    Missing,
    Outside(String),
}

/// The real path of a source file when it is a regular file under one of
/// `roots` (already canonical). Checked on the resolved path, so a symlink
/// inside a root that points out of it is outside.
fn source_under_roots(path: &Path, roots: &[PathBuf]) -> Result<PathBuf, Skip> {
    // Never read kernel pseudo-files a DWARF might name (/proc/self/environ
    // would publish the job's environment, tokens included).
    if ["/proc/", "/sys/", "/dev/"]
        .iter()
        .any(|p| path.starts_with(p))
    {
        return Err(Skip::Outside("a kernel pseudo-file".into()));
    }
    let real = std::fs::canonicalize(path).map_err(|_| Skip::Missing)?;
    if !roots.iter().any(|root| real.starts_with(root)) {
        let why = if real != path {
            format!(
                "outside the source roots (it resolves to {})",
                real.display()
            )
        } else {
            "outside the source roots (the compilation directories under the working directory, and --source-root)".to_owned()
        };
        return Err(Skip::Outside(why));
    }
    if !std::fs::metadata(&real).is_ok_and(|m| m.is_file()) {
        return Err(Skip::Outside("not a regular file".into()));
    }
    Ok(real)
}
