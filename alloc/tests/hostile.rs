//! Memory profiling's shared state on a hostile host (issue #37): the
//! agent's map of live sampled allocations and its probe slots serve every
//! process of the host; one unprivileged process (uid 65534) may take only
//! its share of each, and a root service beside it keeps its in-use
//! profile. Real agents with their BPF programs loaded; root and BTF
//! needed.

mod common;

use std::io::{BufRead, BufReader, Write};
use std::os::unix::fs::PermissionsExt;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use symtrace_testkit::agent::{bpf_test, clang_with_frame_pointers, number_after, Agent};
use symtrace_testkit::{self as kit, Backend, Server};

const NOBODY: u32 = 65534;
const INUSE: &str = "inuse_space:bytes::";

fn open_dir() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o777)).unwrap();
    dir
}

fn c_source(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/c")
        .join(name)
}

/// Starts `cmd` and waits for its first line, which starts with `first`.
fn start_ready(cmd: &mut Command, first: &str) -> (Child, String) {
    let mut child = cmd.stdout(Stdio::piped()).spawn().unwrap();
    let mut line = String::new();
    BufReader::new(child.stdout.as_mut().unwrap())
        .read_line(&mut line)
        .unwrap();
    assert!(line.starts_with(first), "{line}");
    (child, line)
}

/// The service's in-use bytes (the latest snapshot) under `function`.
fn in_use_under(server: &Server, service: &str, function: &str) -> f64 {
    let url = format!(
        "{}/api/v1/flamegraph?service={service}&type={INUSE}&format=folded&from=now-1h&to=now",
        server.url
    );
    let resp = kit::client().get(url).send().unwrap();
    if resp.status() != 200 {
        return 0.0;
    }
    let stacks: Vec<(String, f64)> = kit::folded(&resp.text().unwrap());
    stacks
        .iter()
        .filter(|(s, _)| s.split(';').any(|f| f == function))
        .map(|(_, n)| n)
        .sum()
}

/// The memory workload (its leaky thread keeps 64 MiB live).
fn workload(dir: &Path) -> PathBuf {
    let bin = dir.join("memory_workload");
    clang_with_frame_pointers(&bin, &[c_source("memory_workload.c")], &[]);
    bin
}

/// Waits until the agent attached to the probes of `lib` (its log).
fn wait_for_attach(agent: &Agent, lib: &Path) {
    let name = lib.file_name().unwrap().to_str().unwrap().to_owned();
    let deadline = Instant::now() + Duration::from_secs(30);
    while !agent
        .stderr()
        .lines()
        .any(|l| l.contains("otel_memory probes attached") && l.contains(&name))
    {
        assert!(Instant::now() < deadline, "{}", agent.stderr());
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// The root service: the memory workload under the preload library, let
/// go once the agent attached to the library's probes, its leaked blocks
/// live for `linger` seconds; returns the process and the bytes it says it
/// leaked.
fn root_service(agent: &Agent, bin: &Path, lib: &Path, service: &str, linger: u32) -> (Child, f64) {
    let mut child = Command::new(bin)
        .arg(linger.to_string())
        .env("LD_PRELOAD", lib)
        .env("OTEL_SERVICE_NAME", service)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    // It waits for a line: its allocations start once the probes are on.
    wait_for_attach(agent, lib);
    writeln!(child.stdin.take().unwrap(), "go").unwrap();
    let mut out = BufReader::new(child.stdout.take().unwrap());
    let mut leaked = 0.0;
    loop {
        let mut line = String::new();
        assert!(
            out.read_line(&mut line).unwrap() > 0,
            "the workload ended early"
        );
        if let Some(b) = line.strip_prefix("leaky ") {
            leaked = b.trim().parse().unwrap();
        }
        if line.trim() == "ready" {
            break;
        }
    }
    (child, leaked)
}

#[test]
fn one_process_cannot_take_the_live_allocation_map() {
    let Some(_one) = bpf_test(&["clang-19", "make"]) else {
        return;
    };
    let dir = open_dir();
    let lib = common::build_preload(dir.path());
    std::fs::set_permissions(&lib, std::fs::Permissions::from_mode(0o755)).unwrap();
    let hostile = dir.path().join("hostile_alloc");
    clang_with_frame_pointers(&hostile, &[c_source("hostile_alloc.c")], &["-ldl"]);
    let bin = workload(dir.path());
    let server = Server::start(&Backend::local(), &[]);
    // Its frames named (the agents here publish nothing).
    server.upload(&kit::build_id_of(&bin), "debuginfo", &bin);
    // A live map of 4,096: one process may take 1,024 of it.
    let mut agent = Agent::start(
        &kit::workspace_bin("symtrace-agent"),
        &server.grpc_addr,
        &[
            "--memory-max-live",
            "4096",
            "--memory-max-live-per-process",
            "1024",
            "--memory-max-rate",
            "0",
        ],
    );
    // The user samples every allocation and keeps 20,000 live, once the
    // agent attached to the library's probes.
    let (mut flood, line) = start_ready(
        Command::new(&hostile)
            .args(["hold", "20000", "20"])
            .env("LD_PRELOAD", &lib)
            .env("OTEL_MEMORY_SAMPLING_INTERVAL", "1")
            .stdin(Stdio::piped())
            .uid(NOBODY)
            .gid(NOBODY),
        "loaded",
    );
    assert_eq!(line.trim(), "loaded");
    wait_for_attach(&agent, &lib);
    writeln!(flood.stdin.take().unwrap(), "go").unwrap();
    let mut rest = String::new();
    BufReader::new(flood.stdout.as_mut().unwrap())
        .read_line(&mut rest)
        .unwrap();
    assert_eq!(rest.trim(), "ready");
    let service = kit::unique("mem-root-");
    let (mut svc, leaked) = root_service(&agent, &bin, &lib, &service, 6);
    // Its leaked blocks are in its in-use profile.
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut seen = in_use_under(&server, &service, "leaky");
    while seen < 0.5 * leaked && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(500));
        seen = in_use_under(&server, &service, "leaky");
    }
    svc.wait().unwrap();
    let _ = flood.kill();
    let _ = flood.wait();
    let stats = agent.last_line("stats:").unwrap();
    assert!(
        (0.5..=1.5).contains(&(seen / leaked)),
        "{seen:.0} bytes in use under leaky, {leaked:.0} leaked\n{stats}"
    );
    assert!(
        number_after(&stats, "live allocations over their process's share ") > 0,
        "{stats}"
    );
    assert!(agent.stop().success());
}

#[test]
fn one_user_cannot_take_the_probe_slots() {
    let Some(_one) = bpf_test(&["clang-19", "make"]) else {
        return;
    };
    let dir = open_dir();
    let lib = common::build_preload(dir.path());
    std::fs::set_permissions(&lib, std::fs::Permissions::from_mode(0o755)).unwrap();
    let hostile = dir.path().join("hostile_alloc");
    clang_with_frame_pointers(&hostile, &[c_source("hostile_alloc.c")], &["-ldl"]);
    // 70 copies of a library with 64 probe sites each, the user's: more
    // sites than the host has slots (4,096).
    let one = dir.path().join("probes64.so");
    kit::run(
        Command::new("clang-19")
            .args(["-shared", "-fPIC", "-O1", "-o"])
            .arg(&one)
            .arg(c_source("probes64.c")),
    );
    let copies: Vec<PathBuf> = (0..70)
        .map(|i| {
            let copy = dir.path().join(format!("probes64-{i}.so"));
            std::fs::copy(&one, &copy).unwrap();
            std::os::unix::fs::chown(&copy, Some(NOBODY), Some(NOBODY)).unwrap();
            copy
        })
        .collect();
    let bin = workload(dir.path());
    let server = Server::start(&Backend::local(), &[]);
    // Its frames named (the agents here publish nothing).
    server.upload(&kit::build_id_of(&bin), "debuginfo", &bin);
    // Its sampler thread watched: /healthz says 503 if it has not gone
    // round its loop for 10 s (it loops every second).
    let mut agent = Agent::start(
        &kit::workspace_bin("symtrace-agent"),
        &server.grpc_addr,
        &[
            "--health-addr",
            "127.0.0.1:0",
            "--health-max-silence",
            "10s",
        ],
    );
    let addr = agent.health_addr();
    let (mut user, line) = start_ready(
        Command::new(&hostile)
            .args(["libs", "70", "30"])
            .args(&copies)
            .uid(NOBODY)
            .gid(NOBODY),
        "ready",
    );
    assert_eq!(line.trim(), "ready 70");
    // The agent looks at it (every second for a new process).
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let stats = agent.last_line("stats:").unwrap_or_default();
        if !stats.is_empty() && number_after(&stats, "sites refused ") > 0 {
            break;
        }
        assert!(Instant::now() < deadline, "{stats}");
        std::thread::sleep(Duration::from_millis(250));
    }
    // Then a root service loads the preload library: its probes are
    // attached, and its allocations profiled.
    let service = kit::unique("mem-slots-");
    let (mut svc, leaked) = root_service(&agent, &bin, &lib, &service, 6);
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut seen = in_use_under(&server, &service, "leaky");
    while seen < 0.5 * leaked && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(500));
        seen = in_use_under(&server, &service, "leaky");
    }
    svc.wait().unwrap();
    let stats = agent.last_line("stats:").unwrap();
    assert!(
        seen >= 0.5 * leaked,
        "{seen:.0} of {leaked:.0} leaked bytes in use\n{stats}\n{}",
        agent.stderr()
    );
    // The user took its share, no more.
    assert!(number_after(&stats, "sites refused ") > 0, "{stats}");
    assert!(number_after(&stats, "probe sites ") <= 256 + 64, "{stats}");
    // Its libraries go (the process, then the files: a file no process
    // maps stays attached for the next process until it is deleted):
    // their sites are detached at the next full scan (each waits ~0.1 s
    // in the kernel) while the sampler thread goes on; their slots free
    // once gone.
    let _ = user.kill();
    let _ = user.wait();
    for copy in &copies {
        std::fs::remove_file(copy).unwrap();
    }
    let deadline = Instant::now() + Duration::from_secs(180);
    loop {
        let health = kit::client()
            .get(format!("http://{addr}/healthz"))
            .timeout(Duration::from_secs(5))
            .send()
            .unwrap();
        assert_eq!(health.status(), 200, "{}", health.text().unwrap());
        let stats = agent.last_line("stats:").unwrap();
        if number_after(&stats, "probe sites ") < 64 && number_after(&stats, "detaching ") == 0 {
            break;
        }
        assert!(Instant::now() < deadline, "{stats}");
        std::thread::sleep(Duration::from_millis(500));
    }
    assert!(agent.stop().success());
}
