//! The identities of a file that has no GNU build-ID (and of every other
//! file, so that any profiler's IDs find it):
//!
//! - [`htlhash`]: the OpenTelemetry eBPF profiler's file ID — SHA-256 over
//!   the first 4 KiB, the last 4 KiB (both the whole file when it is
//!   shorter) and the length as 8 big-endian bytes, kept as 128 bits, in
//!   lowercase hex (32 digits). Computable from any file, by anyone, from
//!   8 KiB of it.
//! - [`go_build_id`]: the Go toolchain's build-ID, from the `Go` note
//!   (`.note.go.buildid`, type 4) that `go build` writes instead of a GNU
//!   one. Stripping keeps it, so it ties a stripped Go binary to its
//!   unstripped original: all of them are stored under [`go_key`].

use std::io::{self, Read, Seek, SeekFrom};

use object::{Object, ObjectSection};
use sha2::{Digest, Sha256};

/// Bytes hashed at each end of the file.
const PIECE: u64 = 4096;
/// Longest Go build-ID accepted (they are about 83 characters).
pub const MAX_GO_BUILD_ID: usize = 256;
/// The Go note's type.
const GO_NOTE_TYPE: u32 = 4;

/// The htlhash file ID of a file read through `reader` (which is left at
/// an unspecified position).
pub fn htlhash<R: Read + Seek>(reader: &mut R) -> io::Result<String> {
    let mut hasher = Sha256::new();
    let size = reader.seek(SeekFrom::End(0))?;
    let mut buf = vec![0u8; PIECE as usize];
    reader.seek(SeekFrom::Start(0))?;
    let head = size.min(PIECE) as usize;
    reader.read_exact(&mut buf[..head])?;
    hasher.update(&buf[..head]);
    reader.seek(SeekFrom::Start(size - head as u64))?;
    reader.read_exact(&mut buf[..head])?;
    hasher.update(&buf[..head]);
    hasher.update(size.to_be_bytes());
    Ok(hex::encode(&hasher.finalize()[..16]))
}

/// [`htlhash`] of bytes in memory.
pub fn htlhash_bytes(data: &[u8]) -> String {
    htlhash(&mut io::Cursor::new(data)).expect("reading memory cannot fail")
}

/// The key a file with Go build-ID `go_build_id` (and no GNU build-ID) is
/// stored under: 128 bits of SHA-256 over `go-build-id:` and the ID, in hex.
/// Every variant of the build — as linked, stripped, its debug-only file —
/// has the same Go build-ID, so all of them go under one key, as the files
/// of one GNU build-ID do.
pub fn go_key(go_build_id: &str) -> String {
    let mut hasher = Sha256::new();
    hasher.update(b"go-build-id:");
    hasher.update(go_build_id.as_bytes());
    hex::encode(&hasher.finalize()[..16])
}

/// Whether `id` has the form of an htlhash: 32 lowercase hex digits.
pub fn is_htlhash(id: &str) -> bool {
    id.len() == 32 && id.parse::<crate::BuildId>().is_ok()
}

/// Whether `id` may be a Go build-ID: 1 to [`MAX_GO_BUILD_ID`] characters
/// of the alphabet the toolchain writes (base64url pieces joined by `/`).
pub fn is_go_build_id(id: &str) -> bool {
    !id.is_empty()
        && id.len() <= MAX_GO_BUILD_ID
        && id.bytes().all(|b| {
            b.is_ascii_alphanumeric() || matches!(b, b'/' | b'-' | b'_' | b'=' | b'+' | b'.')
        })
}

/// The Go build-ID of a parsed ELF file, if it has a well-formed one.
pub fn go_build_id<'d>(file: &object::File<'d>) -> Option<String> {
    let section = file.section_by_name(".note.go.buildid")?;
    let data = section.data().ok()?;
    let little = file.is_little_endian();
    go_note(data, little)
}

/// The description of the `Go` note of type 4 in a note section's bytes.
fn go_note(data: &[u8], little: bool) -> Option<String> {
    let word = |at: usize| -> Option<u32> {
        let b: [u8; 4] = data.get(at..at + 4)?.try_into().ok()?;
        Some(if little {
            u32::from_le_bytes(b)
        } else {
            u32::from_be_bytes(b)
        })
    };
    let align4 = |n: usize| n.checked_add(3).map(|n| n & !3);
    let mut at = 0usize;
    while at + 12 <= data.len() {
        let (namesz, descsz, kind) = (word(at)? as usize, word(at + 4)? as usize, word(at + 8)?);
        let name_at = at + 12;
        let desc_at = name_at.checked_add(align4(namesz)?)?;
        let end = desc_at.checked_add(align4(descsz)?)?;
        let name = data.get(name_at..name_at.checked_add(namesz)?)?;
        let desc = data.get(desc_at..desc_at.checked_add(descsz)?)?;
        let name_end = name.iter().rposition(|&b| b != 0).map_or(0, |i| i + 1);
        if kind == GO_NOTE_TYPE && &name[..name_end] == b"Go" {
            let id = std::str::from_utf8(desc).ok()?.trim_end_matches('\0');
            return is_go_build_id(id).then(|| id.to_owned());
        }
        at = end;
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The profiler's algorithm, written out the long way.
    fn reference(data: &[u8]) -> String {
        let n = data.len().min(4096);
        let mut h = Sha256::new();
        h.update(&data[..n]);
        h.update(&data[data.len() - n..]);
        h.update((data.len() as u64).to_be_bytes());
        hex::encode(&h.finalize()[..16])
    }

    #[test]
    fn htlhash_hashes_head_tail_and_length() {
        for len in [0usize, 1, 100, 4095, 4096, 4097, 8191, 8192, 8193, 100_000] {
            let data: Vec<u8> = (0..len).map(|i| (i * 7 % 251) as u8).collect();
            let id = htlhash_bytes(&data);
            assert_eq!(id, reference(&data), "length {len}");
            assert!(is_htlhash(&id));
        }
        // Only the middle differs: the same ID (the algorithm's known limit);
        // the length differs: another ID.
        let mut a = vec![0u8; 20_000];
        let b = a.clone();
        a[10_000] = 1;
        assert_eq!(htlhash_bytes(&a), htlhash_bytes(&b));
        assert_ne!(htlhash_bytes(&a), htlhash_bytes(&a[..19_999]));
    }

    #[test]
    fn htlhash_of_a_file_is_that_of_its_bytes() {
        use std::io::Write;
        let mut f = tempfile::tempfile().unwrap();
        let data: Vec<u8> = (0..50_000u32).map(|i| (i % 13) as u8).collect();
        f.write_all(&data).unwrap();
        assert_eq!(htlhash(&mut f).unwrap(), htlhash_bytes(&data));
    }

    fn note(name: &[u8], kind: u32, desc: &[u8]) -> Vec<u8> {
        let mut out = Vec::new();
        out.extend((name.len() as u32).to_le_bytes());
        out.extend((desc.len() as u32).to_le_bytes());
        out.extend(kind.to_le_bytes());
        out.extend(name);
        out.resize(out.len().next_multiple_of(4), 0);
        out.extend(desc);
        out.resize(out.len().next_multiple_of(4), 0);
        out
    }

    #[test]
    fn go_note_is_found_after_other_notes_and_checked() {
        let id = "abcDEF_-/ghi/jkl/mno";
        let mut data = note(b"GNU\0", 3, &[1; 20]);
        data.extend(note(b"Go\0\0", 4, id.as_bytes()));
        assert_eq!(go_note(&data, true).as_deref(), Some(id));
        // The wrong type, a hostile size, characters outside the alphabet.
        assert_eq!(go_note(&note(b"Go\0\0", 3, id.as_bytes()), true), None);
        let mut huge = note(b"Go\0\0", 4, id.as_bytes());
        huge[4..8].copy_from_slice(&u32::MAX.to_le_bytes());
        assert_eq!(go_note(&huge, true), None);
        assert_eq!(go_note(&note(b"Go\0\0", 4, b"a b"), true), None);
        assert_eq!(go_note(&note(b"Go\0\0", 4, &[b'a'; 300]), true), None);
        assert_eq!(go_note(&[1, 2, 3], true), None);
    }
}
