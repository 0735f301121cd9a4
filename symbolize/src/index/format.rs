//! The on-disk layout of a symbol index, version [`VERSION`].
//!
//! Little-endian, every array 8-byte aligned, read in place from an mmap:
//!
//! ```text
//! Header                      72 bytes
//! range_starts [u32; ranges]  address - base, sorted ascending
//! range_locs   [u32; ranges]  location of each range, NONE = no DWARF here
//! locations    [Location; locations]
//! functions    [Function; functions]
//! files        [StrRef; files]
//! symbols      [SymbolEntry; symbols]   sorted by address
//! strings      [u8; strings_len]        UTF-8, validated when opened
//! ```
//!
//! A range runs from its start to the next range's start. A location is one
//! frame: function, file, line, column, and the location it is inlined into
//! (always a *smaller* index, so chains end and cannot cycle). A lookup is
//! one binary search in `range_starts` and a walk up `inlined_into`.
//!
//! Version history:
//! - 1: first format.

use bytemuck::{Pod, Zeroable};

/// File magic.
pub const MAGIC: [u8; 8] = *b"STSYMIDX";
/// Format version; any change to this file bumps it, and stored indexes of
/// another version are rebuilt.
pub const VERSION: u32 = 1;
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
    pub ranges: u32,
    pub locations: u32,
    pub functions: u32,
    pub files: u32,
    pub symbols: u32,
    pub _reserved: u32,
    pub strings_len: u64,
    pub _reserved2: [u64; 2],
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
    /// Raw linkage name, or `len == 0` when the same as `name`.
    pub raw: StrRef,
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
