//! Liveness: whether the agent still does its job, for the orchestrator
//! (`--health-addr`: `GET /healthz`, and `GET /metrics` in Prometheus'
//! text format), and what ends it when it cannot.
//!
//! Healthy means, within `--health-max-silence`: the sampler thread went
//! round its loop (it is neither dead nor stuck), the BPF sampler ran (the
//! perf events fire), and — when batches wait for the server — one was
//! delivered within `--health-max-undelivered`. A thread of the agent that
//! dies (a panic outside the contained jobs, a task that ends) is fatal:
//! [`Health::died`] wakes `main`, which exits non-zero.

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::sync::Notify;

/// What the agent's threads report.
pub struct Health {
    started: Instant,
    /// Milliseconds since `started` of the sampler loop's last round.
    heartbeat_ms: AtomicU64,
    /// ... of the last time the BPF sampler's run count moved.
    sampled_ms: AtomicU64,
    /// ... of the last batch delivered (0: none yet).
    delivered_ms: AtomicU64,
    /// Batches waiting for the server.
    undelivered: AtomicU64,
    /// Why a thread died, if one did.
    dead: Mutex<Option<String>>,
    died: Notify,
    /// The latest `/metrics` text (made by the sampler thread each interval).
    metrics: Mutex<String>,
    max_silence: Duration,
    max_undelivered: Option<Duration>,
}

/// What `/healthz` says.
#[derive(Debug, PartialEq, Eq)]
pub enum Verdict {
    Healthy,
    Unhealthy(String),
}

impl Health {
    pub fn new(max_silence: Duration, max_undelivered: Option<Duration>) -> Arc<Self> {
        Arc::new(Health {
            started: Instant::now(),
            heartbeat_ms: AtomicU64::new(0),
            sampled_ms: AtomicU64::new(0),
            delivered_ms: AtomicU64::new(0),
            undelivered: AtomicU64::new(0),
            dead: Mutex::new(None),
            died: Notify::new(),
            metrics: Mutex::new(String::new()),
            max_silence,
            max_undelivered,
        })
    }

    fn now_ms(&self) -> u64 {
        self.started.elapsed().as_millis() as u64
    }

    /// The sampler loop went round.
    pub fn beat(&self) {
        self.heartbeat_ms.store(self.now_ms(), Relaxed);
    }

    /// The BPF sampler ran since the last call.
    pub fn sampled(&self) {
        self.sampled_ms.store(self.now_ms(), Relaxed);
    }

    /// A batch was delivered; `waiting` are still queued.
    pub fn delivered(&self, waiting: u64) {
        self.delivered_ms.store(self.now_ms(), Relaxed);
        self.undelivered.store(waiting, Relaxed);
    }

    /// Batches queued for the server now.
    pub fn queued(&self, waiting: u64) {
        self.undelivered.store(waiting, Relaxed);
    }

    /// A thread of the agent died: the agent must end.
    pub fn died(&self, why: String) {
        tracing::error!("{why}: the agent exits");
        let mut dead = self.dead.lock().unwrap_or_else(|e| e.into_inner());
        dead.get_or_insert(why);
        drop(dead);
        self.died.notify_one();
    }

    /// Why a thread died, once one did.
    pub fn death(&self) -> Option<String> {
        self.dead.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// Waits until a thread dies; its reason.
    pub async fn wait_for_death(&self) -> String {
        loop {
            if let Some(why) = self.death() {
                return why;
            }
            self.died.notified().await;
        }
    }

    pub fn set_metrics(&self, text: String) {
        *self.metrics.lock().unwrap_or_else(|e| e.into_inner()) = text;
    }

    pub fn metrics(&self) -> String {
        self.metrics
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// The verdict now.
    pub fn verdict(&self) -> Verdict {
        self.verdict_at(self.now_ms())
    }

    fn verdict_at(&self, now_ms: u64) -> Verdict {
        if let Some(why) = self.death() {
            return Verdict::Unhealthy(why);
        }
        let silence = self.max_silence.as_millis() as u64;
        let since = |ms: &AtomicU64| now_ms.saturating_sub(ms.load(Relaxed));
        if since(&self.heartbeat_ms) > silence {
            return Verdict::Unhealthy(format!(
                "the sampler thread has not gone round its loop for {} ms",
                since(&self.heartbeat_ms)
            ));
        }
        if since(&self.sampled_ms) > silence {
            return Verdict::Unhealthy(format!(
                "no sample has flowed for {} ms",
                since(&self.sampled_ms)
            ));
        }
        if let Some(max) = self.max_undelivered {
            let max = max.as_millis() as u64;
            if self.undelivered.load(Relaxed) > 0 && since(&self.delivered_ms) > max {
                return Verdict::Unhealthy(format!(
                    "batches wait for the server and none was delivered for {} ms",
                    since(&self.delivered_ms)
                ));
            }
        }
        Verdict::Healthy
    }
}

/// Serves `/healthz` and `/metrics` on `listener` until the runtime ends.
pub async fn serve(listener: tokio::net::TcpListener, health: Arc<Health>) {
    use axum::http::StatusCode;
    use axum::routing::get;
    let healthz = {
        let health = health.clone();
        move || {
            let health = health.clone();
            async move {
                match health.verdict() {
                    Verdict::Healthy => (StatusCode::OK, "ok\n".to_owned()),
                    Verdict::Unhealthy(why) => {
                        (StatusCode::SERVICE_UNAVAILABLE, format!("{why}\n"))
                    }
                }
            }
        }
    };
    let metrics = move || {
        let health = health.clone();
        async move {
            (
                [(
                    axum::http::header::CONTENT_TYPE,
                    "text/plain; version=0.0.4",
                )],
                health.metrics(),
            )
        }
    };
    let app = axum::Router::new()
        .route("/healthz", get(healthz))
        .route("/metrics", get(metrics));
    if let Err(e) = axum::serve(listener, app).await {
        tracing::error!("the health endpoint stopped: {e}");
    }
}

/// Ends the process's thread reporting to `health` when dropped while not
/// stopping (a panic unwinding it, or an early return).
pub struct Watch {
    pub health: Arc<Health>,
    pub what: &'static str,
    pub stopping: Arc<std::sync::atomic::AtomicBool>,
}

impl Drop for Watch {
    fn drop(&mut self) {
        if !self.stopping.load(Relaxed) {
            let why = if std::thread::panicking() {
                format!("the {} thread panicked", self.what)
            } else {
                format!("the {} thread ended", self.what)
            };
            self.health.died(why);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn verdicts() {
        let h = Health::new(Duration::from_secs(2), Some(Duration::from_secs(10)));
        h.beat();
        h.sampled();
        assert_eq!(h.verdict_at(1000), Verdict::Healthy);
        assert!(matches!(h.verdict_at(5000), Verdict::Unhealthy(w) if w.contains("loop")));
        h.heartbeat_ms.store(5000, Relaxed);
        assert!(matches!(h.verdict_at(5000), Verdict::Unhealthy(w) if w.contains("no sample")));
        h.sampled_ms.store(5000, Relaxed);
        assert_eq!(h.verdict_at(5000), Verdict::Healthy);
        // Batches waiting, none delivered for longer than allowed.
        h.queued(3);
        h.heartbeat_ms.store(20_000, Relaxed);
        h.sampled_ms.store(20_000, Relaxed);
        assert!(matches!(h.verdict_at(20_000), Verdict::Unhealthy(w) if w.contains("delivered")));
        h.delivered_ms.store(19_000, Relaxed);
        assert_eq!(h.verdict_at(20_000), Verdict::Healthy);
        h.died("the sampler thread panicked".into());
        assert!(matches!(h.verdict_at(20_000), Verdict::Unhealthy(w) if w.contains("panicked")));
    }
}
