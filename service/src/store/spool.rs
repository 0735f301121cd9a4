//! Spooling: a request body goes to a temporary file in the data directory
//! while it is hashed and counted, so nothing is visible, and nothing reaches
//! the object store, before the whole body arrived and was validated. A body
//! cut short, over the limit or undecodable leaves nothing behind: the
//! temporary file is removed when the [`Spooled`] value (or the error path)
//! drops it, and leftovers of a crash are cleared at start-up.

use std::fmt::Display;
use std::path::{Path, PathBuf};

use bytes::Bytes;
use futures::{Stream, StreamExt};
use sha2::{Digest, Sha256};
use tempfile::TempPath;
use tokio::io::AsyncWriteExt;

/// A complete body on local disk.
#[derive(Debug)]
pub struct Spooled {
    /// Deleted on drop.
    pub path: TempPath,
    /// Lowercase hex SHA-256 of the content.
    pub sha256: String,
    pub size: u64,
}

/// Why a body could not be spooled.
#[derive(Debug, thiserror::Error)]
pub enum SpoolError {
    #[error("body larger than the limit of {limit} bytes")]
    TooLarge { limit: u64 },
    #[error("body could not be read completely ({0}); nothing was stored")]
    Body(String),
    #[error("spool file: {0}")]
    Io(#[from] std::io::Error),
}

/// Writes `body` to a new temporary file in `dir`, hashing it on the way.
pub async fn spool<S, E>(body: S, dir: &Path, limit: u64) -> Result<Spooled, SpoolError>
where
    S: Stream<Item = Result<Bytes, E>>,
    E: Display,
{
    let temp = tempfile::Builder::new()
        .prefix("upload-")
        .tempfile_in(dir)?;
    let (std_file, path) = temp.into_parts();
    let mut file =
        tokio::io::BufWriter::with_capacity(1 << 20, tokio::fs::File::from_std(std_file));
    let mut hasher = Sha256::new();
    let mut size = 0u64;
    let mut body = std::pin::pin!(body);
    while let Some(chunk) = body.next().await {
        let chunk = chunk.map_err(|e| SpoolError::Body(e.to_string()))?;
        size += chunk.len() as u64;
        if size > limit {
            return Err(SpoolError::TooLarge { limit });
        }
        hasher.update(&chunk);
        file.write_all(&chunk).await?;
    }
    file.flush().await?;
    Ok(Spooled {
        path,
        sha256: hex::encode(hasher.finalize()),
        size,
    })
}

/// Removes spool files a crash left behind.
pub fn clear_spool_dir(dir: &Path) -> std::io::Result<usize> {
    std::fs::create_dir_all(dir)?;
    let mut removed = 0;
    for entry in std::fs::read_dir(dir)? {
        let path: PathBuf = entry?.path();
        if path.is_file() {
            std::fs::remove_file(&path)?;
            removed += 1;
        }
    }
    Ok(removed)
}

/// Writes `bytes` to a new spool file, fsynced, with its hash.
pub fn spool_bytes(bytes: &[u8], dir: &Path) -> std::io::Result<Spooled> {
    use std::io::Write;
    std::fs::create_dir_all(dir)?;
    let mut file = tempfile::NamedTempFile::new_in(dir)?;
    file.write_all(bytes)?;
    file.as_file().sync_all()?;
    Ok(Spooled {
        sha256: hex::encode(Sha256::digest(bytes)),
        size: bytes.len() as u64,
        path: file.into_temp_path(),
    })
}
