//! A real `symtrace-agent` for tests: its BPF program loaded into this
//! kernel (root and BTF needed; missing under `CI=true` is a failure).

use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus};
use std::time::Duration;

use serde_json::Value;

use crate::Server;

/// Whether BPF programs can be loaded here: root and kernel BTF.
pub fn bpf_available() -> bool {
    // SAFETY: geteuid has no preconditions.
    let root = unsafe { libc::geteuid() } == 0;
    crate::require(root, "root (to load BPF programs)")
        && crate::require(
            Path::new("/sys/kernel/btf/vmlinux").exists(),
            "kernel BTF (/sys/kernel/btf/vmlinux)",
        )
}

static ONE_AT_A_TIME: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// Held by a test that runs an agent and CPU-bound workloads: one such test
/// at a time per test binary. On 2 CPUs several at once starve the agents
/// of the CPU they need to register new processes in time (a process's
/// trace contexts are read from the sample after its registration).
pub fn one_at_a_time() -> std::sync::MutexGuard<'static, ()> {
    ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner())
}

/// The start of a test that runs an agent: `None` (a skip, or a failure
/// under CI) when BPF or one of `tools` is missing, else the guard of
/// [`one_at_a_time`].
pub fn bpf_test(tools: &[&str]) -> Option<std::sync::MutexGuard<'static, ()>> {
    if !bpf_available() || !tools.iter().all(|t| crate::have(t)) {
        return None;
    }
    Some(one_at_a_time())
}

/// A running `symtrace-agent` with its output in files.
pub struct Agent {
    child: Option<Child>,
    stdout: PathBuf,
    stderr: PathBuf,
    _dir: tempfile::TempDir,
}

impl Agent {
    /// [`Self::start`] publishing the binaries `server` lacks to it, fast
    /// (256 MiB/s), files up to `max_bytes` (the test's own binaries are
    /// sampled too; the bound keeps the big ones out).
    pub fn start_publishing(bin: &Path, server: &Server, max_bytes: u64) -> Agent {
        Agent::start(
            bin,
            &server.grpc_addr,
            &[
                "--upload-url",
                &server.url,
                "--upload-bytes-per-second",
                "268435456",
                "--upload-max-file-bytes",
                &max_bytes.to_string(),
            ],
        )
    }

    /// Starts `bin` against `grpc_addr` at 97 Hz, exporting every second
    /// with `--stats`, and waits until it samples and has read the running
    /// processes. It publishes no binaries unless `extra` says where
    /// (`--upload-url`): a test's server holds what the test uploads.
    pub fn start(bin: &Path, grpc_addr: &str, extra: &[&str]) -> Agent {
        let dir = tempfile::tempdir().unwrap();
        let (stdout, stderr) = (dir.path().join("stdout"), dir.path().join("stderr"));
        let uploads: &[&str] = if extra.contains(&"--upload-url") {
            &[]
        } else {
            &["--no-upload-binaries"]
        };
        let child = Command::new(bin)
            .args(["--server", &format!("http://{grpc_addr}")])
            .args(["--frequency", "97", "--interval", "1s", "--stats"])
            .args(uploads)
            .args(extra)
            .env("RUST_LOG", "info,symtrace_agent=debug")
            .env("NO_COLOR", "1")
            .stdout(std::fs::File::create(&stdout).unwrap())
            .stderr(std::fs::File::create(&stderr).unwrap())
            .spawn()
            .expect("spawn symtrace-agent");
        let mut agent = Agent {
            child: Some(child),
            stdout,
            stderr,
            _dir: dir,
        };
        // A deadline for an agent that never starts, not a speed: loading
        // and verifying the BPF programs is CPU-bound, and took 28.5 s on
        // this 2-core machine beside a release build (the agent logs it:
        // "BPF loaded and attached in …").
        let started = crate::wait_until_ok(Duration::from_secs(120), || {
            if let Some(status) = agent.child.as_mut().unwrap().try_wait().unwrap() {
                panic!("agent exited with {status}:\n{}", agent.stderr());
            }
            match agent.stderr().contains("running processes in") {
                true => Ok(()),
                false => Err(()),
            }
        });
        assert!(started.is_ok(), "agent did not start:\n{}", agent.stderr());
        agent
    }

    /// The agent's process ID.
    pub fn pid(&self) -> u32 {
        self.child.as_ref().map_or(0, |c| c.id())
    }

    /// Everything the agent has written to stderr (its log) so far.
    pub fn stderr(&self) -> String {
        std::fs::read_to_string(&self.stderr).unwrap_or_default()
    }

    /// Everything the agent has written to stdout so far: its `stats:` lines,
    /// and `total:` once stopped.
    pub fn stdout(&self) -> String {
        std::fs::read_to_string(&self.stdout).unwrap_or_default()
    }

    /// The last line starting with `prefix` (`stats:` or `total:`).
    pub fn last_line(&self, prefix: &str) -> Option<String> {
        self.stdout()
            .lines()
            .rev()
            .find(|l| l.starts_with(prefix))
            .map(str::to_owned)
    }

    /// The address the agent serves `/healthz` on (`--health-addr`, from
    /// its log), waiting up to 10 s for it.
    pub fn health_addr(&self) -> String {
        let addr = crate::wait_until_ok(Duration::from_secs(10), || {
            self.stderr()
                .lines()
                .find(|l| l.contains("serving /healthz"))
                .and_then(|l| l.split("addr=").nth(1))
                .and_then(|a| a.split_whitespace().next())
                .map(str::to_owned)
                .ok_or(())
        });
        addr.unwrap_or_else(|()| panic!("no /healthz address:\n{}", self.stderr()))
    }

    /// SIGTERM, then wait for the exit (it flushes and reports).
    pub fn stop(&mut self) -> ExitStatus {
        let mut child = self.child.take().unwrap();
        // SAFETY: kill has no memory preconditions.
        unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
        let stopped = crate::wait_until_ok(Duration::from_secs(30), || {
            child.try_wait().unwrap().ok_or(())
        });
        stopped.unwrap_or_else(|()| panic!("agent did not stop:\n{}", self.stderr()))
    }
}

impl Drop for Agent {
    fn drop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// The number after `label` in a stats line ("dropped 12 samples").
pub fn number_after(line: &str, label: &str) -> u64 {
    let at = line
        .find(label)
        .unwrap_or_else(|| panic!("{label:?} in {line}"));
    line[at + label.len()..]
        .trim_start()
        .split(|c: char| !c.is_ascii_digit())
        .next()
        .unwrap()
        .parse()
        .unwrap_or_else(|_| panic!("number after {label:?} in {line}"))
}

/// Builds a C workload the way the agent needs it: clang-19 with frame
/// pointers in leaf functions too and no sibling calls (so every caller
/// shows), debug info, pthreads; `extra` goes after the sources.
pub fn clang_with_frame_pointers(out: &Path, sources: &[PathBuf], extra: &[&str]) {
    crate::run(
        Command::new("clang-19")
            .args([
                "-O1",
                "-g",
                "-fno-omit-frame-pointer",
                "-mno-omit-leaf-frame-pointer",
            ])
            .args(["-fno-optimize-sibling-calls", "-pthread"])
            .args(sources)
            .args(extra)
            .arg("-o")
            .arg(out),
    );
}

/// The service's CPU flamegraph, folded (root first): (frames, samples).
pub fn folded(server: &Server, service: &str) -> Vec<(String, u64)> {
    crate::split::folded_in(server, None, service)
}

/// The fields of the service's CPU flamegraph nodes named `name` (JSON
/// format). Read out of the text: a JSON tree of a deep stack (node's are
/// 50 frames deep) is beyond serde_json's recursion limit.
pub fn tree_nodes(server: &Server, service: &str, name: &str) -> Vec<Value> {
    let url = format!(
        "{}/api/v1/flamegraph?service={service}&from=now-1h&to=now",
        server.url
    );
    let resp = crate::client().get(url).send().unwrap();
    assert_eq!(resp.status(), 200);
    let text = resp.text().unwrap();
    let needle = format!("\"name\":{}", Value::from(name));
    text.match_indices(&needle)
        .filter_map(|(at, _)| {
            let start = text[..at].rfind('{')?;
            let end = at + text[at..].find(",\"children\":[")?;
            serde_json::from_str(&format!("{}}}", &text[start..end])).ok()
        })
        .collect()
}

/// Samples of stacks holding `frame`.
pub fn samples_with(stacks: &[(String, u64)], frame: &str) -> u64 {
    stacks
        .iter()
        .filter(|(s, _)| s.split(';').any(|f| f == frame))
        .map(|(_, n)| n)
        .sum()
}

/// Waits until `done` holds for the service's folded stacks (or 30 s).
pub fn wait_for(
    server: &Server,
    service: &str,
    done: impl Fn(&[(String, u64)]) -> bool,
) -> Vec<(String, u64)> {
    crate::split::wait_for_selected(server, None, service, "", Duration::from_secs(30), done)
}

/// The 40 heaviest stacks, one per line, for assertion messages.
pub fn summary(stacks: &[(String, u64)]) -> String {
    let mut lines: Vec<String> = stacks.iter().map(|(f, n)| format!("{n:>6} {f}")).collect();
    lines.sort();
    lines.reverse();
    lines.truncate(40);
    lines.join("\n")
}

/// The `go` on the PATH's minor version (`go1.26.8`: 26).
pub fn go_minor_version() -> u32 {
    let out = crate::run(Command::new("go").args(["env", "GOVERSION"]));
    let version = String::from_utf8(out.stdout).unwrap();
    version
        .trim()
        .strip_prefix("go1.")
        .and_then(|v| v.split(['.', 'r', 'b']).next()?.parse().ok())
        .unwrap_or_else(|| panic!("go env GOVERSION: {version:?}"))
}

/// `go build -ldflags=…` flags that leave out the GNU build-ID: Go 1.26
/// derives one from Go's by default; `-B none` builds what older
/// toolchains make (Go's build-ID only).
pub fn go_without_gnu_build_id(ldflags: &str) -> String {
    let none = if go_minor_version() >= 26 {
        " -B none"
    } else {
        ""
    };
    format!("-ldflags={ldflags}{none}")
}

/// Builds the Go workload (`agent/tests/workload/gowork`) at `out` with
/// the `go` on the PATH: `go build` with `flags`, its caches under `dir`.
pub fn go_build(dir: &Path, out: &Path, flags: &[&str]) {
    let source = Path::new(env!("CARGO_MANIFEST_DIR")).join("../agent/tests/workload/gowork");
    crate::run(
        Command::new("go")
            .arg("build")
            .args(flags)
            .arg("-o")
            .arg(out)
            .arg(".")
            .current_dir(source)
            .env("GOCACHE", dir.join("gocache"))
            .env("GOPATH", dir.join("gopath"))
            .env("GOFLAGS", "-buildvcs=false")
            .env("GO111MODULE", "on"),
    );
}

/// Stacks the agent walked before their process's unwind ranges were set
/// and could not make whole from their stack's copy (the copy failed or
/// was skipped, or its walk did not reach the stack's end), so far, on
/// the whole host (its latest stats line): a new process's first samples,
/// walked by frame pointer alone (longer on a busy machine).
pub fn walks_early(agent: &Agent) -> u64 {
    let e = early_walks(agent);
    e.early.saturating_sub(e.copied) + e.not_whole
}

/// The agent's counts, so far on the whole host (its latest stats line;
/// all 0 before the first), of the stacks it walked before their
/// process's unwind ranges were set, and of their copies.
#[derive(Debug, Default, Clone, Copy)]
pub struct EarlyWalks {
    /// Stacks walked before their process's unwind ranges were set.
    pub early: u64,
    /// Of those, the stacks copied.
    pub copied: u64,
    /// Of the copies, those walked whole from the copy.
    pub whole: u64,
    /// Of the copies, those whose walk did not reach the stack's end.
    pub not_whole: u64,
}

/// The agent's [`EarlyWalks`] so far.
pub fn early_walks(agent: &Agent) -> EarlyWalks {
    agent
        .last_line("stats:")
        .map_or_else(EarlyWalks::default, |l| {
            let early = number_after(&l, "stacks walked before their process's ranges");
            EarlyWalks {
                early,
                copied: number_after(&l, &format!("ranges {early} (")),
                whole: number_after(&l, "with their stack copied:"),
                not_whole: number_after(&l, "walked whole from it,"),
            }
        })
}

/// `ok` of `n` samples right, but for `early` the agent walked before
/// their process's unwind ranges were set ([`walks_early`]: counted on the
/// whole host, so at most what the run missed is excused): the share right
/// with the excuse, and the excuse used. The excuse is for a new process's
/// first moments, never for a run whose ranges did not come: it must be at
/// most half of `n` (`evidence` follows the failure's first line).
pub fn excuse_early(
    what: &str,
    ok: u64,
    n: u64,
    early: u64,
    evidence: impl FnOnce() -> String,
) -> (f64, u64) {
    let early = early.min(n - ok.min(n));
    assert!(
        early * 2 <= n,
        "{what}: {early} of {n} samples walked before the process's unwind ranges were set\n{}",
        evidence()
    );
    ((ok + early) as f64 / n.max(1) as f64, early)
}

/// The agent's unwinding counters (from its latest stats line), and the
/// most frequent of `stacks`: what a failed stack check prints after its
/// first line.
pub fn evidence(agent: &Agent, stacks: &[(Vec<String>, u64)]) -> String {
    let line = agent.last_line("stats:").unwrap_or_default();
    let unwinding = line
        .find("unwinding:")
        .map(|at| &line[at..])
        .map(|rest| &rest[..rest.find(" | memory").unwrap_or(rest.len())])
        .unwrap_or("(no stats line)");
    let mut top: Vec<&(Vec<String>, u64)> = stacks.iter().collect();
    top.sort_by_key(|(_, n)| std::cmp::Reverse(*n));
    let top: Vec<String> = top
        .iter()
        .take(8)
        .map(|(s, n)| format!("{n} {}", s.join(";")))
        .collect();
    format!("agent: {unwinding}\ntop stacks:\n{}", top.join("\n"))
}
