//! Compiles the BPF program (`bpf/profile.bpf.c`, C with CO-RE against the
//! committed `bpf/vmlinux.h`) with clang for the `bpf` target, and strips its
//! DWARF (keeping `.BTF`/`.BTF.ext`, which CO-RE needs) when llvm-strip is
//! there. `SYMTRACE_BPF_CLANG` names another clang (≥ 14).

use std::path::PathBuf;
use std::process::Command;

fn main() {
    let dir = PathBuf::from(std::env::var("CARGO_MANIFEST_DIR").unwrap()).join("bpf");
    let out = PathBuf::from(std::env::var("OUT_DIR").unwrap()).join("profile.bpf.o");
    for f in ["profile.bpf.c", "sample.h", "vmlinux.h"] {
        println!("cargo:rerun-if-changed={}", dir.join(f).display());
    }
    println!("cargo:rerun-if-env-changed=SYMTRACE_BPF_CLANG");
    let clang = std::env::var("SYMTRACE_BPF_CLANG").unwrap_or_else(|_| "clang-19".to_owned());
    let status = Command::new(&clang)
        .args([
            "-target",
            "bpf",
            "-D__TARGET_ARCH_x86",
            "-O2",
            "-g",
            "-Wall",
            "-Werror",
        ])
        .arg(format!("-I{}", dir.display()))
        .arg("-c")
        .arg(dir.join("profile.bpf.c"))
        .arg("-o")
        .arg(&out)
        .status()
        .unwrap_or_else(|e| {
            panic!(
                "cannot run {clang} ({e}): the agent's BPF program needs clang for the bpf target \
                 and libbpf's headers (Debian: apt-get install clang-19 libbpf-dev), or set \
                 SYMTRACE_BPF_CLANG"
            )
        });
    assert!(
        status.success(),
        "{clang} failed to compile bpf/profile.bpf.c"
    );
    // Optional: DWARF is 600 KB of the object, and only BTF is used.
    let _ = Command::new("llvm-strip-19").arg("-g").arg(&out).status();
    // The interop example publishes thread contexts: export the TLS slot.
    println!("cargo:rustc-link-arg-examples=-Wl,--export-dynamic-symbol=otel_thread_ctx_v1");
}
