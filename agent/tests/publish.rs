//! Every frame named out of the box (issue #25): the agent publishes the
//! binaries no CI uploaded, and Go programs as `go build` makes them are
//! named. Real agents with their BPF programs loaded into this kernel, a
//! real server, real compilers (clang, Debian's Go); root and BTF needed.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use serde_json::Value;
use symtrace_testkit::agent::{
    bpf_test, clang_with_frame_pointers, folded, number_after, samples_with, summary, tree_nodes,
    wait_for, Agent,
};
use symtrace_testkit::{self as kit, Backend, Killed, Server};

fn workload(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/workload")
        .join(name)
}

/// An agent that publishes to `server`, files up to `max_bytes`.
fn publishing_agent(server: &Server, max_bytes: u64) -> Agent {
    Agent::start_publishing(
        Path::new(env!("CARGO_BIN_EXE_symtrace-agent")),
        server,
        max_bytes,
    )
}

/// The flamegraph's `build_ids` entry for `id`.
fn status_of(server: &Server, service: &str, id: &str) -> Option<String> {
    let url = format!(
        "{}/api/v1/flamegraph?service={service}&from=now-1h&to=now",
        server.url
    );
    let (status, body) = kit::json_of(kit::client().get(url).send().unwrap());
    assert_eq!(status, 200, "{body}");
    body["build_ids"]
        .as_array()?
        .iter()
        .find(|b| b["build_id"] == id)
        .map(|b| b["status"].as_str().unwrap_or_default().to_owned())
}

fn run_for(exe: &Path, service: &str, seconds: &str) -> std::process::Child {
    Command::new(exe)
        .arg(seconds)
        .env("OTEL_SERVICE_NAME", service)
        .spawn()
        .unwrap()
}

#[test]
fn a_service_never_uploaded_is_named_from_what_two_agents_published_once() {
    let Some(_one) = bpf_test(&["clang-19", "objcopy"]) else {
        return;
    };
    let server = Server::start(&Backend::local(), &[]);
    let dir = tempfile::tempdir().unwrap();
    let full = dir.path().join("vendor-full");
    clang_with_frame_pointers(&full, &[workload("symtab_service.c")], &[]);
    // What runs: a symbol table, no DWARF (the vendor's build).
    let service_exe = dir.path().join("vendor-svc");
    kit::run(
        Command::new("objcopy")
            .arg("--strip-debug")
            .arg(&full)
            .arg(&service_exe),
    );
    let build_id = kit::build_id_of(&service_exe);
    let mut agents = [
        publishing_agent(&server, 64 << 20),
        publishing_agent(&server, 64 << 20),
    ];
    let service = kit::unique("vendor-");
    let mut child = run_for(&service_exe, &service, "6");
    // Both functions named: the first batch may hold samples of one only.
    let stacks = wait_for(&server, &service, |s| {
        samples_with(s, "publish_heavy") > 0 && samples_with(s, "publish_light") > 0
    });
    assert!(
        samples_with(&stacks, "publish_heavy") > 0 && samples_with(&stacks, "publish_light") > 0,
        "the symbol table the agent published names the service:\n{}",
        summary(&stacks)
    );
    assert_eq!(
        status_of(&server, &service, &build_id).as_deref(),
        Some("symbols_only")
    );
    child.wait().unwrap();

    // Published once, by one of the two agents, marked as an agent's.
    let (_, details) = kit::json_of(server.get(&format!("/api/v1/debuginfo/{build_id}")));
    let artifacts = details["artifacts"].as_array().unwrap();
    assert_eq!(artifacts.len(), 1, "{details}");
    assert_eq!(artifacts[0]["origin"], "agent");
    assert_eq!(artifacts[0]["quality"], 2, "a symbol table");
    for agent in &mut agents {
        agent.stop();
    }
    let published: u64 = agents
        .iter()
        .map(|a| number_after(&a.last_line("total:").unwrap(), "binaries published "))
        .sum();
    let created = server.metric(
        "symtrace_uploads_total",
        &[("origin", "agent"), ("result", "created")],
    );
    let all = server.metric("symtrace_uploads_total", &[("origin", "agent")]);
    let (_, listed) = kit::json_of(server.get("/api/v1/debuginfo?limit=1000"));
    let by_agents = listed["artifacts"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|a| a["origin"] == "agent")
        .count();
    // Every file the two agents sent was new: nothing was sent twice.
    assert!(published >= 1);
    assert_eq!(
        created as u64, published,
        "uploads created vs the agents' count"
    );
    assert_eq!(all, created, "an agent upload that was not new");
    assert_eq!(by_agents as u64, published);

    // The CI's DWARF for the same build-ID takes over: file and line.
    server.upload(&build_id, "debuginfo", &full);
    assert_eq!(
        status_of(&server, &service, &build_id).as_deref(),
        Some("ok")
    );
    let nodes = tree_nodes(&server, &service, "publish_heavy");
    assert!(!nodes.is_empty());
    for node in &nodes {
        assert!(
            node["file"]
                .as_str()
                .is_some_and(|f| f.ends_with("symtab_service.c")),
            "{node}"
        );
        assert!(node["line"].as_u64().is_some_and(|l| l > 0), "{node}");
    }
}

#[test]
fn a_plain_go_build_is_named_with_file_and_line() {
    let Some(_one) = bpf_test(&["go", "readelf"]) else {
        return;
    };
    let server = Server::start(&Backend::local(), &[]);
    let dir = tempfile::tempdir().unwrap();
    let plain = dir.path().join("goplain");
    let small = dir.path().join("gosmall");
    // What older toolchains (and Go's own cache) make: Go's build-ID only.
    let plain_flags = kit::agent::go_without_gnu_build_id("");
    kit::agent::go_build(dir.path(), &plain, &[&plain_flags]);
    let small_flags = kit::agent::go_without_gnu_build_id("-s -w");
    kit::agent::go_build(dir.path(), &small, &[&small_flags]);
    let notes =
        String::from_utf8(kit::run(Command::new("readelf").arg("-n").arg(&plain)).stdout).unwrap();
    assert!(
        notes.contains("GO BUILDID") && !notes.contains("Build ID:"),
        "a plain go build has only Go's build-ID:\n{notes}"
    );
    // Published as CI would: the DWARF split off and the binary stripped in
    // place (`--strip`), so what runs has another htlhash than what was
    // built; the `-s -w` build as it is.
    let built = std::fs::read(&plain).unwrap();
    for (file, strip) in [(&plain, true), (&small, false)] {
        let out = kit::run(
            Command::new(kit::workspace_bin("symtrace-upload"))
                .args(["--server", &server.url, "--no-sources"])
                .args(strip.then_some("--strip"))
                .arg(file),
        );
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let stripped = std::fs::read(&plain).unwrap();
    assert_ne!(
        symtrace_elf::htlhash_bytes(&built),
        symtrace_elf::htlhash_bytes(&stripped)
    );
    assert!(!symtrace_elf::inspect(&stripped).unwrap().has_dwarf);

    let mut agent = publishing_agent(&server, 64 << 20);
    let (plain_svc, small_svc) = (kit::unique("go-plain-"), kit::unique("go-small-"));
    let mut a = run_for(&plain, &plain_svc, "6");
    let mut b = run_for(&small, &small_svc, "6");
    let stacks = wait_for(&server, &plain_svc, |s| {
        samples_with(s, "main.heavyWork") > 0 && samples_with(s, "main.lightWork") > 0
    });
    assert!(
        samples_with(&stacks, "main.heavyWork") > 0 && samples_with(&stacks, "main.lightWork") > 0,
        "{}",
        summary(&stacks)
    );
    // Under the Go runtime's frames. (main.main is missing above a
    // frameless leaf: Go writes no .eh_frame to recover its caller from.)
    assert!(
        stacks
            .iter()
            .any(|(s, _)| s.contains("runtime.main;") && s.ends_with("main.heavyWork")),
        "{}",
        summary(&stacks)
    );
    let source = workload("gowork/main.go");
    let text = std::fs::read_to_string(&source).unwrap();
    let decl = text
        .lines()
        .position(|l| l.contains("func heavyWork"))
        .unwrap() as u64
        + 1;
    let nodes: Vec<Value> = tree_nodes(&server, &plain_svc, "main.heavyWork");
    assert!(!nodes.is_empty());
    for node in &nodes {
        assert!(
            node["file"]
                .as_str()
                .is_some_and(|f| f.ends_with("gowork/main.go")),
            "{node}"
        );
        let line = node["line"].as_u64().unwrap_or(0);
        assert!(
            (decl..decl + 5).contains(&line),
            "line {line}, heavyWork at {decl}: {node}"
        );
    }
    // `-s -w` left no symbol table and no DWARF: reported as such.
    let small_id = symtrace_elf::htlhash_bytes(&std::fs::read(&small).unwrap());
    let small_stacks = wait_for(&server, &small_svc, |s| !s.is_empty());
    assert!(!small_stacks.is_empty());
    assert_eq!(
        status_of(&server, &small_svc, &small_id).as_deref(),
        Some("no_symbols"),
        "{}",
        summary(&small_stacks)
    );
    a.wait().unwrap();
    b.wait().unwrap();
    agent.stop();
}

/// Distinct unnamed frames of `module` (`module+0xADDRESS`) in the stacks.
fn unnamed_frames(stacks: &[(String, u64)], module: &str) -> std::collections::BTreeSet<u64> {
    let prefix = format!("{module}+0x");
    stacks
        .iter()
        .flat_map(|(s, _)| s.split(';'))
        .filter_map(|f| u64::from_str_radix(f.strip_prefix(&prefix)?, 16).ok())
        .collect()
}

/// (address, size, name) of the defined functions of `file`'s dynamic
/// symbol table, as binutils reads them.
fn dynamic_functions(file: &Path) -> Vec<(u64, u64, String)> {
    let out = kit::run(
        Command::new("nm")
            .args(["-D", "-S", "--defined-only"])
            .arg(file),
    );
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            if f.len() != 4 || !matches!(f[2], "T" | "t" | "W" | "i") {
                return None;
            }
            Some((
                u64::from_str_radix(f[0], 16).ok()?,
                u64::from_str_radix(f[1], 16).ok()?,
                f[3].split('@').next()?.to_owned(),
            ))
        })
        .collect()
}

#[test]
fn third_party_interpreters_are_named_as_far_as_their_own_symbols_go() {
    let Some(_one) = bpf_test(&["node", "nm"]) else {
        return;
    };
    let python = PathBuf::from("/usr/bin/python3.11");
    assert!(python.exists(), "Debian's python3 (python3.11)");
    let node = std::fs::canonicalize(
        String::from_utf8(kit::run(Command::new("sh").args(["-c", "command -v node"])).stdout)
            .unwrap()
            .trim(),
    )
    .unwrap();
    let server = Server::start(&Backend::local(), &[]);
    // node is 99 MB.
    let mut agent = publishing_agent(&server, 128 << 20);
    let (py_svc, node_svc) = (kit::unique("py-"), kit::unique("node-"));
    let mut py = Command::new(&python)
        .args([
            "-c",
            "import time\nt = time.time()\nwhile time.time() - t < 8:\n    sum(i * i for i in range(10000))",
        ])
        .env("OTEL_SERVICE_NAME", &py_svc)
        .spawn()
        .unwrap();
    let mut js = Command::new(&node)
        .args([
            "-e",
            "const t = Date.now(); let s = 0; while (Date.now() - t < 8000) { for (let i = 0; i < 1e6; i++) s += Math.sqrt(i); JSON.stringify({s}); }",
        ])
        .env("OTEL_SERVICE_NAME", &node_svc)
        .spawn()
        .unwrap();
    // Named from what the agent published: python's .dynsym, node's own
    // symbol table.
    // Node's 90 MB go first, and its DWARF is indexed: give it time.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(90);
    // (node's frame carries its parameters: `node::Start(int, char**)`.)
    let named = |stacks: &[(String, u64)], frame: &str| {
        stacks
            .iter()
            .any(|(s, _)| s.split(';').any(|f| f.split('(').next() == Some(frame)))
    };
    while std::time::Instant::now() < deadline
        && !(named(&folded(&server, &py_svc), "_PyEval_EvalFrameDefault")
            && named(&folded(&server, &node_svc), "node::Start"))
    {
        std::thread::sleep(std::time::Duration::from_millis(500));
    }
    py.wait().unwrap();
    js.wait().unwrap();
    agent.stop();
    // Every sample exported; the flamegraph and the answer read together.
    let py_stacks = wait_for(&server, &py_svc, |_| true);
    let node_stacks = wait_for(&server, &node_svc, |_| true);
    assert!(
        samples_with(&py_stacks, "_PyEval_EvalFrameDefault") > 0,
        "{}\n{}",
        summary(&py_stacks),
        agent.stderr()
    );
    assert!(
        node_stacks.iter().any(|(s, _)| s.contains("node::Start")),
        "{}",
        summary(&node_stacks)
    );

    // python3.11: only .dynsym. A named frame is one of its functions; an
    // unnamed one lies outside every function's extent (a static function
    // the table leaves out), never named after the symbol before it.
    let functions = dynamic_functions(&python);
    assert!(functions.len() > 1000, "{} functions", functions.len());
    let names: std::collections::HashSet<&str> =
        functions.iter().map(|(_, _, n)| n.as_str()).collect();
    let python_id = kit::build_id_of(&python);
    let url = format!(
        "{}/api/v1/flamegraph?service={py_svc}&from=now-1h&to=now",
        server.url
    );
    // Asked until it answers 200 (a busy server answers 503 with
    // Retry-After), and what it answered else is shown: a clean-clone CI
    // run once read a body without `build_ids` here, its status unprinted.
    let fg = kit::wait_until_ok(std::time::Duration::from_secs(60), || {
        match kit::json_of(kit::client().get(&url).send().unwrap()) {
            (200, fg) => Ok(fg),
            (status, body) => Err(format!("{status}: {body}")),
        }
    })
    .unwrap_or_else(|e| panic!("the flamegraph of {py_svc}: {e}"));
    // Every frame of python3.11 is named by what the agent published: the
    // samples taken while its content hash was being computed too (they
    // carry it by the time they are sent), so there is one entry for it,
    // bound to its content.
    let modules: Vec<&Value> = fg["build_ids"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|m| m["build_id"] == python_id.as_str())
        .collect();
    assert_eq!(
        modules.len(),
        1,
        "python3.11 in {}\n{}",
        fg["build_ids"],
        agent.stderr()
    );
    let module = modules[0];
    assert_eq!(module["status"], "symbols_only", "{module}");
    assert_eq!(
        module["content_sha256"],
        hex::encode(<sha2::Sha256 as sha2::Digest>::digest(
            std::fs::read(&python).unwrap()
        )),
        "{module}"
    );
    let unnamed = unnamed_frames(&py_stacks, "python3.11");
    assert_eq!(module["unnamed"], unnamed.len(), "{module}");
    if !unnamed.is_empty() {
        assert!(
            module["reason"]
                .as_str()
                .unwrap()
                .contains("outside every symbol"),
            "{module}"
        );
    }
    for address in &unnamed {
        let inside = functions
            .iter()
            .find(|(a, size, _)| (*a..a + size.max(&1)).contains(address));
        assert!(inside.is_none(), "{address:#x} is inside {inside:?}");
    }
    // Frames in python3.11 that were named carry one of its functions.
    let stack_text: String = py_stacks.iter().map(|(s, _)| format!("{s};")).collect();
    assert!(names.contains("_PyEval_EvalFrameDefault"));
    assert!(stack_text.contains("_PyEval_EvalFrameDefault;"));

    // node: its own symbol table (and DWARF) names its frames.
    let node_id = kit::build_id_of(&node);
    let (_, details) = kit::json_of(server.get(&format!("/api/v1/debuginfo/{node_id}")));
    assert_eq!(details["artifacts"][0]["origin"], "agent", "{details}");
    let (_, details) = kit::json_of(server.get(&format!("/api/v1/debuginfo/{python_id}")));
    assert_eq!(details["artifacts"][0]["origin"], "agent", "{details}");
    assert_eq!(details["artifacts"][0]["quality"], 1, "{details}");
}

/// The vendor service, linked with build-ID `build_id` and `pad` bytes of
/// a non-loaded section: a file of a known size to upload.
fn padded_service(dir: &Path, name: &str, build_id: &str, pad: usize) -> PathBuf {
    let full = dir.join(format!("{name}-full"));
    clang_with_frame_pointers(
        &full,
        &[workload("symtab_service.c")],
        &[&format!("-Wl,--build-id=0x{build_id}")],
    );
    let padding = dir.join(format!("{name}.pad"));
    let bytes: Vec<u8> = (0..pad).map(|i| (i * 131 % 251) as u8).collect();
    std::fs::write(&padding, bytes).unwrap();
    let out = dir.join(name);
    kit::run(
        Command::new("objcopy")
            .arg("--strip-debug")
            .arg(format!("--add-section=.pad={}", padding.display()))
            .arg(&full)
            .arg(&out),
    );
    out
}

/// Waits (up to `secs`) until the server stores something under `build_id`.
fn wait_stored(server: &Server, build_id: &str, secs: u64) -> bool {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(secs);
    while std::time::Instant::now() < deadline {
        if server
            .get(&format!("/api/v1/debuginfo/{build_id}"))
            .status()
            == 200
        {
            return true;
        }
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    false
}

/// (bytes, elapsed ms) of the agent's upload of `path`, from its log.
fn upload_logged(agent: &Agent, path: &Path) -> (u64, u64) {
    let log = agent.stderr();
    let line = log
        .lines()
        .find(|l| l.contains("published a binary") && l.contains(&path.display().to_string()))
        .unwrap_or_else(|| panic!("no upload of {} logged:\n{log}", path.display()));
    (
        number_after(line, "bytes="),
        number_after(line, "elapsed_ms="),
    )
}

#[test]
fn uploads_keep_to_their_byte_rate_and_a_slow_server_delays_no_export() {
    let Some(_one) = bpf_test(&["clang-19", "objcopy", "python3"]) else {
        return;
    };
    let server = Server::start(&Backend::local(), &[]);
    let dir = tempfile::tempdir().unwrap();
    let agent_bin = Path::new(env!("CARGO_BIN_EXE_symtrace-agent"));

    // The cap: 1.5 MiB at 512 KiB/s cannot take less than 3 s.
    let rate = 512 * 1024u64;
    let capped = padded_service(dir.path(), "capped", "c0ffee01", 3 << 19);
    let size = std::fs::metadata(&capped).unwrap().len();
    let mut agent = Agent::start(
        agent_bin,
        &server.grpc_addr,
        &[
            "--upload-url",
            &server.url,
            "--upload-bytes-per-second",
            &rate.to_string(),
            "--upload-max-file-bytes",
            "4194304",
        ],
    );
    let mut child = run_for(&capped, &kit::unique("capped-"), "4");
    assert!(wait_stored(&server, "c0ffee01", 60), "{}", agent.stderr());
    child.wait().unwrap();
    agent.stop();
    let (bytes, ms) = upload_logged(&agent, &capped);
    assert_eq!(bytes, size);
    let floor = size * 1000 / rate;
    assert!(
        ms >= floor * 95 / 100,
        "{bytes} bytes in {ms} ms: faster than {rate} B/s"
    );

    // A slow server (a 32 KiB/s link in front of it): 256 KiB take 8 s,
    // and the exports, which do not go through it, stay on time.
    let mut link = Command::new("python3")
        .arg(workload("slowlink.py"))
        .arg(server.url.trim_start_matches("http://"))
        .arg("32768")
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut first = String::new();
    std::io::BufRead::read_line(
        &mut std::io::BufReader::new(link.stdout.as_mut().unwrap()),
        &mut first,
    )
    .unwrap();
    let port = first.trim().strip_prefix("listening ").unwrap().to_owned();
    let slow = padded_service(dir.path(), "slow", "c0ffee02", 256 << 10);
    let mut agent = Agent::start(
        agent_bin,
        &server.grpc_addr,
        &[
            "--upload-url",
            &format!("http://127.0.0.1:{port}"),
            "--upload-bytes-per-second",
            "16777216",
            "--upload-max-file-bytes",
            "4194304",
        ],
    );
    let service = kit::unique("slow-");
    let started = Instant::now();
    let mut child = run_for(&slow, &service, "12");
    assert!(wait_stored(&server, "c0ffee02", 60), "{}", agent.stderr());
    child.wait().unwrap();
    let ran = started.elapsed();
    agent.stop();
    let _ = link.kill();
    let _ = link.wait();
    let (_, ms) = upload_logged(&agent, &slow);
    assert!(ms >= 6000, "the link is slow: {ms} ms");
    // One export a second while the upload crawled: none waited. Batches
    // the agent held (for content hashes or identities being read: on a
    // busy host, other processes') or sent late it reports, and only that
    // time is excused; the agent ran at least as long as the service, and
    // its first and last intervals may be cut (on an idle host: the 10 a
    // 12 s run always had to show).
    let stats: Vec<String> = agent
        .stdout()
        .lines()
        .filter(|l| l.starts_with("stats:"))
        .map(str::to_owned)
        .collect();
    let total = agent.last_line("total:").unwrap();
    let late = Duration::from_millis(number_after(&total, "batches ("));
    let due = ran.saturating_sub(late).as_secs_f64();
    assert!(
        stats.len() as f64 >= due - 2.0,
        "{} exports in {ran:?}, {late:?} of it late: {stats:?}",
        stats.len()
    );
    for line in &stats {
        assert!(number_after(line, "buffered ") <= 1, "{line}");
    }
    assert_eq!(number_after(&total, "failed exports "), 0, "{total}");
    let delivered: Vec<u64> = stats
        .iter()
        .map(|l| number_after(l, "samples in "))
        .collect();
    assert!(
        delivered.windows(2).all(|w| w[1] > w[0]),
        "a batch every interval: {delivered:?}"
    );
    let stacks = wait_for(&server, &service, |s| samples_with(s, "publish_heavy") > 0);
    assert!(
        samples_with(&stacks, "publish_heavy") > 0,
        "{}",
        summary(&stacks)
    );
}

#[test]
fn a_binary_over_the_size_bound_is_published_as_its_symbol_table() {
    let Some(_one) = bpf_test(&["clang-19", "objcopy"]) else {
        return;
    };
    let server = Server::start(&Backend::local(), &[]);
    let dir = tempfile::tempdir().unwrap();
    let full = dir.path().join("big-full");
    clang_with_frame_pointers(
        &full,
        &[workload("symtab_service.c")],
        &["-DPAD_BYTES=3145728"],
    );
    let big = dir.path().join("big-svc");
    kit::run(
        Command::new("objcopy")
            .arg("--strip-debug")
            .arg(&full)
            .arg(&big),
    );
    assert!(std::fs::metadata(&big).unwrap().len() > 3 << 20);
    let build_id = kit::build_id_of(&big);
    let mut agent = publishing_agent(&server, 1 << 20);
    let service = kit::unique("big-");
    let mut child = run_for(&big, &service, "5");
    let stacks = wait_for(&server, &service, |s| samples_with(s, "publish_heavy") > 0);
    child.wait().unwrap();
    agent.stop();
    assert!(
        samples_with(&stacks, "publish_heavy") > 0,
        "{}\n{}",
        summary(&stacks),
        agent.stderr()
    );
    let (_, details) = kit::json_of(server.get(&format!("/api/v1/debuginfo/{build_id}")));
    let artifact = &details["artifacts"][0];
    assert_eq!(artifact["kind"], "debuginfo", "{details}");
    assert_eq!(artifact["origin"], "agent", "{details}");
    assert_eq!(artifact["quality"], 2, "{details}");
    assert!(artifact["size"].as_u64().unwrap() < 1 << 20, "{details}");
}

#[test]
fn a_file_ci_published_is_neither_hashed_nor_published_by_an_agent() {
    let Some(_one) = bpf_test(&["clang-19", "objcopy"]) else {
        return;
    };
    let server = Server::start(&Backend::local(), &[]);
    let dir = tempfile::tempdir().unwrap();
    // Two builds of one service under their own build-IDs, each over the
    // 16 MiB below which the agent hashes without asking: CI publishes
    // one; the other only runs on the host.
    let build = |name: &str, id: &str| {
        let exe = padded_service(dir.path(), name, id, 20 << 20);
        assert_eq!(kit::build_id_of(&exe), id);
        exe
    };
    let (ci_id, host_id) = ("c1".repeat(20), "a7".repeat(20));
    let (ci_exe, host_exe) = (build("ci-built", &ci_id), build("host-built", &host_id));
    server.upload(&ci_id, "executable", &ci_exe);
    let mut agent = publishing_agent(&server, 64 << 20);
    let (ci_svc, host_svc) = (kit::unique("ci-svc-"), kit::unique("host-svc-"));
    // Both run until the checks below are done (the agent opens a file
    // while a process maps it: beside a busy build it reads a new process
    // seconds late).
    let children = [
        Killed(run_for(&ci_exe, &ci_svc, "120")),
        Killed(run_for(&host_exe, &host_svc, "120")),
    ];
    // The host's build is named once the agent has published it: 20 MiB at
    // the default 2 MiB/s, after the files of the host's other processes
    // offered before it (beside a cargo build, many: the queue publishes
    // 30 files a minute), so that comes first.
    assert!(
        wait_stored(&server, &host_id, 120),
        "the agent published the file no CI uploaded"
    );
    for service in [&ci_svc, &host_svc] {
        let stacks = wait_for(&server, service, |s| samples_with(s, "publish_heavy") > 0);
        assert!(
            samples_with(&stacks, "publish_heavy") > 0,
            "{service} is named:\n{}",
            summary(&stacks)
        );
    }
    drop(children);
    agent.stop();
    let log = agent.stderr();
    let about = |exe: &Path| -> Vec<String> {
        let path = exe.display().to_string();
        log.lines()
            .filter(|l| l.contains(&path))
            .map(str::to_owned)
            .collect()
    };
    let (ci_lines, host_lines) = (about(&ci_exe), about(&host_exe));
    // CI's file: asked about, never hashed, never offered.
    assert!(
        ci_lines.iter().any(|l| l.contains("not hashed")),
        "{ci_lines:#?}"
    );
    assert!(
        !ci_lines
            .iter()
            .any(|l| l.contains("content hash") || l.contains("published a binary")),
        "{ci_lines:#?}"
    );
    // The host's own build: hashed, then published.
    assert!(
        host_lines
            .iter()
            .any(|l| l.contains("content hash") && l.contains("computed=true")),
        "{host_lines:#?}"
    );
    assert!(
        host_lines.iter().any(|l| l.contains("published a binary")),
        "{host_lines:#?}"
    );
    let total = agent.last_line("total:").unwrap();
    assert!(number_after(&total, "not needed ") >= 1, "{total}");
    // CI's is still the only file of its ID.
    let (_, details) = kit::json_of(server.get(&format!("/api/v1/debuginfo/{ci_id}")));
    let artifacts = details["artifacts"].as_array().unwrap();
    assert_eq!(artifacts.len(), 1, "{details}");
    assert_ne!(artifacts[0]["origin"], "agent", "{details}");
}
