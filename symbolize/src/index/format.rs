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
//!   linkage names front-coded;
//! - 3: a size-0 symbol's extent filled in (to the next symbol or the end
//!   of its section), so such symbols name the code after them.

use bytemuck::{Pod, Zeroable};

/// File magic.
pub const MAGIC: [u8; 8] = *b"STSYMIDX";
/// Format version; any change to this file bumps it, and stored indexes of
/// another version are rebuilt.
pub const VERSION: u32 = 3;
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

/// The fixed header at offset 0: what the tables after it hold and how
/// long each is.
#[repr(C)]
#[derive(Debug, Clone, Copy, Pod, Zeroable)]
pub struct Header {
    /// [`MAGIC`].
    pub magic: [u8; 8],
    /// [`VERSION`].
    pub version: u32,
    /// [`FLAG_DYNSYM`] and [`FLAG_DWARF`], or'ed.
    pub flags: u32,
    /// Address of the first range; `block_starts` are relative to it.
    pub base: u64,
    /// Entries in `block_starts` and in `block_ends`.
    pub blocks: u32,
    /// Entries in `scopes`.
    pub scopes: u32,
    /// Entries in `locations`.
    pub locations: u32,
    /// Entries in `functions`.
    pub functions: u32,
    /// Entries in `files`.
    pub files: u32,
    /// Entries in `symbols`.
    pub symbols: u32,
    /// Ranges in `range_data`, over all blocks.
    pub ranges: u32,
    /// Linkage names in `raw_data` (those that differ from the display name).
    pub raw_names: u32,
    /// Length of `range_data` in bytes.
    pub range_data_len: u64,
    /// Length of `strings` in bytes.
    pub strings_len: u64,
    /// Length of `raw_data` in bytes.
    pub raw_data_len: u64,
}

/// The function a range is in, and where it was inlined, if it was.
#[repr(C)]
#[derive(Debug, Clone, Copy, Pod, Zeroable, PartialEq, Eq, Hash)]
pub struct Scope {
    /// Index into `functions`, or `NONE`.
    pub function: u32,
    /// The caller's location, for inlined code; `NONE` otherwise.
    pub inlined_into: u32,
}

/// The call site of an inlined function: the caller's frame as it
/// continues there.
#[repr(C)]
#[derive(Debug, Clone, Copy, Pod, Zeroable, PartialEq, Eq, Hash)]
pub struct Location {
    /// The caller: index into `functions`, or `NONE`.
    pub function: u32,
    /// Index into `files`, or `NONE`.
    pub file: u32,
    /// Line of the call, 0 when unknown.
    pub line: u32,
    /// Column of the call, 0 when unknown.
    pub column: u32,
    /// The caller's own call site, when it was inlined too: always a smaller
    /// location index; `NONE` otherwise.
    pub inlined_into: u32,
}

/// A function's names.
#[repr(C)]
#[derive(Debug, Clone, Copy, Pod, Zeroable)]
pub struct Function {
    /// Demangled (display) name.
    pub name: StrRef,
    /// Ordinal of the raw linkage name in the sorted, front-coded raw
    /// names, or `NONE` when it is the same as `name`.
    pub raw: u32,
    /// Zero; pads the entry to a multiple of 8 bytes.
    pub _pad: u32,
}

/// A string in `strings`.
#[repr(C)]
#[derive(Debug, Clone, Copy, Pod, Zeroable, PartialEq, Eq)]
pub struct StrRef {
    /// Byte offset into `strings`.
    pub offset: u32,
    /// Length in bytes.
    pub len: u32,
}

/// A function symbol from `.symtab` or `.dynsym`.
#[repr(C)]
#[derive(Debug, Clone, Copy, Pod, Zeroable)]
pub struct SymbolEntry {
    /// Start address; strictly increasing over `symbols`.
    pub address: u64,
    /// Bytes it covers (a size-0 symbol's extent is filled in when the
    /// index is built; 0 only for one at its section's end: its address).
    pub size: u64,
    /// Its name: index into `functions`.
    pub function: u32,
    /// Zero; pads the entry to a multiple of 8 bytes.
    pub _pad: u32,
}

/// Size of [`Header`] in bytes (80).
pub const HEADER_LEN: usize = std::mem::size_of::<Header>();

/// Rounds up to the 8-byte alignment of every array.
pub fn align8(n: usize) -> usize {
    (n + 7) & !7
}
