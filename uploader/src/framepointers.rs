//! The frame-pointer gate: profiles are only complete when functions keep
//! their frame pointer, because the agent unwinds by frame pointer.
//!
//! Each function is decoded (iced-x86) from its symbol: it keeps a frame
//! pointer when its prologue — the instructions before its first call —
//! contains `push %rbp` followed by `mov %rsp,%rbp` (compilers may schedule
//! other instructions in between at -O2). A function that calls nothing
//! does not break the chain of frame pointers (its caller's frame stays
//! reachable through %rbp), and compilers omit the frame in leaves even with
//! `-fno-omit-frame-pointer`; so only functions that *call* and lack one are
//! counted against the gate. Functions come from `.symtab` (or `.dynsym` when
//! stripped); the toolchain's own start-up code (crt*.o), which no build flag
//! controls, is not counted.

use object::{Architecture, Object, ObjectSection, ObjectSymbol, SymbolKind};
use serde::Serialize;

/// Start-up and runtime glue from crt1.o/crti.o/crtbegin.o and the like.
const TOOLCHAIN_FUNCTIONS: &[&str] = &[
    "_start",
    "_init",
    "_fini",
    "deregister_tm_clones",
    "register_tm_clones",
    "__do_global_dtors_aux",
    "frame_dummy",
    "__libc_csu_init",
    "__libc_csu_fini",
    "_dl_relocate_static_pie",
    "__x86.get_pc_thunk.bx",
];

#[derive(Debug, Clone, Serialize)]
pub struct FramePointerReport {
    pub functions: usize,
    /// Functions that call others without keeping a frame pointer.
    pub without: usize,
    /// Leaf functions without one (counted against the gate only when the
    /// file has no `.eh_frame`).
    pub leaves_without: usize,
    /// Whether the file has `.eh_frame` (the agent recovers the callers of
    /// frameless leaves from it).
    pub eh_frame: bool,
    /// Bytes of code in functions without frame pointers, in percent.
    pub share_without_percent: f64,
    /// The largest offenders (name, size).
    pub examples: Vec<(String, u64)>,
}

/// Checks an ELF file; `None` when it cannot be checked (not x86-64, no
/// symbols, no code).
pub fn check(data: &[u8]) -> Option<FramePointerReport> {
    let file = object::File::parse(data).ok()?;
    if file.architecture() != Architecture::X86_64 {
        return None;
    }
    let symbols: Vec<_> = if file.symbols().next().is_some() {
        file.symbols().collect()
    } else {
        file.dynamic_symbols().collect()
    };
    let eh_frame = file
        .section_by_name(".eh_frame")
        .is_some_and(|s| s.size() > 0);
    let mut seen = std::collections::HashSet::new();
    let (mut functions, mut without, mut leaves_without) = (0usize, 0usize, 0usize);
    let (mut total_bytes, mut without_bytes) = (0u64, 0u64);
    let mut examples = Vec::new();
    for sym in symbols {
        if sym.kind() != SymbolKind::Text || sym.size() == 0 || !sym.is_definition() {
            continue;
        }
        let name = sym.name().unwrap_or("");
        if TOOLCHAIN_FUNCTIONS.contains(&name) || !seen.insert(sym.address()) {
            continue;
        }
        let Some(index) = sym.section_index() else {
            continue;
        };
        let Ok(section) = file.section_by_index(index) else {
            continue;
        };
        let Ok(bytes) = section.data() else { continue };
        let Some(offset) = sym.address().checked_sub(section.address()) else {
            continue;
        };
        let Some(code) = bytes.get(offset as usize..(offset + sym.size()) as usize) else {
            continue;
        };
        functions += 1;
        total_bytes += sym.size();
        match classify(code, sym.address()) {
            Frame::Kept => {}
            Frame::LeafWithout => {
                leaves_without += 1;
                if !eh_frame {
                    without_bytes += sym.size();
                    examples.push((name.to_owned(), sym.size()));
                }
            }
            Frame::Missing => {
                without += 1;
                without_bytes += sym.size();
                examples.push((name.to_owned(), sym.size()));
            }
        }
    }
    if functions == 0 {
        return None;
    }
    examples.sort_by_key(|e| std::cmp::Reverse(e.1));
    examples.truncate(10);
    Some(FramePointerReport {
        functions,
        without,
        leaves_without,
        eh_frame,
        share_without_percent: 100.0 * without_bytes as f64 / total_bytes.max(1) as f64,
        examples,
    })
}

#[derive(Debug, PartialEq, Eq)]
enum Frame {
    Kept,
    LeafWithout,
    Missing,
}

/// Decodes a function and decides whether it keeps a frame pointer.
fn classify(code: &[u8], address: u64) -> Frame {
    use iced_x86::{Code, Decoder, DecoderOptions, Mnemonic, OpKind, Register};
    let mut decoder = Decoder::with_ip(64, code, address, DecoderOptions::NONE);
    let (mut pushed, mut kept, mut calls) = (false, false, false);
    let mut in_prologue = true;
    for (n, instr) in decoder.iter().enumerate() {
        if instr.code() == Code::INVALID {
            break;
        }
        let is_call = instr.mnemonic() == Mnemonic::Call;
        if is_call {
            calls = true;
            in_prologue = false;
        }
        if in_prologue && n < 24 {
            if instr.mnemonic() == Mnemonic::Push
                && instr.op0_kind() == OpKind::Register
                && instr.op0_register() == Register::RBP
            {
                pushed = true;
            } else if pushed
                && instr.mnemonic() == Mnemonic::Mov
                && instr.op0_kind() == OpKind::Register
                && instr.op0_register() == Register::RBP
                && instr.op1_kind() == OpKind::Register
                && instr.op1_register() == Register::RSP
            {
                kept = true;
            }
        }
        if calls && !in_prologue && (kept || n > 4096) {
            break;
        }
    }
    match (kept, calls) {
        (true, _) => Frame::Kept,
        (false, false) => Frame::LeafWithout,
        (false, true) => Frame::Missing,
    }
}

#[cfg(test)]
mod tests {
    use super::{check, classify, Frame};

    /// A gcc build with frameless leaves passes while it has `.eh_frame`,
    /// and fails once `.eh_frame` is stripped.
    #[test]
    fn frameless_leaves_count_only_without_eh_frame() {
        if !symtrace_testkit::have("gcc") || !symtrace_testkit::have("objcopy") {
            return;
        }
        let dir = tempfile::tempdir().unwrap();
        let src = dir.path().join("leaf.c");
        std::fs::write(
            &src,
            "__attribute__((noinline)) int leaf(int x) { return x * 3 + 1; }\n\
             int main(int argc, char **argv) { return leaf(argc) + leaf(argc + 1); }\n",
        )
        .unwrap();
        let bin = dir.path().join("leaf");
        symtrace_testkit::run(
            std::process::Command::new("gcc")
                .args([
                    "-O1",
                    "-g",
                    "-fno-omit-frame-pointer",
                    "-mno-omit-leaf-frame-pointer",
                ])
                .arg(&src)
                .arg("-o")
                .arg(&bin),
        );
        let with = check(&std::fs::read(&bin).unwrap()).unwrap();
        assert!(with.eh_frame);
        assert!(with.leaves_without >= 1, "{with:?}");
        assert!(!with.examples.iter().any(|(n, _)| n == "leaf"), "{with:?}");
        let stripped = dir.path().join("leaf-no-eh-frame");
        symtrace_testkit::run(
            std::process::Command::new("objcopy")
                .args([
                    "--remove-section=.eh_frame",
                    "--remove-section=.eh_frame_hdr",
                ])
                .arg(&bin)
                .arg(&stripped),
        );
        let without = check(&std::fs::read(&stripped).unwrap()).unwrap();
        assert!(!without.eh_frame);
        assert!(
            without.examples.iter().any(|(n, _)| n == "leaf"),
            "{without:?}"
        );
        assert!(without.share_without_percent > with.share_without_percent);
    }

    const CALL: [u8; 5] = [0xe8, 0, 0, 0, 0];

    #[test]
    fn recognises_prologues() {
        let with = |prologue: &[u8]| [prologue, &CALL[..], &[0x5d, 0xc3][..]].concat();
        // push %rbp; mov %rsp,%rbp; call; pop; ret
        assert_eq!(
            classify(&with(&[0x55, 0x48, 0x89, 0xe5]), 0x1000),
            Frame::Kept
        );
        // endbr64 first, and the 8b ec encoding
        assert_eq!(
            classify(
                &with(&[0xf3, 0x0f, 0x1e, 0xfa, 0x55, 0x48, 0x8b, 0xec]),
                0x1000
            ),
            Frame::Kept
        );
        // -O2 scheduling: push %rbp; movslq %edi,%rdi; mov %rsp,%rbp
        assert_eq!(
            classify(&with(&[0x55, 0x48, 0x63, 0xff, 0x48, 0x89, 0xe5]), 0x1000),
            Frame::Kept
        );
        // sub $8,%rsp; call: no frame pointer
        assert_eq!(
            classify(&with(&[0x48, 0x83, 0xec, 0x08]), 0x1000),
            Frame::Missing
        );
        // a leaf: mov %rdi,%rax; ret
        assert_eq!(
            classify(&[0x48, 0x89, 0xf8, 0xc3], 0x1000),
            Frame::LeafWithout
        );
    }
}
