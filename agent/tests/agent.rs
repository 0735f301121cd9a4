//! The agent for real: its BPF program loaded into this kernel, sampling
//! every CPU, exporting to a real `symtrace-server`, checked through the
//! flamegraph API. Needs root and BTF (CI runs as root on a VM where BPF
//! works; a skip there is a failure).

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use symtrace_testkit::agent::{bpf_available, bpf_test, number_after, Agent};
use symtrace_testkit::collector::{Collector, Export};
use symtrace_testkit::split::{self, assert_split, run_workload, split, wait_for_split};
use symtrace_testkit::{self as kit, Backend, Server};

/// The agent's frequency in these tests.
const HZ: f64 = 97.0;

/// This package's agent binary, started against `grpc_addr`.
fn start_agent(grpc_addr: &str, extra: &[&str]) -> Agent {
    Agent::start(
        Path::new(env!("CARGO_BIN_EXE_symtrace-agent")),
        grpc_addr,
        extra,
    )
}

/// The C workload, built as the issue asks: clang with frame pointers in
/// leaf functions too, no sibling calls.
fn c_workload(dir: &Path) -> PathBuf {
    let bin = dir.join("cpu_split_c");
    split::build_c_workload(&bin);
    bin
}

/// The Rust workload: `examples/cpu_split.rs`, built by `cargo test` with
/// our frame-pointer flags.
fn rust_workload() -> PathBuf {
    let bin = kit::target_dir().join("examples/cpu_split");
    assert!(
        bin.exists(),
        "{} not built (cargo test builds examples)",
        bin.display()
    );
    bin
}

#[test]
fn flamegraph_shows_the_measured_cpu_split_of_c_and_rust_workloads() {
    let Some(_one) = bpf_test(&["clang-19"]) else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(&Backend::local(), &[]);
    let mut agent = start_agent(&server.grpc_addr, &[]);
    for (name, bin) in [("c", c_workload(dir.path())), ("rust", rust_workload())] {
        server.upload(&kit::build_id_of(&bin), "debuginfo", &bin);
        let service = kit::unique(&format!("split-{name}-"));
        let used = run_workload(&bin, &service, 1.2, 0.6);
        let expected = (used.0 + used.1) * HZ;
        let got = wait_for_split(&server, None, &service, expected, Duration::from_secs(30));
        assert_split(name, HZ, got, used);

        // The raw samples carry the process's resource and thread names,
        // and their frames the workload's build-ID (not every stack has a
        // frame of the workload: one that entered the kernel from libc's
        // frameless syscall wrappers stops in libc).
        let (status, body) = kit::json_of(server.get(&format!(
            "/api/v1/profiles/samples?service={service}&limit=100"
        )));
        assert_eq!(status, 200, "{body}");
        let samples = body["samples"].as_array().unwrap();
        assert!(!samples.is_empty(), "{body}");
        for sample in samples {
            assert_eq!(sample["resource"]["service.name"], service.as_str());
            assert!(sample["resource"]["process.pid"].is_string(), "{sample}");
            assert!(sample["resource"]["host.name"].is_string(), "{sample}");
            assert!(sample["labels"]["thread.name"].is_string(), "{sample}");
        }
        let build_id = kit::build_id_of(&bin);
        let mapped = samples
            .iter()
            .filter(|s| {
                s["stack"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .any(|f| f["mapping"]["build_id"] == build_id.as_str())
            })
            .count();
        assert!(
            mapped > 0,
            "none of {} samples has a frame of the workload's build-ID: {body}",
            samples.len()
        );
    }
    let stats = agent
        .last_line("stats:")
        .expect("a stats line every interval");
    assert!(number_after(&stats, "delivered") > 0, "{stats}");
    assert!(
        stats.contains("agent CPU") && stats.contains("BPF"),
        "{stats}"
    );
    assert!(agent.stop().success(), "{}", agent.stderr());
    let total = agent.last_line("total:").expect("a final summary");
    assert_eq!(number_after(&total, "dropped"), 0, "{total}");
}

/// Each program the agent loaded and the instructions the verifier
/// processed to check it, from the agent's log.
fn verified(log: &str) -> Vec<(String, u64)> {
    log.lines()
        .filter(|l| l.contains("BPF program verified"))
        .filter_map(|l| {
            let field = |key: &str| {
                let at = l.find(key)? + key.len();
                let rest = &l[at..];
                let end = rest.find(' ').unwrap_or(rest.len());
                Some(rest[..end].trim_matches('"').to_string())
            };
            Some((field("program=")?, field("instructions=")?.parse().ok()?))
        })
        .collect()
}

#[test]
fn every_bpf_program_verifies_far_inside_the_kernels_budget() {
    let Some(_one) = bpf_test(&[]) else {
        return;
    };
    // The verifier follows every path of a program up to 1,000,000
    // instructions; the sample program's walk, inlined into its loop, once
    // took 930,000 of them (one more branch and the agent would not have
    // loaded). Its steps now verify once, as functions of their own: a
    // tenth of the budget is far more than they need, and far less than
    // paths that multiply again would take.
    let server = Server::start(&Backend::local(), &[]);
    let agent = start_agent(&server.grpc_addr, &[]);
    let log = agent.stderr();
    let programs = verified(&log);
    for name in [
        "on_cpu_sample",
        "on_switch",
        "on_usdt",
        "on_exec",
        "on_exit",
    ] {
        assert!(
            programs.iter().any(|(p, _)| p == name),
            "{name} not reported verified: {programs:?}\n{log}"
        );
    }
    for (name, n) in &programs {
        assert!(*n < 100_000, "{name} took {n} instructions to verify");
    }
}

#[test]
fn a_missing_capability_is_named() {
    if !bpf_available() || !kit::have("capsh") {
        return;
    }
    let agent = env!("CARGO_BIN_EXE_symtrace-agent");
    let all = ["CAP_BPF", "CAP_PERFMON", "CAP_SYS_PTRACE"];
    for cap in all {
        let out = Command::new("capsh")
            .arg(format!("--drop={}", cap.to_lowercase()))
            .args([
                "--",
                "-c",
                &format!("exec {agent} --server http://127.0.0.1:9"),
            ])
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "started without {cap}: {stderr}");
        assert!(
            stderr.contains(&format!("missing capability: {cap} (")),
            "{cap}: {stderr}"
        );
        for other in all.iter().filter(|&&c| c != cap) {
            assert!(
                !stderr.contains(&format!("{other} (")),
                "{cap}: {other} reported missing too: {stderr}"
            );
        }
    }
}

#[test]
fn buffers_while_the_server_is_down_and_delivers_after() {
    let Some(_one) = bpf_test(&["clang-19"]) else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let bin = c_workload(dir.path());
    let mut server = Server::start(&Backend::local(), &[]);
    server.upload(&kit::build_id_of(&bin), "debuginfo", &bin);
    server.kill9();

    // Two agents, two tenants: one with room for the whole outage, one
    // with room for a few batches only.
    let mut roomy = start_agent(&server.grpc_addr, &["--tenant", "roomy"]);
    let mut tight = start_agent(
        &server.grpc_addr,
        &["--tenant", "tight", "--buffer-bytes", "16384"],
    );
    let service = kit::unique("outage-");
    let used = run_workload(&bin, &service, 1.0, 0.5);
    // Down until the tight agent has dropped batches and the roomy one
    // holds its own (and says the export fails).
    kit::wait_until(
        "the tight agent to drop batches",
        Duration::from_secs(60),
        || {
            let tight_stats = tight.last_line("stats:")?;
            let roomy_stats = roomy.last_line("stats:")?;
            (number_after(&tight_stats, "dropped") > 0
                && number_after(&roomy_stats, "buffered") > 0
                && roomy.stderr().contains("retrying"))
            .then_some(())
        },
    );

    // It kept sampling and is holding batches; it says the export fails.
    let stats = roomy.last_line("stats:").unwrap();
    assert!(number_after(&stats, "buffered") > 0, "{stats}");
    assert_eq!(number_after(&stats, "delivered"), 0, "{stats}");
    assert!(roomy.stderr().contains("retrying"), "{}", roomy.stderr());

    server.spawn(); // the same ports and data
    let got = wait_for_split(
        &server,
        Some("roomy"),
        &service,
        (used.0 + used.1) * HZ,
        Duration::from_secs(45),
    );
    assert_split("after the outage", HZ, got, used);

    // The tight agent dropped its oldest batches (the workload's) and says
    // how many samples it dropped.
    let deadline = Instant::now() + Duration::from_secs(30);
    let tight_stats = loop {
        let line = tight.last_line("stats:").unwrap();
        if number_after(&line, "delivered") > 0 || Instant::now() > deadline {
            break line;
        }
        std::thread::sleep(Duration::from_millis(500));
    };
    assert!(number_after(&tight_stats, "dropped") > 0, "{tight_stats}");
    let (a, b) = split(&split::folded_in(&server, Some("tight"), &service));
    assert!(
        a + b < got.0 + got.1,
        "tight kept {} samples, roomy {}",
        a + b,
        got.0 + got.1
    );

    assert!(roomy.stop().success());
    assert!(tight.stop().success());
    let total = tight.last_line("total:").unwrap();
    assert!(number_after(&total, "dropped") > 0, "{total}");
    assert_eq!(
        number_after(&roomy.last_line("total:").unwrap(), "dropped"),
        0
    );
}

/// Our reader on another writer's records: Datadog's libdd-otel-thread-ctx
/// (`examples/dd_writer.rs`).
#[test]
fn reads_thread_contexts_written_by_libdd_otel_thread_ctx() {
    let Some(_one) = bpf_test(&[]) else {
        return;
    };
    let writer = kit::target_dir().join("examples/dd_writer");
    assert!(
        writer.exists(),
        "{} not built (cargo test builds examples)",
        writer.display()
    );
    let server = Server::start(&Backend::local(), &[]);
    server.upload(&kit::build_id_of(&writer), "debuginfo", &writer);
    let mut agent = start_agent(&server.grpc_addr, &[]);
    let (trace, span) = ("4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7");
    kit::run(Command::new(&writer).args([trace, span, "1.0"]));
    let url = format!(
        "{}/api/v1/flamegraph?format=folded&trace_id={trace}&span_id={span}",
        server.url
    );
    let deadline = Instant::now() + Duration::from_secs(30);
    let samples = loop {
        let resp = kit::client().get(&url).send().unwrap();
        let text = if resp.status() == 200 {
            resp.text().unwrap()
        } else {
            String::new()
        };
        let n: u64 = text
            .lines()
            .filter(|l| l.contains("dd_work"))
            .map(|l| l.rsplit_once(' ').unwrap().1.parse::<u64>().unwrap())
            .sum();
        if n as f64 >= HZ * 0.8 || Instant::now() > deadline {
            break n;
        }
        std::thread::sleep(Duration::from_millis(500));
    };
    assert!(
        samples as f64 >= HZ * 0.6,
        "{samples} samples of dd_work linked to its span for 1 s of CPU"
    );
    assert!(agent.stop().success());
}

/// Our writers pass the other writer's layout checks: the TLS slot exported
/// as a global TLS symbol in .dynsym, accessed through TLSDESC (or relaxed
/// to local-exec) only.
#[test]
fn our_writers_pass_libdd_otel_thread_ctx_layout_checks() {
    let service = kit::target_dir().join("examples/http_service");
    assert!(
        service.exists(),
        "{} not built: cargo build -p symtrace-context --examples (cargo test --workspace does)",
        service.display()
    );
    libdd_otel_thread_ctx::sanity_check::check_tls_slot_in(&service)
        .unwrap_or_else(|e| panic!("http_service: {e:#}"));
    // And the check can fail: the test workload publishes nothing.
    let workload = kit::target_dir().join("examples/cpu_split");
    assert!(libdd_otel_thread_ctx::sanity_check::check_tls_slot_in(&workload).is_err());
}

/// Our agent's profiles through the OpenTelemetry Collector (issue #39):
/// the agent exports to a real Collector's OTLP receiver, the Collector to
/// symtrace over OTLP/gRPC (tenant `via`, set by the Collector's exporter)
/// and over OTLP/HTTP (tenant `via-http`, the same flamegraph): the split, the resource and thread attributes and the workload's frames
/// come out as when the agent exports directly (the test above).
#[test]
fn through_the_opentelemetry_collector() {
    let Some(_one) = bpf_test(&["clang-19"]) else {
        return;
    };
    let Some(otelcol_bin) = symtrace_testkit::collector::binary() else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(&Backend::local(), &[]);
    let mut otelcol = Collector::start(
        &otelcol_bin,
        &[
            Export::Grpc {
                endpoint: server.grpc_addr.clone(),
                tenant: "via".into(),
            },
            Export::Http {
                endpoint: server.url.clone(),
                tenant: "via-http".into(),
            },
        ],
    );
    let mut agent = start_agent(&otelcol.grpc_addr, &[]);
    let bin = c_workload(dir.path());
    server.upload(&kit::build_id_of(&bin), "debuginfo", &bin);
    let service = kit::unique("collector-split-");
    let used = run_workload(&bin, &service, 1.2, 0.6);
    let expected = (used.0 + used.1) * HZ;
    let timeout = Duration::from_secs(30);
    let got = wait_for_split(&server, Some("via"), &service, expected, timeout);
    assert_split("through the Collector (OTLP/gRPC out)", HZ, got, used);
    // Its OTLP/HTTP exporter delivers the same.
    wait_for_split(&server, Some("via-http"), &service, expected, timeout);
    assert_eq!(
        split::folded_in(&server, Some("via-http"), &service),
        split::folded_in(&server, Some("via"), &service),
        "the same flamegraph through both exporters"
    );
    let (status, body) = kit::json_of(
        kit::client()
            .get(format!(
                "{}/api/v1/profiles/samples?service={service}&limit=100",
                server.url
            ))
            .header("X-Scope-OrgID", "via")
            .send()
            .unwrap(),
    );
    assert_eq!(status, 200, "{body}");
    let samples = body["samples"].as_array().unwrap();
    assert!(!samples.is_empty(), "{body}");
    for sample in samples {
        assert_eq!(sample["resource"]["service.name"], service.as_str());
        assert!(sample["resource"]["process.pid"].is_string(), "{sample}");
        assert!(sample["labels"]["thread.name"].is_string(), "{sample}");
    }
    let build_id = kit::build_id_of(&bin);
    assert!(
        samples.iter().any(|s| s["stack"]
            .as_array()
            .unwrap()
            .iter()
            .any(|f| f["mapping"]["build_id"] == build_id.as_str())),
        "{body}"
    );
    assert!(agent.stop().success(), "{}", agent.stderr());
    assert!(
        otelcol.stop().is_some_and(|s| s.success()),
        "{}",
        otelcol.log_text()
    );
}
