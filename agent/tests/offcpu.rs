//! Off-CPU profiles for real (issue #22): the agent's scheduler program
//! loaded into this kernel records where a thread waited and for how long,
//! and the server's off-CPU flamegraph says so. Needs root and BTF (CI runs
//! as root on a VM where BPF works; a skip there is a failure).

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use symtrace_testkit::agent::{bpf_test, clang_with_frame_pointers, number_after, Agent};
use symtrace_testkit::{self as kit, Backend, Server};

const OFF_CPU: &str = "off_cpu:nanoseconds::";

fn start_agent(server: &Server, probability: &str) -> Agent {
    Agent::start(
        Path::new(env!("CARGO_BIN_EXE_symtrace-agent")),
        &server.grpc_addr,
        &[
            "--off-cpu-probability",
            probability,
            "--off-cpu-span-probability",
            probability,
        ],
    )
}

/// The workload (tests/workload/offcpu.c), built with frame pointers and
/// uploaded so its frames are named.
fn workload(dir: &Path, server: &Server) -> PathBuf {
    let bin = dir.join("offcpu");
    let source = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/workload/offcpu.c");
    clang_with_frame_pointers(&bin, &[source], &[]);
    server.upload(&kit::build_id_of(&bin), "debuginfo", &bin);
    bin
}

/// What the workload measured: nanoseconds away in sleepy_a and sleepy_b,
/// and the sleeper thread's wall and CPU time over its loop.
struct Measured {
    a: f64,
    b: f64,
    wall: f64,
    cpu: f64,
}

fn run(bin: &Path, service: &str, rounds: u32) -> Measured {
    let out = kit::run(
        Command::new(bin)
            .args([service, &rounds.to_string()])
            .env("OTEL_SERVICE_NAME", service)
            .stdin(Stdio::null()),
    );
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let field = |name: &str, i: usize| -> f64 {
        text.lines()
            .find_map(|l| {
                l.strip_prefix(name)?
                    .split_whitespace()
                    .nth(i)?
                    .parse()
                    .ok()
            })
            .unwrap_or_else(|| panic!("{name} in workload output: {text}"))
    };
    Measured {
        a: field("sleepy_a ", 0),
        b: field("sleepy_b ", 0),
        wall: field("thread ", 0),
        cpu: field("thread ", 1),
    }
}

/// The sleeper thread's off-CPU flamegraph, folded: (frames, nanoseconds).
fn folded(server: &Server, service: &str) -> Vec<(String, f64)> {
    let url = format!(
        "{}/api/v1/flamegraph?service={service}&type={OFF_CPU}&format=folded&from=now-1h&to=now\
         &selector=%7Bthread.name%3D%22sleeper%22%7D",
        server.url
    );
    let resp = kit::client().get(url).send().unwrap();
    if resp.status() != 200 {
        return Vec::new(); // not ingested yet
    }
    kit::folded(&resp.text().unwrap())
}

/// Nanoseconds of the loop's stacks (under `sleeper_loop`) that hold
/// `function` called from `sleeper_loop`, or all of them for "".
fn waited(stacks: &[(String, f64)], function: &str) -> f64 {
    stacks
        .iter()
        .filter(|(frames, _)| {
            let frames: Vec<&str> = frames.split(';').collect();
            let Some(lp) = frames.iter().position(|f| *f == "sleeper_loop") else {
                return false;
            };
            function.is_empty() || frames[lp..].contains(&function)
        })
        .map(|(_, n)| n)
        .sum()
}

/// The loop's off-CPU stacks once at least `min` nanoseconds of them
/// arrived (or 30 s passed).
fn wait_for(server: &Server, service: &str, min: f64) -> Vec<(String, f64)> {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let stacks = folded(server, service);
        if waited(&stacks, "") >= min || Instant::now() > deadline {
            return stacks;
        }
        std::thread::sleep(Duration::from_millis(500));
    }
}

fn within(what: &str, got: f64, want: f64, tolerance: f64, context: &str) {
    assert!(
        (got / want - 1.0).abs() <= tolerance,
        "{what}: {got:.0} against {want:.0} measured (±{:.0}%)\n{context}",
        tolerance * 100.0
    );
}

fn summary(stacks: &[(String, f64)]) -> String {
    let mut lines: Vec<String> = stacks
        .iter()
        .map(|(f, n)| format!("{:>14.0} {f}", n))
        .collect();
    lines.sort();
    lines.join("\n")
}

#[test]
fn the_off_cpu_flamegraph_splits_a_threads_waits_as_it_measured_them() {
    let Some(_one) = bpf_test(&["clang-19"]) else {
        return;
    };
    let server = Server::start(&Backend::local(), &[]);
    let dir = tempfile::tempdir().unwrap();
    let bin = workload(dir.path(), &server);
    let mut agent = start_agent(&server, "1");
    let service = kit::unique("offcpu-");
    let m = run(&bin, &service, 60);
    let away = m.wall - m.cpu;
    let stacks = wait_for(&server, &service, 0.85 * away);
    let context = summary(&stacks);
    let (a, b) = (waited(&stacks, "sleepy_a"), waited(&stacks, "sleepy_b"));
    // Both named under their callers, 3:1 as the program measured.
    assert!(a > 0.0 && b > 0.0, "{context}");
    within("sleepy_a : sleepy_b", a / b, m.a / m.b, 0.15, &context);
    // Their waits are the blocking calls in libc and the kernel's sleep
    // and pipe read.
    assert!(
        stacks.iter().any(|(f, _)| f.contains("sleepy_a;")
            && f.contains("do_nanosleep")
            && f.contains("nanosleep")),
        "{context}"
    );
    assert!(
        stacks
            .iter()
            .any(|(f, _)| f.contains("sleepy_b;") && f.contains("pipe_read")),
        "{context}"
    );
    // The thread's time off the CPU over the loop: wall minus CPU time.
    within("off-CPU total", waited(&stacks, ""), away, 0.15, &context);
    assert!(agent.stop().success());
    // The agent counted at least the sleeper's 120 waits (every thread of
    // the machine is recorded at p = 1).
    let total = agent.last_line("total:").expect("the agent's totals");
    assert!(number_after(&total, "off-CPU waits ") >= 120, "{total}");
}

#[test]
fn sampled_waits_are_scaled_to_unbiased_totals() {
    let Some(_one) = bpf_test(&["clang-19"]) else {
        return;
    };
    let server = Server::start(&Backend::local(), &[]);
    let dir = tempfile::tempdir().unwrap();
    let bin = workload(dir.path(), &server);
    // Half the switch-outs recorded, each counting twice.
    let mut agent = start_agent(&server, "0.5");
    let service = kit::unique("offcpu-half-");
    let m = run(&bin, &service, 150);
    let away = m.wall - m.cpu;
    let stacks = wait_for(&server, &service, 0.8 * away);
    let context = summary(&stacks);
    within(
        "off-CPU total at p = 0.5",
        waited(&stacks, ""),
        away,
        0.20,
        &context,
    );
    assert!(agent.stop().success());
}
