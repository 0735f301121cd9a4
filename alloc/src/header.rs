//! How a free recognises a sampled block without a lookup.
//!
//! A sampled allocation gets a 16-byte header right before the pointer the
//! program sees: at `ptr - 16` the distance back to the block the inner
//! allocator returned, at `ptr - 8` a tag, [`MAGIC`] mixed with the pointer
//! itself. Every free reads the 8 bytes before its pointer and compares —
//! one load from memory next to what it frees, no table, no lock (the
//! x86-64 scheme of the OpenTelemetry design's reference sampler, which
//! calls it a per-allocation magic prefix). The read stays inside the
//! pointer's own page, so it never faults whatever the allocator: a
//! pointer at the start of a page is never a sampled one (the header is
//! then moved one step further) and is not read before.
//!
//! Page-aligned requests (alignment ≥ 4096) cannot take a header without
//! becoming page-aligned themselves: they are counted as allocated but
//! reported freed at once, so they never show in the in-use profiles.

/// The tag's constant part; the tag is `MAGIC ^ ptr`, so it differs per
/// block and a stale copy in freed memory does not match a new pointer.
/// The `LD_PRELOAD` library uses another constant (`0x5a3da11c0ffee5a5`)
/// and another header: a Rust program under the library has both layers,
/// and each must see only its own blocks.
pub const MAGIC: u64 = 0x7a3d_a11c_0ffe_e5a5;

/// The header's size: the distance word and the tag.
pub const HEADER: usize = 16;

/// Pages are at least this large on every Linux target we run on.
pub const PAGE: usize = 4096;

/// Where a sampled block's user pointer goes, for an inner block of
/// `slack + size` bytes at `raw` aligned to `align`: `(offset, step)`,
/// the pointer being `raw + offset`. `step` is the header room kept for
/// alignment (`max(16, align)`); the inner block is allocated with
/// `2 × step` of slack so the pointer can move one step further when the
/// first place would be page-aligned. `None` for page-sized alignments.
pub fn place(raw: usize, align: usize) -> Option<usize> {
    let step = step(align)?;
    let first = raw + step;
    Some(if first % PAGE == 0 { 2 * step } else { step })
}

/// The header room for an alignment: `max(16, align)`; `None` when the
/// user pointer would always be page-aligned.
pub fn step(align: usize) -> Option<usize> {
    let step = align.max(HEADER);
    (step < PAGE).then_some(step)
}

/// The inner block's extra bytes for an alignment (see [`place`]).
pub fn slack(align: usize) -> Option<usize> {
    step(align).map(|s| 2 * s)
}

/// The tag stored at `ptr - 8` of a sampled block.
pub fn tag(ptr: usize) -> u64 {
    MAGIC ^ ptr as u64
}

/// Writes the header of a sampled block whose user pointer is `raw +
/// offset`.
///
/// # Safety
/// `raw .. raw + offset` must be writable memory of one block, `offset ≥ 16`.
pub unsafe fn write(raw: *mut u8, offset: usize) -> *mut u8 {
    let ptr = raw.add(offset);
    (ptr.sub(16) as *mut [u8; 8]).write(offset.to_ne_bytes());
    (ptr.sub(8) as *mut [u8; 8]).write(tag(ptr as usize).to_ne_bytes());
    ptr
}

/// Whether `ptr` is a sampled block's user pointer: its tag is in place.
/// Reads the 8 bytes before `ptr` unless `ptr` starts a page.
///
/// # Safety
/// `ptr` must be a live block of the allocator (or null).
#[inline(always)]
pub unsafe fn is_sampled(ptr: *const u8) -> bool {
    let at = ptr as usize;
    if at % PAGE < 8 {
        return false; // null, or the 8 bytes before are on another page
    }
    // A plain load of bytes that may belong to another block: volatile so
    // it is done as written (one 8-byte load, not elided).
    let before = (ptr.sub(8) as *const [u8; 8]).read_volatile();
    u64::from_ne_bytes(before) == tag(at)
}

/// A sampled block's inner pointer, and clears its tag (so a stale header
/// in reused memory never matches).
///
/// # Safety
/// `ptr` must be a sampled block ([`is_sampled`]).
pub unsafe fn take(ptr: *mut u8) -> *mut u8 {
    let offset = usize::from_ne_bytes((ptr.sub(16) as *const [u8; 8]).read());
    // A tag in place with an offset [`place`] never writes is not ours: a
    // block's own bytes that happen to (or were made to) look like a
    // header. Freeing `ptr - offset` then would free a wild pointer.
    if !(HEADER..=PAGE).contains(&offset) || offset % HEADER != 0 {
        std::process::abort();
    }
    (ptr.sub(8) as *mut [u8; 8]).write([0; 8]);
    ptr.sub(offset)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_header_is_recognised_and_cleared() {
        // A page-aligned buffer, so `raw + 32` never starts a page.
        let layout = std::alloc::Layout::from_size_align(PAGE, PAGE).unwrap();
        let raw = unsafe { std::alloc::alloc_zeroed(layout) };
        assert!(!raw.is_null());
        unsafe {
            let ptr = write(raw, 32);
            assert_eq!(ptr as usize - raw as usize, 32);
            assert!(is_sampled(ptr));
            assert!(!is_sampled(ptr.add(8)), "another pointer, another tag");
            assert_eq!(take(ptr), raw);
            assert!(!is_sampled(ptr), "the tag is cleared");
            std::alloc::dealloc(raw, layout);
        }
    }

    #[test]
    fn a_user_pointer_never_starts_a_page() {
        for align in [1, 8, 16, 32, 64, 256, 2048] {
            let step = step(align).unwrap();
            for raw in (0..3 * PAGE).step_by(align.max(16)) {
                let offset = place(raw, align).unwrap();
                let ptr = raw + offset;
                assert_ne!(ptr % PAGE, 0, "align {align} raw {raw}");
                assert_eq!(ptr % align, 0, "alignment kept");
                assert!(offset <= slack(align).unwrap() && offset >= HEADER);
                assert!(offset == step || offset == 2 * step);
            }
        }
        assert_eq!(place(0, 4096), None);
        assert_eq!(slack(8192), None);
    }

    #[test]
    fn the_first_bytes_of_a_page_are_not_read_before() {
        // Addresses below 8 into a page (and null) are answered without a
        // read: a read there could be on an unmapped page.
        for at in [0usize, PAGE, 3 * PAGE + 4] {
            assert!(!unsafe { is_sampled(at as *const u8) });
        }
    }
}
