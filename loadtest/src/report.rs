//! What a run measured: per operation the answers, the latency histogram
//! (HDR, µs) and the errors by kind; per server its CPU and memory (from
//! `/proc` when it runs here, from its `/metrics` otherwise). Printed as a
//! table, then as one JSON line for CI.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use hdrhistogram::Histogram;
use serde_json::{json, Value};

/// One kind of request of a scenario (an export, a debuginfod hit, …).
pub struct Op {
    pub scenario: &'static str,
    pub name: &'static str,
    ok: AtomicU64,
    /// What the answers carried: events for exports, bytes for downloads.
    units: AtomicU64,
    /// Requests that failed on one server and were answered by another.
    failovers: AtomicU64,
    latency_us: Mutex<Histogram<u64>>,
    errors: Mutex<BTreeMap<String, u64>>,
}

impl Op {
    pub fn new(scenario: &'static str, name: &'static str) -> Arc<Self> {
        Arc::new(Self {
            scenario,
            name,
            ok: AtomicU64::new(0),
            units: AtomicU64::new(0),
            failovers: AtomicU64::new(0),
            latency_us: Mutex::new(Histogram::new(3).expect("3 significant digits")),
            errors: Mutex::new(BTreeMap::new()),
        })
    }

    pub fn ok(&self, latency: Duration, units: u64) {
        self.ok.fetch_add(1, Ordering::Relaxed);
        self.units.fetch_add(units, Ordering::Relaxed);
        let _ = self
            .latency_us
            .lock()
            .unwrap()
            .record(latency.as_micros() as u64);
    }

    pub fn error(&self, kind: impl Into<String>) {
        *self.errors.lock().unwrap().entry(kind.into()).or_default() += 1;
    }

    pub fn failover(&self) {
        self.failovers.fetch_add(1, Ordering::Relaxed);
    }

    pub fn succeeded(&self) -> u64 {
        self.ok.load(Ordering::Relaxed)
    }

    pub fn units(&self) -> u64 {
        self.units.load(Ordering::Relaxed)
    }

    pub fn error_count(&self) -> u64 {
        self.errors.lock().unwrap().values().sum()
    }

    fn summary(&self, seconds: f64) -> Value {
        let h = self.latency_us.lock().unwrap();
        let ms = |q: f64| h.value_at_quantile(q) as f64 / 1000.0;
        json!({
            "scenario": self.scenario, "op": self.name,
            "ok": self.succeeded(), "per_second": self.succeeded() as f64 / seconds,
            "units": self.units(), "units_per_second": self.units() as f64 / seconds,
            "failovers": self.failovers.load(Ordering::Relaxed),
            "errors": *self.errors.lock().unwrap(),
            "latency_ms": {"p50": ms(0.5), "p90": ms(0.9), "p99": ms(0.99), "max": h.max() as f64 / 1000.0},
        })
    }
}

/// A server's CPU time and resident memory, sampled once a second.
pub struct ServerWatch {
    stop: Arc<tokio::sync::Notify>,
    task: tokio::task::JoinHandle<Vec<Watched>>,
}

struct Watched {
    url: String,
    /// Where the numbers come from: a local pid's /proc, or /metrics.
    source: Source,
    first: Option<(Instant, f64)>,
    last: Option<(Instant, f64)>,
    rss_max: u64,
    rss_last: u64,
    /// Readings that failed (the server was down).
    unreachable: u64,
}

#[derive(Clone)]
enum Source {
    Proc(u32),
    Metrics,
}

impl ServerWatch {
    /// Starts reading the servers once a second (on the Tokio runtime).
    pub fn start(urls: &[String]) -> Self {
        let mut servers: Vec<Watched> = urls
            .iter()
            .map(|url| Watched {
                url: url.trim_end_matches('/').to_owned(),
                source: crate::target::local_pid(url).map_or(Source::Metrics, Source::Proc),
                first: None,
                last: None,
                rss_max: 0,
                rss_last: 0,
                unreachable: 0,
            })
            .collect();
        let stop = Arc::new(tokio::sync::Notify::new());
        let task = {
            let stop = stop.clone();
            tokio::spawn(async move {
                let http = reqwest::Client::builder()
                    .timeout(Duration::from_secs(2))
                    .build()
                    .expect("an HTTP client");
                let mut stopped = false;
                loop {
                    for s in &mut servers {
                        let reading = match s.source {
                            Source::Proc(pid) => proc_reading(pid),
                            Source::Metrics => metrics_reading(&http, &s.url).await,
                        };
                        match reading {
                            Some((cpu, rss)) => {
                                let now = Instant::now();
                                s.first.get_or_insert((now, cpu));
                                s.last = Some((now, cpu));
                                s.rss_max = s.rss_max.max(rss);
                                s.rss_last = rss;
                            }
                            None => s.unreachable += 1,
                        }
                    }
                    if stopped {
                        return servers;
                    }
                    // When stopped, one final reading, then the answer.
                    tokio::select! {
                        _ = stop.notified() => stopped = true,
                        _ = tokio::time::sleep(Duration::from_secs(1)) => {}
                    }
                }
            })
        };
        Self { stop, task }
    }

    async fn finish(self) -> Vec<Watched> {
        self.stop.notify_one();
        self.task.await.unwrap_or_default()
    }
}

fn proc_reading(pid: u32) -> Option<(f64, u64)> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let fields: Vec<&str> = stat.rsplit_once(')')?.1.split_whitespace().collect();
    // stat(5): utime 14, stime 15, rss 24 (pages); field 3 is index 0 here.
    let field = |i: usize| fields.get(i)?.parse::<u64>().ok();
    // SAFETY: sysconf has no preconditions.
    let (ticks, page) = unsafe {
        (
            libc::sysconf(libc::_SC_CLK_TCK),
            libc::sysconf(libc::_SC_PAGESIZE),
        )
    };
    Some((
        (field(11)? + field(12)?) as f64 / ticks.max(1) as f64,
        field(21)? * page.max(1) as u64,
    ))
}

async fn metrics_reading(http: &reqwest::Client, url: &str) -> Option<(f64, u64)> {
    let text = http
        .get(format!("{url}/metrics"))
        .send()
        .await
        .ok()?
        .text()
        .await
        .ok()?;
    let value = |name: &str| {
        text.lines()
            .find(|l| l.split_whitespace().next() == Some(name))?
            .split_whitespace()
            .nth(1)?
            .parse::<f64>()
            .ok()
    };
    Some((
        value("process_cpu_seconds_total")?,
        value("process_resident_memory_bytes")? as u64,
    ))
}

/// Everything a scenario run prints.
pub struct Report {
    pub started: Instant,
    pub ops: Vec<Arc<Op>>,
    watch: ServerWatch,
    /// Extra key figures (name, value) printed under the table.
    pub figures: Vec<(String, Value)>,
}

impl Report {
    pub fn new(server_urls: &[String]) -> Self {
        Self {
            started: Instant::now(),
            ops: Vec::new(),
            watch: ServerWatch::start(server_urls),
            figures: Vec::new(),
        }
    }

    pub fn op(&mut self, scenario: &'static str, name: &'static str) -> Arc<Op> {
        let op = Op::new(scenario, name);
        self.ops.push(op.clone());
        op
    }

    /// Errors of every operation.
    pub fn errors(&self) -> u64 {
        self.ops.iter().map(|o| o.error_count()).sum()
    }

    /// Prints the table and the JSON line; returns the JSON.
    pub async fn print(self) -> Value {
        let seconds = self.started.elapsed().as_secs_f64();
        let errors = self.errors();
        let servers = self.watch.finish().await;
        println!(
            "{:<11}{:<13}{:>9}{:>8}{:>10}{:>9}{:>9}{:>9}{:>9}",
            "scenario", "op", "ok", "errors", "ok/s", "p50 ms", "p90 ms", "p99 ms", "max ms"
        );
        let mut ops = Vec::new();
        let (mut error_lines, mut failover_lines) = (Vec::new(), Vec::new());
        for op in &self.ops {
            let s = op.summary(seconds);
            let l = &s["latency_ms"];
            println!(
                "{:<11}{:<13}{:>9}{:>8}{:>10.1}{:>9.1}{:>9.1}{:>9.1}{:>9.1}",
                op.scenario,
                op.name,
                op.succeeded(),
                op.error_count(),
                s["per_second"].as_f64().unwrap_or(0.0),
                l["p50"].as_f64().unwrap_or(0.0),
                l["p90"].as_f64().unwrap_or(0.0),
                l["p99"].as_f64().unwrap_or(0.0),
                l["max"].as_f64().unwrap_or(0.0),
            );
            for (kind, n) in op.errors.lock().unwrap().iter() {
                error_lines.push(format!("{} {}: {kind} ×{n}", op.scenario, op.name));
            }
            let failovers = op.failovers.load(Ordering::Relaxed);
            if failovers > 0 {
                failover_lines.push(format!("{} {} ×{failovers}", op.scenario, op.name));
            }
            ops.push(s);
        }
        for (name, value) in &self.figures {
            println!("{name:<17} {}", value_text(value));
        }
        let mut server_json = Vec::new();
        for s in &servers {
            let cpu = match (s.first, s.last) {
                (Some((t0, a)), Some((t1, b))) if t1 > t0 => {
                    Some((b - a) / (t1 - t0).as_secs_f64())
                }
                _ => None,
            };
            let source = match s.source {
                Source::Proc(pid) => format!("/proc/{pid}"),
                Source::Metrics => "/metrics".to_owned(),
            };
            println!(
                "server {} ({source}): CPU {} cores, RSS max {:.0} MB, at end {:.0} MB{}",
                s.url,
                cpu.map_or("?".to_owned(), |c| format!("{c:.2}")),
                s.rss_max as f64 / 1e6,
                s.rss_last as f64 / 1e6,
                if s.unreachable > 0 {
                    format!(", unreachable for {} readings", s.unreachable)
                } else {
                    String::new()
                }
            );
            server_json.push(json!({
                "url": s.url, "source": source, "cpu_cores": cpu,
                "rss_max_bytes": s.rss_max, "rss_end_bytes": s.rss_last, "unreachable_readings": s.unreachable,
            }));
        }
        if !failover_lines.is_empty() {
            println!(
                "failovers         {} (answered by another server after a connection failure)",
                failover_lines.join("; ")
            );
        }
        println!(
            "errors            {}",
            if error_lines.is_empty() {
                "none".to_owned()
            } else {
                error_lines.join("; ")
            }
        );
        let json = json!({
            "seconds": seconds,
            "ops": ops,
            "figures": self.figures.iter().cloned().collect::<serde_json::Map<String, Value>>(),
            "servers": server_json,
            "errors": errors,
        });
        println!("{json}");
        json
    }
}

fn value_text(v: &Value) -> String {
    match v {
        Value::Number(n) => match n.as_f64() {
            Some(f) if f.fract() != 0.0 => format!("{f:.1}"),
            _ => n.to_string(),
        },
        Value::String(s) => s.clone(),
        other => other.to_string(),
    }
}
