//! Fixture binaries (built once per test process) and address sampling.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

use object::{Object, ObjectSection, ObjectSymbol};
use symtrace_testkit::{have, run};

pub const FIXTURES: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures");

pub struct Binaries {
    _dir: tempfile::TempDir,
    pub gcc: PathBuf,
    pub clang: PathBuf,
    pub rust: PathBuf,
    pub zstd: PathBuf,
    pub dwz: PathBuf,
    /// Built from the same sources as `dwz_multi`, before `dwz -m`.
    pub dwz_multi_original: PathBuf,
    /// Processed by `dwz -m`: its DWARF refers into `dwz_common`.
    pub dwz_multi: PathBuf,
    pub dwz_common: PathBuf,
}

/// The fixtures, or `None` when a compiler is missing outside CI.
pub fn binaries() -> Option<&'static Binaries> {
    static BINARIES: OnceLock<Option<Binaries>> = OnceLock::new();
    BINARIES
        .get_or_init(|| {
            for tool in ["g++", "clang++", "rustc", "objcopy", "dwz"] {
                if !have(tool) {
                    return None;
                }
            }
            Some(build())
        })
        .as_ref()
}

fn build() -> Binaries {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let heavy = Path::new(FIXTURES).join("heavy.cpp");
    let extra = Path::new(FIXTURES).join("extra.cpp");
    let out = |name: &str| d.join(name);
    run(Command::new("g++")
        .args(["-O2", "-g", "-o"])
        .arg(out("gcc"))
        .arg(&heavy));
    run(Command::new("clang++")
        .args(["-O2", "-g", "-o"])
        .arg(out("clang"))
        .arg(&heavy));
    run(Command::new("rustc")
        .args(["-C", "opt-level=2", "-C", "debuginfo=2", "-o"])
        .arg(out("rust"))
        .arg(Path::new(FIXTURES).join("rustprog.rs")));
    run(Command::new("objcopy")
        .arg("--compress-debug-sections=zstd")
        .arg(out("gcc"))
        .arg(out("zstd")));
    for (name, define) in [("two", "-DONE"), ("two-b", "-DTWO")] {
        run(Command::new("g++")
            .args(["-O2", "-g", define, "-o"])
            .arg(out(name))
            .args([&heavy, &extra]));
    }
    run(Command::new("dwz")
        .arg("-o")
        .arg(out("dwz"))
        .arg(out("two")));
    std::fs::copy(out("two"), out("multi")).unwrap();
    std::fs::copy(out("two-b"), out("multi-b")).unwrap();
    run(Command::new("dwz")
        .arg("-m")
        .arg(out("common.debug"))
        .arg("-M")
        .arg(out("common.debug"))
        .arg(out("multi"))
        .arg(out("multi-b")));
    Binaries {
        gcc: out("gcc"),
        clang: out("clang"),
        rust: out("rust"),
        zstd: out("zstd"),
        dwz: out("dwz"),
        dwz_multi_original: out("two"),
        dwz_multi: out("multi"),
        dwz_common: out("common.debug"),
        _dir: dir,
    }
}

/// `count` addresses drawn uniformly over the bytes of the file's `.text`
/// (sized functions, size-0 ones, padding and gaps alike; seeded, so runs
/// repeat), then every address of each size-0 function symbol's extent
/// there (up to the next symbol, at most 256 bytes each).
pub fn sample_addresses(file: &Path, count: usize, seed: u64) -> Vec<u64> {
    let data = std::fs::read(file).unwrap();
    let obj = object::File::parse(&*data).unwrap();
    let text = obj.section_by_name(".text").expect("a .text section");
    let (start, size) = (text.address(), text.size());
    assert!(size > 0, "{} has an empty .text", file.display());
    let mut state = seed;
    let mut addresses: Vec<u64> = (0..count)
        .map(|_| {
            // xorshift64*
            state ^= state >> 12;
            state ^= state << 25;
            state ^= state >> 27;
            start + state.wrapping_mul(0x2545_f491_4f6c_dd1d) % size
        })
        .collect();
    for (address, end) in size_zero_functions(file) {
        addresses.extend(address..end.min(address + 256));
    }
    addresses
}

/// The size-0 function symbols of the file's `.text` and where each one's
/// extent ends (the next symbol, or the section's end).
pub fn size_zero_functions(file: &Path) -> Vec<(u64, u64)> {
    let data = std::fs::read(file).unwrap();
    let obj = object::File::parse(&*data).unwrap();
    let text = obj.section_by_name(".text").expect("a .text section");
    let end = text.address() + text.size();
    let mut starts: Vec<(u64, u64)> = obj
        .symbols()
        .filter(|s| s.section_index() == Some(text.index()) && s.address() > 0)
        .filter(|s| s.kind() == object::SymbolKind::Text)
        .map(|s| (s.address(), s.size()))
        .collect();
    starts.sort_unstable();
    let mut out = Vec::new();
    for (i, &(address, size)) in starts.iter().enumerate() {
        // At one address a sized alias wins (it is sorted last).
        let alias_sized = starts[i + 1..]
            .iter()
            .take_while(|s| s.0 == address)
            .any(|s| s.1 > 0);
        if size != 0 || alias_sized || out.last().is_some_and(|&(a, _)| a == address) {
            continue;
        }
        let next = starts[i + 1..]
            .iter()
            .find(|s| s.0 > address)
            .map_or(end, |s| s.0);
        out.push((address, next.min(end)));
    }
    out
}
