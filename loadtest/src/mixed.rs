//! The `mixed` scenario: exports, debuginfod traffic (with uploads) and
//! flamegraph and trace queries at once, as production sees them, over one
//! or several replicas; with `--verify`, every export and upload the
//! servers acknowledged is then looked up through every server still up.

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use crate::debuginfod::{Debuginfod, Ops};
use crate::generate::Zipf;
use crate::otlp::{export_name, Exporter, EXPORTS_SERVICE};
use crate::report::{Op, Report};
use crate::target::{classify, run, send_checked, Failure, Targets};

pub struct Queries {
    http: reqwest::Client,
    tenant: String,
    exporter: Arc<Exporter>,
    zipf: Zipf,
}

impl Queries {
    /// `services`: the fleet's, `service-0` … (see `Shape::services`).
    /// Trace lookups ask for recent exports' traces (`exporter`).
    pub fn new(tenant: &str, exporter: Arc<Exporter>, services: usize) -> anyhow::Result<Self> {
        Ok(Self {
            http: reqwest::Client::builder()
                .timeout(Duration::from_secs(60))
                .build()?,
            tenant: tenant.to_owned(),
            exporter,
            zipf: Zipf::new(services.max(1)),
        })
    }

    /// Even n: a flamegraph of the last minute of a (Zipf-chosen) service;
    /// odd n: the trace of a recent export.
    pub async fn request(&self, targets: &Targets, flamegraph: &Op, trace: &Op, n: u64) {
        let trace_id = self.exporter.recent_trace_id();
        let service = self.zipf.sample(&mut rand::rng());
        match trace_id {
            Some(id) if n % 2 == 1 => {
                let path = format!("/api/v1/traces/{id}");
                targets.send(trace, |url| self.get(url, &path)).await;
            }
            _ => {
                let path =
                    format!("/api/v1/flamegraph?service=service-{service}&from=now-1m&to=now");
                targets.send(flamegraph, |url| self.get(url, &path)).await;
            }
        }
    }

    async fn get(&self, url: String, path: &str) -> Result<u64, Failure> {
        let r = send_checked(
            self.http
                .get(format!("{url}{path}"))
                .header("X-Scope-OrgID", &self.tenant),
        )
        .await?;
        Ok(r.bytes().await.map_err(|e| classify(&e))?.len() as u64)
    }
}

pub struct Settings {
    pub duration: Duration,
    pub otlp_connections: usize,
    pub export_interval: Option<Duration>,
    pub debuginfod_connections: usize,
    /// Pause between debuginfod requests (None: as fast as answered).
    pub debuginfod_interval: Option<Duration>,
    pub miss_ratio: f64,
    pub upload_ratio: f64,
    pub query_connections: usize,
    pub query_interval: Duration,
}

/// Runs the three loads at once until `duration` ends.
pub async fn run_mixed(
    s: &Settings,
    targets: Arc<Targets>,
    exporter: Arc<Exporter>,
    debuginfod: Arc<Debuginfod>,
    queries: Arc<Queries>,
    report: &mut Report,
) -> Arc<Op> {
    let export = report.op("otlp", "export");
    let ops = Ops::new(report);
    let (flamegraph, trace) = (
        report.op("query", "flamegraph"),
        report.op("query", "trace"),
    );
    let otlp = {
        let (t, e, op) = (targets.clone(), exporter.clone(), export.clone());
        run(
            s.otlp_connections,
            s.duration,
            0,
            s.export_interval,
            move |n| {
                let (t, e, op) = (t.clone(), e.clone(), op.clone());
                async move { e.export(&t, &op, n).await }
            },
        )
    };
    let symbols = {
        let (t, d, ops) = (targets.clone(), debuginfod.clone(), ops.clone());
        let (miss, upload) = (s.miss_ratio, s.upload_ratio);
        run(
            s.debuginfod_connections,
            s.duration,
            0,
            s.debuginfod_interval,
            move |_| {
                let (t, d, ops) = (t.clone(), d.clone(), ops.clone());
                async move { d.request(&t, &ops, miss, upload).await }
            },
        )
    };
    let query = {
        let (t, q, e) = (targets.clone(), queries.clone(), exporter.clone());
        run(
            s.query_connections,
            s.duration,
            0,
            Some(s.query_interval),
            move |n| {
                let (t, q, f, tr) = (t.clone(), q.clone(), flamegraph.clone(), trace.clone());
                // Services exist once an export is stored (an unknown one is a 400).
                let stored = !e.acknowledged.lock().unwrap().is_empty();
                async move {
                    if stored {
                        q.request(&t, &f, &tr, n).await
                    }
                }
            },
        )
    };
    tokio::join!(otlp, symbols, query);
    export
}

/// What one server answered for the run's acknowledged data.
struct Verified {
    exports_found: usize,
    exports_missing: Vec<u64>,
    uploads_missing: Vec<String>,
}

impl Verified {
    fn good(&self) -> bool {
        self.exports_missing.is_empty() && self.uploads_missing.is_empty()
    }

    fn describe(&self) -> String {
        format!(
            "{} acknowledged exports found, {} missing{}; {} uploads missing{}",
            self.exports_found,
            self.exports_missing.len(),
            first(&self.exports_missing, 10),
            self.uploads_missing.len(),
            first(&self.uploads_missing, 5),
        )
    }
}

/// The first `n` items, for a report line ("" when there are none).
fn first<T: std::fmt::Debug>(items: &[T], n: usize) -> String {
    if items.is_empty() {
        String::new()
    } else {
        format!(" {:?}", &items[..items.len().min(n)])
    }
}

/// Verifies through every server that is up (see [`verify`]), one report
/// line each; false when something acknowledged is missing or no server
/// was up to ask.
pub async fn verify_all(
    urls: &[String],
    tenant: &str,
    exporter: &Exporter,
    debuginfod: &Debuginfod,
    from_ns: u64,
    report: &mut Report,
) -> anyhow::Result<bool> {
    let (mut checked, mut good) = (0, true);
    for url in urls {
        let line = match verify(url, tenant, exporter, debuginfod, from_ns).await? {
            Some(v) => {
                checked += 1;
                good &= v.good();
                v.describe()
            }
            None => "down: not checked".to_owned(),
        };
        report.figures.push((format!("verify {url}"), line.into()));
    }
    if checked == 0 {
        good = false;
        report
            .figures
            .push(("verify".to_owned(), "no server up to verify through".into()));
    }
    let verdict = if good {
        "yes"
    } else {
        "NO: acknowledged data missing"
    };
    report.figures.push(("verified".to_owned(), verdict.into()));
    Ok(good)
}

/// Looks every acknowledged export and upload up through one server;
/// None when it is down.
async fn verify(
    url: &str,
    tenant: &str,
    exporter: &Exporter,
    debuginfod: &Debuginfod,
    from_ns: u64,
) -> anyhow::Result<Option<Verified>> {
    let http = reqwest::Client::builder()
        .timeout(Duration::from_secs(300))
        .build()?;
    match http.get(format!("{url}/readyz")).send().await {
        Ok(r) if r.status().is_success() => {}
        _ => return Ok(None),
    }
    let r = http
        .get(format!(
            "{url}/api/v1/flamegraph?service={EXPORTS_SERVICE}&from={from_ns}&to=now&format=folded&max_nodes=100000"
        ))
        .header("X-Scope-OrgID", tenant)
        .send()
        .await?;
    anyhow::ensure!(
        r.status().is_success(),
        "{url}: the exports' flamegraph: {} {}",
        r.status(),
        r.text().await?
    );
    let folded = r.text().await?;
    let prefix = format!("{}-", export_name(exporter.run, 0).trim_end_matches("-0"));
    let stored: HashSet<u64> = folded
        .lines()
        .filter_map(|l| l.split(' ').next()?.strip_prefix(&prefix)?.parse().ok())
        .collect();
    let acknowledged = exporter.acknowledged.lock().unwrap().clone();
    let mut exports_missing: Vec<u64> = acknowledged
        .iter()
        .copied()
        .filter(|s| !stored.contains(s))
        .collect();
    exports_missing.sort_unstable();
    Ok(Some(Verified {
        exports_found: acknowledged.len() - exports_missing.len(),
        exports_missing,
        uploads_missing: debuginfod.missing_uploads(url).await?,
    }))
}
