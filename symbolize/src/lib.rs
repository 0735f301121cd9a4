//! From (build-ID, ELF virtual address) to function, file and line, inline
//! frames included, innermost first.
//!
//! Two tiers, the way symbolicator and LLVM's GSYM cut it:
//!
//! * [`DwarfSymbolizer`] answers straight from an ELF file's DWARF (through
//!   the `addr2line` crate: compile units are parsed lazily, the batch is
//!   sorted and de-duplicated, each function name is demangled once). This is
//!   the path for the first request for a build-ID.
//! * [`index::build`] turns the same data, once, into a [`SymbolIndex`]: flat,
//!   sorted arrays (range starts → source locations → `inlined_into` chains,
//!   functions with their demangled and raw names, files, the symbol table and
//!   one string table) that are read from an mmap with one binary search per
//!   address and no parsing. See `index/format.rs` for the layout.
//!
//! Both fall back to `.symtab`, then `.dynsym`, when the DWARF has nothing
//! for an address, and both say explicitly why an address got no frames
//! ([`Miss`]).
//!
//! ```no_run
//! let debug = std::fs::read("app.debug").unwrap();
//! let inputs = symtrace_symbolize::Inputs::new(&debug);
//! let bytes = symtrace_symbolize::index::build(&inputs).unwrap();
//! let index = symtrace_symbolize::SymbolIndex::new(bytes).unwrap();
//! let mut frames = Vec::new();
//! match index.lookup(0x1234, &mut frames) {
//!     Ok(source) => println!("{source:?}: {frames:?}"),
//!     Err(miss) => println!("no frames: {miss}"),
//! }
//! ```

mod demangle;
mod dwarf;
mod elf;
mod error;
pub mod index;
mod symtab;
mod types;

pub use demangle::demangle;
pub use dwarf::DwarfSymbolizer;
pub use elf::Inputs;
pub use error::Error;
pub use index::SymbolIndex;
pub use types::{Frame, FrameRef, LinkageName, Miss, Source};

/// Largest batch the library accepts in one call; callers split bigger ones.
pub const MAX_BATCH: usize = 1_000_000;

#[cfg(target_endian = "big")]
compile_error!("the symbol index is read in place and assumes a little-endian host");
