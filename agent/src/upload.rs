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
    /// 3 DWARF, 2 `.symtab`, 1 `.dynsym`, 0 nothing.
    pub symbols: i32,
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
    /// with symbols, not over the size bound (else counted, once, as
    /// unpublishable). Marks it offered.
    pub fn wants(&self, map: &MapEntry, symbols: i32, size: u64) -> bool {
        let mut offered = self.offered.lock().unwrap_or_else(|e| e.into_inner());
        if offered.len() >= MAX_OFFERED {
            offered.clear();
        }
        if !offered.insert((map.dev, map.inode)) {
            return false;
        }
        if symbols == 0 || size > self.max_file_bytes {
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

/// What the uploader did (the stats line's `uploads:` segment).
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
        let wanted = batch;
        let granted = match claim(&client, &options, &wanted).await {
            Ok(g) => g,
            Err(e) => {
                if e.contains("401") && !told_token && options.token.is_none() {
                    told_token = true;
                    tracing::warn!("the server wants a token to publish binaries: pass --token");
                }
                tracing::warn!(error = %e, files = wanted.len(), "claiming binaries to upload failed; trying again later");
                stats.failed.fetch_add(wanted.len() as u64, Relaxed);
                for offer in wanted {
                    offers.retry(offer);
                }
                continue;
            }
        };
        let mut wanted: Vec<Option<Offer>> = wanted.into_iter().map(Some).collect();
        for (index, key) in granted {
            let Some(offer) = wanted.get_mut(index).and_then(Option::take) else {
                continue;
            };
            let started = Instant::now();
            match upload(&client, &options, &offer, &key).await {
                Ok(bytes) => {
                    stats.uploaded.fetch_add(1, Relaxed);
                    stats.uploaded_bytes.fetch_add(bytes, Relaxed);
                    let elapsed_ms = started.elapsed().as_millis() as u64;
                    tracing::info!(path = %offer.map.path, id = %offer.id, key, bytes, elapsed_ms, "published a binary no CI uploaded");
                }
                Err(e) => {
                    // The claim is this agent's until it runs out: the
                    // next try renews it.
                    stats.failed.fetch_add(1, Relaxed);
                    tracing::warn!(path = %offer.map.path, id = %offer.id, error = %e, attempt = offer.attempts + 1, "uploading a binary failed");
                    offers.retry(offer);
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
                "quality": o.symbols,
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

/// Uploads the offered file under `key`, paced; returns the bytes sent.
async fn upload(
    client: &reqwest::Client,
    options: &Options,
    offer: &Offer,
    key: &str,
) -> Result<u64, String> {
    let size = offer.file.size;
    let file = Arc::new(offer.file.file.try_clone().map_err(|e| e.to_string())?);
    let rate = options.bytes_per_second.max(1);
    let started = Instant::now();
    let body = futures::stream::unfold(0u64, move |offset| {
        let file = file.clone();
        async move {
            if offset >= size {
                return None;
            }
            // Paced: the piece at `offset` leaves no earlier than
            // offset / rate seconds after the start.
            let due = started + Duration::from_secs_f64(offset as f64 / rate as f64);
            tokio::time::sleep_until(due.into()).await;
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
    });
    let path = format!(
        "/api/v1/debuginfo/{key}/executable?origin=agent&file={}",
        url_escape(&offer.map.path)
    );
    // Slow by design: the pace, plus a minute.
    let timeout = Duration::from_secs(60 + size / rate);
    let resp = request(client, options, reqwest::Method::PUT, &path)
        .timeout(timeout)
        .header(reqwest::header::CONTENT_LENGTH, size)
        .body(reqwest::Body::wrap_stream(body))
        .send()
        .await
        .map_err(|e| e.to_string())?;
    let status = resp.status();
    if !offer.file.unchanged() {
        return Err("the file changed while it was sent".into());
    }
    if status.is_success() {
        Ok(size)
    } else {
        let text = resp.text().await.unwrap_or_default();
        Err(format!(
            "{status}: {}",
            text.chars().take(300).collect::<String>()
        ))
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
        assert!(!offers.wants(&map(1), 0, 10), "no symbols");
        assert!(!offers.wants(&map(2), 2, 1001), "too large");
        assert!(!offers.wants(&map(2), 2, 10), "counted once");
        assert_eq!(offers.stats().skipped.load(Relaxed), 2);
        assert!(offers.wants(&map(3), 2, 1000));
        assert!(!offers.wants(&map(3), 2, 1000), "once");
        let file = tempfile::tempfile().unwrap();
        for inode in 0..QUEUE as u64 + 5 {
            let m = map(100 + inode);
            assert!(offers.wants(&m, 2, 1));
            offers.offer(Offer {
                file: crate::safefile::Opened::for_test(file.try_clone().unwrap()),
                map: m,
                id: "ab".into(),
                htlhash: false,
                symbols: 2,
                attempts: 0,
            });
        }
        let stats = offers.stats();
        assert_eq!(stats.offered.load(Relaxed), QUEUE as u64 + 5);
        assert_eq!(stats.dropped.load(Relaxed), 5);
        // A dropped offer may be made again; a queued one not.
        assert!(offers.wants(&map(100 + QUEUE as u64 + 4), 2, 1));
        assert!(!offers.wants(&map(100), 2, 1));
    }
}
