//! Real ELF files with compressed debug sections, built by gcc (zlib,
//! `-gz=zlib` and the legacy `.zdebug` form `-gz=zlib-gnu`) and
//! llvm-objcopy (zstd: Debian 12's gcc has no `-gz=zstd` and its binutils
//! objcopy silently leaves sections uncompressed), then with their headers
//! patched to lie.

use std::path::Path;
use std::process::Command;

use object::{Object, ObjectSection};

use super::*;
use crate::{inspect, inspect_with, source_files, source_files_with, Quality};

const MAIN_C: &str = "#include <stdio.h>\n#include \"util.h\"\n\n\
static const char *names[] = {\"alpha\", \"beta\", \"gamma\", \"delta\"};\n\n\
struct point { int x, y, z; const char *label; };\n\n\
static int walk(struct point *p, int n)\n{\n  int sum = 0;\n  \
for (int i = 0; i < n; i++)\n    sum += scale(p[i].x, p[i].y) + p[i].z;\n  return sum;\n}\n\n\
int main(int argc, char **argv)\n{\n  struct point pts[4];\n  \
for (int i = 0; i < 4; i++) {\n    pts[i].x = i; pts[i].y = argc; pts[i].z = i * i;\n    \
pts[i].label = names[i];\n  }\n  printf(\"%s %d\\n\", argv[0], walk(pts, 4));\n  return 0;\n}\n";
const UTIL_H: &str = "static inline int scale(int a, int b) { return a * b + 1; }\n";

fn in_ci() -> bool {
    std::env::var("CI").is_ok_and(|v| !v.is_empty() && v != "0" && v != "false")
}

fn have(tool: &str) -> bool {
    Command::new(tool)
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success())
}

/// Records a skip as symtrace-testkit's `skip` does (this crate cannot use
/// the testkit, which depends on it): stderr and `target/test-skips.txt`.
fn skip(why: &str) {
    eprintln!("SKIP: {why}");
    let test = std::thread::current()
        .name()
        .unwrap_or("unnamed test")
        .to_owned();
    let log = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../target/test-skips.txt");
    if let Ok(mut f) = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(log)
    {
        use std::io::Write;
        let _ = writeln!(f, "{test}\t{why}");
    }
}

/// Whether a tool is there; missing under `CI=true` fails instead of skipping.
fn require(tool: &str) -> bool {
    let found = have(tool);
    if !found {
        assert!(!in_ci(), "{tool} is required in CI");
        skip(&format!("{tool} is not available"));
    }
    found
}

fn run(cmd: &mut Command) {
    let out = cmd.output().unwrap_or_else(|e| panic!("{cmd:?}: {e}"));
    assert!(
        out.status.success(),
        "{cmd:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Builds main.c with `-g` and `flags` in `dir/src`, as `dir/name`.
fn gcc(dir: &Path, name: &str, flags: &[&str]) -> Vec<u8> {
    let src = dir.join("src");
    std::fs::create_dir_all(&src).unwrap();
    std::fs::write(src.join("main.c"), MAIN_C).unwrap();
    std::fs::write(src.join("util.h"), UTIL_H).unwrap();
    let out = dir.join(name);
    run(Command::new("gcc")
        .current_dir(&src)
        .args(["-O0", "-g", "-Wl,--build-id"])
        .args(flags)
        .arg("-o")
        .arg(&out)
        .arg("main.c"));
    std::fs::read(out).unwrap()
}

fn llvm_objcopy() -> Option<&'static str> {
    ["llvm-objcopy-19", "llvm-objcopy"]
        .into_iter()
        .find(|t| have(t))
}

/// The test files: uncompressed, zlib, zstd and `.zdebug` (zlib-gnu).
struct Files {
    _dir: tempfile::TempDir,
    plain: Vec<u8>,
    zlib: Vec<u8>,
    zdebug: Vec<u8>,
    zstd: Option<Vec<u8>>,
}

fn files() -> Option<Files> {
    if !require("gcc") {
        return None;
    }
    let dir = tempfile::tempdir().unwrap();
    let plain = gcc(dir.path(), "plain", &[]);
    let zlib = gcc(dir.path(), "zlib", &["-gz=zlib"]);
    let zdebug = gcc(dir.path(), "zdebug", &["-gz=zlib-gnu"]);
    let zstd = match llvm_objcopy() {
        Some(tool) => {
            let out = dir.path().join("zstd");
            run(Command::new(tool)
                .arg("--compress-debug-sections=zstd")
                .arg(dir.path().join("plain"))
                .arg(&out));
            Some(std::fs::read(out).unwrap())
        }
        None => {
            assert!(!in_ci(), "llvm-objcopy is required in CI");
            skip("zstd cases: llvm-objcopy is not available");
            None
        }
    };
    let files = Files {
        _dir: dir,
        plain,
        zlib,
        zdebug,
        zstd,
    };
    // The fixtures really are what they are named.
    assert_eq!(
        format_of(&files.plain, ".debug_info"),
        CompressionFormat::None
    );
    assert_eq!(
        format_of(&files.zlib, ".debug_info"),
        CompressionFormat::Zlib
    );
    assert_eq!(
        format_of(&files.zdebug, ".zdebug_info"),
        CompressionFormat::Zlib
    );
    if let Some(zstd) = &files.zstd {
        assert_eq!(format_of(zstd, ".debug_info"), CompressionFormat::Zstandard);
    }
    Some(files)
}

impl Files {
    /// The SHF_COMPRESSED files, by format name.
    fn compressed(&self) -> Vec<(&'static str, &[u8])> {
        let mut out = vec![("zlib", &self.zlib[..])];
        if let Some(zstd) = &self.zstd {
            out.push(("zstd", &zstd[..]));
        }
        out
    }
}

fn format_of(data: &[u8], name: &str) -> CompressionFormat {
    let file = object::File::parse(data).unwrap();
    let section = file.section_by_name(name).expect(name);
    section.compressed_file_range().unwrap().format
}

/// The claimed uncompressed size of a section, as its header says.
fn claimed(data: &[u8], name: &str) -> u64 {
    let file = object::File::parse(data).unwrap();
    let section = file.section_by_name(name).expect(name);
    section.compressed_file_range().unwrap().uncompressed_size
}

/// Rewrites the size a compressed section's header claims: `ch_size` of the
/// Elf64_Chdr (little-endian, at offset 8) of an SHF_COMPRESSED section, or
/// the big-endian size after `ZLIB` of a `.zdebug_*` one.
fn patch_raw(data: &[u8], name: &str, size: u64) -> Vec<u8> {
    let file = object::File::parse(data).unwrap();
    assert!(file.is_64() && file.is_little_endian());
    let section = file.section_by_name(name).expect(name);
    let start = section.file_range().unwrap().0 as usize;
    let mut out = data.to_vec();
    if name.starts_with(".zdebug_") {
        assert_eq!(&out[start..start + 4], b"ZLIB");
        out[start + 4..start + 12].copy_from_slice(&size.to_be_bytes());
    } else {
        out[start + 8..start + 16].copy_from_slice(&size.to_le_bytes());
    }
    out
}

/// [`patch_raw`], checked to be what object now reads as the claim.
fn patch_claim(data: &[u8], name: &str, size: u64) -> Vec<u8> {
    let out = patch_raw(data, name, size);
    assert_eq!(claimed(&out, name), size);
    out
}

/// `section_data` of one section with `budget`.
fn data_of(data: &[u8], name: &str, budget: &mut Budget) -> Result<Vec<u8>, Error> {
    let file = object::File::parse(data).unwrap();
    let section = file.section_by_name(name).expect(name);
    section_data(&section, budget).map(|d| d.into_owned())
}

fn check_of(data: &[u8], name: &str, budget: &mut Budget) -> Result<u64, Error> {
    let file = object::File::parse(data).unwrap();
    let section = file.section_by_name(name).expect(name);
    check_section(&section, budget)
}

/// Asserts a decompression error of `kind` naming `section`, whose message
/// contains `needle`.
fn assert_refused<T: std::fmt::Debug>(
    result: Result<T, Error>,
    section: &str,
    kind: DecompressionKind,
    needle: &str,
) -> String {
    match result {
        Err(e @ Error::Decompression { .. }) => {
            let Error::Decompression {
                section: s,
                kind: k,
                message,
            } = &e
            else {
                unreachable!()
            };
            assert_eq!(s, section, "{e}");
            assert_eq!(*k, kind, "{e}");
            assert!(message.contains(needle), "{e:?} should mention {needle:?}");
            let text = e.to_string();
            assert!(text.starts_with(&format!("section {section}: ")), "{text}");
            text
        }
        other => panic!("expected a decompression error for {section}, got {other:?}"),
    }
}

const TIB: u64 = 1 << 40;

#[test]
fn compressed_sections_decompress_to_what_they_claim() {
    let Some(f) = files() else { return };
    let want_sources = source_files(&f.plain).unwrap();
    assert!(
        want_sources
            .paths
            .iter()
            .any(|p| p.ends_with("/src/main.c")),
        "{want_sources:?}"
    );
    let mut cases = f.compressed();
    cases.push(("zdebug", &f.zdebug[..]));
    for (what, data) in cases {
        let file = object::File::parse(data).unwrap();
        let mut budget = Budget::new(u64::MAX);
        let mut total = 0u64;
        let mut checked = 0;
        for section in file.sections() {
            let name = section.name().unwrap();
            if !(name.starts_with(".debug_") || name.starts_with(".zdebug_")) {
                continue;
            }
            let range = section.compressed_file_range().unwrap();
            if range.format == CompressionFormat::None {
                continue;
            }
            let got = section_data(&section, &mut budget).unwrap();
            // The same bytes as object's own (unbounded) decompression.
            let want = section.uncompressed_data().unwrap();
            assert_eq!(got, want, "{what} {name}");
            assert_eq!(got.len() as u64, range.uncompressed_size);
            assert_eq!(
                check_section(&section, &mut Budget::new(range.uncompressed_size)).unwrap(),
                range.uncompressed_size
            );
            total += range.uncompressed_size;
            checked += 1;
        }
        assert!(checked >= 3, "{what}: only {checked} compressed sections");
        assert_eq!(budget.remaining(), u64::MAX - total, "{what}");

        assert_eq!(source_files(data).unwrap(), want_sources, "{what}");
        let info = inspect(data).unwrap();
        assert!(info.compressed_debug, "{what}");
        assert_eq!(info.quality(), Quality::Dwarf, "{what}");
        // Exactly the budget the sections need is enough.
        inspect_with(data, &mut Budget::new(total)).unwrap();
    }
}

#[test]
fn an_uncompressed_section_is_borrowed_and_costs_nothing() {
    let Some(f) = files() else { return };
    let file = object::File::parse(&*f.plain).unwrap();
    let section = file.section_by_name(".debug_info").unwrap();
    let mut budget = Budget::new(0);
    let got = section_data(&section, &mut budget).unwrap();
    assert!(matches!(got, Cow::Borrowed(_)));
    assert_eq!(&*got, section.data().unwrap());
    assert_eq!(budget.remaining(), 0);
    let info = inspect_with(&f.plain, &mut Budget::new(0)).unwrap();
    assert!(!info.compressed_debug);
    source_files_with(&f.plain, &mut Budget::new(0)).unwrap();
}

#[test]
fn a_terabyte_claim_is_refused_before_allocating() {
    let Some(f) = files() else { return };
    for (what, data) in f.compressed() {
        let bad = patch_claim(data, ".debug_info", TIB);
        let want = format!(
            "section .debug_info: claims 1099511627776 uncompressed bytes ({what}), \
             over the 4294967296-byte budget"
        );
        // Every path: bounded decompression, its check, inspection (upload
        // validation) and the source listing.
        let text = assert_refused(
            data_of(&bad, ".debug_info", &mut Budget::default()),
            ".debug_info",
            DecompressionKind::OverBudget,
            "claims 1099511627776",
        );
        assert_eq!(text, want);
        let mut budget = Budget::default();
        let text = assert_refused(
            check_of(&bad, ".debug_info", &mut budget),
            ".debug_info",
            DecompressionKind::OverBudget,
            "over the 4294967296-byte budget",
        );
        assert_eq!(text, want);
        // Nothing was charged for the refused section.
        assert_eq!(budget.remaining(), DEFAULT_MAX_DECOMPRESSED_BYTES);
        // Inspection checks the sections in file order: some before
        // .debug_info may have used part of the budget.
        let text = assert_refused(
            inspect(&bad),
            ".debug_info",
            DecompressionKind::OverBudget,
            "claims 1099511627776",
        );
        assert!(text.starts_with(&want), "{text}");
        assert_refused(
            source_files(&bad),
            ".debug_info",
            DecompressionKind::OverBudget,
            "claims 1099511627776",
        );
        // Even a budget that would allow it cannot be fooled into keeping
        // the file: the stream is far shorter than the claim.
        assert_refused(
            check_of(&bad, ".debug_info", &mut Budget::new(u64::MAX)),
            ".debug_info",
            DecompressionKind::Corrupt,
            "of the 1099511627776 bytes its header claims",
        );
    }
}

#[test]
fn a_zdebug_claim_over_the_budget_is_refused() {
    let Some(f) = files() else { return };
    // The legacy form: "ZLIB" + an 8-byte big-endian size.
    let real = claimed(&f.zdebug, ".zdebug_info");
    let bad = patch_claim(&f.zdebug, ".zdebug_info", u32::MAX as u64);
    let text = assert_refused(
        data_of(&bad, ".zdebug_info", &mut Budget::new(1 << 20)),
        ".zdebug_info",
        DecompressionKind::OverBudget,
        "claims 4294967295 uncompressed bytes (zlib), over the 1048576-byte budget",
    );
    assert_eq!(
        text,
        "section .zdebug_info: claims 4294967295 uncompressed bytes (zlib), over the \
         1048576-byte budget"
    );
    // Within the budget, the stream is checked and found short.
    assert_refused(
        inspect_with(&bad, &mut Budget::new(u64::MAX)),
        ".zdebug_info",
        DecompressionKind::Corrupt,
        &format!("ends after {real} of the 4294967295 bytes"),
    );
    // A size over 32 bits is no valid .zdebug header for object at all.
    let bad = patch_raw(&f.zdebug, ".zdebug_info", TIB);
    assert_refused(
        inspect(&bad),
        ".zdebug_info",
        DecompressionKind::Corrupt,
        "unreadable compression header",
    );
    assert!(source_files(&bad).is_err());
}

#[test]
fn a_real_stream_larger_than_a_small_budget_is_refused() {
    let Some(f) = files() else { return };
    let mut cases: Vec<_> = f
        .compressed()
        .into_iter()
        .map(|(what, data)| (what, data, ".debug_info"))
        .collect();
    cases.push(("zlib", &f.zdebug[..], ".zdebug_info"));
    for (what, data, name) in cases {
        let size = claimed(data, name);
        assert!(size > 16, "{size}");
        // One byte less than the section really inflates to.
        assert_refused(
            data_of(data, name, &mut Budget::new(size - 1)),
            name,
            DecompressionKind::OverBudget,
            &format!(
                "claims {size} uncompressed bytes ({what}), over the {}-byte budget",
                size - 1
            ),
        );
        assert_refused(
            check_of(data, name, &mut Budget::new(size - 1)),
            name,
            DecompressionKind::OverBudget,
            "budget",
        );
        // Exactly enough is enough.
        let mut budget = Budget::new(size);
        assert_eq!(data_of(data, name, &mut budget).unwrap().len() as u64, size);
        assert_eq!(budget.remaining(), 0);

        // The budget is shared by the sections of one operation: enough for
        // .debug_info alone is not enough for the whole file.
        let file = object::File::parse(data).unwrap();
        let all: u64 = file
            .sections()
            .filter_map(|s| s.compressed_file_range().ok())
            .filter(|r| r.format != CompressionFormat::None)
            .map(|r| r.uncompressed_size)
            .sum();
        assert!(all > size);
        let err = inspect_with(data, &mut Budget::new(all - 1)).unwrap_err();
        assert!(
            matches!(
                err,
                Error::Decompression {
                    kind: DecompressionKind::OverBudget,
                    ..
                }
            ),
            "{err}"
        );
        assert!(
            err.to_string()
                .contains(&format!("over the {}-byte budget (", all - 1))
                && err
                    .to_string()
                    .contains("bytes left after the sections before it)"),
            "{err}"
        );
        inspect_with(data, &mut Budget::new(all)).unwrap();
        let err = source_files_with(data, &mut Budget::new(size)).unwrap_err();
        assert!(
            matches!(
                err,
                Error::Decompression {
                    kind: DecompressionKind::OverBudget,
                    ..
                }
            ),
            "{err}"
        );
    }
}

#[test]
fn a_claim_larger_than_the_stream_is_corrupt() {
    let Some(f) = files() else { return };
    for (what, data) in f.compressed() {
        let real = claimed(data, ".debug_info");
        for lie in [real + 1, real * 2, 1 << 30] {
            let bad = patch_claim(data, ".debug_info", lie);
            let needle =
                format!("{what} stream ends after {real} of the {lie} bytes its header claims");
            assert_refused(
                data_of(&bad, ".debug_info", &mut Budget::default()),
                ".debug_info",
                DecompressionKind::Corrupt,
                &needle,
            );
            assert_refused(
                check_of(&bad, ".debug_info", &mut Budget::default()),
                ".debug_info",
                DecompressionKind::Corrupt,
                &needle,
            );
            assert_refused(
                inspect(&bad),
                ".debug_info",
                DecompressionKind::Corrupt,
                &needle,
            );
            assert_refused(
                source_files(&bad),
                ".debug_info",
                DecompressionKind::Corrupt,
                &needle,
            );
        }
    }
}

#[test]
fn a_stream_longer_than_its_claim_is_corrupt() {
    let Some(f) = files() else { return };
    for (what, data) in f.compressed() {
        let real = claimed(data, ".debug_info");
        for lie in [real - 1, real / 2, 0] {
            let bad = patch_claim(data, ".debug_info", lie);
            let needle =
                format!("{what} stream inflates to more than the {lie} bytes its header claims");
            assert_refused(
                data_of(&bad, ".debug_info", &mut Budget::default()),
                ".debug_info",
                DecompressionKind::Corrupt,
                &needle,
            );
            assert_refused(
                check_of(&bad, ".debug_info", &mut Budget::default()),
                ".debug_info",
                DecompressionKind::Corrupt,
                &needle,
            );
            assert_refused(
                inspect(&bad),
                ".debug_info",
                DecompressionKind::Corrupt,
                &needle,
            );
        }
    }
    // The same for the legacy form.
    let real = claimed(&f.zdebug, ".zdebug_info");
    let bad = patch_claim(&f.zdebug, ".zdebug_info", real - 1);
    assert_refused(
        inspect(&bad),
        ".zdebug_info",
        DecompressionKind::Corrupt,
        "zlib stream inflates to more than",
    );
}

#[test]
fn a_damaged_stream_is_refused_without_panicking() {
    let Some(f) = files() else { return };
    for (what, data) in f.compressed() {
        let file = object::File::parse(data).unwrap();
        let range = file
            .section_by_name(".debug_info")
            .unwrap()
            .compressed_file_range()
            .unwrap();
        let (start, len) = (range.offset as usize, range.compressed_size as usize);
        // Bytes of the stream overwritten, at a few places.
        for at in [0, len / 3, len / 2, len - 4] {
            let mut bad = data.to_vec();
            for b in &mut bad[start + at..(start + at + 4).min(start + len)] {
                *b ^= 0xa5;
            }
            // Undetectable damage may decode to other bytes of the right size;
            // anything else must be a decompression error, never a panic.
            for result in [
                data_of(&bad, ".debug_info", &mut Budget::default()).map(|d| d.len() as u64),
                check_of(&bad, ".debug_info", &mut Budget::default()),
            ] {
                match result {
                    Ok(n) => assert_eq!(n, range.uncompressed_size, "{what} at {at}"),
                    Err(Error::Decompression { section, .. }) => {
                        assert_eq!(section, ".debug_info")
                    }
                    Err(e) => panic!("{what} at {at}: {e}"),
                }
            }
        }
        // A stream cut short.
        let mut bad = data.to_vec();
        bad[start + len / 2..start + len].fill(0);
        assert!(matches!(
            inspect(&bad),
            Err(Error::Decompression {
                kind: DecompressionKind::Corrupt,
                ..
            })
        ));
    }
}
