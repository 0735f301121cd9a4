//! An `ObjectStore` that counts the requests it forwards, by operation, as
//! `symtrace_object_store_requests_total{op}`: what each export, upload and
//! query costs the bucket (docs/scaling.md is computed from it).
//!
//! One count per call of the `object_store` API, which is one HTTP request
//! to S3, except that a `list` is counted once though S3 answers it in pages
//! of 1,000 keys (only the orphan collector lists), and a multipart upload is
//! one `multipart_create`, one `multipart_part` per part and one
//! `multipart_complete`.

use std::ops::Range;
use std::sync::Arc;

use async_trait::async_trait;
use bytes::Bytes;
use futures::stream::BoxStream;
use object_store::path::Path;
use object_store::{
    GetOptions, GetResult, ListResult, MultipartUpload, ObjectMeta, ObjectStore,
    PutMultipartOptions, PutOptions, PutPayload, PutResult, Result, UploadPart,
};

#[derive(Debug)]
pub struct CountedStore {
    inner: Arc<dyn ObjectStore>,
}

impl CountedStore {
    pub fn new(inner: Arc<dyn ObjectStore>) -> Self {
        Self { inner }
    }
}

fn count(op: &'static str) {
    metrics::counter!("symtrace_object_store_requests_total", "op" => op).increment(1);
}

impl std::fmt::Display for CountedStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Counted({})", self.inner)
    }
}

#[async_trait]
impl ObjectStore for CountedStore {
    async fn put_opts(
        &self,
        location: &Path,
        payload: PutPayload,
        opts: PutOptions,
    ) -> Result<PutResult> {
        count("put");
        self.inner.put_opts(location, payload, opts).await
    }

    async fn put_multipart_opts(
        &self,
        location: &Path,
        opts: PutMultipartOptions,
    ) -> Result<Box<dyn MultipartUpload>> {
        count("multipart_create");
        let upload = self.inner.put_multipart_opts(location, opts).await?;
        Ok(Box::new(CountedUpload { upload }))
    }

    async fn get_opts(&self, location: &Path, options: GetOptions) -> Result<GetResult> {
        count(if options.head { "head" } else { "get" });
        self.inner.get_opts(location, options).await
    }

    async fn get_range(&self, location: &Path, range: Range<u64>) -> Result<Bytes> {
        count("get");
        self.inner.get_range(location, range).await
    }

    async fn get_ranges(&self, location: &Path, ranges: &[Range<u64>]) -> Result<Vec<Bytes>> {
        count("get");
        self.inner.get_ranges(location, ranges).await
    }

    async fn head(&self, location: &Path) -> Result<ObjectMeta> {
        count("head");
        self.inner.head(location).await
    }

    async fn delete(&self, location: &Path) -> Result<()> {
        count("delete");
        self.inner.delete(location).await
    }

    fn list(&self, prefix: Option<&Path>) -> BoxStream<'static, Result<ObjectMeta>> {
        count("list");
        self.inner.list(prefix)
    }

    fn list_with_offset(
        &self,
        prefix: Option<&Path>,
        offset: &Path,
    ) -> BoxStream<'static, Result<ObjectMeta>> {
        count("list");
        self.inner.list_with_offset(prefix, offset)
    }

    async fn list_with_delimiter(&self, prefix: Option<&Path>) -> Result<ListResult> {
        count("list");
        self.inner.list_with_delimiter(prefix).await
    }

    async fn copy(&self, from: &Path, to: &Path) -> Result<()> {
        count("copy");
        self.inner.copy(from, to).await
    }

    async fn rename(&self, from: &Path, to: &Path) -> Result<()> {
        count("rename");
        self.inner.rename(from, to).await
    }

    async fn copy_if_not_exists(&self, from: &Path, to: &Path) -> Result<()> {
        count("copy");
        self.inner.copy_if_not_exists(from, to).await
    }

    async fn rename_if_not_exists(&self, from: &Path, to: &Path) -> Result<()> {
        count("rename");
        self.inner.rename_if_not_exists(from, to).await
    }
}

#[derive(Debug)]
struct CountedUpload {
    upload: Box<dyn MultipartUpload>,
}

#[async_trait]
impl MultipartUpload for CountedUpload {
    fn put_part(&mut self, data: PutPayload) -> UploadPart {
        count("multipart_part");
        self.upload.put_part(data)
    }

    async fn complete(&mut self) -> Result<PutResult> {
        count("multipart_complete");
        self.upload.complete().await
    }

    async fn abort(&mut self) -> Result<()> {
        count("multipart_abort");
        self.upload.abort().await
    }
}
