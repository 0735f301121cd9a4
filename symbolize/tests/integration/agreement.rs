//! Agreement with `llvm-symbolizer-19 --inlines` on 10,000 sampled
//! addresses per binary, for both tiers (straight from DWARF, and from the
//! index). Names are compared as linkage names (`--no-demangle`), which is
//! stricter than comparing demangled text: demanglers differ in spacing and
//! Rust legacy hashes, linkage names do not.

use std::io::Write;
use std::path::Path;
use std::process::{Command, Stdio};

use symtrace_symbolize::{index, DwarfSymbolizer, Frame, Inputs, SymbolIndex};
use symtrace_testkit::have;

use object::{Object, ObjectSymbol};

use crate::support::{binaries, sample_addresses, size_zero_functions};

const SAMPLES: usize = 10_000;
const THRESHOLD: f64 = 99.9;

/// (name, file, line) per frame, innermost first.
type Frames = Vec<(String, String, u32)>;

fn llvm_symbolizer(file: &Path, addresses: &[u64]) -> Vec<Frames> {
    let mut child = Command::new("llvm-symbolizer-19")
        .arg(format!("--obj={}", file.display()))
        .args(["--inlines", "--no-demangle", "--output-style=LLVM"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .expect("running llvm-symbolizer-19");
    let input: String = addresses.iter().map(|a| format!("{a:#x}\n")).collect();
    let mut stdin = child.stdin.take().unwrap();
    let writer = std::thread::spawn(move || stdin.write_all(input.as_bytes()).unwrap());
    let out = child.wait_with_output().unwrap();
    writer.join().unwrap();
    assert!(out.status.success());
    let text = String::from_utf8(out.stdout).unwrap();
    let answers: Vec<Frames> = text
        .trim_end_matches('\n')
        .split("\n\n")
        .map(|block| {
            let lines: Vec<&str> = block.lines().collect();
            lines
                .chunks(2)
                .map(|pair| {
                    let mut loc = pair[1].rsplitn(3, ':');
                    let _column = loc.next();
                    let line = loc.next().and_then(|l| l.parse().ok()).unwrap_or(0);
                    let file = loc.next().unwrap_or("??").to_owned();
                    (pair[0].to_owned(), file, line)
                })
                .filter(|f| f.0 != "??" || f.2 != 0)
                .collect()
        })
        .collect();
    assert_eq!(answers.len(), addresses.len(), "one answer per address");
    answers
}

/// Our frames as llvm's are read: a frame with neither a name nor a line
/// (padding between functions that a line-table row covers: llvm prints
/// `??` and `file:0`) is left out on both sides.
fn ours(frames: &[Frame]) -> Frames {
    frames
        .iter()
        .map(|f| {
            let name = f.linkage_name.as_ref().or(f.function.as_ref());
            (
                name.cloned().unwrap_or_else(|| "??".into()),
                f.file.clone().unwrap_or_else(|| "??".into()),
                f.line,
            )
        })
        .filter(|f| f.0 != "??" || f.2 != 0)
        .collect()
}

/// Percentage of llvm's frames we reproduce (name and line, at the same
/// depth); prints every difference with its reason.
fn agreement(label: &str, addresses: &[u64], llvm: &[Frames], ours: &[Frames]) -> f64 {
    let mut total = 0usize;
    let mut bad = 0usize;
    let mut shown = 0;
    for ((address, want), got) in addresses.iter().zip(llvm).zip(ours) {
        total += want.len().max(1);
        let mut wrong = want.len().abs_diff(got.len());
        let mut reasons = Vec::new();
        if wrong > 0 {
            reasons.push(format!("inline depth {} vs llvm {}", got.len(), want.len()));
        }
        for (depth, (w, g)) in want.iter().zip(got).enumerate() {
            if w.0 != g.0 {
                reasons.push(format!(
                    "frame {depth}: function {:?} vs llvm {:?}",
                    g.0, w.0
                ));
                wrong += 1;
            } else if w.2 != g.2 {
                reasons.push(format!("frame {depth}: line {} vs llvm {}", g.2, w.2));
                wrong += 1;
            }
        }
        if wrong > 0 {
            bad += wrong;
            if shown < 20 {
                shown += 1;
                eprintln!("{label} {address:#x}: {}", reasons.join("; "));
            }
        }
    }
    let percent = 100.0 * (total - bad.min(total)) as f64 / total as f64;
    eprintln!("{label}: {percent:.3}% of {total} frames agree ({bad} differ)");
    percent
}

/// Both tiers against llvm on `file`; `inputs_file` is what we read (the
/// same file, or a dwz'd copy with its supplementary file).
fn check(label: &str, reference: &Path, primary: &Path, supplementary: Option<&Path>) {
    let addresses = sample_addresses(reference, SAMPLES, 42);
    let llvm = llvm_symbolizer(reference, &addresses);
    let data = std::fs::read(primary).unwrap();
    let sup = supplementary.map(|p| std::fs::read(p).unwrap());
    let inputs = Inputs {
        supplementary: sup.as_deref(),
        ..Inputs::new(&data)
    };

    let dwarf = DwarfSymbolizer::new(&inputs).unwrap();
    let answers = dwarf.symbolize(&addresses).unwrap();
    let from_dwarf: Vec<Frames> = answers
        .iter()
        .map(|a| a.as_ref().map(|(_, f)| ours(f)).unwrap_or_default())
        .collect();
    let dwarf_percent = agreement(&format!("{label}/dwarf"), &addresses, &llvm, &from_dwarf);

    let index = SymbolIndex::new(index::build(&inputs).unwrap()).unwrap();
    let mut frames = Vec::new();
    let from_index: Vec<Frames> = addresses
        .iter()
        .map(|&a| match index.lookup(a, &mut frames) {
            Ok(_) => ours(&frames.iter().map(|f| f.to_owned()).collect::<Vec<_>>()),
            Err(_) => Vec::new(),
        })
        .collect();
    let index_percent = agreement(&format!("{label}/index"), &addresses, &llvm, &from_index);

    // Several threads give exactly the answers of one.
    let mut threaded = vec![Vec::new(); addresses.len()];
    dwarf
        .symbolize_on(&addresses, 2, |i, answer, frames| {
            threaded[i] = answer
                .map(|_| frames.iter().map(|f| f.to_owned()).collect())
                .unwrap_or_default();
        })
        .unwrap();
    let single: Vec<Vec<Frame>> = answers
        .iter()
        .map(|a| a.as_ref().map(|(_, f)| f.clone()).unwrap_or_default())
        .collect();
    assert!(
        threaded == single,
        "{label}: 2 threads answer differently from 1"
    );
    let one_thread = SymbolIndex::new(index::build_with_threads(&inputs, 1).unwrap().0).unwrap();
    let mut want = Vec::new();
    for &a in addresses.iter().step_by(7) {
        let w = one_thread.lookup(a, &mut want);
        assert_eq!(index.lookup(a, &mut frames), w, "{label} {a:#x}");
        assert_eq!(
            frames, want,
            "{label} {a:#x}: the index depends on the thread count"
        );
    }

    assert!(
        dwarf_percent >= THRESHOLD,
        "{label}: DWARF path agrees on {dwarf_percent:.3}%"
    );
    assert!(
        index_percent >= THRESHOLD,
        "{label}: index agrees on {index_percent:.3}%"
    );
    let inlined = llvm.iter().filter(|f| f.len() > 1).count();
    assert!(
        inlined > SAMPLES / 10,
        "{label}: only {inlined} addresses have inline frames"
    );
}

fn ready() -> Option<&'static crate::support::Binaries> {
    if !have("llvm-symbolizer-19") {
        return None;
    }
    binaries()
}

/// The C++ fixtures have functions without a size (the fixture's assembly
/// ones; crt's too, with gcc), whose every address is checked.
fn assert_size_zero_functions(file: &Path) {
    let zero = size_zero_functions(file);
    let data = std::fs::read(file).unwrap();
    let obj = object::File::parse(&*data).unwrap();
    let asm = obj
        .symbols()
        .find(|s| s.name() == Ok("st_asm_sum"))
        .expect("the fixture's st_asm_sum");
    assert_eq!(asm.size(), 0, "st_asm_sum is written without a .size");
    assert!(
        zero.iter().any(|&(a, _)| a == asm.address()),
        "{zero:x?} lacks st_asm_sum"
    );
}

#[test]
fn gcc_o2_cpp_agrees_with_llvm_symbolizer() {
    let Some(b) = ready() else { return };
    assert_size_zero_functions(&b.gcc);
    check("g++ -O2", &b.gcc, &b.gcc, None);
}

#[test]
fn clang_o2_cpp_agrees_with_llvm_symbolizer() {
    let Some(b) = ready() else { return };
    assert_size_zero_functions(&b.clang);
    check("clang++ -O2", &b.clang, &b.clang, None);
}

#[test]
fn rust_release_agrees_with_llvm_symbolizer() {
    let Some(b) = ready() else { return };
    check("rustc -O", &b.rust, &b.rust, None);
}

#[test]
fn zstd_compressed_debug_sections_agree_with_llvm_symbolizer() {
    let Some(b) = ready() else { return };
    check("zstd", &b.zstd, &b.zstd, None);
}

#[test]
fn dwz_processed_binary_agrees_with_llvm_symbolizer() {
    let Some(b) = ready() else { return };
    check("dwz", &b.dwz, &b.dwz, None);
}

/// llvm-symbolizer cannot follow `.gnu_debugaltlink`, so the reference is
/// the same binary before `dwz -m`; we read the processed one plus the
/// supplementary file.
#[test]
fn dwz_multifile_with_supplementary_file_agrees_with_the_original() {
    let Some(b) = ready() else { return };
    let data = std::fs::read(&b.dwz_multi).unwrap();
    let info = symtrace_elf::inspect(&data).unwrap();
    let (path, build_id) = info.debugaltlink.expect("dwz -m adds .gnu_debugaltlink");
    assert_eq!(Path::new(&path), b.dwz_common.as_path());
    let build_id = build_id.expect("the supplementary file's build-ID");
    assert_eq!(build_id.as_str().len(), 40);
    check(
        "dwz -m",
        &b.dwz_multi_original,
        &b.dwz_multi,
        Some(&b.dwz_common),
    );
}
