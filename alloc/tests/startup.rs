//! Allocations a process makes in its first milliseconds are in the in-use
//! profile (issue #38), real BPF as root, the agent started first:
//! - a C program under the preload library, the first process ever to map
//!   it: the agent attached to the library at start
//!   (`--memory-probe-files`, a directory);
//! - a Rust program with `SampledAllocator`, not named: its first run makes
//!   the agent attach to the executable, which stays attached when the run
//!   ends, so the second run is covered from its first allocation.
//!
//! - the C program again, its churn of small blocks (thousands of records
//!   in milliseconds, past the agent's rate bound) run just before its
//!   large blocks: the thinning a burst of small records brings must not
//!   reach the large ones (a CI run saw 116% when a previous process's
//!   churn thinned the Rust program's first records).
//!
//! Each keeps 64 × 1 MiB live from the first lines of `main`
//! (`hold_at_start`); ≥ 95% of it must be in `inuse_space`, under
//! `hold_at_start`.

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use symtrace_testkit::agent::{bpf_test, clang_with_frame_pointers, number_after, Agent};
use symtrace_testkit::{self as kit, Backend, Server};

mod common;

const INUSE: &str = "inuse_space:bytes::";
/// 8 KiB between samples: 64 MiB live is ~8,192 sample points, so the
/// estimate's standard error is ~1.1% and a 95% bound is 4.5 of them away.
const INTERVAL: &str = "8192";

/// Starts `cmd` (its arguments given: the linger first) for `service`; returns it (lingering with its blocks live)
/// and the bytes it says it holds.
fn run(cmd: &mut Command, service: &str) -> (Child, f64) {
    let mut child = cmd
        .env("OTEL_SERVICE_NAME", service)
        .env("OTEL_MEMORY_SAMPLING_INTERVAL", INTERVAL)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .spawn()
        .expect("start the program");
    let mut out = BufReader::new(child.stdout.take().unwrap());
    let mut text = String::new();
    loop {
        let mut line = String::new();
        assert!(
            out.read_line(&mut line).unwrap() > 0,
            "ended before ready: {text}"
        );
        text.push_str(&line);
        if line.trim() == "ready" {
            break;
        }
    }
    let held = text
        .lines()
        .find_map(|l| l.strip_prefix("held "))
        .and_then(|n| n.trim().parse().ok())
        .unwrap_or_else(|| panic!("no `held` in {text}"));
    (child, held)
}

fn is(frame: &str, name: &str) -> bool {
    frame == name || frame.ends_with(&format!("::{name}"))
}

/// In-use bytes of `service` under `function`, once they reach `want`
/// (or 30 s passed), and the whole profile for messages.
fn in_use_under(server: &Server, service: &str, function: &str, want: f64) -> (f64, String) {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let resp = server.get(&format!(
            "/api/v1/flamegraph?service={service}&type={INUSE}&from=now-1h&to=now&format=folded"
        ));
        let text = if resp.status() == 200 {
            resp.text().unwrap()
        } else {
            String::new()
        };
        let stacks: Vec<(String, f64)> = kit::folded(&text);
        let under: f64 = stacks
            .iter()
            .filter(|(s, _)| s.split(';').any(|f| is(f, function)))
            .map(|(_, n)| *n)
            .sum();
        if under >= want || Instant::now() > deadline {
            return (under, text);
        }
        std::thread::sleep(Duration::from_millis(500));
    }
}

fn assert_covered(server: &Server, what: &str, service: &str, held: f64) {
    let (under, profile) = in_use_under(server, service, "hold_at_start", 0.95 * held);
    eprintln!("{what}: {under:.0} of {held:.0} bytes held from the start in inuse_space");
    assert!(
        under >= 0.95 * held && under <= 1.05 * held,
        "{what}: {under:.0} bytes in use under hold_at_start, it holds {held:.0} (want 95%..105%):\n{profile}"
    );
}

#[test]
fn allocations_from_the_first_milliseconds_are_in_use() {
    let Some(_one) = bpf_test(&["clang-19", "make"]) else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let libs = dir.path().join("lib");
    std::fs::create_dir(&libs).unwrap();
    let lib = common::build_preload(&libs);
    let c = dir.path().join("startup_alloc");
    let source = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/c/startup_alloc.c");
    clang_with_frame_pointers(&c, &[source], &[]);
    let rust = kit::target_dir().join("examples/startup_alloc");
    assert!(
        rust.exists(),
        "{} (cargo test builds the examples)",
        rust.display()
    );
    let server = Server::start(&Backend::local(), &[]);
    for bin in [&c, &rust] {
        server.upload(&kit::build_id_of(bin), "debuginfo", bin);
    }
    let mut agent = Agent::start(
        &kit::workspace_bin("symtrace-agent"),
        &server.grpc_addr,
        &["--memory-probe-files", libs.to_str().unwrap()],
    );
    // Attached at start, before any process mapped it.
    assert!(
        agent
            .stderr()
            .lines()
            .any(|l| l.contains("otel_memory probes attached") && l.contains("named=true")),
        "{}",
        agent.stderr()
    );

    // The C program: the library's first process.
    let service = kit::unique("startup-c-");
    let (mut child, held) = run(Command::new(&c).arg("6").env("LD_PRELOAD", &lib), &service);
    assert_covered(&server, "C, preload library named", &service, held);
    child.kill().unwrap();
    child.wait().unwrap();

    // Small records past the rate bound just before the large ones.
    let service = kit::unique("startup-c-churn-first-");
    let (mut child, held) = run(
        Command::new(&c)
            .args(["6", "churn-first"])
            .env("LD_PRELOAD", &lib),
        &service,
    );
    assert_covered(&server, "C, churn first", &service, held);
    child.kill().unwrap();
    child.wait().unwrap();

    // The Rust program: a first run the agent finds (a few ms late), then
    // a second one, covered from its start by the attachment kept.
    let first = kit::unique("startup-rust-first-");
    let (mut child, _) = run(Command::new(&rust).arg("6"), &first);
    let name = rust.file_name().unwrap().to_str().unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    while !agent
        .stderr()
        .lines()
        .any(|l| l.contains("otel_memory probes attached") && l.contains(name))
    {
        assert!(Instant::now() < deadline, "{}", agent.stderr());
        std::thread::sleep(Duration::from_millis(50));
    }
    child.kill().unwrap();
    child.wait().unwrap();
    let service = kit::unique("startup-rust-");
    let (mut child, held) = run(Command::new(&rust).arg("6"), &service);
    assert_covered(&server, "Rust, second run", &service, held);
    child.kill().unwrap();
    child.wait().unwrap();
    assert!(agent.stop().success(), "{}", agent.stderr());
    // The churns were past the rate bound: the large blocks' coverage
    // above held with thinning in force.
    let totals = agent.last_line("total:").expect("the agent's totals");
    assert!(number_after(&totals, "throttled ") > 0, "{totals}");
}
