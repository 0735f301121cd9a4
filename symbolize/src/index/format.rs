//! The on-disk layout of a symbol index, version [`VERSION`].
//!
//! Little-endian, every table 8-byte aligned, read in place from an mmap:
//!
//! ```text
//! Header                         80 bytes
//! block_starts [u32; blocks]     address - base of each block's first range
//! block_ends   [u32; blocks]     end offset of each block in range_data
//! range_data   [u8]              the ranges, BLOCK to a block, varints
//! scopes       [Scope; scopes]   function + the location it is inlined into
//! locations    [Location; ...]   call sites of inlined functions
//! functions    [Function; ...]
//! files        [StrRef; files]
//! symbols      [SymbolEntry; symbols]   sorted by address
//! strings      [u8; strings_len]        UTF-8, validated when opened
//! raw_ends     [u32; raw buckets]       end offset of each bucket
//! raw_data     [u8]                     linkage names, sorted, front-coded
//! ```
//!
//! Linkage names are kept (the API returns them beside the demangled name)
//! but front-coded in buckets of [`NAME_BUCKET`]: sorted mangled names share
//! long prefixes (crate paths, namespaces), which cuts them to about 40%.
//!
//! A range runs from its start to the next range's start and names the
//! innermost frame: a scope (the function and, for inlined code, the call
//! site it continues at), a file, a line and a column. In `range_data` each
//! range is: the start as a delta from the previous range in the block
//! (absent for the first, whose start is in `block_starts`), then
//! `scope + 1` (0: no DWARF covers this range, and nothing follows), then
//! file, line and column, the first two as zig-zag deltas from the previous
//! range in the block. A lookup is a binary search over `block_starts`, a
//! scan of at most [`BLOCK`] ranges, then a walk up `inlined_into` — always
//! to a *smaller* location index, so chains end and cannot cycle.
//!
//! Version history:
//! - 1: fixed-width ranges and a location per range (about 23% of the
//!   DWARF's size on a release Rust binary);
//! - 2: varint ranges in blocks, innermost frame stored in the range,
//!   linkage names front-coded.

use bytemuck::{Pod, Zeroable};

/// File magic.
pub const MAGIC: [u8; 8] = *b"STSYMIDX";
/// Format version; any change to this file bumps it, and stored indexes of
/// another version are rebuilt.
pub const VERSION: u32 = 2;
/// Ranges per block.
pub const BLOCK: usize = 16;
/// Raw (linkage) names per front-coded bucket.
pub const NAME_BUCKET: usize = 16;
/// "No such entry" in any index field.
pub const NONE: u32 = u32::MAX;

/// Header flag: the symbol table came from `.dynsym`.
pub const FLAG_DYNSYM: u32 = 1;
/// Header flag: the file had DWARF.
pub const FLAG_DWARF: u32 = 2;

#[repr(C)]
#[derive(Debug, Clone, Copy, Pod, Zeroable)]
pub struct Header {
    pub magic: [u8; 8],
    pub version: u32,
    pub flags: u32,
    pub base: u64,
    pub blocks: u32,
    pub scopes: u32,
    pub locations: u32,
    pub functions: u32,
    pub files: u32,
    pub symbols: u32,
    pub ranges: u32,
    pub raw_names: u32,
    pub range_data_len: u64,
    pub strings_len: u64,
    pub raw_data_len: u64,
}

#[repr(C)]
#[derive(Debug, Clone, Copy, Pod, Zeroable, PartialEq, Eq, Hash)]
pub struct Scope {
    pub function: u32,
    /// The caller's location, for inlined code; `NONE` otherwise.
    pub inlined_into: u32,
}

#[repr(C)]
#[derive(Debug, Clone, Copy, Pod, Zeroable, PartialEq, Eq, Hash)]
pub struct Location {
    pub function: u32,
    pub file: u32,
    pub line: u32,
    pub column: u32,
    pub inlined_into: u32,
}

#[repr(C)]
#[derive(Debug, Clone, Copy, Pod, Zeroable)]
pub struct Function {
    /// Demangled (display) name.
    pub name: StrRef,
    /// Ordinal of the raw linkage name in the sorted, front-coded raw
    /// names, or `NONE` when it is the same as `name`.
    pub raw: u32,
    pub _pad: u32,
}

#[repr(C)]
#[derive(Debug, Clone, Copy, Pod, Zeroable, PartialEq, Eq)]
pub struct StrRef {
    pub offset: u32,
    pub len: u32,
}

#[repr(C)]
#[derive(Debug, Clone, Copy, Pod, Zeroable)]
pub struct SymbolEntry {
    pub address: u64,
    /// 0: extends to the next symbol.
    pub size: u64,
    pub function: u32,
    pub _pad: u32,
}

pub const HEADER_LEN: usize = std::mem::size_of::<Header>();

/// Rounds up to the 8-byte alignment of every array.
pub fn align8(n: usize) -> usize {
    (n + 7) & !7
}
