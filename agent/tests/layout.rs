//! The BPF record's layout has one contract, the `LAYOUT_` numbers of
//! `bpf/sample.h`: a change to the C structs alone, or to `src/record.rs`
//! alone, or to a size constant on one side, fails the build. Proven here
//! by compiling both sides as they are (they build) and with one
//! deliberate mismatch each (they do not).

use std::path::{Path, PathBuf};
use std::process::Command;

fn bpf_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("bpf")
}

fn clang() -> String {
    std::env::var("SYMTRACE_BPF_CLANG").unwrap_or_else(|_| "clang-19".to_owned())
}

/// Compiles `header` (a copy of sample.h, or it) for the BPF target;
/// returns clang's stderr on failure.
fn compile_c(header: &str) -> Result<(), String> {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("sample.h"), header).unwrap();
    std::fs::write(
        dir.path().join("check.c"),
        "#include \"vmlinux.h\"\n#include \"sample.h\"\n",
    )
    .unwrap();
    let out = Command::new(clang())
        .args(["-target", "bpf", "-D__TARGET_ARCH_x86", "-fsyntax-only"])
        .arg(format!("-I{}", dir.path().display()))
        .arg(format!("-I{}", bpf_dir().display()))
        .arg(dir.path().join("check.c"))
        .output()
        .expect("clang for the bpf target (the agent's build needs it too)");
    if out.status.success() {
        Ok(())
    } else {
        Err(String::from_utf8_lossy(&out.stderr).into_owned())
    }
}

/// Compiles `src/record.rs` (or `record`, a changed copy) as a library
/// against `constants` (the generated `sample_h.rs`, or a changed copy);
/// returns rustc's stderr on failure.
fn compile_rust(record: &str, constants: &str) -> Result<(), String> {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("sample_h.rs"), constants).unwrap();
    let source = dir.path().join("record.rs");
    std::fs::write(&source, record).unwrap();
    let out = Command::new(std::env::var("RUSTC").unwrap_or_else(|_| "rustc".into()))
        .env("OUT_DIR", dir.path())
        .args([
            "--edition",
            "2021",
            "--crate-type",
            "lib",
            "--emit=metadata",
        ])
        .arg("--out-dir")
        .arg(dir.path())
        .arg(&source)
        .output()
        .expect("rustc");
    if out.status.success() {
        Ok(())
    } else {
        Err(String::from_utf8_lossy(&out.stderr).into_owned())
    }
}

fn header() -> String {
    std::fs::read_to_string(bpf_dir().join("sample.h")).unwrap()
}

fn record() -> String {
    std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("src/record.rs")).unwrap()
}

fn constants() -> String {
    std::fs::read_to_string(concat!(env!("OUT_DIR"), "/sample_h.rs")).unwrap()
}

/// `text` with `from` replaced once (which must be there).
fn changed(text: &str, from: &str, to: &str) -> String {
    assert!(text.contains(from), "{from:?} is not in the file any more");
    text.replacen(from, to, 1)
}

#[test]
fn both_sides_build_as_they_are() {
    compile_c(&header()).unwrap();
    compile_rust(&record(), &constants()).unwrap();
}

#[test]
fn a_field_added_in_c_alone_fails_the_c_build() {
    let header = changed(
        &header(),
        "\t__u64 user_bp;",
        "\t__u64 user_bp;\n\t__u64 added;",
    );
    let err = compile_c(&header).unwrap_err();
    assert!(
        err.contains("does not match its LAYOUT_ number") && err.contains("cpu_sample.trace"),
        "{err}"
    );
}

#[test]
fn two_fields_of_one_size_swapped_in_c_fail_the_c_build() {
    let header = changed(
        &header(),
        "\t__u32 pid;           /* tgid */\n\t__u32 tid;",
        "\t__u32 tid;\n\t__u32 pid;           /* tgid */",
    );
    let err = compile_c(&header).unwrap_err();
    assert!(
        err.contains("cpu_sample.pid") && err.contains("cpu_sample.tid"),
        "{err}"
    );
}

#[test]
fn two_fields_of_one_size_swapped_in_rust_fail_the_rust_build() {
    let record = changed(
        &record(),
        "    pub user_sp: u64,\n    pub user_bp: u64,\n",
        "    pub user_bp: u64,\n    pub user_sp: u64,\n",
    );
    let err = compile_rust(&record, &constants()).unwrap_err();
    assert!(err.contains("LAYOUT_CPU_SAMPLE_USER_SP"), "{err}");
}

#[test]
fn a_stack_depth_changed_in_c_alone_fails_the_c_build() {
    let header = changed(
        &header(),
        "#define USER_STACK_DEPTH 127",
        "#define USER_STACK_DEPTH 100",
    );
    let err = compile_c(&header).unwrap_err();
    assert!(err.contains("sizeof(struct cpu_sample)"), "{err}");
}

#[test]
fn new_numbers_without_the_rust_struct_fail_the_rust_build() {
    // The C side updated (a field added, its numbers moved on), record.rs
    // not: the generated constants no longer describe the Rust struct.
    let constants = changed(
        &constants(),
        "pub const LAYOUT_CPU_SAMPLE_SIZE: usize = 1984;",
        "pub const LAYOUT_CPU_SAMPLE_SIZE: usize = 1992;",
    );
    let err = compile_rust(&record(), &constants).unwrap_err();
    assert!(
        err.contains("does not match bpf/sample.h's LAYOUT_CPU_SAMPLE_SIZE"),
        "{err}"
    );
}

#[test]
fn a_field_added_in_rust_alone_fails_the_rust_build() {
    let record = changed(
        &record(),
        "    pub user_bp: u64,\n",
        "    pub user_bp: u64,\n    pub added: u64,\n",
    );
    let err = compile_rust(&record, &constants()).unwrap_err();
    assert!(err.contains("LAYOUT_CPU_SAMPLE_TRACE"), "{err}");
}
