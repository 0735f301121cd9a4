//! `keep-memlock COMMAND [ARGS…]`: runs COMMAND with every attempt to
//! *change* RLIMIT_MEMLOCK answered with success without acting (reads of
//! the limit go through).
//!
//! Why: the OpenTelemetry eBPF profiler raises RLIMIT_MEMLOCK to infinity
//! at its start, unconditionally, and exits when that fails. Raising a hard
//! limit needs CAP_SYS_RESOURCE, which root lacks on the machines symtrace's
//! tests run on (hard limit 8 MiB). On Linux ≥ 5.11 BPF memory is charged
//! to the memory cgroup, not to RLIMIT_MEMLOCK, so the raise changes
//! nothing the profiler needs: skipping it lets the unmodified profiler
//! run. A classic-BPF seccomp filter, installed before the exec and
//! inherited by every thread the command starts. x86-64 only.

use std::ffi::{CString, OsString};
use std::os::unix::ffi::OsStrExt;

// Offsets into `struct seccomp_data` (nr, arch, ip, args[6]).
const NR: u32 = 0;
const ARCH: u32 = 4;
const fn arg_lo(i: u32) -> u32 {
    16 + 8 * i
}
const fn arg_hi(i: u32) -> u32 {
    16 + 8 * i + 4
}

const AUDIT_ARCH_X86_64: u32 = 0xc000_003e;
const SYS_SETRLIMIT: u32 = 160;
const SYS_PRLIMIT64: u32 = 302;
const RLIMIT_MEMLOCK: u32 = 8;
const SECCOMP_RET_ALLOW: u32 = 0x7fff_0000;
/// `SECCOMP_RET_ERRNO` with errno 0: the call returns 0, not carried out.
const SECCOMP_RET_SKIP: u32 = 0x0005_0000;

fn stmt(code: u16, k: u32) -> libc::sock_filter {
    libc::sock_filter {
        code,
        jt: 0,
        jf: 0,
        k,
    }
}

fn jump(code: u16, k: u32, jt: u8, jf: u8) -> libc::sock_filter {
    libc::sock_filter { code, jt, jf, k }
}

/// The filter, as a list of classic-BPF instructions.
fn filter() -> Vec<libc::sock_filter> {
    let ld = (libc::BPF_LD | libc::BPF_W | libc::BPF_ABS) as u16;
    let jeq = (libc::BPF_JMP | libc::BPF_JEQ | libc::BPF_K) as u16;
    let ret = (libc::BPF_RET | libc::BPF_K) as u16;
    vec![
        // 0: another architecture's calls are let through.
        stmt(ld, ARCH),
        jump(jeq, AUDIT_ARCH_X86_64, 0, 13),
        stmt(ld, NR),
        // 3: setrlimit(RLIMIT_MEMLOCK, …) → skipped.
        jump(jeq, SYS_SETRLIMIT, 0, 3),
        stmt(ld, arg_lo(0)),
        jump(jeq, RLIMIT_MEMLOCK, 8, 9),
        stmt(ret, SECCOMP_RET_ALLOW), // (unreached: keeps offsets simple)
        // 7: prlimit64(pid, RLIMIT_MEMLOCK, new != NULL, …) → skipped.
        jump(jeq, SYS_PRLIMIT64, 0, 7),
        stmt(ld, arg_lo(1)),
        jump(jeq, RLIMIT_MEMLOCK, 0, 5),
        stmt(ld, arg_lo(2)),
        jump(jeq, 0, 0, 2),
        stmt(ld, arg_hi(2)),
        jump(jeq, 0, 1, 0),
        // 14
        stmt(ret, SECCOMP_RET_SKIP),
        // 15
        stmt(ret, SECCOMP_RET_ALLOW),
    ]
}

fn main() {
    let args: Vec<OsString> = std::env::args_os().skip(1).collect();
    if args.is_empty() {
        eprintln!("usage: keep-memlock COMMAND [ARGS…]");
        std::process::exit(2);
    }
    if std::env::consts::ARCH != "x86_64" {
        eprintln!("keep-memlock: x86-64 only");
        std::process::exit(2);
    }
    let mut program = filter();
    let prog = libc::sock_fprog {
        len: program.len() as u16,
        filter: program.as_mut_ptr(),
    };
    // SAFETY: prctl with documented arguments; `prog` outlives the call
    // (the kernel copies the filter).
    unsafe {
        if libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0 {
            eprintln!(
                "keep-memlock: PR_SET_NO_NEW_PRIVS: {}",
                std::io::Error::last_os_error()
            );
            std::process::exit(1);
        }
        if libc::prctl(
            libc::PR_SET_SECCOMP,
            libc::SECCOMP_MODE_FILTER,
            &prog as *const libc::sock_fprog,
        ) != 0
        {
            eprintln!(
                "keep-memlock: PR_SET_SECCOMP: {}",
                std::io::Error::last_os_error()
            );
            std::process::exit(1);
        }
    }
    let c: Vec<CString> = args
        .iter()
        .map(|a| CString::new(a.as_bytes()).expect("an argument without NUL"))
        .collect();
    let mut argv: Vec<*const libc::c_char> = c.iter().map(|a| a.as_ptr()).collect();
    argv.push(std::ptr::null());
    // SAFETY: argv is a NULL-terminated array of C strings that live here.
    unsafe { libc::execvp(argv[0], argv.as_ptr()) };
    eprintln!(
        "keep-memlock: {}: {}",
        args[0].to_string_lossy(),
        std::io::Error::last_os_error()
    );
    std::process::exit(127);
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Runs the filter over one call, as the kernel does.
    fn run(nr: u32, args: [u64; 6]) -> u32 {
        run_on(AUDIT_ARCH_X86_64, nr, args)
    }

    fn run_on(arch: u32, nr: u32, args: [u64; 6]) -> u32 {
        let mut data = [0u8; 64];
        data[0..4].copy_from_slice(&nr.to_ne_bytes());
        data[4..8].copy_from_slice(&arch.to_ne_bytes());
        for (i, a) in args.iter().enumerate() {
            data[16 + 8 * i..24 + 8 * i].copy_from_slice(&a.to_ne_bytes());
        }
        let prog = filter();
        let (mut pc, mut acc) = (0usize, 0u32);
        loop {
            let ins = prog[pc];
            match ins.code as u32 {
                c if c == libc::BPF_LD | libc::BPF_W | libc::BPF_ABS => {
                    let k = ins.k as usize;
                    acc = u32::from_ne_bytes(data[k..k + 4].try_into().unwrap());
                    pc += 1;
                }
                c if c == libc::BPF_JMP | libc::BPF_JEQ | libc::BPF_K => {
                    pc += 1 + if acc == ins.k { ins.jt } else { ins.jf } as usize;
                }
                c if c == libc::BPF_RET | libc::BPF_K => return ins.k,
                c => panic!("unexpected instruction {c:#x}"),
            }
        }
    }

    #[test]
    fn only_changes_of_the_memlock_limit_are_skipped() {
        let p = 0x7fff_0000_1000u64;
        assert_eq!(run(SYS_SETRLIMIT, [8, p, 0, 0, 0, 0]), SECCOMP_RET_SKIP);
        assert_eq!(run(SYS_SETRLIMIT, [7, p, 0, 0, 0, 0]), SECCOMP_RET_ALLOW);
        assert_eq!(run(SYS_PRLIMIT64, [0, 8, p, 0, 0, 0]), SECCOMP_RET_SKIP);
        assert_eq!(
            run(SYS_PRLIMIT64, [0, 8, p << 32, 0, 0, 0]),
            SECCOMP_RET_SKIP
        );
        // A read of the limit (no new value) goes through.
        assert_eq!(run(SYS_PRLIMIT64, [0, 8, 0, p, 0, 0]), SECCOMP_RET_ALLOW);
        assert_eq!(run(SYS_PRLIMIT64, [0, 7, p, 0, 0, 0]), SECCOMP_RET_ALLOW);
        assert_eq!(run(39, [0; 6]), SECCOMP_RET_ALLOW);
        // Another architecture's numbers mean other calls.
        assert_eq!(
            run_on(0x4000_0003, SYS_SETRLIMIT, [8, p, 0, 0, 0, 0]),
            SECCOMP_RET_ALLOW
        );
    }
}
