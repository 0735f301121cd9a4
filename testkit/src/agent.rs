//! A real `symtrace-agent` for tests: its BPF program loaded into this
//! kernel (root and BTF needed; missing under `CI=true` is a failure).

use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus};
use std::time::{Duration, Instant};

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
    /// Starts `bin` against `grpc_addr` at 97 Hz, exporting every second
    /// with `--stats`, and waits until it samples and has read the running
    /// processes.
    pub fn start(bin: &Path, grpc_addr: &str, extra: &[&str]) -> Agent {
        let dir = tempfile::tempdir().unwrap();
        let (stdout, stderr) = (dir.path().join("stdout"), dir.path().join("stderr"));
        let child = Command::new(bin)
            .args(["--server", &format!("http://{grpc_addr}")])
            .args(["--frequency", "97", "--interval", "1s", "--stats"])
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
        let deadline = Instant::now() + Duration::from_secs(30);
        while !agent.stderr().contains("running processes in") {
            if let Some(status) = agent.child.as_mut().unwrap().try_wait().unwrap() {
                panic!("agent exited with {status}:\n{}", agent.stderr());
            }
            assert!(
                Instant::now() < deadline,
                "agent did not start:\n{}",
                agent.stderr()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
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

    /// SIGTERM, then wait for the exit (it flushes and reports).
    pub fn stop(&mut self) -> ExitStatus {
        let mut child = self.child.take().unwrap();
        // SAFETY: kill has no memory preconditions.
        unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            if let Some(status) = child.try_wait().unwrap() {
                return status;
            }
            assert!(
                Instant::now() < deadline,
                "agent did not stop:\n{}",
                self.stderr()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
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
