//! ELF and DWARF inspection for symtrace.
//!
//! Everything here works on a byte slice (usually an mmap of a spooled upload
//! or a stored blob) and does no I/O of its own, so the server, the uploader
//! and the agent can share it:
//!
//! - [`inspect`] reads what a file is: its GNU build-ID, what debug data it
//!   carries ([`Quality`]), its section table and its debug links;
//! - [`source_files`] lists the source files its DWARF line tables name, as
//!   canonical absolute paths (`comp_dir` + directory + file name);
//! - [`canonical_path`] is the path normalisation debuginfod clients and
//!   servers agree on (RFC 3986 dot-segment removal plus `//` → `/`);
//! - [`only_keep_debug`] and [`strip_debug`] split a binary natively, as
//!   `objcopy --only-keep-debug` and `objcopy --strip-debug
//!   --add-gnu-debuglink` do, streaming from the input slice;
//! - [`BuildId`] is a validated, lowercase-hex GNU build-ID; [`htlhash`]
//!   and [`go_build_id`] are the other IDs a file without one is known by;
//! - [`section_data`] and [`check_section`] decompress (or check) a
//!   compressed section within a [`Budget`] of decompressed bytes, so that a
//!   header claiming a terabyte is refused before anything is allocated;
//! - [`usdt_probes`] reads the USDT probes (`.note.stapsdt`) a profiler
//!   attaches to: where each is in the file, its semaphore, its arguments.

mod build_id;
mod bundle;
mod content;
mod decompress;
mod file_id;
mod inspect;
mod path;
mod rewrite;
mod sources;
pub mod usdt;

pub use build_id::{BuildId, BuildIdError};
pub use bundle::{read_bundle, BundleError, RejectedMember};
pub use content::content_hash_file;
pub use decompress::{
    check_section, section_data, Budget, DecompressionKind, DEFAULT_MAX_DECOMPRESSED_BYTES,
};
pub use file_id::{
    go_build_id, go_key, htlhash, htlhash_bytes, is_go_build_id, is_htlhash, MAX_GO_BUILD_ID,
};
pub use inspect::{inspect, inspect_with, ElfInfo, FileKind, Quality, SectionEntry};
pub use path::{canonical_path, escape_path};
pub use rewrite::{debuglink_section, only_keep_debug, strip_debug, Input};
pub use sources::{source_files, source_files_with, SourceFiles};
pub use usdt::{usdt_probes, UsdtError, UsdtProbe};

/// Why a file could not be read as ELF or DWARF.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The bytes are not an ELF file at all (bad magic, truncated header).
    #[error("not an ELF file: {0}")]
    NotElf(String),
    /// The ELF structure is damaged (a section or note points outside the file).
    #[error("malformed ELF file: {0}")]
    Malformed(String),
    /// DWARF data could not be parsed.
    #[error("malformed DWARF: {0}")]
    Dwarf(String),
    /// A compressed section could not be decompressed within the budget:
    /// its header claims more than the [`Budget`] has left, or its stream is
    /// damaged or inflates to more or fewer bytes than it claims.
    #[error("section {section}: {message}")]
    Decompression {
        /// The section's name, e.g. `.debug_info`.
        section: String,
        /// Over budget, corrupt, unsupported or out of memory.
        kind: DecompressionKind,
        /// What was wrong, e.g. `claims 1099511627776 uncompressed bytes
        /// (zlib), over the 4294967296-byte budget`.
        message: String,
    },
}
