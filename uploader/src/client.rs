//! The server's upload API: one `missing` round trip, then streaming,
//! zstd-compressed uploads with retries (network errors and 5xx, with
//! exponential backoff; never 4xx, whose message is reported as is).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use async_compression::tokio::bufread::ZstdEncoder;
use async_compression::Level;
use serde_json::Value;
use tokio::io::BufReader;
use tokio_util::io::{InspectReader, ReaderStream};

use symtrace_elf::escape_path;

use crate::prepare::Item;

/// Items per `missing` request.
const MISSING_CHUNK: usize = 10_000;

/// Why a request failed.
#[derive(Debug)]
pub enum ClientError {
    /// The server answered 4xx: retrying would not help.
    Refused { status: u16, message: String },
    /// Unreachable, or 5xx after every retry.
    Failed(String),
}

impl std::fmt::Display for ClientError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Refused { status, message } => write!(f, "server refused ({status}): {message}"),
            Self::Failed(m) => f.write_str(m),
        }
    }
}

pub struct Client {
    http: reqwest::Client,
    base: String,
    token: Option<String>,
    retries: u32,
    compress: bool,
    /// Uncompressed bytes read from disk for uploads, for progress.
    pub sent: Arc<AtomicU64>,
}

impl Client {
    pub fn new(
        base: &str,
        token: Option<String>,
        retries: u32,
        compress: bool,
    ) -> anyhow::Result<Self> {
        let http = reqwest::Client::builder()
            .connect_timeout(Duration::from_secs(10))
            // A server that accepts and then stalls must not hang the job.
            .read_timeout(Duration::from_secs(120))
            .user_agent(concat!("symtrace-upload/", env!("CARGO_PKG_VERSION")))
            .build()?;
        Ok(Self {
            http,
            base: base.trim_end_matches('/').to_owned(),
            token,
            retries: retries.max(1),
            compress,
            sent: Arc::new(AtomicU64::new(0)),
        })
    }

    fn auth(&self, r: reqwest::RequestBuilder) -> reqwest::RequestBuilder {
        match &self.token {
            Some(t) => r.bearer_auth(t),
            None => r,
        }
    }

    /// Runs `attempt` until it succeeds, is refused, or retries run out.
    async fn with_retries<F, Fut>(&self, what: &str, mut attempt: F) -> Result<Value, ClientError>
    where
        F: FnMut() -> Fut,
        Fut: std::future::Future<Output = Result<reqwest::Response, String>>,
    {
        let mut last = String::new();
        for n in 0..self.retries {
            if n > 0 {
                let wait = Duration::from_millis(500 * (1 << (n - 1).min(5)));
                tracing::warn!(%what, attempt = n + 1, error = %last, "retrying in {wait:?}");
                tokio::time::sleep(wait).await;
            }
            match attempt().await {
                Ok(resp) => {
                    let status = resp.status();
                    let text = resp.text().await.unwrap_or_default();
                    let body: Value =
                        serde_json::from_str(&text).unwrap_or(Value::String(text.clone()));
                    if status.is_success() {
                        return Ok(body);
                    }
                    let message = body["error"]["message"]
                        .as_str()
                        .map(str::to_owned)
                        .unwrap_or(text);
                    if status.is_client_error() {
                        return Err(ClientError::Refused {
                            status: status.as_u16(),
                            message,
                        });
                    }
                    last = format!("{status}: {message}");
                }
                Err(e) => last = e,
            }
        }
        Err(ClientError::Failed(format!(
            "{what} failed after {} attempts: {last}",
            self.retries
        )))
    }

    /// Indexes (into `items`) of what the server lacks.
    pub async fn missing(&self, items: &[Item]) -> Result<Vec<usize>, ClientError> {
        use symtrace_wire::missing::{MissingAnswer, MissingRequest, WantedItem, PATH};
        let wanted: Vec<WantedItem> = items
            .iter()
            .map(|i| WantedItem {
                build_id: i.build_id.as_str().to_owned(),
                kind: i.kind.to_owned(),
                sha256: i.sha256.clone(),
                path: (i.kind == "source").then(|| i.name.clone()),
                quality: i.quality,
                ..Default::default()
            })
            .collect();
        let url = format!("{}{PATH}", self.base);
        let mut missing = Vec::new();
        // The server takes at most MAX_ITEMS items a request.
        for (n, chunk) in wanted.chunks(MISSING_CHUNK).enumerate() {
            let body = serde_json::to_value(MissingRequest {
                items: chunk.to_vec(),
            })
            .expect("a request serializes");
            let answer = self
                .with_retries("asking the server what it lacks", || {
                    let request = self.auth(self.http.post(&url)).json(&body);
                    async move { request.send().await.map_err(|e| e.to_string()) }
                })
                .await?;
            // Anything but a well-formed answer (a web page behind a wrong
            // URL, say) must not read as "the server has everything".
            let answer: MissingAnswer = serde_json::from_value(answer).map_err(|_| {
                ClientError::Failed(format!(
                    "{url} did not answer like a symtrace server (is --server right?)"
                ))
            })?;
            answer
                .check(chunk.len())
                .map_err(|e| ClientError::Failed(format!("{url} {e}")))?;
            missing.extend(answer.missing.iter().map(|m| n * MISSING_CHUNK + m.index));
        }
        Ok(missing)
    }

    /// Uploads one item; the answer's `status` (created/unchanged/superseded).
    pub async fn upload(&self, item: &Item) -> Result<String, ClientError> {
        let url = match item.kind {
            "source" => format!(
                "{}/api/v1/debuginfo/{}/source{}",
                self.base,
                item.build_id,
                escape_path(&item.name)
            ),
            kind => format!(
                "{}/api/v1/debuginfo/{}/{kind}?file={}",
                self.base,
                item.build_id,
                escape_path(&item.name).replace('/', "%2F")
            ),
        };
        let what = format!("uploading {}", item.local.display());
        let answer = self
            .with_retries(&what, || {
                let local = item.local.clone();
                let sent = self.sent.clone();
                let mut request = self.auth(self.http.put(&url));
                if self.compress {
                    request = request.header("content-encoding", "zstd");
                }
                let compress = self.compress;
                async move {
                    let file = tokio::fs::File::open(&local)
                        .await
                        .map_err(|e| format!("cannot read {}: {e}", local.display()))?;
                    let counted =
                        InspectReader::new(BufReader::with_capacity(1 << 20, file), move |b| {
                            sent.fetch_add(b.len() as u64, Ordering::Relaxed);
                        });
                    let body = if compress {
                        // The fastest level: CI runners are short of CPU,
                        // and debug info still shrinks several times.
                        let encoder =
                            ZstdEncoder::with_quality(BufReader::new(counted), Level::Fastest);
                        reqwest::Body::wrap_stream(ReaderStream::with_capacity(encoder, 256 << 10))
                    } else {
                        reqwest::Body::wrap_stream(ReaderStream::with_capacity(counted, 256 << 10))
                    };
                    request.body(body).send().await.map_err(|e| e.to_string())
                }
            })
            .await?;
        Ok(answer["status"].as_str().unwrap_or("stored").to_owned())
    }
}
