//! Blobs: content-addressed files in an object store (a local directory by
//! default; S3, GCS or Azure for several replicas), through `object_store`.
//!
//! Keys are `blobs/<first two hex digits>/<sha256>`. Every backend makes a
//! put atomic (the local one writes a staging file and renames it; S3
//! completes a multipart upload in one step), so a reader never sees half a
//! blob, and a blob is only referenced once the metadata row is committed.

use std::collections::{HashMap, VecDeque};
use std::ops::Range;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::SystemTime;

use async_trait::async_trait;
use bytes::Bytes;
use futures::stream::BoxStream;
use futures::{StreamExt, TryStreamExt};
use object_store::buffered::BufWriter;
use object_store::local::LocalFileSystem;
use object_store::path::Path as ObjectPath;
use object_store::prefix::PrefixStore;
use object_store::{GetOptions, GetRange, ObjectStore};
use tokio::io::AsyncWriteExt;

use super::counted::CountedStore;
use super::error::Error;

/// A blob's bytes, ready to become an HTTP body.
pub enum BlobBody {
    /// Small or memory-mapped content, sent in one piece.
    Bytes(Bytes),
    /// Content streamed from a remote store.
    Stream(BoxStream<'static, Result<Bytes, std::io::Error>>),
}

/// The narrow interface the rest of the server uses for blobs.
#[async_trait]
pub trait BlobStore: Send + Sync + 'static {
    /// Where blobs live, for logs.
    fn describe(&self) -> String;
    /// Cheap reachability check for `/readyz`.
    async fn ping(&self) -> Result<(), Error>;
    /// Stores a complete local file under its hash, durably.
    async fn put_file(&self, sha256: &str, file: &Path) -> Result<(), Error>;
    /// Reads a blob, or a byte range of it.
    async fn get(&self, sha256: &str, range: Option<Range<u64>>) -> Result<BlobBody, Error>;
    /// Deletes a blob (absent is fine).
    async fn delete(&self, sha256: &str) -> Result<(), Error>;
    /// Every blob with its last-modified time, for the orphan collector.
    fn list(&self) -> BoxStream<'static, Result<(String, SystemTime), Error>>;
}

/// [`BlobStore`] over any `object_store` backend.
pub struct ObjectBlobStore {
    store: Arc<dyn ObjectStore>,
    description: String,
    /// Root directory when the backend is the local filesystem: blobs are
    /// fsynced there after a put, and read through mmap.
    local_root: Option<PathBuf>,
    /// Mappings of local blobs, reused across requests (blobs are immutable,
    /// so a mapping never goes stale; page tables stay populated).
    maps: MapCache,
}

/// Most local blobs kept mapped at once (each is one VMA and one open file).
const MAPPED_BLOBS: usize = 1024;

/// A small FIFO cache of mapped blobs. The lock is never held across I/O:
/// mapping happens outside it.
#[derive(Default)]
struct MapCache {
    inner: Mutex<(HashMap<String, Bytes>, VecDeque<String>)>,
}

impl MapCache {
    fn get(&self, sha256: &str) -> Option<Bytes> {
        self.inner
            .lock()
            .expect("map cache lock")
            .0
            .get(sha256)
            .cloned()
    }

    fn insert(&self, sha256: &str, bytes: Bytes) {
        let mut guard = self.inner.lock().expect("map cache lock");
        let (map, order) = &mut *guard;
        if map.insert(sha256.to_owned(), bytes).is_none() {
            order.push_back(sha256.to_owned());
            while order.len() > MAPPED_BLOBS {
                if let Some(old) = order.pop_front() {
                    map.remove(&old);
                }
            }
        }
    }

    fn remove(&self, sha256: &str) {
        let mut guard = self.inner.lock().expect("map cache lock");
        let (map, order) = &mut *guard;
        if map.remove(sha256).is_some() {
            order.retain(|s| s != sha256);
        }
    }
}

/// Buffer of the upload writer; larger blobs go up as multipart uploads.
const PUT_BUFFER: usize = 8 << 20;

fn key(sha256: &str) -> ObjectPath {
    ObjectPath::from(format!("blobs/{}/{}", &sha256[..2], sha256))
}

impl ObjectBlobStore {
    /// A blob store in a local directory (created if absent).
    pub fn local(dir: &Path) -> Result<Self, Error> {
        std::fs::create_dir_all(dir)?;
        let dir = dir.canonicalize()?;
        let store = LocalFileSystem::new_with_prefix(&dir)?;
        Ok(Self {
            store: Arc::new(CountedStore::new(Arc::new(store))),
            description: format!("file://{}", dir.display()),
            local_root: Some(dir),
            maps: MapCache::default(),
        })
    }

    /// A blob store from a URL: `s3://bucket/prefix`, `gs://bucket/prefix`,
    /// `az://container/prefix`, `file:///dir` or a plain directory path.
    /// Credentials and endpoints come from the usual environment variables
    /// (`AWS_ACCESS_KEY_ID`, `AWS_ENDPOINT_URL`, `AWS_ALLOW_HTTP`,
    /// `GOOGLE_SERVICE_ACCOUNT`, `AZURE_STORAGE_ACCOUNT_NAME`, …).
    pub fn from_url(url: &str) -> Result<Self, StorageUrlError> {
        if let Some(dir) = url.strip_prefix("file://") {
            return Ok(Self::local(Path::new(dir))?);
        }
        if !url.contains("://") {
            return Ok(Self::local(Path::new(url))?);
        }
        let parsed: url_lite::Url = url_lite::Url::parse(url)?;
        let store: Arc<dyn ObjectStore> = match parsed.scheme.as_str() {
            "s3" | "s3a" => Arc::new(
                object_store::aws::AmazonS3Builder::from_env()
                    .with_bucket_name(&parsed.bucket)
                    .build()?,
            ),
            "gs" => Arc::new(
                object_store::gcp::GoogleCloudStorageBuilder::from_env()
                    .with_bucket_name(&parsed.bucket)
                    .build()?,
            ),
            "az" | "azure" | "abfs" | "abfss" => Arc::new(
                object_store::azure::MicrosoftAzureBuilder::from_env()
                    .with_container_name(&parsed.bucket)
                    .build()?,
            ),
            other => return Err(StorageUrlError::Scheme(other.to_owned())),
        };
        let store: Arc<dyn ObjectStore> = if parsed.prefix.is_empty() {
            store
        } else {
            Arc::new(PrefixStore::new(store, parsed.prefix.as_str()))
        };
        Ok(Self {
            store: Arc::new(CountedStore::new(store)),
            description: url.to_owned(),
            local_root: None,
            maps: MapCache::default(),
        })
    }
}

#[async_trait]
impl BlobStore for ObjectBlobStore {
    fn describe(&self) -> String {
        self.description.clone()
    }

    async fn ping(&self) -> Result<(), Error> {
        match self.store.head(&ObjectPath::from("blobs/.ping")).await {
            Ok(_) | Err(object_store::Error::NotFound { .. }) => Ok(()),
            Err(e) => Err(e.into()),
        }
    }

    async fn put_file(&self, sha256: &str, file: &Path) -> Result<(), Error> {
        if let Some(root) = &self.local_root {
            // Same filesystem as the spool (the default layout): link the
            // spooled file into place instead of copying it.
            let (dir, spooled, sha) = (root.clone(), file.to_owned(), sha256.to_owned());
            let linked = tokio::task::spawn_blocking(move || link_local(&dir, &spooled, &sha))
                .await
                .map_err(std::io::Error::other)?;
            match linked {
                Ok(()) => return Ok(()),
                // Another filesystem, or one without hard links: copy.
                Err(e) => {
                    tracing::debug!(error = %e, "linking the spooled blob failed; copying it");
                    let (root, source, sha) = (root.clone(), file.to_owned(), sha256.to_owned());
                    tokio::task::spawn_blocking(move || copy_local(&root, &source, &sha))
                        .await
                        .map_err(std::io::Error::other)??;
                    return Ok(());
                }
            }
        }
        let mut source = tokio::fs::File::open(file).await?;
        let mut writer = BufWriter::with_capacity(self.store.clone(), key(sha256), PUT_BUFFER);
        let copied = async {
            tokio::io::copy(&mut source, &mut writer).await?;
            writer.shutdown().await
        }
        .await;
        if let Err(e) = copied {
            let _ = writer.abort().await;
            return Err(e.into());
        }
        Ok(())
    }

    async fn get(&self, sha256: &str, range: Option<Range<u64>>) -> Result<BlobBody, Error> {
        if let Some(root) = &self.local_root {
            let whole = match self.maps.get(sha256) {
                Some(bytes) => bytes,
                None => {
                    let file = root.join(key(sha256).as_ref());
                    let bytes = tokio::task::spawn_blocking(move || map_local(&file))
                        .await
                        .map_err(std::io::Error::other)?
                        .map_err(|e| match e.kind() {
                            std::io::ErrorKind::NotFound => {
                                Error::NotFound(format!("blob {sha256} is not in the object store"))
                            }
                            _ => Error::from(e),
                        })?;
                    self.maps.insert(sha256, bytes.clone());
                    bytes
                }
            };
            let range = range.unwrap_or(0..whole.len() as u64);
            if range.end > whole.len() as u64 || range.start > range.end {
                return Err(Error::from(std::io::Error::new(
                    std::io::ErrorKind::UnexpectedEof,
                    format!("blob {sha256} is shorter than the range {range:?}"),
                )));
            }
            return Ok(BlobBody::Bytes(
                whole.slice(range.start as usize..range.end as usize),
            ));
        }
        let options = GetOptions {
            range: range.clone().map(GetRange::Bounded),
            ..Default::default()
        };
        let result = match self.store.get_opts(&key(sha256), options).await {
            Ok(r) => r,
            Err(object_store::Error::NotFound { .. }) => {
                return Err(Error::NotFound(format!(
                    "blob {sha256} is not in the object store"
                )))
            }
            Err(e) => return Err(e.into()),
        };
        Ok(BlobBody::Stream(
            result.into_stream().map_err(std::io::Error::other).boxed(),
        ))
    }

    async fn delete(&self, sha256: &str) -> Result<(), Error> {
        self.maps.remove(sha256);
        match self.store.delete(&key(sha256)).await {
            Ok(()) | Err(object_store::Error::NotFound { .. }) => Ok(()),
            Err(e) => Err(e.into()),
        }
    }

    fn list(&self) -> BoxStream<'static, Result<(String, SystemTime), Error>> {
        self.store
            .list(Some(&ObjectPath::from("blobs")))
            .map_err(Error::from)
            .try_filter_map(|meta| async move {
                let name = meta.location.filename().unwrap_or_default();
                let is_hash = name.len() == 64 && name.bytes().all(|b| b.is_ascii_hexdigit());
                Ok(is_hash.then(|| (name.to_owned(), SystemTime::from(meta.last_modified))))
            })
            .boxed()
    }
}

/// Puts a local blob without copying it: the spooled file is synced, then
/// hard-linked under the blob's name. `link(2)` creates the name atomically
/// and only once the data is durable, so no staging name is ever visible or
/// left behind. An existing blob of the same size is the same content (the
/// name is its hash) and is kept. Fails when the spool is on another
/// filesystem or links are not supported; the caller then copies.
fn link_local(root: &Path, file: &Path, sha256: &str) -> std::io::Result<()> {
    let target = root.join(key(sha256).as_ref());
    let dir = target.parent().expect("blob keys have a directory");
    std::fs::create_dir_all(dir)?;
    let spooled = std::fs::File::open(file)?;
    spooled.sync_all()?;
    for _ in 0..2 {
        match std::fs::hard_link(file, &target) {
            Ok(()) => {
                // The new name, and the directories create_dir_all may have made.
                for d in [dir, dir.parent().unwrap_or(dir)] {
                    std::fs::File::open(d)?.sync_all()?;
                }
                return Ok(());
            }
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
                // The name is the content's hash, but a file of that name
                // may be a damaged leftover (a power cut, a disk error):
                // trusted only when its bytes hash to the name.
                if std::fs::metadata(&target)?.len() == spooled.metadata()?.len()
                    && hash_file(&target)? == sha256
                {
                    return Ok(());
                }
                tracing::warn!(sha256, "replacing a damaged local blob");
                std::fs::remove_file(&target)?;
            }
            Err(e) => return Err(e),
        }
    }
    Err(std::io::Error::other(format!(
        "could not link blob {sha256} into place"
    )))
}

/// Copies a spooled file into the local store (when the spool is on another
/// filesystem): to a staging name in the blob's directory, fsynced, renamed
/// into place, and the directory fsynced — so the name never appears before
/// the data is durable. An existing blob is kept when its bytes hash to its
/// name.
fn copy_local(root: &Path, file: &Path, sha256: &str) -> std::io::Result<()> {
    let target = root.join(key(sha256).as_ref());
    let dir = target.parent().expect("blob keys have a directory");
    std::fs::create_dir_all(dir)?;
    if target.exists() && hash_file(&target)? == sha256 {
        return Ok(());
    }
    let mut staging = tempfile::Builder::new()
        .prefix(&format!(".{sha256}."))
        .tempfile_in(dir)?;
    std::io::copy(&mut std::fs::File::open(file)?, staging.as_file_mut())?;
    staging.as_file().sync_all()?;
    staging.persist(&target).map_err(|e| e.error)?;
    for d in [dir, dir.parent().unwrap_or(dir)] {
        std::fs::File::open(d)?.sync_all()?;
    }
    Ok(())
}

/// The sha256 of a file's bytes, as lowercase hex.
fn hash_file(path: &Path) -> std::io::Result<String> {
    use sha2::Digest;
    let mut hasher = sha2::Sha256::new();
    std::io::copy(&mut std::fs::File::open(path)?, &mut hasher)?;
    Ok(hex::encode(hasher.finalize()))
}

/// Maps a whole local blob. The mapping is registered for `sendfile`, so
/// serving it copies nothing through user space (see `zerocopy`). Empty
/// blobs cannot be mapped and need not be.
fn map_local(path: &Path) -> std::io::Result<Bytes> {
    let file = std::fs::File::open(path)?;
    if file.metadata()?.len() == 0 {
        return Ok(Bytes::new());
    }
    Ok(Bytes::from_owner(crate::zerocopy::FileMapping::new(file)?))
}

/// Why a storage URL opened no blob store.
#[derive(Debug, thiserror::Error)]
pub enum StorageUrlError {
    #[error("storage URL {0:?} has no scheme")]
    NoScheme(String),
    #[error("storage URL {0:?} names no bucket")]
    NoBucket(String),
    #[error(
        "unsupported storage URL scheme {0:?}: use a directory, file://, s3://, gs:// or az://"
    )]
    Scheme(String),
    /// The object store's client refused its configuration.
    #[error(transparent)]
    ObjectStore(#[from] object_store::Error),
    /// The local directory could not be opened.
    #[error("opening the local blob directory: {0}")]
    Local(#[from] Error),
}

/// Minimal parsing of `scheme://bucket/prefix` storage URLs.
mod url_lite {
    pub struct Url {
        pub scheme: String,
        pub bucket: String,
        pub prefix: String,
    }

    impl Url {
        pub fn parse(url: &str) -> Result<Self, super::StorageUrlError> {
            let (scheme, rest) = url
                .split_once("://")
                .ok_or_else(|| super::StorageUrlError::NoScheme(url.to_owned()))?;
            let (bucket, prefix) = rest.split_once('/').unwrap_or((rest, ""));
            if bucket.is_empty() {
                return Err(super::StorageUrlError::NoBucket(url.to_owned()));
            }
            Ok(Self {
                scheme: scheme.to_ascii_lowercase(),
                bucket: bucket.to_owned(),
                prefix: prefix.trim_matches('/').to_owned(),
            })
        }
    }
}
