//! What the addon does with its arguments, apart from Node-API: hex IDs as
//! OpenTelemetry JS writes them, and the per-thread stack of what `enter`
//! replaced, whose depth is the token `exit` takes back.

use std::cell::RefCell;

use symtrace_context::Ids;

/// Deepest nesting of `enter` on one thread: a runaway caller gets an
/// error, not unbounded memory (26 bytes an entry: 1.7 MiB at most).
pub const MAX_DEPTH: usize = 65_536;

/// Parses `N` bytes (8 or 16: a span or a trace ID) from exactly `2N`
/// hex digits, either case. Eight digits at a time in one `u64` (SWAR),
/// and the result made in a register and stored once: on every publish,
/// a loop over digits and a byte-wise result (loaded back wider, a
/// store-forwarding stall) were a third of `set`'s cost.
#[inline(always)]
pub fn parse_hex<const N: usize>(text: &[u8]) -> Option<[u8; N]> {
    if text.len() != 2 * N || N % 4 != 0 || N > 16 {
        return None;
    }
    let word = |i: usize| -> Option<u128> {
        let digits: [u8; 8] = text[8 * i..8 * i + 8].try_into().ok()?;
        Some(u128::from(parse8(u64::from_le_bytes(digits))?) << (32 * i))
    };
    let mut value = 0u128;
    for i in 0..N / 4 {
        value |= word(i)?;
    }
    value.to_le_bytes()[..N].try_into().ok()
}

/// Eight ASCII hex digits (first digit in the low byte) → four bytes.
#[inline(always)]
fn parse8(x: u64) -> Option<u32> {
    const ONES: u64 = 0x0101_0101_0101_0101;
    const HIGH: u64 = 0x8080_8080_8080_8080;
    if x & HIGH != 0 {
        return None; // not ASCII
    }
    let lower = x | (0x20 * ONES); // 'A'..'F' → 'a'..'f'; digits keep bit 5
                                   // Per byte b < 0x80: b + (0x80 - lo) has its high bit set iff b >= lo.
    let at_least = |v: u64, lo: u64| v + (0x80 - lo) * ONES;
    let digit = at_least(x, 0x30) & !at_least(x, 0x3a);
    let letter = at_least(lower, 0x61) & !at_least(lower, 0x67);
    if (digit | letter) & HIGH != HIGH {
        return None;
    }
    // Each byte's value: its low nibble, plus 9 for a letter.
    let nibbles = (lower & (0x0f * ONES)) + ((letter & HIGH) >> 7) * 9;
    // Pairs (high nibble first) into bytes 0, 2, 4, 6, then packed.
    let pairs = ((nibbles << 4) | (nibbles >> 8)) & 0x00ff_00ff_00ff_00ff;
    let quads = (pairs | (pairs >> 8)) & 0x0000_ffff_0000_ffff;
    Some((quads | (quads >> 16)) as u32)
}

/// Lower-case hex of `bytes`.
pub fn to_hex(bytes: &[u8]) -> String {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    let mut s = String::with_capacity(bytes.len() * 2);
    for b in bytes {
        s.push(DIGITS[(b >> 4) as usize] as char);
        s.push(DIGITS[(b & 15) as usize] as char);
    }
    s
}

thread_local! {
    static SAVED: RefCell<Vec<Ids>> = const { RefCell::new(Vec::new()) };
}

/// Why `enter` refused.
#[derive(Debug, PartialEq, Eq)]
pub struct TooDeep;

/// Publishes `ids` on this thread and saves what it replaces; the token is
/// the depth at which it was saved.
pub fn enter(ids: &Ids) -> Result<i32, TooDeep> {
    SAVED.with(|saved| {
        let mut saved = saved.borrow_mut();
        if saved.len() >= MAX_DEPTH {
            return Err(TooDeep);
        }
        let token = saved.len() as i32;
        saved.push(symtrace_context::swap(ids));
        Ok(token)
    })
}

/// Restores what the `enter` that returned `token` replaced, and forgets
/// everything entered after it (an inner `exit` that never came). A token
/// already exited, or never given, changes nothing.
pub fn exit(token: i32) -> bool {
    SAVED.with(|saved| {
        let mut saved = saved.borrow_mut();
        let Ok(depth) = usize::try_from(token) else {
            return false;
        };
        if depth >= saved.len() {
            return false;
        }
        let previous = saved[depth];
        saved.truncate(depth);
        symtrace_context::set(&previous);
        true
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ids(n: u8) -> Ids {
        Ids::new([n; 16], [n; 8], 1)
    }

    #[test]
    fn hex_both_cases_exact_length() {
        assert_eq!(parse_hex::<4>(b"0aFf9B10"), Some([0x0a, 0xff, 0x9b, 0x10]));
        assert_eq!(parse_hex::<4>(b"0aFf9B1"), None);
        assert_eq!(parse_hex::<20>(&[b'0'; 40]), None, "beyond 16 bytes");
        assert_eq!(parse_hex::<4>(b"0aFf9B100"), None);
        assert_eq!(to_hex(&[0x0a, 0xff]), "0aff");
        let id = *b"0af7651916cd43dd8448eb211c80319c";
        let parsed = parse_hex::<16>(&id).unwrap();
        assert_eq!(to_hex(&parsed).as_bytes(), id);
    }

    /// Every byte value in every position: accepted exactly when it is a
    /// hex digit, and then worth what it says.
    #[test]
    fn every_byte_in_every_position() {
        let digit = |b: u8| (b as char).to_digit(16);
        for position in 0..8 {
            for b in 0..=255u8 {
                let mut text = *b"00000000";
                text[position] = b;
                let got = parse_hex::<4>(&text);
                match digit(b) {
                    Some(v) => {
                        let mut want = [0u8; 4];
                        want[position / 2] = (v as u8) << (if position % 2 == 0 { 4 } else { 0 });
                        assert_eq!(got, Some(want), "{b:#x} at {position}");
                    }
                    None => assert_eq!(got, None, "{b:#x} at {position}"),
                }
            }
        }
    }

    #[test]
    fn exit_restores_and_unwinds_missed_exits() {
        assert!(!symtrace_context::current().active);
        let a = enter(&ids(1)).unwrap();
        let b = enter(&ids(2)).unwrap();
        let _c = enter(&ids(3)).unwrap();
        assert_eq!(symtrace_context::current(), ids(3));
        // The exit of c never came: b's exit still restores a.
        assert!(exit(b));
        assert_eq!(symtrace_context::current(), ids(1));
        assert!(!exit(b), "already exited");
        assert!(!exit(-1) && !exit(1 << 30));
        assert_eq!(symtrace_context::current(), ids(1));
        assert!(exit(a));
        assert!(!symtrace_context::current().active);
    }

    #[test]
    fn depth_is_bounded() {
        std::thread::spawn(|| {
            for _ in 0..MAX_DEPTH {
                enter(&ids(1)).unwrap();
            }
            assert_eq!(enter(&ids(2)), Err(TooDeep));
            assert_eq!(symtrace_context::current(), ids(1), "unchanged");
            assert!(exit(0));
            assert!(!symtrace_context::current().active);
        })
        .join()
        .unwrap();
    }
}
