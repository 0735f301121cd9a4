//! A user stack walked in userspace from a copy of its memory: the samples
//! a process takes before the agent has set its unwind ranges (its first
//! moments, or a short-lived process's whole life) come with up to
//! `STACK_SNAPSHOT_BYTES` of their stack (`struct stack_snapshot`), and are
//! walked here the way the BPF walk would have walked them with the
//! process's tables: each frame by its file's CFI where there is one, by
//! frame pointer elsewhere (JIT code, files without CFI). Pure logic over
//! bytes; the rules come from the caller.

use crate::cfi::LeafRule;

/// The registers at the sample and the stack bytes from `%rsp` up.
#[derive(Debug, Clone, Copy)]
pub struct Snapshot<'a> {
    pub ip: u64,
    pub sp: u64,
    pub bp: u64,
    pub data: &'a [u8],
}

/// Why the walk ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum End {
    /// A zero return address or frame pointer: the ABI's end of the chain.
    Root,
    /// CFI marks the return address undefined (`_start`, a thread's entry).
    Outermost,
    /// `max` frames.
    Depth,
    /// A value the next step needs lies outside the copied bytes.
    OutOfSnapshot,
    /// The caller's stack pointer was not above the callee's (a loop, or
    /// garbage taken for a frame).
    NotIncreasing,
}

impl End {
    /// The walk reached the stack's end: the frames are the whole stack.
    pub fn whole(self) -> bool {
        matches!(self, End::Root | End::Outermost)
    }
}

/// Walks `snap` for at most `max` return addresses (after the leaf's
/// `%rip`); `rule_of(depth, ip)` is the CFI rule of the code at `ip`
/// (depth 0: the leaf's `%rip`; deeper: a return address), `None` when its
/// file has no CFI (then the frame pointer is followed, as in the BPF walk).
pub fn walk(
    snap: &Snapshot<'_>,
    max: usize,
    mut rule_of: impl FnMut(usize, u64) -> Option<LeafRule>,
) -> (Vec<u64>, End) {
    let (mut ip, mut sp, mut bp) = (snap.ip, snap.sp, snap.bp);
    let mut returns = Vec::new();
    for depth in 0..=max {
        if depth == max {
            return (returns, End::Depth);
        }
        let (ret, caller_sp, caller_bp) = match rule_of(depth, ip) {
            Some(LeafRule::Outermost) => return (returns, End::Outermost),
            Some(LeafRule::Frameless { ra, rbp }) => {
                let Some(ret_at) = sp.checked_add_signed(ra) else {
                    return (returns, End::OutOfSnapshot);
                };
                let Some(ret) = read(snap, ret_at) else {
                    return (returns, End::OutOfSnapshot);
                };
                let caller_bp = match rbp {
                    Some(at) => match sp.checked_add_signed(at).and_then(|a| read(snap, a)) {
                        Some(saved) => saved,
                        None => return (returns, End::OutOfSnapshot),
                    },
                    None => bp,
                };
                (ret, ret_at.saturating_add(8), caller_bp)
            }
            // The frame pointer: a function with its frame, or code of
            // which nothing is known (JIT code keeps frame pointers).
            Some(LeafRule::Framed | LeafRule::Unknown) | None => {
                if bp == 0 {
                    return (returns, End::Root);
                }
                if bp < sp {
                    return (returns, End::NotIncreasing);
                }
                let (Some(saved), Some(ret)) = (read(snap, bp), read(snap, bp.wrapping_add(8)))
                else {
                    return (returns, End::OutOfSnapshot);
                };
                (ret, bp.saturating_add(16), saved)
            }
        };
        if ret == 0 {
            return (returns, End::Root);
        }
        if caller_sp <= sp {
            return (returns, End::NotIncreasing);
        }
        returns.push(ret);
        (ip, sp, bp) = (ret, caller_sp, caller_bp);
    }
    (returns, End::Depth)
}

/// The word at address `at` of the copied stack.
fn read(snap: &Snapshot<'_>, at: u64) -> Option<u64> {
    let offset = usize::try_from(at.checked_sub(snap.sp)?).ok()?;
    let bytes = snap.data.get(offset..offset.checked_add(8)?)?;
    Some(u64::from_le_bytes(bytes.try_into().ok()?))
}

#[cfg(test)]
mod tests {
    use super::*;

    const SP: u64 = 0x7fff_0000;

    fn bytes(words: &[u64]) -> Vec<u8> {
        words.iter().flat_map(|w| w.to_le_bytes()).collect()
    }

    /// A leaf with its frame (0x1000) called by a frameless function
    /// (0x2000: 8 bytes of locals, the caller's %rbp saved above them,
    /// %rbp then its own register) called by a framed main (0x3000) whose
    /// caller is _start (0x4000).
    fn rules(_depth: usize, ip: u64) -> Option<LeafRule> {
        match ip & !0xfff {
            0x1000 | 0x3000 => Some(LeafRule::Framed),
            0x2000 => Some(LeafRule::Frameless {
                ra: 16,
                rbp: Some(8),
            }),
            0x4000 => Some(LeafRule::Outermost),
            _ => None,
        }
    }

    fn stack() -> Vec<u8> {
        bytes(&[
            0xdead_beef, // SP+0: the leaf's saved %rbp (the frameless function's data)
            0x2010,      // SP+8: return into the frameless function
            7,           // SP+16: its locals
            SP + 48,     // SP+24: main's %rbp, saved by the frameless function
            0x3010,      // SP+32: return into main
            9,           // SP+40: main's locals
            0,           // SP+48: main's saved %rbp (the end of the chain)
            0x4010,      // SP+56: return into _start
        ])
    }

    #[test]
    fn walks_through_a_frameless_function_to_the_outermost_frame() {
        let data = stack();
        let snap = Snapshot {
            ip: 0x1008,
            sp: SP,
            bp: SP,
            data: &data,
        };
        let (returns, end) = walk(&snap, 127, rules);
        assert_eq!(returns, [0x2010, 0x3010, 0x4010]);
        assert_eq!(end, End::Outermost);
        assert!(end.whole());
    }

    #[test]
    fn by_frame_pointer_alone_the_chain_is_garbage() {
        // The same stack where no file has CFI: the frame-pointer chain
        // reads the frameless function's data for a frame pointer.
        let data = stack();
        let snap = Snapshot {
            ip: 0x1008,
            sp: SP,
            bp: SP,
            data: &data,
        };
        let (returns, end) = walk(&snap, 127, |_, _| None);
        assert_eq!(returns, [0x2010]);
        assert!(!end.whole(), "{end:?}");
    }

    #[test]
    fn stops_where_the_copy_ends_or_the_depth_is_reached() {
        let data = stack();
        let short = Snapshot {
            ip: 0x1008,
            sp: SP,
            bp: SP,
            data: &data[..40],
        };
        let (returns, end) = walk(&short, 127, rules);
        assert_eq!(
            (returns.as_slice(), end),
            (&[0x2010, 0x3010][..], End::OutOfSnapshot)
        );
        let snap = Snapshot {
            data: &data,
            ..short
        };
        let (returns, end) = walk(&snap, 2, rules);
        assert_eq!((returns.len(), end), (2, End::Depth));
    }

    #[test]
    fn a_frame_pointer_below_the_stack_pointer_or_a_loop_ends_the_walk() {
        let data = bytes(&[SP, 0x1010, 0, 0]);
        let snap = Snapshot {
            ip: 0x1008,
            sp: SP,
            bp: SP,
            data: &data,
        };
        // A frame pointer that points at itself: the caller's frame is the
        // same frame, a loop.
        let (returns, end) = walk(&snap, 127, |_, _| Some(LeafRule::Framed));
        assert_eq!(returns, [0x1010]);
        assert_eq!(end, End::NotIncreasing);
        let below = Snapshot {
            bp: SP - 64,
            ..snap
        };
        assert_eq!(walk(&below, 127, |_, _| None), (vec![], End::NotIncreasing));
        // Hostile offsets never overflow.
        let (_, end) = walk(&snap, 127, |_, _| {
            Some(LeafRule::Frameless {
                ra: i64::MAX,
                rbp: Some(i64::MIN),
            })
        });
        assert_eq!(end, End::OutOfSnapshot);
    }
}
