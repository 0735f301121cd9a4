//! The CPU-split workload (`agent/tests/workload/cpu_split.c`, and the
//! Rust example of the same shape): two threads burning measured amounts
//! of their own CPU time in `alpha_work` and `beta_work`, and the checks
//! that a profiler's flamegraph shows that split.

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use crate::Server;

/// Runs a workload; returns the thread CPU seconds it measured for
/// alpha_work and beta_work.
pub fn run_workload(bin: &Path, service: &str, alpha: f64, beta: f64) -> (f64, f64) {
    let mut cmd = Command::new(bin);
    cmd.args([alpha.to_string(), beta.to_string()]);
    let out = crate::run(cmd.env("OTEL_SERVICE_NAME", service).stdin(Stdio::null()));
    measured(&out.stdout)
}

/// [`run_workload`], the C workload burning in `warm_up` until `sampled`
/// says a profiler's samples of it arrived (at most 60 s): for a profiler
/// that learns of a process some time after it starts, the later the
/// busier the machine (the OpenTelemetry eBPF profiler), the measured part
/// then is all sampled. Only the C workload takes it.
pub fn run_workload_gated(
    bin: &Path,
    service: &str,
    alpha: f64,
    beta: f64,
    mut sampled: impl FnMut() -> bool,
) -> (f64, f64) {
    use std::io::Write;
    let mut child = Command::new(bin)
        .args([alpha.to_string(), beta.to_string(), "-".into()])
        .env("OTEL_SERVICE_NAME", service)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("{}: {e}", bin.display()));
    let seen = crate::wait::wait_until_ok(Duration::from_secs(60), || {
        if sampled() {
            Ok(())
        } else {
            Err(String::new())
        }
    });
    // Let go either way: a profiler that never sampled it fails the
    // caller's checks, with what it did sample.
    let mut stdin = child.stdin.take().unwrap();
    let _ = writeln!(stdin, "go");
    drop(stdin);
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success(), "{}: {out:?}", bin.display());
    if seen.is_err() {
        eprintln!("{service}: no profiler sample of the warm-up within 60 s");
    }
    measured(&out.stdout)
}

/// The thread CPU seconds the workload printed for alpha_work and
/// beta_work.
fn measured(stdout: &[u8]) -> (f64, f64) {
    let text = String::from_utf8_lossy(stdout);
    let used = |name: &str| -> f64 {
        text.lines()
            .find_map(|l| l.strip_prefix(name)?.trim().parse().ok())
            .unwrap_or_else(|| panic!("{name} in workload output: {text}"))
    };
    (used("alpha_work "), used("beta_work "))
}

/// The service's CPU flamegraph in `tenant` (the default one if `None`),
/// folded, root first: (frames, samples). Empty until the service is
/// known.
pub fn folded_in(server: &Server, tenant: Option<&str>, service: &str) -> Vec<(String, u64)> {
    folded_selected(server, tenant, service, "")
}

/// [`folded_in`] of the samples a label `selector` (`{name="v"}`, empty
/// for all) picks.
pub fn folded_selected(
    server: &Server,
    tenant: Option<&str>,
    service: &str,
    selector: &str,
) -> Vec<(String, u64)> {
    let mut req = crate::client()
        .get(format!("{}/api/v1/flamegraph", server.url))
        .query(&[
            ("service", service),
            ("format", "folded"),
            ("from", "now-1h"),
            ("to", "now"),
        ]);
    if !selector.is_empty() {
        req = req.query(&[("selector", selector)]);
    }
    if let Some(t) = tenant {
        req = req.header("X-Scope-OrgID", t);
    }
    let resp = req.send().unwrap();
    let status = resp.status();
    let text = resp.text().unwrap();
    if status != 200 {
        // Not ingested yet: the service is unknown. Any other error is
        // the test's own.
        assert!(
            text.contains("unknown service"),
            "{service} {selector}: {status} {text}"
        );
        return Vec::new();
    }
    crate::folded(&text)
}

/// Waits until `done` holds for [`folded_selected`]'s stacks, or
/// `timeout` passes; returns the last stacks read.
pub fn wait_for_selected(
    server: &Server,
    tenant: Option<&str>,
    service: &str,
    selector: &str,
    timeout: Duration,
    done: impl Fn(&[(String, u64)]) -> bool,
) -> Vec<(String, u64)> {
    let deadline = Instant::now() + timeout;
    loop {
        let stacks = folded_selected(server, tenant, service, selector);
        if done(&stacks) || Instant::now() > deadline {
            return stacks;
        }
        std::thread::sleep(Duration::from_millis(500));
    }
}

/// Whether a folded stack holds function `f` (a Rust frame may carry its
/// module path).
pub fn holds(frames: &str, f: &str) -> bool {
    frames
        .split(';')
        .any(|frame| frame == f || frame.ends_with(&format!("::{f}")))
}

/// Samples under alpha_work and under beta_work.
pub fn split(stacks: &[(String, u64)]) -> (u64, u64) {
    let (mut alpha, mut beta) = (0, 0);
    for (frames, n) in stacks {
        if holds(frames, "alpha_work") {
            alpha += n;
        } else if holds(frames, "beta_work") {
            beta += n;
        }
    }
    (alpha, beta)
}

/// Waits until the flamegraph holds the samples the workload's CPU time
/// is due (`expected`), or holds most of them and has stopped growing for
/// three seconds (the workload has exited, so a count that stands still
/// is complete), or `timeout` passes; returns the split. Returning at a
/// fraction of `expected` would skew it: the samples arrive in time
/// order, and the workload's last stretch runs alpha_work alone.
pub fn wait_for_split(
    server: &Server,
    tenant: Option<&str>,
    service: &str,
    expected: f64,
    timeout: Duration,
) -> (u64, u64) {
    let deadline = Instant::now() + timeout;
    let mut last = (0, Instant::now());
    loop {
        let (a, b) = split(&folded_in(server, tenant, service));
        let n = a + b;
        if n != last.0 {
            last = (n, Instant::now());
        }
        let settled = n as f64 >= 0.6 * expected && last.1.elapsed() >= Duration::from_secs(3);
        if n as f64 >= 0.98 * expected || settled || Instant::now() > deadline {
            return (a, b);
        }
        std::thread::sleep(Duration::from_millis(500));
    }
}

/// Asserts the profile's split is the measured CPU-time split ±10 points
/// and that most of the samples due at `hz` arrived.
pub fn assert_split(what: &str, hz: f64, (alpha, beta): (u64, u64), (a, b): (f64, f64)) {
    let expected_samples = (a + b) * hz;
    let samples = (alpha + beta) as f64;
    assert!(
        samples >= 0.6 * expected_samples,
        "{what}: {samples} samples for {:.2} CPU seconds at {hz} Hz (expected about {expected_samples:.0})",
        a + b
    );
    let expected = a / (a + b);
    let share = alpha as f64 / samples;
    assert!(
        (share - expected).abs() <= 0.10,
        "{what}: alpha_work has {:.1}% of the samples ({alpha} vs beta_work {beta}); its thread CPU time share is {:.1}%",
        share * 100.0,
        expected * 100.0
    );
}

/// Builds the C workload as the agent's tests do (clang with frame
/// pointers in leaf functions too, no sibling calls) at `out`.
pub fn build_c_workload(out: &Path) {
    let source = Path::new(env!("CARGO_MANIFEST_DIR")).join("../agent/tests/workload/cpu_split.c");
    crate::agent::clang_with_frame_pointers(out, &[source], &[]);
}
