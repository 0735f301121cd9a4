//! The uploader's HTTP side: a claim (`POST /api/v1/debuginfo/missing`,
//! one file at a time, right before its upload, so no claim is held while
//! a file waits its turn) and the upload itself, paced by a rate all
//! uploads share.

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use symtrace_wire::missing::{MissingAnswer, MissingRequest, WantedItem, PATH};
use tokio::sync::mpsc;

use super::{Offer, Options};
use crate::files::hash::{Pinned, CHANGED};

/// Bytes read and sent per piece of an upload body.
const CHUNK: usize = 256 << 10;

/// Why an upload did not happen: worth another try later, or not.
pub enum Failure {
    Retry(String),
    GiveUp(String),
}

/// The byte rate every upload shares: each piece takes its time on one
/// timeline.
pub struct Pacer {
    rate: u64,
    next_free: Mutex<Instant>,
}

impl Pacer {
    pub fn new(rate: u64) -> Arc<Self> {
        Arc::new(Pacer {
            rate: rate.max(1),
            next_free: Mutex::new(Instant::now()),
        })
    }

    /// When a piece of `len` bytes may leave (its slot on the timeline is
    /// taken now).
    fn slot(&self, len: usize) -> Instant {
        let mut next = self.next_free.lock().unwrap_or_else(|e| e.into_inner());
        let now = Instant::now();
        // Idle time is not saved up for a burst.
        let due = (*next).max(now);
        *next = due + Duration::from_secs_f64(len as f64 / self.rate as f64);
        due
    }
}

pub fn request(
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

/// Claims `offer` for this agent: the key to upload it under when the
/// server grants it (it has nothing as good for this content, and no other
/// agent is publishing it), `None` when it does not need it.
pub async fn claim(
    client: &reqwest::Client,
    options: &Options,
    offer: &Offer,
    max: u64,
) -> Result<Option<String>, String> {
    // What will be sent: the whole file, or (over `max`) its extract.
    let kind = if offer.file.size <= max {
        "executable"
    } else {
        "debuginfo"
    };
    let item = WantedItem {
        build_id: offer.id.clone(),
        id_kind: Some(if offer.htlhash { "htlhash" } else { "gnu" }.into()),
        kind: kind.into(),
        quality: Some(offer.symbols.rank()),
        claim: Some(options.holder.clone()),
        content_sha256: offer.content_sha256.clone(),
        ..Default::default()
    };
    let answer = ask_missing(client, options, item, Duration::from_secs(30)).await?;
    Ok(answer.upload_key(0).map(str::to_owned))
}

/// Asks whether the server holds a CI or upstream file of `id` (of
/// `quality` or better): then no agent's file is needed to name its
/// frames, nor the content hash that would bind one (a probe: nothing is
/// claimed).
pub async fn probe(
    client: &reqwest::Client,
    options: &Options,
    id: &str,
    htlhash: bool,
    quality: i32,
    timeout: Duration,
) -> Result<bool, String> {
    let item = WantedItem {
        build_id: id.to_owned(),
        id_kind: Some(if htlhash { "htlhash" } else { "gnu" }.into()),
        kind: "executable".into(),
        quality: Some(quality),
        claim: Some(options.holder.clone()),
        probe: true,
        ..Default::default()
    };
    let answer = ask_missing(client, options, item, timeout).await?;
    Ok(!answer.lacks(0))
}

/// Sends one `item` to `POST /api/v1/debuginfo/missing` within `timeout`:
/// the server's answer, or what went wrong.
async fn ask_missing(
    client: &reqwest::Client,
    options: &Options,
    item: WantedItem,
    timeout: Duration,
) -> Result<MissingAnswer, String> {
    let resp = request(client, options, reqwest::Method::POST, PATH)
        .timeout(timeout)
        .json(&MissingRequest { items: vec![item] })
        .send()
        .await
        .map_err(|e| e.to_string())?;
    let status = resp.status();
    let body = resp.bytes().await.map_err(|e| e.to_string())?;
    if !status.is_success() {
        return Err(format!("{status}: {}", String::from_utf8_lossy(&body)));
    }
    let answer: MissingAnswer = serde_json::from_slice(&body).map_err(|e| {
        format!(
            "not an answer of `missing` ({e}): {}",
            String::from_utf8_lossy(&body)
        )
    })?;
    answer.check(1)?;
    Ok(answer)
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
fn symbol_tables(file: Arc<std::fs::File>, size: u64, content: String, max: u64) -> Pieces {
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
        // Split from the very bytes whose hash the upload declares.
        let pinned = match Pinned::new(&file, size, &content) {
            Ok(pinned) => pinned,
            Err(e) => {
                let _ = tx.blocking_send(Err(std::io::Error::other(e)));
                return;
            }
        };
        // A hostile file may make the extractor panic: contained here.
        let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            symtrace_elf::only_keep_debug(&pinned, &mut out)
                .map_err(|e| std::io::Error::other(e.to_string()))
                .and_then(|_| std::io::Write::flush(&mut out))
        }))
        .unwrap_or_else(|p| {
            Err(std::io::Error::other(format!(
                "extracting the symbol tables panicked: {}",
                crate::jobs::panic_message(p.as_ref())
            )))
        });
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

/// `pieces` paced by `pacer`; `sent` counts what left.
fn paced(pieces: Pieces, pacer: Arc<Pacer>, sent: Arc<AtomicU64>) -> Pieces {
    Box::pin(futures::StreamExt::then(pieces, move |piece| {
        let (sent, pacer) = (sent.clone(), pacer.clone());
        async move {
            if let Ok(bytes) = &piece {
                let due = pacer.slot(bytes.len());
                tokio::time::sleep_until(due.into()).await;
                sent.fetch_add(bytes.len() as u64, Relaxed);
            }
            piece
        }
    }))
}

/// Uploads the offered file under `key`, paced; returns the bytes sent.
/// A file within `max` (`--upload-max-file-bytes`) goes whole (the
/// executable); a larger one with a GNU build-ID as its symbol tables and
/// DWARF only (a debuginfo file, with the content hash of the file it was
/// taken from), if those fit.
pub async fn upload(
    client: &reqwest::Client,
    options: &Options,
    pacer: &Arc<Pacer>,
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
    let (pieces, kind, length) = match (whole, &offer.content_sha256) {
        (true, _) => (whole_file(file, size), "executable", Some(size)),
        (false, Some(content)) => (
            symbol_tables(file, size, content.clone(), max),
            "debuginfo",
            None,
        ),
        // Bound to no content, its debug file would name no frame.
        (false, None) => return Err(Failure::GiveUp("no content hash".into())),
    };
    let sent = Arc::new(AtomicU64::new(0));
    let body = paced(pieces, pacer.clone(), sent.clone());
    let mut path = format!(
        "/api/v1/debuginfo/{key}/{kind}?origin=agent&file={}",
        super::url_escape(&offer.map.path)
    );
    if let (false, Some(sha)) = (whole, &offer.content_sha256) {
        path.push_str(&format!("&content_sha256={sha}"));
    }
    // Slow by design: the pace (shared with another upload), plus a minute.
    let timeout = Duration::from_secs(60 + 2 * length.unwrap_or(max) / rate);
    let mut req = request(client, options, reqwest::Method::PUT, &path).timeout(timeout);
    if let Some(n) = length {
        req = req.header(reqwest::header::CONTENT_LENGTH, n);
    }
    let resp = req.body(reqwest::Body::wrap_stream(body)).send().await;
    let resp = match resp {
        Err(e) if format!("{e:?}").contains(OVER_BOUND) => {
            return Err(Failure::GiveUp(OVER_BOUND.into()))
        }
        Err(e) if format!("{e:?}").contains(CHANGED) => {
            return Err(Failure::GiveUp(CHANGED.into()))
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
    if matches!(status.as_u16(), 400 | 403 | 409 | 413 | 422) {
        Err(Failure::GiveUp(message))
    } else {
        Err(Failure::Retry(message))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_pacer_shares_one_rate() {
        let pacer = Pacer::new(1000);
        let t0 = Instant::now();
        let a = pacer.slot(500);
        let b = pacer.slot(500);
        let c = pacer.slot(1000);
        assert!(a >= t0 && a < t0 + Duration::from_millis(50));
        assert!(b >= a + Duration::from_millis(499));
        assert!(c >= a + Duration::from_millis(999));
        assert!(*pacer.next_free.lock().unwrap() >= a + Duration::from_millis(1999));
    }
}
