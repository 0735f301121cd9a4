//! The servers a run is aimed at: requests go round-robin over them; with
//! failover, a request whose connection fails is sent to the next one, as a
//! load balancer would after a replica dies.

use std::future::Future;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use crate::report::Op;

pub struct Targets {
    pub urls: Vec<String>,
    next: AtomicUsize,
    failover: bool,
}

/// Why a request failed, as the report groups it.
pub enum Failure {
    /// The server could not be reached or dropped the connection: another
    /// replica may answer.
    Connection(String),
    /// The server answered wrongly.
    Answer(String),
}

impl Targets {
    pub fn new(urls: &[String], failover: bool) -> Self {
        Self {
            urls: urls
                .iter()
                .map(|u| u.trim_end_matches('/').to_owned())
                .collect(),
            next: AtomicUsize::new(0),
            failover,
        }
    }

    /// Runs `request` against the next server (and, with failover, the
    /// ones after it when the connection fails); records the outcome in
    /// `op`. Returns the units on success.
    pub async fn send<F, Fut>(&self, op: &Op, request: F) -> Option<u64>
    where
        F: Fn(String) -> Fut,
        Fut: Future<Output = Result<u64, Failure>>,
    {
        let first = self.next.fetch_add(1, Ordering::Relaxed);
        let attempts = if self.failover { self.urls.len() } else { 1 };
        for i in 0..attempts {
            let url = self.urls[(first + i) % self.urls.len()].clone();
            let t = Instant::now();
            match request(url).await {
                Ok(units) => {
                    if i > 0 {
                        op.failover();
                    }
                    op.ok(t.elapsed(), units);
                    return Some(units);
                }
                // Another server may answer.
                Err(Failure::Connection(_)) if i + 1 < attempts => continue,
                Err(Failure::Connection(kind) | Failure::Answer(kind)) => {
                    op.error(kind);
                    // Do not spin on a dead server.
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    return None;
                }
            }
        }
        None
    }
}

/// A reqwest failure, by kind.
pub fn classify(e: &reqwest::Error) -> Failure {
    if e.is_connect() {
        Failure::Connection("connection refused".to_owned())
    } else if e.is_timeout() {
        Failure::Answer("timeout".to_owned())
    } else if e.is_request() || e.is_body() || e.is_decode() {
        // Sending failed, or the answer's body was cut off (a server that
        // died mid-response): another replica may answer.
        Failure::Connection("connection lost".to_owned())
    } else {
        Failure::Answer(format!("client error: {e}"))
    }
}

/// A non-success HTTP status as a failure kind (a 503 of a replica that is
/// shutting down counts as a connection failure: another may answer).
pub fn status_failure(status: reqwest::StatusCode) -> Failure {
    let kind = format!("HTTP {}", status.as_u16());
    if status == reqwest::StatusCode::SERVICE_UNAVAILABLE {
        Failure::Connection(kind)
    } else {
        Failure::Answer(kind)
    }
}

/// Sends a request; a connection failure or a non-success status is a
/// [`Failure`].
pub async fn send_checked(request: reqwest::RequestBuilder) -> Result<reqwest::Response, Failure> {
    let r = request.send().await.map_err(|e| classify(&e))?;
    if !r.status().is_success() {
        return Err(status_failure(r.status()));
    }
    Ok(r)
}

/// The pid of the local process listening on a loopback URL's port, found
/// through /proc/net/tcp{,6} and the processes' socket descriptors.
pub fn local_pid(url: &str) -> Option<u32> {
    let authority = url.split("://").nth(1)?.split('/').next()?;
    let (host, port) = authority.rsplit_once(':')?;
    if !matches!(
        host.trim_matches(['[', ']']),
        "127.0.0.1" | "localhost" | "::1"
    ) {
        return None;
    }
    let port: u16 = port.parse().ok()?;
    let mut inodes = Vec::new();
    for table in ["/proc/net/tcp", "/proc/net/tcp6"] {
        let Ok(text) = std::fs::read_to_string(table) else {
            continue;
        };
        for line in text.lines().skip(1) {
            let f: Vec<&str> = line.split_whitespace().collect();
            // local_address is HEX_IP:HEX_PORT; state 0A is LISTEN.
            let listening = f.get(3) == Some(&"0A");
            let local_port = f
                .get(1)
                .and_then(|a| a.rsplit_once(':'))
                .and_then(|(_, p)| u16::from_str_radix(p, 16).ok());
            if listening && local_port == Some(port) {
                if let Some(inode) = f.get(9) {
                    inodes.push(format!("socket:[{inode}]"));
                }
            }
        }
    }
    if inodes.is_empty() {
        return None;
    }
    for entry in std::fs::read_dir("/proc").ok()?.flatten() {
        let Some(pid) = entry
            .file_name()
            .to_str()
            .and_then(|s| s.parse::<u32>().ok())
        else {
            continue;
        };
        let Ok(fds) = std::fs::read_dir(entry.path().join("fd")) else {
            continue;
        };
        for fd in fds.flatten() {
            if let Ok(link) = std::fs::read_link(fd.path()) {
                if inodes.iter().any(|i| link.as_os_str() == i.as_str()) {
                    return Some(pid);
                }
            }
        }
    }
    None
}

/// Runs `request(n)` for n = 0, 1, 2, … on `connections` concurrent tasks
/// until `duration` has passed or `max` requests (0 = no limit) were
/// started; with `interval`, request n starts no earlier than n × interval
/// after the start (a target rate).
pub async fn run<F, Fut>(
    connections: usize,
    duration: Duration,
    max: u64,
    interval: Option<Duration>,
    request: F,
) where
    F: Fn(u64) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = ()> + Send,
{
    let request = std::sync::Arc::new(request);
    let seq = std::sync::Arc::new(std::sync::atomic::AtomicU64::new(0));
    let started = tokio::time::Instant::now();
    let tasks: Vec<_> = (0..connections.max(1))
        .map(|_| {
            let (request, seq) = (request.clone(), seq.clone());
            tokio::spawn(async move {
                while started.elapsed() < duration {
                    let n = seq.fetch_add(1, Ordering::Relaxed);
                    if max > 0 && n >= max {
                        break;
                    }
                    if let Some(interval) = interval {
                        let at = started + interval.mul_f64(n as f64);
                        if at >= started + duration {
                            break;
                        }
                        tokio::time::sleep_until(at).await;
                    }
                    request(n).await;
                }
            })
        })
        .collect();
    for t in tasks {
        let _ = t.await;
    }
}
