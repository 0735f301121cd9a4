//! The crate's error type: input that cannot be used at all. A single
//! address without frames is not an error but a [`crate::Miss`].

/// Why an object file or an index could not be used.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// Not a readable ELF file.
    #[error("not a readable ELF file: {0}")]
    Elf(#[from] object::read::Error),
    /// A compressed DWARF section cannot be decompressed within the budget
    /// ([`crate::Inputs::max_decompressed_bytes`]): its header claims more
    /// than is left, or its stream is damaged or inflates to another size
    /// than it claims. Always a [`symtrace_elf::Error::Decompression`],
    /// which names the section.
    #[error("{0}")]
    Decompression(symtrace_elf::Error),
    /// The DWARF is malformed beyond what can be skipped.
    #[error("malformed DWARF: {0}")]
    Dwarf(#[from] gimli::Error),
    /// A symbol index that is truncated, from another format version or
    /// internally inconsistent.
    #[error("invalid symbol index: {0}")]
    Index(String),
    /// The file's addresses do not fit the index format.
    #[error("unsupported: {0}")]
    Unsupported(String),
    /// More addresses than [`crate::MAX_BATCH`] in one call.
    #[error("{0} addresses in one batch; at most {max} are accepted", max = crate::MAX_BATCH)]
    BatchTooLarge(usize),
}
