//! Bounded decompression of compressed ELF sections.
//!
//! A compressed section says how large it is once decompressed: `ch_size` in
//! the `Elf64_Chdr`/`Elf32_Chdr` of an `SHF_COMPRESSED` section (zlib or
//! zstd), or the 8-byte big-endian size after the `ZLIB` magic of a legacy
//! `.zdebug_*` section. That number comes from the file, so it is checked
//! against a [`Budget`] — the decompressed bytes one operation on one file
//! may produce, shared by all its sections — *before* anything is allocated,
//! and the stream is then inflated by a streaming decoder into a buffer of
//! exactly that size: a stream that would produce more than it claims, or
//! less, is refused as corrupt instead of being trusted.
//!
//! [`section_data`] keeps the bytes (what DWARF readers need);
//! [`check_section`] only counts them (what upload validation needs: the
//! section must really decompress, within the budget, to what it claims).

use std::borrow::Cow;
use std::io::Read;

use object::{CompressedData, CompressionFormat, ObjectSection};

use crate::Error;

/// Decompressed bytes one operation on one file may produce by default
/// (4 GiB): what [`Budget::default`] allows.
pub const DEFAULT_MAX_DECOMPRESSED_BYTES: u64 = 4 << 30;

/// Most bytes decoded per read, so that decoders that buffer internally up
/// to the size asked for (and the discarding [`check_section`]) work in
/// bounded steps.
const CHUNK: usize = 1 << 20;

/// Largest zstd window accepted (libzstd's own default limit, 2^27 = 128
/// MiB): a frame that asks for more is refused instead of allocating it.
const ZSTD_WINDOW_LOG_MAX: u32 = 27;

/// How many decompressed bytes an operation may still produce.
///
/// Shared by every section decompressed for one file (or one operation over
/// several files, such as loading a debug file and its dwz supplementary
/// file): each compressed section is charged the size its header claims
/// before it is inflated. Sections stored uncompressed are borrowed from the
/// input and cost nothing.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Budget {
    limit: u64,
    remaining: u64,
}

impl Budget {
    /// A budget of `bytes` decompressed bytes.
    pub fn new(bytes: u64) -> Self {
        Self {
            limit: bytes,
            remaining: bytes,
        }
    }

    /// What the budget started with.
    pub fn limit(&self) -> u64 {
        self.limit
    }

    /// What is left of it.
    pub fn remaining(&self) -> u64 {
        self.remaining
    }

    /// Charges `claimed` bytes for section `section`, or says why not.
    fn charge(&mut self, section: &str, format: &str, claimed: u64) -> Result<(), Error> {
        if claimed > self.remaining {
            let mut over = format!("over the {}-byte budget", self.limit);
            if self.remaining != self.limit {
                over.push_str(&format!(
                    " ({} bytes left after the sections before it)",
                    self.remaining
                ));
            }
            return Err(decompression_error(
                section,
                DecompressionKind::OverBudget,
                format!("claims {claimed} uncompressed bytes ({format}), {over}"),
            ));
        }
        self.remaining -= claimed;
        Ok(())
    }
}

impl Default for Budget {
    /// [`DEFAULT_MAX_DECOMPRESSED_BYTES`].
    fn default() -> Self {
        Self::new(DEFAULT_MAX_DECOMPRESSED_BYTES)
    }
}

/// Why a compressed section could not be decompressed (see
/// [`Error::Decompression`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DecompressionKind {
    /// The size its header claims is more than the budget has left.
    OverBudget,
    /// The stream is damaged, or produces more or fewer bytes than its
    /// header claims, or its compression header is unreadable.
    Corrupt,
    /// A compression type this build cannot decode.
    Unsupported,
    /// The claimed size is within the budget but could not be allocated.
    OutOfMemory,
}

fn decompression_error(section: &str, kind: DecompressionKind, message: String) -> Error {
    Error::Decompression {
        section: section.to_owned(),
        kind,
        message,
    }
}

fn format_name(format: CompressionFormat) -> &'static str {
    match format {
        CompressionFormat::None => "uncompressed",
        CompressionFormat::Zlib => "zlib",
        CompressionFormat::Zstandard => "zstd",
        _ => "unknown compression",
    }
}

/// The compression of `section` as its header tells it.
fn compressed<'d, S: ObjectSection<'d>>(
    section: &S,
    name: &str,
) -> Result<CompressedData<'d>, Error> {
    section.compressed_data().map_err(|e| {
        let kind = if e.to_string().contains("Unsupported") {
            DecompressionKind::Unsupported
        } else {
            DecompressionKind::Corrupt
        };
        decompression_error(name, kind, format!("unreadable compression header: {e}"))
    })
}

fn section_name<'d, S: ObjectSection<'d>>(section: &S) -> String {
    section
        .name()
        .map(str::to_owned)
        .unwrap_or_else(|_| format!("#{}", section.index().0))
}

/// A streaming decoder over the compressed bytes of one section.
fn decoder<'d>(name: &str, data: &CompressedData<'d>) -> Result<Box<dyn Read + 'd>, Error> {
    let input: &'d [u8] = data.data;
    match data.format {
        CompressionFormat::Zlib => Ok(Box::new(flate2::bufread::ZlibDecoder::new(input))),
        CompressionFormat::Zstandard => {
            let mut decoder = zstd::stream::read::Decoder::with_buffer(input).map_err(|e| {
                decompression_error(
                    name,
                    DecompressionKind::OutOfMemory,
                    format!("cannot create a zstd decoder: {e}"),
                )
            })?;
            decoder.window_log_max(ZSTD_WINDOW_LOG_MAX).map_err(|e| {
                decompression_error(
                    name,
                    DecompressionKind::Corrupt,
                    format!("cannot configure the zstd decoder: {e}"),
                )
            })?;
            Ok(Box::new(decoder))
        }
        other => Err(decompression_error(
            name,
            DecompressionKind::Unsupported,
            format!("unsupported compression ({other:?})"),
        )),
    }
}

fn corrupt(name: &str, format: &str, e: std::io::Error) -> Error {
    decompression_error(
        name,
        DecompressionKind::Corrupt,
        format!("invalid {format} data: {e}"),
    )
}

fn too_long(name: &str, format: &str, claimed: u64) -> Error {
    decompression_error(
        name,
        DecompressionKind::Corrupt,
        format!(
            "{format} stream inflates to more than the {claimed} bytes its header claims \
             (corrupt section)"
        ),
    )
}

fn too_short(name: &str, format: &str, got: u64, claimed: u64) -> Error {
    decompression_error(
        name,
        DecompressionKind::Corrupt,
        format!(
            "{format} stream ends after {got} of the {claimed} bytes its header claims \
             (corrupt section)"
        ),
    )
}

/// Whether the decoder would produce at least one more byte.
fn has_more(reader: &mut dyn Read, name: &str, format: &str) -> Result<bool, Error> {
    let mut probe = [0u8; 1];
    loop {
        match reader.read(&mut probe) {
            Ok(n) => return Ok(n > 0),
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(corrupt(name, format, e)),
        }
    }
}

/// The contents of `section`, decompressed when it is compressed
/// (`SHF_COMPRESSED` zlib or zstd, or a `.zdebug_*` section with a `ZLIB`
/// header), charging the size it claims to `budget` first.
///
/// An uncompressed section is borrowed from the file and costs nothing.
/// Fails with [`Error::Decompression`], naming the section, when the claimed
/// size is over what the budget has left (nothing is allocated then), when
/// the stream is damaged, or when it produces more or fewer bytes than it
/// claims.
pub fn section_data<'d, S: ObjectSection<'d>>(
    section: &S,
    budget: &mut Budget,
) -> Result<Cow<'d, [u8]>, Error> {
    let name = section_name(section);
    let data = compressed(section, &name)?;
    if data.format == CompressionFormat::None {
        return Ok(Cow::Borrowed(data.data));
    }
    decompress_into_vec(&name, &data, budget).map(Cow::Owned)
}

fn decompress_into_vec(
    name: &str,
    data: &CompressedData<'_>,
    budget: &mut Budget,
) -> Result<Vec<u8>, Error> {
    let format = format_name(data.format);
    let claimed = data.uncompressed_size;
    budget.charge(name, format, claimed)?;
    let size = usize::try_from(claimed).map_err(|_| {
        decompression_error(
            name,
            DecompressionKind::OverBudget,
            format!("claims {claimed} uncompressed bytes ({format}), more than this machine can address"),
        )
    })?;
    let mut reader = decoder(name, data)?;
    let mut out = Vec::new();
    // Reserved up front: the claim, but never more than 64× the compressed
    // bytes (real DWARF compresses 3–10×; a header that lies about a tiny
    // stream gets no more than that); beyond it the buffer grows with what
    // the stream really produces, one chunk at a time.
    let reserve = size.min(data.data.len().saturating_mul(64));
    out.try_reserve_exact(reserve).map_err(|_| {
        decompression_error(
            name,
            DecompressionKind::OutOfMemory,
            format!("cannot allocate the {claimed} bytes it claims ({format})"),
        )
    })?;
    while out.len() < size {
        let filled = out.len();
        let want = size.min(filled + CHUNK);
        if want > out.capacity() {
            out.try_reserve(want - filled).map_err(|_| {
                decompression_error(
                    name,
                    DecompressionKind::OutOfMemory,
                    format!("cannot allocate the {claimed} bytes it claims ({format})"),
                )
            })?;
        }
        out.resize(want, 0);
        match reader.read(&mut out[filled..]) {
            Ok(0) => return Err(too_short(name, format, filled as u64, claimed)),
            Ok(n) => out.truncate(filled + n),
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => out.truncate(filled),
            Err(e) => return Err(corrupt(name, format, e)),
        }
    }
    if has_more(&mut *reader, name, format)? {
        return Err(too_long(name, format, claimed));
    }
    Ok(out)
}

/// Checks that `section`, if compressed, really decompresses to the size it
/// claims within `budget`, streaming and discarding the bytes (memory stays
/// bounded by the decoder's window, never by the claimed size). Returns its
/// uncompressed size (the stored size for an uncompressed section, which
/// costs nothing). Fails as [`section_data`] would.
pub fn check_section<'d, S: ObjectSection<'d>>(
    section: &S,
    budget: &mut Budget,
) -> Result<u64, Error> {
    let name = section_name(section);
    let data = compressed(section, &name)?;
    if data.format == CompressionFormat::None {
        return Ok(data.data.len() as u64);
    }
    let format = format_name(data.format);
    let claimed = data.uncompressed_size;
    budget.charge(&name, format, claimed)?;
    let mut reader = decoder(&name, &data)?;
    let mut scratch = vec![0u8; CHUNK.min(usize::try_from(claimed).unwrap_or(CHUNK)).max(1)];
    let mut total = 0u64;
    loop {
        // Never ask for more than one byte past the claimed size.
        let want = (claimed - total.min(claimed)).saturating_add(1);
        let want = usize::try_from(want)
            .unwrap_or(usize::MAX)
            .min(scratch.len());
        match reader.read(&mut scratch[..want]) {
            Ok(0) => break,
            Ok(n) => {
                total += n as u64;
                if total > claimed {
                    return Err(too_long(&name, format, claimed));
                }
            }
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(corrupt(&name, format, e)),
        }
    }
    if total < claimed {
        return Err(too_short(&name, format, total, claimed));
    }
    Ok(total)
}

#[cfg(test)]
mod tests;
