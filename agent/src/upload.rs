//! Publishing the files no CI uploaded: every executable or library whose
//! code is sampled is offered once ([`Offers::offer`]); in the background,
//! batches of offers go to the server's `missing` API as *claims*, and the
//! files the server grants (it has nothing as good for them, and no other
//! agent of the fleet is publishing them) are uploaded as found on the
//! host — through `/proc/PID/map_files` or the process's root, like every
//! file the agent reads — paced to `--upload-bytes-per-second`.
//!
//! Nothing here runs on the sampler thread but the offer (a `try_send`), and
//! the uploads share the export task's runtime without blocking it: files
//! are read on the blocking pool, a chunk at a time, and the body is paced
//! by sleeping, so an export is never late because of an upload.

use std::collections::HashSet;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use tokio::sync::mpsc;

use symtrace_elf::Quality;

use crate::maps::MapEntry;

/// Offers waiting for the uploader, each holding its file open; more are
/// dropped (and offered again when a new process maps the file).
const QUEUE: usize = 256;
/// Offers claimed in one `missing` request.
const BATCH: usize = 256;
/// How long offers gather before a claim request.
const GATHER: Duration = Duration::from_secs(2);
/// Bytes read and sent per piece of an upload body.
const CHUNK: usize = 256 << 10;
/// Tries per offer (a server away, an upload cut); between them 30 s,
/// doubling.
const ATTEMPTS: u32 = 5;
const RETRY_AFTER: Duration = Duration::from_secs(30);

/// A file whose code was sampled, open: a short-lived process's file can
/// still be read when its turn comes.
pub struct Offer {
    pub file: crate::safefile::Opened,
    pub map: MapEntry,
    /// Its GNU build-ID, else its htlhash.
    pub id: String,
    pub htlhash: bool,
    /// What names its code.
    pub symbols: Quality,
    /// Failed tries so far.
    pub attempts: u32,
}

/// Files remembered as offered; beyond it the set starts over (the server
/// answers a repeated offer from its own records).
const MAX_OFFERED: usize = 100_000;

/// The sampler's end of the queue.
#[derive(Clone)]
pub struct Offers {
    tx: mpsc::Sender<Offer>,
    stats: Arc<Stats>,
    /// Files (device, inode) offered and not failed: offered once.
    offered: Arc<Mutex<HashSet<(u64, u64)>>>,
    max_file_bytes: u64,
}

impl Offers {
    /// Whether the file of `map` is worth offering: not offered before,
    /// with symbols, within the size bound — or, with a GNU build-ID
    /// (`gnu`) and a symbol table or DWARF, over it: its symbol tables are
    /// sent then (else counted, once, as unpublishable). Marks it offered.
    pub fn wants(&self, map: &MapEntry, symbols: Quality, size: u64, gnu: bool) -> bool {
        let mut offered = self.offered.lock().unwrap_or_else(|e| e.into_inner());
        if offered.len() >= MAX_OFFERED {
            offered.clear();
        }
        if !offered.insert((map.dev, map.inode)) {
            return false;
        }
        let fits = size <= self.max_file_bytes || (gnu && symbols >= Quality::SymTab);
        if symbols == Quality::None || !fits {
            self.stats.skipped.fetch_add(1, Relaxed);
            return false;
        }
        true
    }

    /// Hands an offer to the uploader without waiting; counted as dropped
    /// (and offered again later) when the queue is full.
    pub fn offer(&self, offer: Offer) {
        self.stats.offered.fetch_add(1, Relaxed);
        if let Err(e) = self.tx.try_send(offer) {
            self.stats.dropped.fetch_add(1, Relaxed);
            let offer = match e {
                mpsc::error::TrySendError::Full(o) | mpsc::error::TrySendError::Closed(o) => o,
            };
            self.forget(&offer.map);
        }
    }

    /// Tries `offer` again later, or — after [`ATTEMPTS`] — lets its file
    /// be offered again when sampled in a new process.
    fn retry(&self, mut offer: Offer) {
        offer.attempts += 1;
        if offer.attempts >= ATTEMPTS {
            self.forget(&offer.map);
            return;
        }
        let tx = self.tx.clone();
        let delay = RETRY_AFTER * 2u32.pow(offer.attempts - 1);
        tokio::spawn(async move {
            tokio::time::sleep(delay).await;
            let _ = tx.send(offer).await;
        });
    }

    /// Lets the file of `map` be offered again (its upload failed).
    fn forget(&self, map: &MapEntry) {
        let mut offered = self.offered.lock().unwrap_or_else(|e| e.into_inner());
        offered.remove(&(map.dev, map.inode));
    }

    /// What the uploader did so far.
    pub fn stats(&self) -> Arc<Stats> {
        self.stats.clone()
    }
}

/// What the uploader did (the stats line's `binaries published` segment).
#[derive(Debug, Default)]
pub struct Stats {
    pub offered: AtomicU64,
    pub dropped: AtomicU64,
    /// Granted by the server and uploaded.
    pub uploaded: AtomicU64,
    pub uploaded_bytes: AtomicU64,
    /// Files not offered: larger than `--upload-max-file-bytes`, or
    /// without symbols.
    pub skipped: AtomicU64,
    pub failed: AtomicU64,
}

/// The counts of [`Stats`] at one moment.
#[derive(Debug, Clone, Copy, Default)]
pub struct Snapshot {
    pub offered: u64,
    pub uploaded: u64,
    pub uploaded_bytes: u64,
    /// Skipped (too large, no symbols) and dropped (queue full).
    pub skipped: u64,
    pub failed: u64,
}

impl Stats {
    pub fn snapshot(&self) -> Snapshot {
        Snapshot {
            offered: self.offered.load(Relaxed),
            uploaded: self.uploaded.load(Relaxed),
            uploaded_bytes: self.uploaded_bytes.load(Relaxed),
            skipped: self.skipped.load(Relaxed) + self.dropped.load(Relaxed),
            failed: self.failed.load(Relaxed),
        }
    }
}

/// Where and how fast to upload.
#[derive(Debug, Clone)]
pub struct Options {
    /// The server's HTTP API, e.g. `http://symtrace:8002`.
    pub url: String,
    pub tenant: Option<String>,
    pub token: Option<String>,
    pub bytes_per_second: u64,
    /// This agent's name in its claims (host and process).
    pub holder: String,
}

/// The queue between sampler and uploader (files up to `max_file_bytes`).
pub fn channel(max_file_bytes: u64) -> (Offers, mpsc::Receiver<Offer>) {
    let (tx, rx) = mpsc::channel(QUEUE);
    (
        Offers {
            tx,
            stats: Arc::new(Stats::default()),
            offered: Arc::default(),
            max_file_bytes,
        },
        rx,
    )
}

/// The uploader task: until the sampler's end is dropped. Failures go
/// back through `offers` (tried again later).
pub async fn run(mut rx: mpsc::Receiver<Offer>, options: Options, offers: Offers) {
    let stats = offers.stats();
    let client = match reqwest::Client::builder()
        .connect_timeout(Duration::from_secs(10))
        .build()
    {
        Ok(c) => c,
        Err(e) => {
            tracing::warn!(error = %e, "no HTTP client: binaries are not uploaded");
            return;
        }
    };
    let mut told_token = false;
    while let Some(first) = rx.recv().await {
        let mut batch = vec![first];
        let until = tokio::time::Instant::now() + GATHER;
        while batch.len() < BATCH {
            match tokio::time::timeout_at(until, rx.recv()).await {
                Ok(Some(offer)) => batch.push(offer),
                Ok(None) | Err(_) => break,
            }
        }
        let granted = match claim(&client, &options, &batch).await {
            Ok(g) => g,
            Err(e) => {
                if e.contains("401") && !told_token && options.token.is_none() {
                    told_token = true;
                    tracing::warn!("the server wants a token to publish binaries: pass --token");
                }
                tracing::warn!(error = %e, files = batch.len(), "claiming binaries to upload failed; trying again later");
                stats.failed.fetch_add(batch.len() as u64, Relaxed);
                for offer in batch {
                    offers.retry(offer);
                }
                continue;
            }
        };
        let mut batch: Vec<Option<Offer>> = batch.into_iter().map(Some).collect();
        for (index, key) in granted {
            let Some(offer) = batch.get_mut(index).and_then(Option::take) else {
                continue;
            };
            let started = Instant::now();
            match upload(&client, &options, offers.max_file_bytes, &offer, &key).await {
                Ok(bytes) => {
                    stats.uploaded.fetch_add(1, Relaxed);
                    stats.uploaded_bytes.fetch_add(bytes, Relaxed);
                    let elapsed_ms = started.elapsed().as_millis() as u64;
                    tracing::info!(path = %offer.map.path, id = %offer.id, key, bytes, elapsed_ms, "published a binary no CI uploaded");
                }
                Err(Failure::Retry(e)) => {
                    // The claim is this agent's until it runs out: the
                    // next try renews it.
                    stats.failed.fetch_add(1, Relaxed);
                    tracing::warn!(path = %offer.map.path, id = %offer.id, error = %e, attempt = offer.attempts + 1, "uploading a binary failed");
                    offers.retry(offer);
                }
                Err(Failure::GiveUp(e)) => {
                    stats.skipped.fetch_add(1, Relaxed);
                    tracing::warn!(path = %offer.map.path, id = %offer.id, error = %e, "not publishing a binary");
                }
            }
        }
    }
}

fn request(
    client: &reqwest::Client,
    options: &Options,
    method: reqwest::Method,
    path: &str,
) -> reqwest::RequestBuilder {
    let mut req = client.request(
        method,
        format!("{}{path}", options.url.trim_end_matches('/')),
    );
    if let Some(t) = &options.tenant {
        req = req.header("X-Scope-OrgID", t);
    }
    if let Some(t) = &options.token {
        req = req.bearer_auth(t);
    }
    req
}

/// The offers (by index) the server grants this agent, with the key to
/// upload each under.
async fn claim(
    client: &reqwest::Client,
    options: &Options,
    offers: &[Offer],
) -> Result<Vec<(usize, String)>, String> {
    let items: Vec<Value> = offers
        .iter()
        .map(|o| {
            json!({
                "build_id": o.id,
                "id_kind": if o.htlhash { "htlhash" } else { "gnu" },
                "kind": "executable",
                "quality": o.symbols.rank(),
                "claim": options.holder,
            })
        })
        .collect();
    let resp = request(
        client,
        options,
        reqwest::Method::POST,
        "/api/v1/debuginfo/missing",
    )
    .timeout(Duration::from_secs(30))
    .json(&json!({ "items": items }))
    .send()
    .await
    .map_err(|e| e.to_string())?;
    let status = resp.status();
    let body: Value = resp.json().await.map_err(|e| e.to_string())?;
    if !status.is_success() {
        return Err(format!("{status}: {body}"));
    }
    Ok(body["missing"]
        .as_array()
        .map(|m| {
            m.iter()
                .filter_map(|i| {
                    let key = i["upload_as"].as_str()?;
                    // The key goes into a URL path: hex digits only.
                    let ok = !key.is_empty() && key.bytes().all(|b| b.is_ascii_hexdigit());
                    let index = i["index"].as_u64()? as usize;
                    ok.then(|| (index, key.to_owned()))
                })
                .collect()
        })
        .unwrap_or_default())
}

/// Why an upload did not happen: worth another try later, or not.
enum Failure {
    Retry(String),
    GiveUp(String),
}

type Pieces = futures::stream::BoxStream<'static, std::io::Result<bytes::Bytes>>;

/// The whole file, a piece at a time, read on the blocking pool.
fn whole_file(file: Arc<std::fs::File>, size: u64) -> Pieces {
    Box::pin(futures::stream::unfold(0u64, move |offset| {
        let file = file.clone();
        async move {
            if offset >= size {
                return None;
            }
            let len = CHUNK.min((size - offset) as usize);
            let read = tokio::task::spawn_blocking(move || {
                use std::os::unix::fs::FileExt;
                let mut buf = vec![0u8; len];
                file.read_exact_at(&mut buf, offset).map(|()| buf)
            })
            .await
            .map_err(std::io::Error::other)
            .and_then(|r| r);
            Some(match read {
                Ok(buf) => (Ok(bytes::Bytes::from(buf)), offset + len as u64),
                Err(e) => (Err(e), size),
            })
        }
    }))
}

/// What `objcopy --only-keep-debug` would write of the file (its symbol
/// table and DWARF; code and data left out), written on the blocking pool
/// into the body as it goes; more than `max` bytes fail the upload.
fn symbol_tables(file: Arc<std::fs::File>, max: u64) -> Pieces {
    struct Sender {
        tx: mpsc::Sender<std::io::Result<bytes::Bytes>>,
        buf: Vec<u8>,
        written: u64,
        max: u64,
    }
    impl std::io::Write for Sender {
        fn write(&mut self, data: &[u8]) -> std::io::Result<usize> {
            self.written += data.len() as u64;
            if self.written > self.max {
                return Err(std::io::Error::other(OVER_BOUND));
            }
            self.buf.extend_from_slice(data);
            if self.buf.len() >= CHUNK {
                self.flush()?;
            }
            Ok(data.len())
        }

        fn flush(&mut self) -> std::io::Result<()> {
            if self.buf.is_empty() {
                return Ok(());
            }
            let piece = bytes::Bytes::from(std::mem::take(&mut self.buf));
            self.tx
                .blocking_send(Ok(piece))
                .map_err(|_| std::io::Error::other("the upload was given up"))
        }
    }
    let (tx, rx) = mpsc::channel(2);
    tokio::task::spawn_blocking(move || {
        let mut out = Sender {
            tx: tx.clone(),
            buf: Vec::with_capacity(CHUNK),
            written: 0,
            max,
        };
        let result = symtrace_elf::only_keep_debug(&*file, &mut out)
            .map_err(|e| std::io::Error::other(e.to_string()))
            .and_then(|_| std::io::Write::flush(&mut out));
        if let Err(e) = result {
            let _ = tx.blocking_send(Err(e));
        }
    });
    Box::pin(futures::stream::unfold(rx, |mut rx| async move {
        rx.recv().await.map(|piece| (piece, rx))
    }))
}

/// The message of a symbol-table extract over the size bound.
const OVER_BOUND: &str = "its symbol tables are over --upload-max-file-bytes too";

/// `pieces` paced to `rate` bytes a second from now: a piece leaves no
/// earlier than (bytes before it) / rate seconds after the start; `sent`
/// counts what left.
fn paced(pieces: Pieces, rate: u64, sent: Arc<AtomicU64>) -> Pieces {
    let started = Instant::now();
    Box::pin(futures::StreamExt::then(pieces, move |piece| {
        let sent = sent.clone();
        async move {
            let before = sent.load(Relaxed);
            let due = started + Duration::from_secs_f64(before as f64 / rate as f64);
            tokio::time::sleep_until(due.into()).await;
            if let Ok(bytes) = &piece {
                sent.fetch_add(bytes.len() as u64, Relaxed);
            }
            piece
        }
    }))
}

/// Uploads the offered file under `key`, paced; returns the bytes sent.
/// A file within `max` (`--upload-max-file-bytes`) goes whole (the executable);
/// a larger one with a GNU build-ID as its symbol tables and DWARF only
/// (a debuginfo file), if those fit.
async fn upload(
    client: &reqwest::Client,
    options: &Options,
    max: u64,
    offer: &Offer,
    key: &str,
) -> Result<u64, Failure> {
    let size = offer.file.size;
    let file = offer
        .file
        .file
        .try_clone()
        .map_err(|e| Failure::Retry(e.to_string()))?;
    let file = Arc::new(file);
    let rate = options.bytes_per_second.max(1);
    let whole = size <= max;
    let (pieces, kind, length) = if whole {
        (whole_file(file, size), "executable", Some(size))
    } else {
        (symbol_tables(file, max), "debuginfo", None)
    };
    let sent = Arc::new(AtomicU64::new(0));
    let body = paced(pieces, rate, sent.clone());
    let path = format!(
        "/api/v1/debuginfo/{key}/{kind}?origin=agent&file={}",
        url_escape(&offer.map.path)
    );
    // Slow by design: the pace, plus a minute.
    let timeout = Duration::from_secs(60 + length.unwrap_or(max) / rate);
    let mut req = request(client, options, reqwest::Method::PUT, &path).timeout(timeout);
    if let Some(n) = length {
        req = req.header(reqwest::header::CONTENT_LENGTH, n);
    }
    let resp = req.body(reqwest::Body::wrap_stream(body)).send().await;
    let resp = match resp {
        Err(e) if format!("{e:?}").contains(OVER_BOUND) => {
            return Err(Failure::GiveUp(OVER_BOUND.into()))
        }
        r => r.map_err(|e| Failure::Retry(e.to_string()))?,
    };
    let status = resp.status();
    if !offer.file.unchanged() {
        return Err(Failure::Retry("the file changed while it was sent".into()));
    }
    if status.is_success() {
        return Ok(sent.load(Relaxed));
    }
    let text = resp.text().await.unwrap_or_default();
    let message = format!("{status}: {}", text.chars().take(300).collect::<String>());
    // The server refused the file itself: another try sends the same.
    if matches!(status.as_u16(), 400 | 409 | 413 | 422) {
        Err(Failure::GiveUp(message))
    } else {
        Err(Failure::Retry(message))
    }
}

/// `s` as a URL query value.
fn url_escape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'/' | b'-' | b'_' | b'.' | b'~') {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// The default upload URL: the OTLP endpoint's host, the server's default
/// HTTP port.
pub fn default_url(grpc_endpoint: &str) -> String {
    let rest = grpc_endpoint
        .split_once("://")
        .map_or(grpc_endpoint, |(_, r)| r);
    let host_port = rest.split('/').next().unwrap_or(rest);
    let host = match host_port.rsplit_once(':') {
        Some((h, p)) if p.bytes().all(|b| b.is_ascii_digit()) => h,
        _ => host_port,
    };
    format!("http://{host}:8002")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn default_url_keeps_the_host() {
        assert_eq!(default_url("http://10.0.0.5:4317"), "http://10.0.0.5:8002");
        assert_eq!(default_url("http://symtrace"), "http://symtrace:8002");
        assert_eq!(default_url("http://[::1]:4317/"), "http://[::1]:8002");
    }

    #[test]
    fn paths_are_escaped_for_the_query() {
        assert_eq!(url_escape("/usr/lib/a b&c=d"), "/usr/lib/a%20b%26c%3Dd");
    }

    fn map(inode: u64) -> MapEntry {
        MapEntry {
            start: 0,
            end: 1,
            offset: 0,
            dev: 0,
            inode,
            path: "/x".into(),
            deleted: false,
        }
    }

    #[test]
    fn files_are_offered_once_unless_dropped_and_only_with_symbols_within_the_bound() {
        let (offers, _rx) = channel(1000);
        assert!(
            !offers.wants(&map(1), Quality::None, 10, true),
            "no symbols"
        );
        assert!(
            !offers.wants(&map(2), Quality::DynSym, 1001, true),
            "too large, .dynsym only"
        );
        assert!(
            !offers.wants(&map(2), Quality::SymTab, 10, true),
            "counted once"
        );
        assert!(
            !offers.wants(&map(4), Quality::SymTab, 1001, false),
            "too large, no GNU build-ID"
        );
        assert_eq!(offers.stats().skipped.load(Relaxed), 3);
        assert!(offers.wants(&map(3), Quality::SymTab, 1000, false));
        assert!(!offers.wants(&map(3), Quality::SymTab, 1000, false), "once");
        assert!(
            offers.wants(&map(5), Quality::SymTab, 1001, true),
            "its symbol tables"
        );
        let file = tempfile::tempfile().unwrap();
        for inode in 0..QUEUE as u64 + 5 {
            let m = map(100 + inode);
            assert!(offers.wants(&m, Quality::SymTab, 1, true));
            offers.offer(Offer {
                file: crate::safefile::Opened::for_test(file.try_clone().unwrap()),
                map: m,
                id: "ab".into(),
                htlhash: false,
                symbols: Quality::SymTab,
                attempts: 0,
            });
        }
        let stats = offers.stats();
        assert_eq!(stats.offered.load(Relaxed), QUEUE as u64 + 5);
        assert_eq!(stats.dropped.load(Relaxed), 5);
        // A dropped offer may be made again; a queued one not.
        assert!(offers.wants(&map(100 + QUEUE as u64 + 4), Quality::SymTab, 1, true));
        assert!(!offers.wants(&map(100), Quality::SymTab, 1, true));
    }
}
