//! The `otel_thread_ctx_v1` TLS slot (OTEP 4947): an exported, 8-byte
//! `STT_TLS` object holding a pointer to the thread's record, accessed with
//! the TLSDESC dialect so that it works in executables and shared libraries
//! alike (the linker relaxes it to local-exec in an executable).
//!
//! Stable Rust cannot name a `#[thread_local]` symbol nor choose its TLS
//! dialect, so the slot is declared in assembly and its address computed by
//! the canonical compiler-emitted TLSDESC sequence. The sequence is the one
//! of Datadog's `libdd-otel-thread-ctx` (Apache-2.0), which verifies it
//! byte for byte against clang's output; keep it exactly as is: linkers
//! pattern-match it for relaxation.
//!
//! Export the symbol to `.dynsym` when linking an executable:
//! `-C link-arg=-Wl,--export-dynamic-symbol=otel_thread_ctx_v1`.

use crate::record::Record;

#[cfg(not(all(
    target_os = "linux",
    any(target_arch = "x86_64", target_arch = "aarch64")
)))]
compile_error!("symtrace-context supports Linux on x86-64 and aarch64");

core::arch::global_asm!(
    ".section .tbss,\"awT\",@nobits",
    ".globl otel_thread_ctx_v1",
    ".type  otel_thread_ctx_v1, @tls_object",
    ".size  otel_thread_ctx_v1, 8",
    ".balign 8",
    "otel_thread_ctx_v1:",
    ".zero  8",
    ".previous",
);

/// The address of this thread's `otel_thread_ctx_v1` slot.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
pub fn slot() -> *mut *mut Record {
    let ptr: usize;
    // SAFETY: the TLSDESC call preserves every register but rax and flags
    // (the TLSDESC calling convention); the result is this thread's slot.
    unsafe {
        core::arch::asm!(
            "leaq otel_thread_ctx_v1@tlsdesc(%rip), %rax",
            "call *otel_thread_ctx_v1@TLSCALL(%rax)",
            "addq %fs:0, %rax",
            out("rax") ptr,
            options(att_syntax),
        );
    }
    ptr as *mut *mut Record
}

#[cfg(target_arch = "aarch64")]
#[inline(always)]
pub fn slot() -> *mut *mut Record {
    let ptr: usize;
    // SAFETY: as above, with the aarch64 TLSDESC sequence and its clobbers.
    unsafe {
        core::arch::asm!(
            "adrp  x0, :tlsdesc:otel_thread_ctx_v1",
            "ldr   x1, [x0, :tlsdesc_lo12:otel_thread_ctx_v1]",
            "add   x0, x0, :tlsdesc_lo12:otel_thread_ctx_v1",
            ".tlsdesccall otel_thread_ctx_v1",
            "blr   x1",
            "mrs   x8, tpidr_el0",
            "add   x0, x8, x0",
            out("x0") ptr,
            out("x1") _,
            out("x8") _,
            out("x30") _,
        );
    }
    ptr as *mut *mut Record
}
