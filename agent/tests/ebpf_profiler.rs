//! The OpenTelemetry eBPF profiler (`go.opentelemetry.io/ebpf-profiler`,
//! built by scripts/test-services.sh from the Go module proxy, unmodified)
//! as a second agent sending to symtrace (issue #39): straight and through
//! the OpenTelemetry Collector, its native frames named at query time from
//! what `symtrace-upload` published (by GNU build-ID, or by htlhash and Go
//! build-ID for files without one), its interpreter frames as it names
//! them. It names a service by its executable's file name; its on-CPU
//! samples carry timestamps without values. Needs root (CI: a skip is a
//! failure).

use std::io::Write;
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use serde_json::Value;
use symtrace_testkit::agent::{bpf_test, summary, Agent};
use symtrace_testkit::collector::{self, Collector, Export};
use symtrace_testkit::ebpf_profiler::{self, Profiler};
use symtrace_testkit::split::{
    assert_split, build_c_workload, folded_in, folded_selected, holds, run_workload_gated,
    wait_for_selected, wait_for_split,
};
use symtrace_testkit::{self as kit, Backend, Server};

/// The profiler's frequency in these tests (it takes any; its default is
/// 20 Hz, too few samples for a split of a 2-second workload).
const HZ: u32 = 97;

/// An executable's name the profiler's service will be: unique, and short
/// enough for a thread's `comm` (15 bytes).
fn short_name(prefix: &str) -> String {
    static N: AtomicU32 = AtomicU32::new(0);
    format!(
        "{prefix}{}{}",
        std::process::id() % 100_000,
        N.fetch_add(1, Ordering::SeqCst)
    )
}

/// Publishes the files of `dir` as CI does: `symtrace-upload`.
fn upload(server: &Server, dir: &Path) {
    let out = kit::run(
        Command::new(kit::workspace_bin("symtrace-upload"))
            .args(["--server", &server.url, "--no-sources"])
            .arg(dir),
    );
    assert!(out.status.success(), "{out:?}");
}

/// The flamegraph's `build_ids` entries (JSON format) of the service.
fn modules(server: &Server, service: &str) -> Vec<Value> {
    let (status, body) = kit::json_of(
        kit::client()
            .get(format!(
                "{}/api/v1/flamegraph?service={service}&from=now-1h&to=now",
                server.url
            ))
            .send()
            .unwrap(),
    );
    assert_eq!(status, 200, "{body}");
    body["build_ids"].as_array().cloned().unwrap_or_default()
}

/// Runs the C workload under `profiler` (already sending to `server`'s
/// `tenant`) and checks its split.
fn check_split(server: &Server, tenant: Option<&str>, bin: &Path, what: &str, profiler: &Profiler) {
    let service = bin.file_name().unwrap().to_str().unwrap();
    // Measured once the profiler's samples of its warm-up arrived (it
    // learns of a new process late, the later the busier the machine).
    let used = run_workload_gated(bin, service, 1.2, 0.6, || {
        !folded_in(server, tenant, service).is_empty()
    });
    let expected = (used.0 + used.1) * HZ as f64;
    let got = wait_for_split(server, tenant, service, expected, Duration::from_secs(60));
    if got.0 + got.1 == 0 {
        panic!(
            "{what}: no samples of {service}:\n{}\n{}",
            summary(&folded_in(server, tenant, service)),
            profiler.log_text()
        );
    }
    assert_split(what, HZ as f64, got, used);
}

/// A C service built with frame pointers, published by `symtrace-upload`:
/// the profiler's samples come out named, split as the workload measured
/// its threads' CPU time — sent straight to symtrace, and through a
/// Collector (OTLP/gRPC in and out, a tenant set by its exporter).
#[test]
fn an_uploaded_c_service_comes_out_symbolized_with_its_measured_split() {
    let Some(_one) = bpf_test(&["clang-19"]) else {
        return;
    };
    let (Some(profiler_bin), Some(otelcol_bin)) = (ebpf_profiler::binary(), collector::binary())
    else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(&Backend::local(), &[]);
    let straight = dir.path().join("up").join(short_name("epstr"));
    let via = dir.path().join("up").join(short_name("epvia"));
    std::fs::create_dir_all(straight.parent().unwrap()).unwrap();
    build_c_workload(&straight);
    std::fs::copy(&straight, &via).unwrap();
    upload(&server, straight.parent().unwrap());

    let mut profiler = Profiler::start(&profiler_bin, &server.grpc_addr, HZ, &[]);
    check_split(&server, None, &straight, "straight", &profiler);
    assert!(profiler.stop().is_some());

    let mut otelcol = Collector::start(
        &otelcol_bin,
        &[Export::Grpc {
            endpoint: server.grpc_addr.clone(),
            tenant: "via".into(),
        }],
    );
    let mut profiler = Profiler::start(&profiler_bin, &otelcol.grpc_addr, HZ, &[]);
    check_split(
        &server,
        Some("via"),
        &via,
        "through the Collector",
        &profiler,
    );
    assert!(profiler.stop().is_some());
    assert!(
        otelcol.stop().is_some_and(|s| s.success()),
        "{}",
        otelcol.log_text()
    );
    // Named from what was uploaded: the workload's module answered `ok`.
    let service = straight.file_name().unwrap().to_str().unwrap();
    let build_id = kit::build_id_of(&straight);
    let found = modules(&server, service);
    assert!(
        found
            .iter()
            .any(|m| m["build_id"] == build_id.as_str() && m["status"] == "ok"),
        "{found:?}"
    );
}

/// Files without a GNU build-ID — a C binary linked with
/// `--build-id=none` and a Go binary with Go's build-ID only — reach
/// symtrace under the profiler's htlhash; what `symtrace-upload` published
/// names them.
#[test]
fn files_without_a_gnu_build_id_are_named_through_their_htlhash() {
    let Some(_one) = bpf_test(&["clang-19", "go"]) else {
        return;
    };
    let Some(profiler_bin) = ebpf_profiler::binary() else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(&Backend::local(), &[]);
    let up = dir.path().join("up");
    std::fs::create_dir_all(&up).unwrap();
    let c = up.join(short_name("epnoid"));
    let source = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/workload/cpu_split.c");
    symtrace_testkit::agent::clang_with_frame_pointers(&c, &[source], &["-Wl,--build-id=none"]);
    let go = up.join(short_name("epgo"));
    let flags = kit::agent::go_without_gnu_build_id("");
    kit::agent::go_build(dir.path(), &go, &[&flags]);
    for bin in [&c, &go] {
        let notes =
            String::from_utf8(kit::run(Command::new("readelf").arg("-n").arg(bin)).stdout).unwrap();
        assert!(!notes.contains("Build ID:"), "{}: {notes}", bin.display());
    }
    upload(&server, &up);

    let mut profiler = Profiler::start(&profiler_bin, &server.grpc_addr, HZ, &[]);
    check_split(&server, None, &c, "C without a build-ID", &profiler);
    let service = go.file_name().unwrap().to_str().unwrap();
    let mut child = Command::new(&go)
        .arg("4")
        .stdin(Stdio::null())
        .spawn()
        .unwrap();
    // It burns by the clock (4 s, heavyWork 3 parts of 4): the samples due
    // are what CPU it got, at HZ, not its wall time (a busy machine gives
    // it less).
    let (status, cpu) = kit::wait_with_cpu(&mut child);
    assert!(status.success());
    let due = cpu * 0.75 * f64::from(HZ);
    let stacks = wait_for_selected(&server, None, service, "", Duration::from_secs(60), |s| {
        let named: u64 = s
            .iter()
            .filter(|(f, _)| holds(f, "main.heavyWork"))
            .map(|(_, n)| n)
            .sum();
        named as f64 >= due * 0.8
    });
    let heavy: u64 = stacks
        .iter()
        .filter(|(f, _)| holds(f, "runtime.main") && holds(f, "main.heavyWork"))
        .map(|(_, n)| n)
        .sum();
    // `heavyWork` is a frameless Go leaf: its caller `main.main` is not in
    // any unwinder's chain (ours reads the same), so the whole stack is
    // runtime.main;main.heavyWork.
    assert!(
        heavy as f64 >= due * 2.0 / 3.0,
        "{heavy} samples of runtime.main;…;main.heavyWork ({due:.0} due: {cpu:.2} CPU s):\n{}\n{}",
        summary(&stacks),
        profiler.log_text()
    );
    // The C file's frames came as addresses under its htlhash and were
    // named from the upload; the profiler names Go frames itself (from
    // `.gopclntab`), so the Go file needs no lookup.
    let c_service = c.file_name().unwrap().to_str().unwrap();
    let found = modules(&server, c_service);
    assert!(
        found
            .iter()
            .any(|m| m["id_kind"] == "htlhash" && m["status"] == "ok"),
        "{found:?}"
    );
    assert!(profiler.stop().is_some());
}

/// A file only our agent published (nobody vouched for it) names our
/// agent's samples of it, whose mappings carry its content hash, and not
/// the profiler's, which carry none: a file an agent sends is bound to its
/// content. The reason given says so.
#[test]
fn a_file_only_our_agent_published_does_not_name_the_profilers_frames() {
    let Some(_one) = bpf_test(&["clang-19"]) else {
        return;
    };
    let Some(profiler_bin) = ebpf_profiler::binary() else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(&Backend::local(), &[]);
    let bin = dir.path().join(short_name("epagent"));
    build_c_workload(&bin);
    let mut agent = Agent::start_publishing(
        Path::new(env!("CARGO_BIN_EXE_symtrace-agent")),
        &server,
        10_000_000,
    );
    let mut profiler = Profiler::start(&profiler_bin, &server.grpc_addr, HZ, &[]);
    let ours = kit::unique("ours-");
    let service = bin.file_name().unwrap().to_str().unwrap();
    run_workload_gated(&bin, &ours, 1.2, 0.6, || {
        !folded_in(&server, None, service).is_empty()
    });
    // Ours, named (service from OTEL_SERVICE_NAME), once published.
    let named = wait_for_selected(&server, None, &ours, "", Duration::from_secs(60), |s| {
        s.iter().any(|(f, _)| holds(f, "alpha_work"))
    });
    assert!(
        named.iter().any(|(f, _)| holds(f, "alpha_work")),
        "{}\n{}",
        summary(&named),
        agent.stderr()
    );
    // The profiler's (service: the executable's name), unnamed.
    let theirs = wait_for_selected(&server, None, service, "", Duration::from_secs(60), |s| {
        s.iter().map(|(_, n)| n).sum::<u64>() >= HZ as u64
    });
    assert!(
        theirs.iter().map(|(_, n)| n).sum::<u64>() >= HZ as u64,
        "{}\n{}",
        summary(&theirs),
        profiler.log_text()
    );
    assert!(
        !theirs
            .iter()
            .any(|(f, _)| holds(f, "alpha_work") || holds(f, "beta_work")),
        "{}",
        summary(&theirs)
    );
    let build_id = kit::build_id_of(&bin);
    let found = modules(&server, service);
    let entry = found
        .iter()
        .find(|m| m["build_id"] == build_id.as_str())
        .unwrap_or_else(|| panic!("{found:?}"));
    assert_eq!(entry["status"], "unknown_build_id", "{entry}");
    assert!(
        entry["reason"]
            .as_str()
            .is_some_and(|r| r.contains("not another profiler's")),
        "{entry}"
    );
    assert!(profiler.stop().is_some());
    assert!(agent.stop().success(), "{}", agent.stderr());
}

/// The distribution's CPython (not a version manager's shim on the PATH,
/// whose process is a shell until it execs).
const PYTHON: &str = "/usr/bin/python3";

/// A CPython process: the profiler's interpreter frames (`<module>`, the
/// Python functions) come out named as it names them, in their order.
#[test]
fn python_frames_come_out_as_the_profiler_names_them() {
    let Some(_one) = bpf_test(&["python3"]) else {
        return;
    };
    let Some(profiler_bin) = ebpf_profiler::binary() else {
        return;
    };
    let server = Server::start(&Backend::local(), &[]);
    let mut profiler = Profiler::start(&profiler_bin, &server.grpc_addr, HZ, &[]);
    // It burns in warm_python until told (once the profiler's samples of
    // it arrived: the profiler learns of a new process late, the later the
    // busier the machine), then 2 s of its CPU time in burn_python, and
    // prints the CPU time that took.
    let script = "import select, sys, time\n\
        def warm_python():\n    n = 0\n    while not select.select([sys.stdin], [], [], 0)[0]:\n        for _ in range(10000):\n            n += 1\n    sys.stdin.readline()\n\
        def burn_python(cpu):\n    n = 0\n    start = time.process_time()\n    while time.process_time() - start < cpu:\n        n += 1\n    return n\n\
        def outer_python(cpu):\n    return burn_python(cpu)\n\
        warm_python()\n\
        start = time.process_time()\n\
        outer_python(2.0)\n\
        print(time.process_time() - start)\n";
    let mut child = Command::new(PYTHON)
        .args(["-c", script])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let selector = format!("{{process.pid=\"{}\"}}", child.id());
    // The profiler names the service by the executable's file name
    // (`python3.11` on Debian 12).
    let exe = std::fs::canonicalize(PYTHON).unwrap();
    let service = exe.file_name().unwrap().to_str().unwrap().to_owned();
    let warm = kit::wait_until_ok(Duration::from_secs(60), || {
        if folded_selected(&server, None, &service, &selector).is_empty() {
            Err(())
        } else {
            Ok(())
        }
    });
    let mut stdin = child.stdin.take().unwrap();
    writeln!(stdin, "go").unwrap();
    drop(stdin);
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success(), "{out:?}");
    let cpu: f64 = String::from_utf8_lossy(&out.stdout).trim().parse().unwrap();
    let due = cpu * f64::from(HZ);
    let chain = |s: &[(String, u64)]| -> u64 {
        s.iter()
            .filter(|(f, _)| f.contains("<module>;outer_python;burn_python"))
            .map(|(_, n)| n)
            .sum()
    };
    let stacks = wait_for_selected(
        &server,
        None,
        &service,
        &selector,
        Duration::from_secs(60),
        |s| chain(s) as f64 >= due * 0.8,
    );
    assert!(
        warm.is_ok() && chain(&stacks) as f64 >= due * 0.6,
        "{} samples of <module>;outer_python;burn_python in {service} {selector} ({due:.0} due: \
         {cpu:.2} CPU s; warm-up sampled: {}):\n{}\n{}\n{}",
        chain(&stacks),
        warm.is_ok(),
        summary(&stacks),
        kit::client()
            .get(format!("{}/api/v1/services", server.url))
            .send()
            .unwrap()
            .text()
            .unwrap(),
        profiler.log_text()
    );
    let all = folded_selected(&server, None, &service, &selector);
    assert!(!all.is_empty());
    assert!(profiler.stop().is_some());
}
