//! Source bundles: a tar whose members are source files named by absolute
//! path (the leading `/` may be dropped, as tar does). Read as a stream:
//! only regular files are kept, `..` paths and other entry types are
//! reported as rejected, and both the number of members and each member's
//! size are bounded.

use std::io::Read;

/// A member not kept, and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RejectedMember {
    /// The member's path as the tar names it.
    pub path: String,
    /// Why it was not kept, e.g. `not a regular file`.
    pub reason: String,
}

/// Why a bundle as a whole is refused.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum BundleError {
    /// Not a tar archive (or a damaged one).
    #[error("not a valid tar bundle: {0}")]
    Invalid(std::io::Error),
    /// More regular files than the given limit.
    #[error("bundle has more than {0} files")]
    TooManyMembers(usize),
    /// This member (its tar path) is longer than `max_member_bytes`.
    #[error("bundle member {0} is over the size limit")]
    MemberTooLarge(String),
    /// What the caller's `keep` returned.
    #[error("storing bundle member {path}: {source}")]
    Keep {
        /// The member's path as the tar names it.
        path: String,
        /// The error `keep` returned.
        source: std::io::Error,
    },
}

/// Reads a bundle; calls `keep(absolute path, member bytes)` for every
/// regular file (reading at most `max_member_bytes + 1` of it: a member
/// longer than that is refused) and returns what `keep` returned, in order,
/// with the members not kept.
pub fn read_bundle<R: Read, T>(
    reader: R,
    max_members: usize,
    max_member_bytes: u64,
    mut keep: impl FnMut(&str, &mut dyn Read) -> std::io::Result<(T, u64)>,
) -> Result<(Vec<T>, Vec<RejectedMember>), BundleError> {
    let mut archive = tar::Archive::new(reader);
    let mut kept = Vec::new();
    let mut rejected = Vec::new();
    for entry in archive.entries().map_err(BundleError::Invalid)? {
        let mut entry = entry.map_err(BundleError::Invalid)?;
        let raw = String::from_utf8_lossy(&entry.path_bytes()).into_owned();
        let kind = entry.header().entry_type();
        if !kind.is_file() {
            if !kind.is_dir() {
                rejected.push(RejectedMember {
                    path: raw,
                    reason: "not a regular file".into(),
                });
            }
            continue;
        }
        if kept.len() >= max_members {
            return Err(BundleError::TooManyMembers(max_members));
        }
        if raw.split('/').any(|s| s == "..") {
            rejected.push(RejectedMember {
                path: raw,
                reason: "path contains '..'".into(),
            });
            continue;
        }
        let path = format!("/{}", raw.trim_start_matches("./").trim_start_matches('/'));
        let mut bounded = (&mut entry).take(max_member_bytes.saturating_add(1));
        let (value, size) = keep(&path, &mut bounded).map_err(|source| match source.kind() {
            // Reading the member itself failed: the archive is damaged.
            std::io::ErrorKind::UnexpectedEof | std::io::ErrorKind::InvalidData => {
                BundleError::Invalid(source)
            }
            _ => BundleError::Keep {
                path: raw.clone(),
                source,
            },
        })?;
        if size > max_member_bytes {
            return Err(BundleError::MemberTooLarge(raw));
        }
        kept.push(value);
    }
    Ok((kept, rejected))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bundle(members: &[(&str, &[u8], tar::EntryType)]) -> Vec<u8> {
        let mut b = tar::Builder::new(Vec::new());
        for (path, data, kind) in members {
            let mut h = tar::Header::new_gnu();
            h.set_entry_type(*kind);
            h.set_size(data.len() as u64);
            h.set_mode(0o644);
            // Written into the header as is: the builder refuses `..`,
            // which is what a hostile bundle carries.
            h.as_old_mut().name[..path.len()].copy_from_slice(path.as_bytes());
            h.set_cksum();
            b.append(&h, *data).unwrap();
        }
        b.into_inner().unwrap()
    }

    /// (path, bytes) kept, and the rejected members.
    type Read = (Vec<(String, Vec<u8>)>, Vec<RejectedMember>);

    fn read(bytes: &[u8], max_members: usize, max_bytes: u64) -> Result<Read, BundleError> {
        read_bundle(bytes, max_members, max_bytes, |path, r| {
            let mut data = Vec::new();
            let n = std::io::copy(r, &mut data)?;
            Ok(((path.to_owned(), data), n))
        })
    }

    #[test]
    fn keeps_regular_files_under_absolute_paths_and_says_what_it_left() {
        let b = bundle(&[
            ("src/a.c", b"int a;", tar::EntryType::Regular),
            ("./src/b.h", b"int b;", tar::EntryType::Regular),
            ("src/../../etc/passwd", b"x", tar::EntryType::Regular),
            ("src/link", b"", tar::EntryType::Symlink),
            ("src", b"", tar::EntryType::Directory),
        ]);
        let (kept, rejected) = read(&b, 10, 100).unwrap();
        assert_eq!(
            kept,
            [
                ("/src/a.c".to_owned(), b"int a;".to_vec()),
                ("/src/b.h".to_owned(), b"int b;".to_vec())
            ]
        );
        let reasons: Vec<&str> = rejected.iter().map(|r| r.reason.as_str()).collect();
        assert_eq!(reasons, ["path contains '..'", "not a regular file"]);
    }

    #[test]
    fn bounds_members_and_sizes_and_refuses_garbage() {
        let b = bundle(&[
            ("a", b"1", tar::EntryType::Regular),
            ("b", b"22", tar::EntryType::Regular),
        ]);
        assert!(matches!(
            read(&b, 1, 100),
            Err(BundleError::TooManyMembers(1))
        ));
        assert!(matches!(read(&b, 10, 1), Err(BundleError::MemberTooLarge(p)) if p == "b"));
        assert!(read(&b, 10, 2).is_ok());
        assert!(matches!(
            read(&[7u8; 1024], 10, 100),
            Err(BundleError::Invalid(_))
        ));
        // A cut archive: an error, never a panic.
        for cut in [1, 100, 511, 513, 700] {
            let _ = read(&b[..cut.min(b.len())], 10, 100);
        }
    }
}
