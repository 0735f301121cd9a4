//! The OpenTelemetry Collector as tests run it: the minimal distribution
//! `scripts/test-services.sh` builds from the Go module proxy
//! (`testkit/peers/otelcol`: the OTLP receiver, the OTLP gRPC and HTTP
//! exporters), with profiles on (`--feature-gates=+service.profilesSupport`),
//! its receiver on loopback, its exporters pointed at a symtrace server.

use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// Where one exporter of the Collector sends what it receives.
#[derive(Debug, Clone)]
pub enum Export {
    /// OTLP/gRPC to `endpoint` (`HOST:PORT`), with this tenant
    /// (`X-Scope-OrgID`).
    Grpc {
        /// `HOST:PORT`.
        endpoint: String,
        /// The `X-Scope-OrgID` the exporter sends.
        tenant: String,
    },
    /// OTLP/HTTP to `endpoint` (`http://HOST:PORT`), with this tenant.
    Http {
        /// `http://HOST:PORT`.
        endpoint: String,
        /// The `X-Scope-OrgID` the exporter sends.
        tenant: String,
    },
}

/// A running Collector; killed when dropped.
pub struct Collector {
    child: Option<Child>,
    bin: PathBuf,
    config: PathBuf,
    /// Its OTLP receiver's gRPC address, `HOST:PORT`.
    pub grpc_addr: String,
    /// Its OTLP receiver's HTTP address, `http://HOST:PORT`.
    pub http_url: String,
    log: PathBuf,
    _dir: tempfile::TempDir,
}

/// The Collector binary: `$SYMTRACE_TEST_OTELCOL`, which
/// scripts/test-services.sh exports. `None` (a skip, a failure in CI) when
/// it is not there.
pub fn binary() -> Option<PathBuf> {
    let path = std::env::var_os("SYMTRACE_TEST_OTELCOL").map(PathBuf::from);
    let found = path.filter(|p| p.exists());
    if crate::require(
        found.is_some(),
        "the OpenTelemetry Collector ($SYMTRACE_TEST_OTELCOL, built by scripts/test-services.sh)",
    ) {
        found
    } else {
        None
    }
}

/// The Collector's configuration: its receiver on `grpc` and `http`, an
/// exporter per `exports`, each exporter's sending queue on disk under
/// `queue` (contrib's `file_storage`) if given, else in memory (the
/// default, lost with the process).
fn config(grpc: &str, http: &str, exports: &[Export], queue: Option<&Path>) -> String {
    let mut exporters = String::new();
    let mut names = Vec::new();
    for (i, e) in exports.iter().enumerate() {
        let (kind, endpoint, tenant, tls) = match e {
            Export::Grpc { endpoint, tenant } => (
                "otlp_grpc",
                endpoint,
                tenant,
                "\n    tls:\n      insecure: true",
            ),
            Export::Http { endpoint, tenant } => ("otlp_http", endpoint, tenant, ""),
        };
        let name = format!("{kind}/e{i}");
        let storage = if queue.is_some() {
            "\n    sending_queue:\n      storage: file_storage"
        } else {
            ""
        };
        exporters.push_str(&format!(
            "  {name}:\n    endpoint: {endpoint}{tls}\n    headers:\n      X-Scope-OrgID: {tenant}{storage}\n"
        ));
        names.push(name);
    }
    let (extensions, service_extensions) = match queue {
        Some(dir) => (
            format!(
                "extensions:\n  file_storage:\n    directory: {}\n",
                dir.display()
            ),
            "  extensions: [file_storage]\n",
        ),
        None => (String::new(), ""),
    };
    format!(
        "receivers:\n  otlp:\n    protocols:\n      grpc:\n        endpoint: {grpc}\n      http:\n        endpoint: {http}\n\
         {extensions}\
         exporters:\n{exporters}\
         service:\n{service_extensions}  telemetry:\n    metrics:\n      level: none\n  pipelines:\n    profiles:\n      receivers: [otlp]\n      exporters: [{}]\n",
        names.join(", ")
    )
}

impl Collector {
    /// Starts `bin` exporting to `exports`; waits until its receiver
    /// accepts connections.
    pub fn start(bin: &Path, exports: &[Export]) -> Collector {
        Collector::start_with(bin, exports, None)
    }

    /// [`Collector::start`], each exporter's sending queue kept on disk
    /// under `queue` (a directory) if given.
    pub fn start_with(bin: &Path, exports: &[Export], queue: Option<&Path>) -> Collector {
        let dir = tempfile::tempdir().unwrap();
        let log = dir.path().join("otelcol.log");
        let config_path = dir.path().join("config.yaml");
        // Ports picked free, then bound by the Collector: another process
        // may take one in between, so a start that fails is tried again.
        for _ in 0..3 {
            let grpc = format!("127.0.0.1:{}", crate::free_port());
            let http = format!("127.0.0.1:{}", crate::free_port());
            std::fs::write(&config_path, config(&grpc, &http, exports, queue)).unwrap();
            if let Some(child) = spawn(bin, &config_path, &log, &grpc, &http) {
                return Collector {
                    child: Some(child),
                    bin: bin.to_owned(),
                    config: config_path,
                    grpc_addr: grpc,
                    http_url: format!("http://{http}"),
                    log,
                    _dir: dir,
                };
            }
        }
        panic!(
            "the Collector did not start:\n{}",
            std::fs::read_to_string(&log).unwrap_or_default()
        );
    }

    /// What it logged.
    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// Kills it (SIGKILL: a crash; it drains nothing) and waits.
    pub fn kill9(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Starts it again after [`Collector::kill9`] or [`Collector::stop`],
    /// with the same configuration (ports, exporters, queue directory).
    pub fn restart(&mut self) {
        assert!(self.child.is_none(), "the Collector is running");
        let grpc = self.grpc_addr.clone();
        let http = self.http_url.trim_start_matches("http://").to_owned();
        let child = spawn(&self.bin, &self.config, &self.log, &grpc, &http);
        self.child =
            Some(child.unwrap_or_else(|| {
                panic!("the Collector did not start again:\n{}", self.log_text())
            }));
    }

    /// Stops it (SIGTERM: it drains what it holds, as it does on a
    /// shutdown), and waits.
    pub fn stop(&mut self) -> Option<std::process::ExitStatus> {
        let mut child = self.child.take()?;
        // SAFETY: signals our own child, not waited for yet.
        unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
        Some(child.wait().unwrap())
    }
}

impl Drop for Collector {
    fn drop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// Starts the Collector on `config`; the process once its receiver is up
/// (`None`: it exited, e.g. a port was taken).
fn spawn(bin: &Path, config: &Path, log: &Path, grpc: &str, http: &str) -> Option<Child> {
    let mut child = Command::new(bin)
        .arg("--config")
        .arg(config)
        .arg("--feature-gates=+service.profilesSupport")
        .stdout(Stdio::null())
        .stderr(
            std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(log)
                .unwrap(),
        )
        .spawn()
        .expect("spawn the Collector");
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            eprintln!(
                "the Collector exited with {status}:\n{}",
                std::fs::read_to_string(log).unwrap_or_default()
            );
            return None;
        }
        if TcpStream::connect(grpc).is_ok() && TcpStream::connect(http).is_ok() {
            return Some(child);
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            panic!(
                "the Collector's receiver did not come up:\n{}",
                std::fs::read_to_string(log).unwrap_or_default()
            );
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}
