//! The content hash of a mapped file: SHA-256 of every byte, as the server
//! hashes what it stores, so that a symbol file an agent publishes from
//! this file is bound to exactly this content (the server names a frame
//! from an agent's file only when the frame's mapping carries the same
//! hash: a forged file under another file's build-ID names only its own
//! frames). Computed once per file (device, inode), in the job that reads
//! its facts, with `pread` in pieces (never a mapping: a file truncated
//! meanwhile cannot fault the agent).

use std::cell::RefCell;
use std::fs::File;
use std::io;
use std::os::unix::fs::FileExt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use sha2::{Digest, Sha256};

/// Largest file hashed (a larger one's frames are never named from an
/// agent's upload; CI's and upstream files name them as ever).
pub const MAX_HASH_BYTES: u64 = 2 << 30;
/// Bytes read at a time.
const PIECE: usize = 1 << 20;

/// The SHA-256 of the first `size` bytes of `file` (its whole content),
/// as lowercase hex; `None` when it is over [`MAX_HASH_BYTES`] or shorter
/// than `size` now (it changed).
pub fn content_sha256(file: &File, size: u64) -> Option<String> {
    hash_pieces(file, size, |_| ())
}

/// What the content hashes cost so far (the stats line and `/metrics`):
/// each file is hashed once, so these grow with the distinct files
/// sampled, not with time.
#[derive(Default)]
pub struct HashCounters {
    files: AtomicU64,
    bytes: AtomicU64,
    cpu_ns: AtomicU64,
    vouched: AtomicU64,
    vouched_bytes: AtomicU64,
}

/// A reading of [`HashCounters`].
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct HashStats {
    pub files: u64,
    pub bytes: u64,
    /// CPU time of the threads that hashed (not wall time).
    pub cpu: Duration,
    /// Files not hashed because the server holds a CI or upstream file of
    /// their ID (their frames never need an agent's file), and their bytes.
    pub vouched: u64,
    pub vouched_bytes: u64,
}

impl HashCounters {
    /// [`content_sha256`], counted when it computes a hash.
    pub fn content_sha256(&self, file: &File, size: u64) -> Option<String> {
        let started = crate::jobs::thread_cpu();
        let sha = content_sha256(file, size)?;
        let cpu = crate::jobs::thread_cpu().saturating_sub(started);
        self.files.fetch_add(1, Ordering::Relaxed);
        self.bytes.fetch_add(size, Ordering::Relaxed);
        let ns = u64::try_from(cpu.as_nanos()).unwrap_or(u64::MAX);
        self.cpu_ns.fetch_add(ns, Ordering::Relaxed);
        Some(sha)
    }

    /// A file of `size` bytes not hashed: the server vouches for its ID.
    pub fn count_vouched(&self, size: u64) {
        self.vouched.fetch_add(1, Ordering::Relaxed);
        self.vouched_bytes.fetch_add(size, Ordering::Relaxed);
    }

    pub fn stats(&self) -> HashStats {
        HashStats {
            files: self.files.load(Ordering::Relaxed),
            bytes: self.bytes.load(Ordering::Relaxed),
            cpu: Duration::from_nanos(self.cpu_ns.load(Ordering::Relaxed)),
            vouched: self.vouched.load(Ordering::Relaxed),
            vouched_bytes: self.vouched_bytes.load(Ordering::Relaxed),
        }
    }
}

/// Hashes the first `size` bytes of `file` a [`PIECE`] at a time, handing
/// each piece to `each` too.
fn hash_pieces(file: &File, size: u64, mut each: impl FnMut(&[u8])) -> Option<String> {
    if size > MAX_HASH_BYTES {
        return None;
    }
    let mut hasher = Sha256::new();
    let mut buf = vec![0u8; PIECE.min(size as usize).max(1)];
    let mut offset = 0u64;
    while offset < size {
        let want = buf.len().min((size - offset) as usize);
        file.read_exact_at(&mut buf[..want], offset).ok()?;
        hasher.update(&buf[..want]);
        each(&buf[..want]);
        offset += want as u64;
    }
    Some(hex::encode(hasher.finalize()))
}

/// A file held to the content it was hashed as: what the agent splits a
/// debug file from must be the content whose hash it declares, or a
/// process could swap its file's bytes between the hash and the split (a
/// forged debug file bound to a real library's hash). One pass hashes the
/// file whole and each [`PIECE`] of it; every read afterwards gets whole
/// pieces whose hash is checked before a byte is handed out.
pub struct Pinned<'a> {
    file: &'a File,
    size: u64,
    pieces: Vec<[u8; 32]>,
    /// The piece read last (the extractor reads mostly in order).
    last: RefCell<Option<(u64, Vec<u8>)>>,
}

/// The file's bytes are not the ones hashed (any more).
#[derive(Debug, thiserror::Error)]
#[error("{}", CHANGED)]
pub struct Changed;

/// What [`Changed`] says.
pub const CHANGED: &str = "the file changed since it was hashed";

impl<'a> Pinned<'a> {
    /// Pins the first `size` bytes of `file` if their SHA-256 is `want`.
    pub fn new(file: &'a File, size: u64, want: &str) -> Result<Self, Changed> {
        let mut pieces = Vec::with_capacity(size.div_ceil(PIECE as u64) as usize);
        let whole = hash_pieces(file, size, |piece| {
            pieces.push(Sha256::digest(piece).into())
        });
        if whole.as_deref() != Some(want) {
            return Err(Changed);
        }
        Ok(Pinned {
            file,
            size,
            pieces,
            last: RefCell::new(None),
        })
    }

    /// Copies what `buf` wants of piece `index` at `within` into it.
    fn copy_from_piece(&self, index: u64, within: usize, buf: &mut [u8]) -> io::Result<usize> {
        let mut last = self.last.borrow_mut();
        if last.as_ref().is_none_or(|(at, _)| *at != index) {
            let start = index * PIECE as u64;
            let len = PIECE.min((self.size - start) as usize);
            let mut bytes = last.take().map(|(_, b)| b).unwrap_or_default();
            bytes.resize(len, 0);
            self.file.read_exact_at(&mut bytes, start)?;
            let digest: [u8; 32] = Sha256::digest(&bytes).into();
            if self.pieces.get(index as usize) != Some(&digest) {
                return Err(io::Error::other(Changed));
            }
            *last = Some((index, bytes));
        }
        let (_, bytes) = last.as_ref().expect("filled above");
        let n = buf.len().min(bytes.len().saturating_sub(within));
        buf[..n].copy_from_slice(&bytes[within..within + n]);
        Ok(n)
    }
}

impl symtrace_elf::Input for Pinned<'_> {
    fn size(&self) -> io::Result<u64> {
        Ok(self.size)
    }

    fn read_at(&self, offset: u64, buf: &mut [u8]) -> io::Result<()> {
        let end = offset.checked_add(buf.len() as u64);
        if end.is_none_or(|end| end > self.size) {
            return Err(io::ErrorKind::UnexpectedEof.into());
        }
        let mut done = 0;
        while done < buf.len() {
            let at = offset + done as u64;
            let index = at / PIECE as u64;
            let within = (at % PIECE as u64) as usize;
            let n = self.copy_from_piece(index, within, &mut buf[done..])?;
            if n == 0 {
                return Err(io::ErrorKind::UnexpectedEof.into());
            }
            done += n;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    #[test]
    fn the_hash_is_sha256_of_the_whole_file() {
        let mut file = tempfile::tempfile().unwrap();
        let bytes: Vec<u8> = (0..3 * PIECE + 17).map(|i| (i * 7 % 251) as u8).collect();
        file.write_all(&bytes).unwrap();
        let want = hex::encode(Sha256::digest(&bytes));
        assert_eq!(
            content_sha256(&file, bytes.len() as u64).as_deref(),
            Some(want.as_str())
        );
        // Shorter than it was said to be: changed, no hash.
        assert_eq!(content_sha256(&file, bytes.len() as u64 + 1), None);
        assert_eq!(content_sha256(&file, MAX_HASH_BYTES + 1), None);
        let empty = tempfile::tempfile().unwrap();
        assert_eq!(
            content_sha256(&empty, 0).as_deref(),
            Some(hex::encode(Sha256::digest(b"")).as_str())
        );
    }

    #[test]
    fn counters_count_the_hashes_computed_only() {
        let mut file = tempfile::tempfile().unwrap();
        file.write_all(&[7u8; 2 * PIECE]).unwrap();
        let counters = HashCounters::default();
        assert!(counters.content_sha256(&file, 2 * PIECE as u64).is_some());
        assert!(counters
            .content_sha256(&file, 2 * PIECE as u64 + 1)
            .is_none());
        let stats = counters.stats();
        assert_eq!((stats.files, stats.bytes), (1, 2 * PIECE as u64));
        assert!(stats.cpu > Duration::ZERO);
    }

    #[test]
    fn a_pinned_file_reads_only_the_bytes_it_was_hashed_as() {
        use symtrace_elf::Input;
        let mut file = tempfile::tempfile().unwrap();
        let bytes: Vec<u8> = (0..2 * PIECE + 100).map(|i| (i * 13 % 251) as u8).collect();
        file.write_all(&bytes).unwrap();
        let size = bytes.len() as u64;
        let want = hex::encode(Sha256::digest(&bytes));
        assert!(Pinned::new(&file, size, &"0".repeat(64)).is_err());
        let pinned = Pinned::new(&file, size, &want).unwrap();
        // Reads across pieces, at the end, and past it.
        let mut buf = vec![0u8; PIECE + 10];
        pinned.read_at(PIECE as u64 - 5, &mut buf).unwrap();
        assert_eq!(buf, bytes[PIECE - 5..2 * PIECE + 5]);
        let mut tail = [0u8; 100];
        pinned.read_at(2 * PIECE as u64, &mut tail).unwrap();
        assert_eq!(tail[..], bytes[2 * PIECE..]);
        assert!(pinned.read_at(size - 1, &mut [0u8; 2]).is_err());
        assert!(pinned.read_at(u64::MAX, &mut [0u8; 1]).is_err());
        // The file changes after it was pinned: a piece not read yet
        // (the last one is cached) is refused, never handed out.
        file.write_all_at(b"forged", 10).unwrap();
        let mut head = [0u8; 16];
        let e = pinned.read_at(0, &mut head).unwrap_err();
        assert!(e.to_string().contains("changed"), "{e}");
        // Its first read is the one checked: a pin of changed bytes fails.
        assert!(Pinned::new(&file, size, &want).is_err());
    }
}
