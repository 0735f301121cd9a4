//! The OpenTelemetry eBPF profiler (`go.opentelemetry.io/ebpf-profiler`)
//! as tests run it: the binary scripts/test-services.sh builds from the Go
//! module proxy, unmodified, under `keep-memlock` (this crate's binary: it
//! answers the profiler's unconditional raise of RLIMIT_MEMLOCK, which
//! root without CAP_SYS_RESOURCE may not do, with success without acting;
//! BPF memory is charged to the memory cgroup on Linux ≥ 5.11).

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// The profiler binary: `$SYMTRACE_TEST_EBPF_PROFILER`, which
/// scripts/test-services.sh exports. `None` (a skip, a failure in CI) when
/// it is not there.
pub fn binary() -> Option<PathBuf> {
    let path = std::env::var_os("SYMTRACE_TEST_EBPF_PROFILER").map(PathBuf::from);
    let found = path.filter(|p| p.exists());
    if crate::require(
        found.is_some(),
        "the OpenTelemetry eBPF profiler ($SYMTRACE_TEST_EBPF_PROFILER, built by scripts/test-services.sh)",
    ) {
        found
    } else {
        None
    }
}

/// A running profiler with its output in a file; killed when dropped.
pub struct Profiler {
    child: Option<Child>,
    log: PathBuf,
    _dir: tempfile::TempDir,
}

/// What the profiler logs once its BPF programs are attached and it
/// samples.
const READY: &str = "Attached sched monitor";

impl Profiler {
    /// Starts `bin` sending to `collection_agent` (`HOST:PORT`, OTLP/gRPC
    /// without TLS) at `hz`, reporting every second, with `extra`
    /// arguments; waits until it samples.
    pub fn start(bin: &Path, collection_agent: &str, hz: u32, extra: &[&str]) -> Profiler {
        let dir = tempfile::tempdir().unwrap();
        let log = dir.path().join("profiler.log");
        let child = Command::new(crate::workspace_bin("keep-memlock"))
            .arg(bin)
            .args(["-collection-agent", collection_agent, "-disable-tls"])
            .args(["-samples-per-second", &hz.to_string()])
            .args(["-reporter-interval", "1s", "-reporter-jitter", "0"])
            .args(extra)
            .stdin(Stdio::null())
            .stdout(std::fs::File::create(&log).unwrap())
            .stderr(std::fs::OpenOptions::new().append(true).open(&log).unwrap())
            .spawn()
            .expect("spawn the eBPF profiler");
        let mut profiler = Profiler {
            child: Some(child),
            log,
            _dir: dir,
        };
        let deadline = Instant::now() + Duration::from_secs(120);
        loop {
            if profiler.log_text().contains(READY) {
                return profiler;
            }
            let exited = profiler.child.as_mut().unwrap().try_wait().unwrap();
            if let Some(status) = exited {
                panic!(
                    "the eBPF profiler exited with {status}:\n{}",
                    profiler.log_text()
                );
            }
            assert!(
                Instant::now() < deadline,
                "the eBPF profiler did not start sampling in 120 s:\n{}",
                profiler.log_text()
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// What it logged.
    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// Stops it (SIGTERM: it reports what it holds and exits) and waits.
    pub fn stop(&mut self) -> Option<std::process::ExitStatus> {
        let mut child = self.child.take()?;
        // SAFETY: signals our own child, not waited for yet.
        unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
        Some(child.wait().unwrap())
    }
}

impl Drop for Profiler {
    fn drop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}
