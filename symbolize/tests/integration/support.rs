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

/// `count` addresses drawn uniformly over the bytes of the sized function
/// symbols in executable sections (seeded, so runs repeat).
pub fn sample_addresses(file: &Path, count: usize, seed: u64) -> Vec<u64> {
    let data = std::fs::read(file).unwrap();
    let obj = object::File::parse(&*data).unwrap();
    let mut functions: Vec<(u64, u64)> = obj
        .symbols()
        .filter(|s| s.kind() == object::SymbolKind::Text && s.size() > 0 && s.address() > 0)
        .filter(|s| {
            s.section_index()
                .and_then(|i| obj.section_by_index(i).ok())
                .is_some_and(|sec| sec.kind() == object::SectionKind::Text)
        })
        .map(|s| (s.address(), s.size()))
        .collect();
    functions.sort_unstable();
    functions.dedup_by_key(|f| f.0);
    let mut prefix = Vec::with_capacity(functions.len());
    let mut total = 0;
    for f in &functions {
        prefix.push(total);
        total += f.1;
    }
    assert!(total > 0, "{} has no sized functions", file.display());
    let mut state = seed;
    (0..count)
        .map(|_| {
            // xorshift64*
            state ^= state >> 12;
            state ^= state << 25;
            state ^= state >> 27;
            let r = state.wrapping_mul(0x2545_f491_4f6c_dd1d) % total;
            let i = prefix.partition_point(|&p| p <= r) - 1;
            functions[i].0 + (r - prefix[i])
        })
        .collect()
}
