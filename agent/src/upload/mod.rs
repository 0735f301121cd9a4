//! Publishing the files no CI uploaded: every executable or library whose
//! code is sampled is offered once ([`Offers::offer`]); in the background
//! the offers wait in a fair queue ([`queue`]: owners take turns, smallest
//! file first, within the host's budgets of files a minute and bytes an
//! hour), and two lanes — small files, and the large ones — each take the
//! next file, claim it from the server (`missing`: it has nothing as good
//! for this content, and no other agent of the fleet is publishing it) and
//! upload it as found on the host ([`send`]), all uploads sharing
//! `--upload-bytes-per-second`. A small library is never stuck behind a
//! large binary, and no claim is held while a file waits its turn.
//!
//! Nothing here runs on the sampler thread but the offer (a `try_send`), and
//! the uploads share the export task's runtime without blocking it: files
//! are read on the blocking pool, a chunk at a time, and the body is paced
//! by sleeping, so an export is never late because of an upload.

pub mod queue;
mod send;

use std::collections::HashSet;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::sync::{mpsc, Notify};

use symtrace_elf::Quality;

use crate::files::Binary;
use crate::process::maps::MapEntry;
use queue::{Budgets, Queue, Queued};
use send::{Failure, Pacer};

/// Offers on their way to the queue, at most (more are refused, counted,
/// and offered again when a new process samples the file).
const CHANNEL: usize = 256;
/// Uploads up to this size go in the small lane.
const SMALL: u64 = 8 << 20;
/// Tries per offer (a server away, an upload cut); between them 30 s,
/// doubling.
const ATTEMPTS: u32 = 5;
const RETRY_AFTER: Duration = Duration::from_secs(30);

/// A file whose code was sampled, open: a short-lived process's file can
/// still be read when its turn comes.
pub struct Offer {
    pub file: crate::files::open::Opened,
    pub map: MapEntry,
    /// Its GNU build-ID, else its htlhash.
    pub id: String,
    pub htlhash: bool,
    /// What names its code.
    pub symbols: Quality,
    /// The SHA-256 of its content (what the server binds it to).
    pub content_sha256: Option<String>,
    /// Its owner (the queue's turns are per owner).
    pub uid: u32,
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
    /// Asks the server whether a file needs its content hash at all.
    probe: Option<Arc<Probe>>,
}

/// How long a probe may take: past it (a server away or slow), the file
/// is hashed as if the server had said nothing.
const PROBE_TIMEOUT: Duration = Duration::from_secs(3);

/// Asks the server, before a file is hashed, whether it holds a CI or
/// upstream file of its ID ([`send::probe`]): such a file names the frames
/// of every file of that ID, so the agent's file needs neither its
/// content hash (about 1 ms of CPU per MiB) nor publishing.
pub struct Probe {
    client: reqwest::Client,
    options: Options,
    runtime: tokio::runtime::Handle,
}

impl Probe {
    /// A probe sending on `runtime` (a multi-threaded one: its workers
    /// drive the request while a job's thread waits).
    pub fn new(options: Options, runtime: tokio::runtime::Handle) -> Option<Self> {
        let client = reqwest::Client::builder()
            .build()
            .map_err(|e| tracing::warn!(error = %e, "no HTTP client: every file is hashed"))
            .ok()?;
        Some(Probe {
            client,
            options,
            runtime,
        })
    }

    /// Whether the server vouches for the file `id` with `symbols`:
    /// blocks, so only from a job's thread (never the sampler's, never one
    /// of the runtime's); `false` when it cannot say.
    pub fn vouched(&self, id: &str, htlhash: bool, symbols: Quality) -> bool {
        let ask = send::probe(
            &self.client,
            &self.options,
            id,
            htlhash,
            symbols.rank(),
            PROBE_TIMEOUT,
        );
        match self.runtime.block_on(ask) {
            Ok(vouched) => vouched,
            Err(e) => {
                tracing::debug!(id, error = %e, "probe failed: the file is hashed");
                false
            }
        }
    }
}

impl Offers {
    /// Files are probed with `probe` before they are hashed.
    pub fn with_probe(mut self, probe: Option<Probe>) -> Self {
        self.probe = probe.map(Arc::new);
        self
    }

    /// The probe, if files are probed before they are hashed.
    pub fn probe(&self) -> Option<Arc<Probe>> {
        self.probe.clone()
    }

    /// Whether the file of `map` is worth offering: not offered before,
    /// with symbols, with a content hash, within the size bound — or, with
    /// a GNU build-ID and a symbol table or DWARF, over it: its symbol
    /// tables are sent then (else counted, once, as unpublishable). Marks
    /// it offered.
    pub fn wants(&self, map: &MapEntry, binary: &Binary) -> bool {
        let mut offered = self.offered.lock().unwrap_or_else(|e| e.into_inner());
        if offered.len() >= MAX_OFFERED {
            offered.clear();
        }
        if !offered.insert((map.dev, map.inode)) {
            return false;
        }
        let gnu = binary.build_id.is_some();
        let symbols = binary.symbols;
        let fits = binary.size <= self.max_file_bytes || (gnu && symbols >= Quality::SymTab);
        // Without its content hash the server could not tell it from a
        // forgery: it would name no frame.
        if symbols == Quality::None || !fits || binary.content_sha256.is_none() {
            self.stats.skipped.fetch_add(1, Relaxed);
            return false;
        }
        true
    }

    /// Hands an offer to the uploader without waiting; counted as dropped
    /// (and offered again later) when the channel is full.
    pub fn offer(&self, offer: Offer) {
        self.stats.offered.fetch_add(1, Relaxed);
        if let Err(e) = self.tx.try_send(offer) {
            self.stats.dropped.fetch_add(1, Relaxed);
            let offer = match e {
                mpsc::error::TrySendError::Full(o) | mpsc::error::TrySendError::Closed(o) => o,
            };
            self.not_offered(&offer.map);
        }
    }

    /// Lets the file of `map` be offered again (it was not, or its upload
    /// failed for good, or it was refused a place in the queue).
    pub fn not_offered(&self, map: &MapEntry) {
        let mut offered = self.offered.lock().unwrap_or_else(|e| e.into_inner());
        offered.remove(&(map.dev, map.inode));
    }

    /// Tries `offer` again later, or — after [`ATTEMPTS`] — lets its file
    /// be offered again when sampled in a new process.
    fn retry(&self, mut offer: Offer) {
        offer.attempts += 1;
        if offer.attempts >= ATTEMPTS {
            self.not_offered(&offer.map);
            return;
        }
        let tx = self.tx.clone();
        let delay = RETRY_AFTER * 2u32.pow(offer.attempts - 1);
        tokio::spawn(async move {
            tokio::time::sleep(delay).await;
            let _ = tx.send(offer).await;
        });
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
    /// Offers refused a place in the queue (its owner's share or the
    /// whole queue full).
    pub over_budget: AtomicU64,
    /// Files being claimed or uploaded right now (a stopping agent waits
    /// for them before its `total:` line).
    pub in_flight: AtomicU64,
}

/// Counts a file as in flight while it lives (dropped on every way out,
/// a cancelled task's too).
struct InFlight<'a>(&'a AtomicU64);

impl<'a> InFlight<'a> {
    fn new(count: &'a AtomicU64) -> Self {
        count.fetch_add(1, Relaxed);
        InFlight(count)
    }
}

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Relaxed);
    }
}

/// The counts of [`Stats`] at one moment.
#[derive(Debug, Clone, Copy, Default)]
pub struct Snapshot {
    pub offered: u64,
    pub uploaded: u64,
    pub uploaded_bytes: u64,
    /// Skipped (too large, no symbols) and dropped (channel full).
    pub skipped: u64,
    pub failed: u64,
    /// Refused a place in the queue.
    pub over_budget: u64,
}

impl Stats {
    /// Waits until no file is being claimed or uploaded, or `deadline`:
    /// whether none is. What a stopping agent does before its final
    /// counts, so they include the uploads the server already took.
    pub async fn settled(&self, deadline: Instant) -> bool {
        while self.in_flight.load(Relaxed) > 0 {
            if Instant::now() >= deadline {
                return false;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        true
    }

    pub fn snapshot(&self) -> Snapshot {
        Snapshot {
            offered: self.offered.load(Relaxed),
            uploaded: self.uploaded.load(Relaxed),
            uploaded_bytes: self.uploaded_bytes.load(Relaxed),
            skipped: self.skipped.load(Relaxed) + self.dropped.load(Relaxed),
            failed: self.failed.load(Relaxed),
            over_budget: self.over_budget.load(Relaxed),
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
    /// The host's publishing budgets.
    pub budgets: Budgets,
}

/// The queue between sampler and uploader (files up to `max_file_bytes`).
pub fn channel(max_file_bytes: u64) -> (Offers, mpsc::Receiver<Offer>) {
    let (tx, rx) = mpsc::channel(CHANNEL);
    (
        Offers {
            tx,
            stats: Arc::new(Stats::default()),
            offered: Arc::default(),
            max_file_bytes,
            probe: None,
        },
        rx,
    )
}

impl Queued for Offer {
    fn owner(&self) -> u32 {
        self.uid
    }
    fn bytes(&self) -> u64 {
        self.file.size
    }
}

/// The queue and its wakeup, shared by the lanes.
struct Shared {
    queue: Mutex<Queue<Offer>>,
    changed: Notify,
}

/// The uploader: until the sampler's end is dropped. Failures go back
/// through `offers` (tried again later).
pub async fn run(mut rx: mpsc::Receiver<Offer>, options: Options, offers: Offers) {
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
    let shared = Arc::new(Shared {
        queue: Mutex::new(Queue::new(options.budgets, Instant::now())),
        changed: Notify::new(),
    });
    let pacer = Pacer::new(options.bytes_per_second);
    let options = Arc::new(options);
    for max in [SMALL, u64::MAX] {
        let lane = Lane {
            shared: shared.clone(),
            client: client.clone(),
            options: options.clone(),
            pacer: pacer.clone(),
            offers: offers.clone(),
            max,
        };
        tokio::spawn(lane.run());
    }
    while let Some(offer) = rx.recv().await {
        let refused = shared
            .queue
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(offer);
        match refused {
            Ok(()) => shared.changed.notify_waiters(),
            Err((offer, why)) => {
                tracing::debug!(path = %offer.map.path, ?why, "offer refused a place in the upload queue");
                offers.stats.over_budget.fetch_add(1, Relaxed);
                offers.not_offered(&offer.map);
            }
        }
    }
}

/// One lane of uploads: files up to `max` bytes, one at a time.
struct Lane {
    shared: Arc<Shared>,
    client: reqwest::Client,
    options: Arc<Options>,
    pacer: Arc<Pacer>,
    offers: Offers,
    max: u64,
}

impl Lane {
    async fn run(self) {
        let mut told_token = false;
        loop {
            let next = {
                let mut q = self.shared.queue.lock().unwrap_or_else(|e| e.into_inner());
                q.pop(self.max, Instant::now())
            };
            let offer = match next {
                Ok(offer) => offer,
                Err(when) => {
                    let changed = self.shared.changed.notified();
                    match when {
                        Some(t) => {
                            let _ = tokio::time::timeout_at(t.into(), changed).await;
                        }
                        None => changed.await,
                    }
                    continue;
                }
            };
            let _in_flight = InFlight::new(&self.offers.stats.in_flight);
            let key = match send::claim(
                &self.client,
                &self.options,
                &offer,
                self.offers.max_file_bytes,
            )
            .await
            {
                Ok(Some(key)) => key,
                Ok(None) => continue, // the server has it, or another agent sends it
                Err(e) => {
                    if e.contains("401") && !told_token && self.options.token.is_none() {
                        told_token = true;
                        tracing::warn!(
                            "the server wants a token to publish binaries: pass --token"
                        );
                    }
                    tracing::warn!(error = %e, path = %offer.map.path, "claiming a binary to upload failed; trying again later");
                    self.offers.stats.failed.fetch_add(1, Relaxed);
                    self.offers.retry(offer);
                    continue;
                }
            };
            self.upload(offer, &key).await;
        }
    }

    async fn upload(&self, offer: Offer, key: &str) {
        let stats = &self.offers.stats;
        let started = Instant::now();
        let max = self.offers.max_file_bytes;
        match send::upload(&self.client, &self.options, &self.pacer, max, &offer, key).await {
            Ok(bytes) => {
                stats.uploaded.fetch_add(1, Relaxed);
                stats.uploaded_bytes.fetch_add(bytes, Relaxed);
                let elapsed_ms = started.elapsed().as_millis() as u64;
                tracing::info!(path = %offer.map.path, id = %offer.id, key, bytes, elapsed_ms, "published a binary no CI uploaded");
            }
            Err(Failure::Retry(e)) => {
                // The claim is this agent's until it runs out: the next try
                // renews it.
                stats.failed.fetch_add(1, Relaxed);
                tracing::warn!(path = %offer.map.path, id = %offer.id, error = %e, attempt = offer.attempts + 1, "uploading a binary failed");
                self.offers.retry(offer);
            }
            Err(Failure::GiveUp(e)) => {
                stats.skipped.fetch_add(1, Relaxed);
                tracing::warn!(path = %offer.map.path, id = %offer.id, error = %e, "not publishing a binary");
            }
        }
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

    fn binary(symbols: Quality, size: u64, gnu: bool) -> Binary {
        Binary {
            build_id: gnu.then(|| "ab".to_owned()),
            htlhash: (!gnu).then(|| "cd".to_owned()),
            symbols,
            size,
            loads: Vec::new(),
            thread_ctx_offset: None,
            thread_ctx_library: None,
            dl_debug_state: None,
            eh_frame: None,
            eh_frame_hdr: None,
            debug_frame: None,
            text_address: 0,
            memory_probes: Vec::new(),
            content_sha256: Some("00".repeat(32)),
            vouched: false,
            uid: 0,
        }
    }

    #[test]
    fn files_are_offered_once_unless_dropped_and_only_with_symbols_within_the_bound() {
        let (offers, _rx) = channel(1000);
        let wants = |m: u64, q, size, gnu| offers.wants(&map(m), &binary(q, size, gnu));
        assert!(!wants(1, Quality::None, 10, true), "no symbols");
        assert!(
            !wants(2, Quality::DynSym, 1001, true),
            "too large, .dynsym only"
        );
        assert!(!wants(2, Quality::SymTab, 10, true), "counted once");
        assert!(
            !wants(4, Quality::SymTab, 1001, false),
            "too large, no GNU build-ID"
        );
        let mut unhashed = binary(Quality::Dwarf, 10, true);
        unhashed.content_sha256 = None;
        assert!(!offers.wants(&map(6), &unhashed), "no content hash");
        assert_eq!(offers.stats().skipped.load(Relaxed), 4);
        assert!(wants(3, Quality::SymTab, 1000, false));
        assert!(!wants(3, Quality::SymTab, 1000, false), "once");
        assert!(wants(5, Quality::SymTab, 1001, true), "its symbol tables");
        let file = tempfile::tempfile().unwrap();
        for inode in 0..CHANNEL as u64 + 5 {
            let m = map(100 + inode);
            assert!(offers.wants(&m, &binary(Quality::SymTab, 1, true)));
            offers.offer(Offer {
                file: crate::files::open::Opened::for_test(file.try_clone().unwrap()),
                map: m,
                id: "ab".into(),
                htlhash: false,
                symbols: Quality::SymTab,
                content_sha256: None,
                uid: 0,
                attempts: 0,
            });
        }
        let stats = offers.stats();
        assert_eq!(stats.offered.load(Relaxed), CHANNEL as u64 + 5);
        assert_eq!(stats.dropped.load(Relaxed), 5);
        // A dropped offer may be made again; a queued one not.
        assert!(wants(100 + CHANNEL as u64 + 4, Quality::SymTab, 1, true));
        assert!(!wants(100, Quality::SymTab, 1, true));
    }
}
