//! The user stack made right, in userspace, from what the BPF program
//! captured: the leaf's caller recovered from `.eh_frame` when the
//! frame-pointer chain skips it, and every return address checked before it
//! becomes a frame. Pure logic over bytes; `procs` feeds it the process's
//! mappings, CFI and code.

use crate::cfi::LeafRule;

/// Why a stack was cut short: the frame there could not be trusted. The
/// stack ends with a marker frame instead of frames that may be garbage.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Cut {
    /// A return address outside every executable mapping.
    OutsideCode,
    /// A return address not just after a call instruction.
    NotAfterCall,
    /// The next frame pointer was not above the last one.
    NotIncreasing,
    /// A frame pointer (not zero, the ABI's end of the chain) pointed at
    /// memory that is not readable: a frameless function's `%rbp` data.
    Unreadable,
    /// A frameless leaf used `%rbp` for its own data: its caller's frame
    /// pointer is on the stack, and the chain the BPF program walked from
    /// `%rbp` is not the caller's.
    CallerFrameUnknown,
}

impl Cut {
    /// The marker frame's name (one name for all causes, so cut stacks
    /// merge in a flamegraph; `--stats` counts the causes).
    pub const MARKER: &'static str = "[truncated: unverifiable frame-pointer chain]";

    pub const ALL: [Cut; 5] = [
        Cut::OutsideCode,
        Cut::NotAfterCall,
        Cut::NotIncreasing,
        Cut::Unreadable,
        Cut::CallerFrameUnknown,
    ];

    pub fn index(self) -> usize {
        self as usize
    }
}

/// What the leaf's CFI says to do.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LeafStep {
    /// The chain is right as walked (the leaf has its frame, or is the
    /// outermost function, or nothing is known).
    Chain,
    /// The chain skips the leaf's caller: insert this return address.
    /// `chain_ok` is false when the chain walked from `%rbp` is not the
    /// caller's (see `Cut::CallerFrameUnknown`).
    Caller { ret: u64, chain_ok: bool },
    /// The return address lies beyond the captured window.
    OutOfWindow,
}

/// Steps out of the leaf: `rule` is the CFI at the leaf's `%rip`, `bp` the
/// `%rbp` the BPF program walked from, `window` the stack bytes from `%rsp`.
pub fn leaf_step(rule: LeafRule, bp: u64, window: &[u8]) -> LeafStep {
    step(rule, bp, window, 0)
}

/// Frameless callers stepped through after the leaf, at most.
pub const MAX_FRAMELESS_CALLERS: usize = 8;

/// Where the caller's `%rsp` is, relative to this function's, under a
/// frameless `rule`: its canonical frame address (on x86-64 the return
/// address is always at CFA - 8).
pub fn caller_sp(rule: LeafRule) -> Option<i64> {
    match rule {
        LeafRule::Frameless { ra, .. } => Some(ra + 8),
        _ => None,
    }
}

/// Steps out of a function whose `%rsp` is `base` bytes into the window
/// (the leaf's: 0; a frameless caller's: the sum of the callees'
/// [`caller_sp`]).
pub fn step(rule: LeafRule, bp: u64, window: &[u8], base: i64) -> LeafStep {
    let LeafRule::Frameless { ra, rbp } = rule else {
        return LeafStep::Chain;
    };
    let (ra, rbp) = (base + ra, rbp.map(|at| base + at));
    let Some(ret) = word(window, ra) else {
        return LeafStep::OutOfWindow;
    };
    let chain_ok = match rbp {
        // A slot below %rsp was popped already (an epilogue after `pop
        // %rbp`: compilers leave the rule in place): %rbp is restored.
        Some(at) if at < base => true,
        // Saved where the CFI says: the chain is the caller's only if %rbp
        // was not changed since (a prologue, before `mov %rsp,%rbp`).
        Some(at) => word(window, at).is_some_and(|saved| saved == bp),
        None => true,
    };
    LeafStep::Caller { ret, chain_ok }
}

fn word(window: &[u8], at: i64) -> Option<u64> {
    let at = usize::try_from(at).ok()?;
    let bytes = window.get(at..at.checked_add(8)?)?;
    Some(u64::from_le_bytes(bytes.try_into().ok()?))
}

/// Bytes of code read before a return address, and after it.
pub const CODE_BEFORE: usize = 8;
pub const CODE_AFTER: usize = 9;

/// Whether the `CODE_BEFORE` bytes before a return address end with a call
/// instruction: `call rel32` (`E8`), or `call`/`lcall` through a register or
/// memory (`FF /2`, `FF /3`, with any ModRM/SIB/displacement; a REX or
/// `notrack` prefix before it changes nothing here).
pub fn after_call(before: &[u8]) -> bool {
    let n = before.len();
    if n >= 5 && before[n - 5] == 0xE8 {
        return true;
    }
    (2..=7).filter(|&len| len <= n).any(|len| {
        let at = n - len;
        if before[at] != 0xFF {
            return false;
        }
        let modrm = before[at + 1];
        let reg = (modrm >> 3) & 7;
        (reg == 2 || reg == 3) && 1 + modrm_len(modrm, before.get(at + 2).copied()) == len
    })
}

/// Bytes of a ModRM operand: the ModRM byte, SIB and displacement.
fn modrm_len(modrm: u8, sib: Option<u8>) -> usize {
    let (mode, rm) = (modrm >> 6, modrm & 7);
    if mode == 3 {
        return 1;
    }
    let disp = match mode {
        1 => 1,
        2 => 4,
        _ => 0,
    };
    if rm == 4 {
        let base_disp = match (mode, sib) {
            (0, Some(sib)) if sib & 7 == 5 => 4,
            _ => 0,
        };
        return 2 + disp + base_disp;
    }
    if mode == 0 && rm == 5 {
        return 5; // %rip-relative disp32
    }
    1 + disp
}

/// Whether code is a signal-return trampoline (`mov $15,%rax; syscall` as
/// glibc's `__restore_rt`, or `mov $15,%eax; syscall` as musl's): the
/// kernel makes it a signal handler's return address, after no call.
pub fn is_sigreturn(at: &[u8]) -> bool {
    at.starts_with(&[0x48, 0xc7, 0xc0, 0x0f, 0, 0, 0, 0x0f, 0x05])
        || at.starts_with(&[0xb8, 0x0f, 0, 0, 0, 0x0f, 0x05])
}

/// Counts of what unwinding did, for `--stats`.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct UnwindStats {
    /// Samples whose leaf's caller was recovered from CFI.
    pub callers_recovered: u64,
    /// Samples whose leaf is in a file without usable CFI (the stack is as
    /// walked).
    pub leaf_without_cfi: u64,
    /// Samples whose return address lay beyond the captured window.
    pub out_of_window: u64,
    /// Frameless callers of the leaf stepped through (libc wrappers).
    pub frameless_callers: u64,
    /// Samples whose leaf the BPF walk stepped out of by its file's
    /// unwind table (nothing left to do here).
    pub leaf_in_bpf: u64,
    /// Processes read as soon as a walk found no unwind ranges for them
    /// (not at the next drain).
    pub read_early: u64,
    /// Samples taken before their process's ranges were set whose stack
    /// copy was walked to its end here (by each file's CFI).
    pub snapshots_whole: u64,
    /// ... whose copy's walk did not reach the end (the BPF walk's chain
    /// was used).
    pub snapshots_cut: u64,
    /// Samples cut, by `Cut::index`.
    pub cut: [u64; 5],
}

impl UnwindStats {
    pub fn cut_total(&self) -> u64 {
        self.cut.iter().sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn window(words: &[u64]) -> Vec<u8> {
        words.iter().flat_map(|w| w.to_le_bytes()).collect()
    }

    #[test]
    fn steps_out_of_a_frameless_leaf() {
        let w = window(&[0x401234, 0x7ffe0010, 0x401999]);
        // gcc's frameless leaf: the return address at %rsp.
        let leaf = LeafRule::Frameless { ra: 0, rbp: None };
        assert_eq!(
            leaf_step(leaf, 0x7ffe0100, &w),
            LeafStep::Caller {
                ret: 0x401234,
                chain_ok: true
            }
        );
        // After `push %rbp`: the return address above the saved %rbp, and
        // the chain is the caller's while %rbp is still the saved value.
        let pushed = LeafRule::Frameless {
            ra: 8,
            rbp: Some(0),
        };
        assert_eq!(
            leaf_step(pushed, 0x401234, &w),
            LeafStep::Caller {
                ret: 0x7ffe0010,
                chain_ok: true
            }
        );
        // A frameless function that reused %rbp: the chain is not the
        // caller's.
        assert_eq!(
            leaf_step(pushed, 0xdead, &w),
            LeafStep::Caller {
                ret: 0x7ffe0010,
                chain_ok: false
            }
        );
        // After `pop %rbp` (the CFI still says saved at CFA-16): restored.
        let popped = LeafRule::Frameless {
            ra: 0,
            rbp: Some(-8),
        };
        assert_eq!(
            leaf_step(popped, 0x7ffe0100, &w),
            LeafStep::Caller {
                ret: 0x401234,
                chain_ok: true
            }
        );
        // Beyond the window, or a negative offset: not guessed.
        let far = LeafRule::Frameless { ra: 24, rbp: None };
        assert_eq!(leaf_step(far, 0, &w), LeafStep::OutOfWindow);
        let below = LeafRule::Frameless { ra: -8, rbp: None };
        assert_eq!(leaf_step(below, 0, &w), LeafStep::OutOfWindow);
        for rule in [LeafRule::Framed, LeafRule::Outermost, LeafRule::Unknown] {
            assert_eq!(leaf_step(rule, 0, &w), LeafStep::Chain);
        }
    }

    #[test]
    fn steps_through_frameless_callers() {
        // glibc's nanosleep (`sub $8,%rsp`) calls clock_nanosleep (`sub
        // $0x28,%rsp`), which blocks in the syscall: the leaf's return
        // address at %rsp+0x28, nanosleep's at 0x30 + 8 above that.
        let mut words = vec![0u64; 8];
        words[5] = 0x7f00_d3e53; // into nanosleep
        words[7] = 0x40_1136; // into the program's function
        let w = window(&words);
        let leaf = LeafRule::Frameless {
            ra: 0x28,
            rbp: None,
        };
        assert_eq!(caller_sp(leaf), Some(0x30));
        let LeafStep::Caller {
            ret,
            chain_ok: true,
        } = leaf_step(leaf, 0, &w)
        else {
            panic!("stepped out of the leaf")
        };
        assert_eq!(ret, 0x7f00_d3e53);
        // nanosleep at its call: `sub $8` below its return address.
        let caller = LeafRule::Frameless { ra: 8, rbp: None };
        assert_eq!(
            step(caller, 0, &w, 0x30),
            LeafStep::Caller {
                ret: 0x40_1136,
                chain_ok: true
            }
        );
        // A caller that saved %rbp (at its %rsp) and changed it: the chain
        // walked from %rbp is not the one above it.
        let saver = LeafRule::Frameless {
            ra: 8,
            rbp: Some(0),
        };
        assert_eq!(
            step(saver, 0xbeef, &w, 0x30),
            LeafStep::Caller {
                ret: 0x40_1136,
                chain_ok: false
            }
        );
        assert!(matches!(
            step(saver, 0, &w, 0x30),
            LeafStep::Caller { chain_ok: true, .. }
        ));
        assert_eq!(step(caller, 0, &w, 0x40), LeafStep::OutOfWindow);
        assert_eq!(caller_sp(LeafRule::Framed), None);
    }

    #[test]
    fn recognizes_calls_before_return_addresses() {
        let ends_with = |tail: &[u8]| {
            let mut b = vec![0x90; CODE_BEFORE - tail.len()];
            b.extend_from_slice(tail);
            after_call(&b)
        };
        assert!(ends_with(&[0xe8, 1, 2, 3, 4]), "call rel32");
        assert!(ends_with(&[0xff, 0xd0]), "call *%rax");
        assert!(ends_with(&[0x41, 0xff, 0xd3]), "call *%r11");
        assert!(ends_with(&[0x3e, 0xff, 0xd0]), "notrack call *%rax");
        assert!(ends_with(&[0xff, 0x15, 1, 2, 3, 4]), "call *disp32(%rip)");
        assert!(ends_with(&[0xff, 0x50, 0x08]), "call *8(%rax)");
        assert!(ends_with(&[0xff, 0x90, 1, 2, 3, 4]), "call *disp32(%rax)");
        assert!(ends_with(&[0xff, 0x14, 0x24]), "call *(%rsp)");
        assert!(ends_with(&[0xff, 0x54, 0x24, 0x08]), "call *8(%rsp)");
        assert!(
            ends_with(&[0xff, 0x14, 0xc5, 1, 2, 3, 4]),
            "call *disp32(,%rax,8)"
        );
        assert!(!ends_with(&[0x90, 0x90, 0x90]), "nops");
        assert!(!ends_with(&[0xff, 0xe0]), "jmp *%rax is no call");
        assert!(!ends_with(&[0xff, 0x15, 1, 2]), "a call cut short");
        assert!(!ends_with(&[0x48, 0x89, 0xe5]), "mov %rsp,%rbp");
        assert!(!after_call(&[0xe8]), "too short to hold a call");
    }

    #[test]
    fn recognizes_signal_trampolines() {
        assert!(is_sigreturn(&[
            0x48, 0xc7, 0xc0, 0x0f, 0, 0, 0, 0x0f, 0x05, 0x90
        ]));
        assert!(is_sigreturn(&[0xb8, 0x0f, 0, 0, 0, 0x0f, 0x05]));
        assert!(!is_sigreturn(&[
            0x48, 0xc7, 0xc0, 0x3c, 0, 0, 0, 0x0f, 0x05
        ]));
    }
}
