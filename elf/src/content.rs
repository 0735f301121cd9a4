/// The content address both the uploader and the server use: the lowercase
/// hex SHA-256 of a file's bytes, and its size. The `missing` round trip only
/// works because both sides compute it the same way, so it lives here.
pub fn content_hash_file(path: &std::path::Path) -> std::io::Result<(String, u64)> {
    use sha2::Digest;
    let mut file = std::fs::File::open(path)?;
    let mut hasher = sha2::Sha256::new();
    let size = std::io::copy(&mut file, &mut hasher)?;
    Ok((hex::encode(hasher.finalize()), size))
}
