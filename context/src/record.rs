//! The OpenTelemetry thread-context record (OTEP 4947), byte for byte:
//!
//! | offset | size | field |
//! |---|---|---|
//! | 0 | 16 | `trace_id` (W3C byte order) |
//! | 16 | 8 | `span_id` |
//! | 24 | 1 | `valid`: 1 when consistent, 0 while being written |
//! | 25 | 1 | `trace_flags` (W3C; bit 0 = sampled) |
//! | 26 | 2 | `attrs_size`: bytes used in `attrs` (native endian) |
//! | 28 | ≤ 612 | `attrs`: `{u8 key_index, u8 len, len bytes of UTF-8}`… |
//!
//! 640 bytes in all, the limit readers copy. A reader interrupts the thread
//! that owns the record, so it never runs concurrently with the writer on
//! that thread: compiler fences around `valid` are all the synchronization
//! needed.

use std::sync::atomic::{compiler_fence, AtomicU8, Ordering};

/// Bytes available for attributes.
pub const MAX_ATTRS_SIZE: usize = 612;

/// One thread's record, laid out as the table above.
#[repr(C)]
pub struct Record {
    /// W3C trace ID, in W3C byte order.
    pub trace_id: [u8; 16],
    /// W3C span ID.
    pub span_id: [u8; 8],
    /// 1 when the record holds an active span and is consistent; 0 while
    /// being written or when no span is active.
    pub valid: AtomicU8,
    /// W3C trace flags (bit 0 = sampled).
    pub trace_flags: u8,
    /// Bytes used in `attrs`.
    pub attrs_size: u16,
    /// Attributes: `{u8 key_index, u8 len, len bytes of UTF-8}`, repeated.
    pub attrs: [u8; MAX_ATTRS_SIZE],
}

const _: () = {
    assert!(std::mem::size_of::<Record>() == 640);
    assert!(std::mem::offset_of!(Record, trace_id) == 0);
    assert!(std::mem::offset_of!(Record, span_id) == 16);
    assert!(std::mem::offset_of!(Record, valid) == 24);
    assert!(std::mem::offset_of!(Record, trace_flags) == 25);
    assert!(std::mem::offset_of!(Record, attrs_size) == 26);
    assert!(std::mem::offset_of!(Record, attrs) == 28);
};

/// What a guard saves and restores: the record's header (attributes are
/// cleared by entering and not restored).
// Aligned: guards copy it on every enter and exit, and an odd-sized,
// byte-aligned copy through the stack costs store-forwarding stalls
// (measured: 33 ns per enter+exit before, see docs/BENCHMARKS.md).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[repr(C, align(16))]
pub struct Ids {
    /// W3C trace ID, in W3C byte order.
    pub trace_id: [u8; 16],
    /// W3C span ID.
    pub span_id: [u8; 8],
    /// W3C trace flags (bit 0 = sampled).
    pub trace_flags: u8,
    /// Whether a span is active (`valid` in the record).
    pub active: bool,
}

impl Record {
    /// All zeroes: no span, no attributes (`valid` 0).
    pub const fn empty() -> Record {
        Record {
            trace_id: [0; 16],
            span_id: [0; 8],
            valid: AtomicU8::new(0),
            trace_flags: 0,
            attrs_size: 0,
            attrs: [0; MAX_ATTRS_SIZE],
        }
    }

    /// The record's header as published (`active` is `valid == 1`).
    pub fn ids(&self) -> Ids {
        Ids {
            trace_id: self.trace_id,
            span_id: self.span_id,
            trace_flags: self.trace_flags,
            active: self.valid.load(Ordering::Relaxed) == 1,
        }
    }

    /// Publishes `ids` (and no attributes): `valid` is 0 while the fields
    /// change, 1 after, unless `ids` is inactive.
    #[inline]
    pub fn set(&mut self, ids: &Ids) {
        self.valid.store(0, Ordering::Relaxed);
        compiler_fence(Ordering::SeqCst);
        self.trace_id = ids.trace_id;
        self.span_id = ids.span_id;
        self.trace_flags = ids.trace_flags;
        self.attrs_size = 0;
        compiler_fence(Ordering::SeqCst);
        if ids.active {
            self.valid.store(1, Ordering::Relaxed);
        }
    }

    /// Replaces the attributes: `(key_index, value)` pairs, key indices into
    /// the process context's `threadlocal.attribute_key_map`. Values are cut
    /// at 255 bytes (on a character boundary); pairs that no longer fit are
    /// left out. Returns whether all of them fit whole.
    pub fn set_attributes(&mut self, attributes: &[(u8, &str)]) -> bool {
        let active = self.valid.load(Ordering::Relaxed) == 1;
        self.valid.store(0, Ordering::Relaxed);
        compiler_fence(Ordering::SeqCst);
        let mut at = 0;
        let mut whole = true;
        for &(key, value) in attributes {
            let mut len = value.len().min(255);
            while !value.is_char_boundary(len) {
                len -= 1;
            }
            whole &= len == value.len();
            if at + 2 + len > MAX_ATTRS_SIZE {
                whole = false;
                break;
            }
            self.attrs[at] = key;
            self.attrs[at + 1] = len as u8;
            self.attrs[at + 2..at + 2 + len].copy_from_slice(&value.as_bytes()[..len]);
            at += 2 + len;
        }
        self.attrs_size = at as u16;
        compiler_fence(Ordering::SeqCst);
        if active {
            self.valid.store(1, Ordering::Relaxed);
        }
        whole
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn set_writes_the_otep_layout() {
        let mut r = Record::empty();
        r.set(&Ids {
            trace_id: [0xab; 16],
            span_id: [0xcd; 8],
            trace_flags: 1,
            active: true,
        });
        assert!(r.set_attributes(&[(0, "GET /cart"), (3, "eu-west")]));
        // SAFETY: Record is plain bytes (AtomicU8 has u8's layout).
        let bytes: &[u8; 640] = unsafe { &*(&r as *const Record).cast() };
        assert_eq!(&bytes[..16], &[0xab; 16]);
        assert_eq!(&bytes[16..24], &[0xcd; 8]);
        assert_eq!((bytes[24], bytes[25]), (1, 1));
        let size = u16::from_ne_bytes([bytes[26], bytes[27]]) as usize;
        assert_eq!(size, 2 + 9 + 2 + 7);
        assert_eq!(&bytes[28..28 + size], b"\x00\x09GET /cart\x03\x07eu-west");
        // Inactive: valid stays 0; attributes cleared.
        r.set(&Ids::default());
        assert_eq!(r.valid.load(Ordering::Relaxed), 0);
        assert_eq!(r.attrs_size, 0);
    }

    #[test]
    fn attributes_are_cut_and_bounded() {
        let mut r = Record::empty();
        let long = "é".repeat(200); // 400 bytes: cut at 254 (a char boundary)
        assert!(!r.set_attributes(&[(1, &long)]));
        assert_eq!(r.attrs[1], 254);
        let many: Vec<(u8, &str)> = (0..10).map(|i| (i, &long[..200])).collect();
        assert!(!r.set_attributes(&many));
        assert_eq!(
            r.attrs_size as usize,
            3 * 202,
            "three 202-byte pairs fit in 612"
        );
    }
}
