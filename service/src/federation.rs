//! Federation: a miss is asked of the upstream debuginfod servers, in
//! parallel; the first to answer 200 is downloaded, validated like an upload,
//! stored and then served from our own store.
//!
//! - Concurrent requests for the same file share one fetch (the fetch runs as
//!   its own task, so it completes even if the first client goes away).
//! - Misses are remembered for a short time (negative cache).
//! - `X-Forwarded-For` carries the hop count; at the hop limit a request is
//!   not forwarded again, so servers that federate with each other cannot loop.
//!   In-flight fetches are keyed by hop count too, so a loop cannot wait on
//!   itself.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::future::{BoxFuture, Shared};
use futures::{FutureExt, TryStreamExt};
use symtrace_elf::BuildId;

use crate::limits::{Busy, Slots};
use crate::store::model::{ArtifactKind, ServedArtifact};
use crate::store::spool::spool;
use crate::store::{Misses, Origin, Publisher, SymbolStore};

/// What to fetch.
#[derive(Debug, Clone)]
pub enum Wanted {
    Artifact(ArtifactKind),
    /// A canonical absolute source path.
    Source(String),
}

/// Who asked, passed on to upstream servers.
#[derive(Debug, Clone, Default)]
pub struct Forwarding {
    /// The incoming `X-Forwarded-For`, if any.
    pub forwarded_for: Option<String>,
    /// The requesting client's address.
    pub peer: String,
    pub user_agent: Option<String>,
}

impl Forwarding {
    /// Servers this request already crossed.
    pub fn hops(&self) -> usize {
        self.forwarded_for
            .as_deref()
            .map(|v| v.split(',').filter(|s| !s.trim().is_empty()).count())
            .unwrap_or(0)
    }

    /// The `X-Forwarded-For` to send upstream: the incoming one plus our client.
    pub fn next_forwarded_for(&self) -> String {
        match self
            .forwarded_for
            .as_deref()
            .filter(|v| !v.trim().is_empty())
        {
            Some(v) => format!("{v}, {}", self.peer),
            None => self.peer.clone(),
        }
    }
}

type FetchFuture = Shared<BoxFuture<'static, bool>>;

pub struct Federation {
    upstreams: Vec<String>,
    client: reqwest::Client,
    store: Arc<SymbolStore>,
    max_bytes: u64,
    hop_limit: usize,
    negative_ttl: Duration,
    inflight: Mutex<HashMap<String, FetchFuture>>,
    negative: Mutex<HashMap<String, Instant>>,
    /// Fetches running at once (coalesced requests share one).
    slots: Slots,
}

/// Why a lookup that may ask upstream servers failed.
#[derive(Debug, thiserror::Error)]
pub enum FindError {
    #[error(transparent)]
    Store(#[from] crate::store::Error),
    #[error(transparent)]
    Busy(#[from] Busy),
}

impl Federation {
    pub fn new(
        upstreams: Vec<String>,
        store: Arc<SymbolStore>,
        timeout: Duration,
        negative_ttl: Duration,
        hop_limit: usize,
        max_bytes: u64,
        slots: Slots,
    ) -> Result<Self, reqwest::Error> {
        let client = reqwest::Client::builder()
            .connect_timeout(timeout)
            .read_timeout(timeout)
            .user_agent(concat!("symtrace-server/", env!("CARGO_PKG_VERSION")))
            .build()?;
        Ok(Self {
            upstreams,
            client,
            store,
            max_bytes,
            hop_limit,
            negative_ttl,
            inflight: Mutex::new(HashMap::new()),
            negative: Mutex::new(HashMap::new()),
            slots,
        })
    }

    pub fn upstreams(&self) -> &[String] {
        &self.upstreams
    }

    pub fn client(&self) -> &reqwest::Client {
        &self.client
    }

    /// Whether a request with this forwarding may be passed on.
    pub fn may_forward(&self, from: &Forwarding) -> bool {
        !self.upstreams.is_empty() && from.hops() < self.hop_limit
    }

    /// Fetches `wanted` from upstream into the store. Returns whether it is
    /// now stored, or [`Busy`] when every fetch slot is taken (nothing is
    /// remembered of that: the next request asks again).
    pub async fn fetch(
        self: &Arc<Self>,
        build_id: &BuildId,
        wanted: Wanted,
        from: Forwarding,
    ) -> Result<bool, Busy> {
        if !self.may_forward(&from) {
            return Ok(false);
        }
        let target = match &wanted {
            Wanted::Artifact(kind) => format!("{build_id}/{}", kind.as_str()),
            Wanted::Source(path) => {
                format!("{build_id}/source{}", symtrace_elf::escape_path(path))
            }
        };
        {
            let mut negative = self.negative.lock().expect("negative cache lock");
            match negative.get(&target) {
                Some(until) if *until > Instant::now() => {
                    metrics::counter!("symtrace_upstream_fetches_total", "result" => "negative_cached")
                        .increment(1);
                    return Ok(false);
                }
                Some(_) => {
                    negative.remove(&target);
                }
                None => {}
            }
        }
        let key = format!("{}:{target}", from.hops());
        let shared = {
            let mut inflight = self.inflight.lock().expect("inflight lock");
            if let Some(existing) = inflight.get(&key) {
                metrics::counter!("symtrace_upstream_fetches_total", "result" => "coalesced")
                    .increment(1);
                existing.clone()
            } else {
                let slot = self.slots.take()?;
                let this = self.clone();
                let (build_id, key2) = (build_id.clone(), key.clone());
                let task = tokio::spawn(async move {
                    // A request that missed locally just before the previous
                    // fetch of this key stored its answer and left the
                    // in-flight table arrives here: that answer is stored.
                    let stored = this.stored(&build_id, &wanted).await
                        || this.fetch_now(&build_id, &wanted, &target, &from).await;
                    drop(slot);
                    if !stored {
                        let mut negative = this.negative.lock().expect("negative cache lock");
                        if negative.len() > 100_000 {
                            let now = Instant::now();
                            negative.retain(|_, until| *until > now);
                        }
                        negative.insert(target, Instant::now() + this.negative_ttl);
                    }
                    this.inflight.lock().expect("inflight lock").remove(&key2);
                    stored
                });
                let fut: BoxFuture<'static, bool> =
                    async move { task.await.unwrap_or(false) }.boxed();
                let fut = fut.shared();
                inflight.insert(key, fut.clone());
                fut
            }
        };
        Ok(shared.await)
    }

    /// Whether `wanted` is in the store already.
    async fn stored(&self, build_id: &BuildId, wanted: &Wanted) -> bool {
        match wanted {
            Wanted::Artifact(kind) => matches!(
                self.store
                    .best_artifact(build_id, *kind, Misses::Recheck)
                    .await,
                Ok(Some(_))
            ),
            Wanted::Source(path) => matches!(
                self.store.meta.source(build_id.as_str(), path).await,
                Ok(Some(_))
            ),
        }
    }

    async fn fetch_now(
        &self,
        build_id: &BuildId,
        wanted: &Wanted,
        target: &str,
        from: &Forwarding,
    ) -> bool {
        let forwarded_for = from.next_forwarded_for();
        let attempts = self.upstreams.iter().map(|base| {
            let url = format!("{base}/buildid/{target}");
            let mut request = self
                .client
                .get(&url)
                .header("x-forwarded-for", &forwarded_for);
            if let Some(ua) = &from.user_agent {
                request = request.header(reqwest::header::USER_AGENT, ua);
            }
            Box::pin(async move {
                let response = request.send().await.map_err(|e| format!("{url}: {e}"))?;
                if response.status() == reqwest::StatusCode::OK {
                    Ok((base.clone(), response))
                } else {
                    Err(format!("{url}: {}", response.status()))
                }
            })
        });
        let (base, response) = match futures::future::select_ok(attempts).await {
            Ok((winner, _rest)) => winner,
            Err(last) => {
                tracing::debug!(build_id = %build_id, target, error = %last, "upstream miss");
                metrics::counter!("symtrace_upstream_fetches_total", "result" => "miss")
                    .increment(1);
                return false;
            }
        };
        let body = response.bytes_stream().map_err(std::io::Error::other);
        let spooled = match spool(body, self.store.spool_dir(), self.max_bytes).await {
            Ok(s) => s,
            Err(e) => {
                tracing::warn!(build_id = %build_id, target, upstream = %without_userinfo(&base), error = %e, "upstream download failed");
                metrics::counter!("symtrace_upstream_fetches_total", "result" => "error")
                    .increment(1);
                return false;
            }
        };
        let upstream = without_userinfo(&base);
        let stored = match wanted {
            Wanted::Artifact(kind) => self
                .store
                .ingest_artifact(
                    build_id,
                    *kind,
                    &spooled,
                    None,
                    Origin::Upstream(&upstream),
                    Publisher::SHARED,
                )
                .await
                .map(|_| ()),
            Wanted::Source(path) => self
                .store
                .ingest_source(build_id, path, &spooled, true, Publisher::SHARED)
                .await
                .map(|_| ()),
        };
        match stored {
            Ok(()) => {
                tracing::info!(build_id = %build_id, target, upstream = %without_userinfo(&base), size = spooled.size, "fetched from upstream");
                metrics::counter!("symtrace_upstream_fetches_total", "result" => "stored")
                    .increment(1);
                true
            }
            Err(e) => {
                tracing::warn!(build_id = %build_id, target, upstream = %without_userinfo(&base), error = %e, "upstream file rejected");
                metrics::counter!("symtrace_upstream_fetches_total", "result" => "rejected")
                    .increment(1);
                false
            }
        }
    }
}

/// An upstream URL as it may be shown: without `user:password@`.
pub fn without_userinfo(url: &str) -> String {
    match url.split_once("://") {
        Some((scheme, rest)) => {
            let (authority, path) = rest.split_at(rest.find('/').unwrap_or(rest.len()));
            let host = authority.rsplit_once('@').map_or(authority, |(_, h)| h);
            format!("{scheme}://{host}{path}")
        }
        None => url.to_owned(),
    }
}

/// The best stored candidate for (build-ID, kind), fetched from the upstream
/// servers (and stored) on a miss.
pub async fn find_or_fetch(
    store: &SymbolStore,
    federation: Option<&Arc<Federation>>,
    build_id: &BuildId,
    kind: ArtifactKind,
    from: &Forwarding,
    misses: Misses,
) -> Result<Option<Arc<ServedArtifact>>, FindError> {
    if let Some(found) = store.best_artifact(build_id, kind, misses).await? {
        return Ok(Some(found));
    }
    if let Some(federation) = federation {
        if federation
            .fetch(build_id, Wanted::Artifact(kind), from.clone())
            .await?
        {
            return Ok(store.best_artifact(build_id, kind, Misses::Recheck).await?);
        }
    }
    Ok(None)
}

#[cfg(test)]
mod tests {
    use super::without_userinfo;

    #[test]
    fn hides_credentials() {
        assert_eq!(without_userinfo("https://u:p@h:8002/x"), "https://h:8002/x");
        assert_eq!(without_userinfo("http://h:8002"), "http://h:8002");
    }
}
