//! `/api/v1/symbolize` and `symtrace-server symbolize` on both storage
//! backends: unknown build-IDs, symbols only, debug info uploaded after the
//! first query, the index built in the background and reused after a
//! restart, answers checked against llvm-symbolizer-19, and bad requests.

use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use crate::support::{self, build_id_of, client, count_files, have, run, Backend, Server};

const HEAVY_CPP: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/../symbolize/tests/fixtures/heavy.cpp"
);

/// The inline-heavy C++ fixture, built with `opt` and `-g` into `dir`.
fn build_heavy(dir: &Path, opt: &str) -> std::path::PathBuf {
    let binary = dir.join("heavy");
    run(Command::new("g++")
        .args([opt, "-g", "-o"])
        .arg(&binary)
        .arg(HEAVY_CPP));
    binary
}

fn post(server: &Server, body: &Value) -> (u16, Value) {
    support::json_of(
        client()
            .post(format!("{}/api/v1/symbolize", server.url))
            .json(body)
            .send()
            .unwrap(),
    )
}

fn symbolize(server: &Server, build_id: &str, addresses: &[u64]) -> Value {
    let hex: Vec<String> = addresses.iter().map(|a| format!("{a:#x}")).collect();
    let (status, body) = post(server, &json!({ "build_id": build_id, "addresses": hex }));
    assert_eq!(status, 200, "{body}");
    body["results"][0].clone()
}

/// Asks until the answer comes from the index (built in the background).
fn symbolize_from_index(server: &Server, build_id: &str, addresses: &[u64]) -> Value {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let result = symbolize(server, build_id, addresses);
        if result["tier"] == "index" {
            return result;
        }
        assert!(
            Instant::now() < deadline,
            "the index was never built: {}",
            server.log_text()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// (raw name, line) per frame, innermost first.
fn frames_of(address: &Value) -> Vec<(String, u64)> {
    address["frames"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| {
            let name = f["linkage_name"]
                .as_str()
                .or(f["function"].as_str())
                .unwrap_or("??");
            (name.to_owned(), f["line"].as_u64().unwrap_or(0))
        })
        .collect()
}

fn llvm_frames(binary: &Path, addresses: &[u64]) -> Vec<Vec<(String, u64)>> {
    let mut cmd = Command::new("llvm-symbolizer-19");
    cmd.arg(format!("--obj={}", binary.display()))
        .args(["--inlines", "--no-demangle"])
        .args(addresses.iter().map(|a| format!("{a:#x}")));
    let text = String::from_utf8(run(&mut cmd).stdout).unwrap();
    text.trim_end()
        .split("\n\n")
        .map(|block| {
            let lines: Vec<&str> = block.lines().collect();
            lines
                .chunks(2)
                .map(|p| {
                    let line = p[1].rsplit(':').nth(1).and_then(|l| l.parse().ok());
                    (p[0].to_owned(), line.unwrap_or(0))
                })
                .filter(|f| f.0 != "??")
                .collect()
        })
        .collect()
}

/// Addresses spread over `main` and the functions it inlines.
fn addresses_of(binary: &Path) -> Vec<u64> {
    let out = run(Command::new("nm")
        .args(["-S", "--defined-only"])
        .arg(binary));
    let mut addresses = Vec::new();
    for line in String::from_utf8(out.stdout).unwrap().lines() {
        let parts: Vec<&str> = line.split_whitespace().collect();
        if parts.len() == 4 && matches!(parts[2], "t" | "T") {
            let start = u64::from_str_radix(parts[0], 16).unwrap();
            let size = u64::from_str_radix(parts[1], 16).unwrap();
            addresses.extend((0..size).step_by(13).map(|o| start + o));
        }
    }
    addresses.truncate(400);
    addresses
}

#[test]
fn symbolize_api_from_symbols_to_dwarf_to_stored_index() {
    for tool in ["g++", "objcopy", "strip", "llvm-symbolizer-19"] {
        if !have(tool) {
            return;
        }
    }
    let dir = tempfile::tempdir().unwrap();
    let full = build_heavy(dir.path(), "-O2");
    let debug = dir.path().join("heavy.debug");
    run(Command::new("objcopy")
        .arg("--only-keep-debug")
        .arg(&full)
        .arg(&debug));
    let stripped = dir.path().join("heavy.stripped");
    run(Command::new("strip")
        .arg("--strip-debug")
        .arg("-o")
        .arg(&stripped)
        .arg(&full));
    let build_id = build_id_of(&full);
    let addresses = addresses_of(&full);
    let reference = llvm_frames(&full, &addresses);

    for backend in Backend::all() {
        let mut server = Server::start(&backend, &[]);
        let label = backend.name;

        // Nothing stored: said so, for the build-ID and every address.
        let result = symbolize(&server, &build_id, &addresses[..3]);
        assert_eq!(result["status"], "unknown_build_id", "{label}: {result}");
        assert_eq!(result["addresses"].as_array().unwrap().len(), 3);
        assert_eq!(result["addresses"][0]["status"], "unknown_build_id");

        // The stripped executable: names from .symtab, no lines.
        server.upload(&build_id, "executable", &stripped);
        let result = symbolize(&server, &build_id, &addresses);
        assert_eq!(result["status"], "symbols_only", "{label}: {result}");
        let first = &result["addresses"][0];
        assert_eq!(first["source"], "symtab");
        assert!(first["frames"][0]["function"].is_string());
        assert!(first["frames"][0]["line"].is_null());

        // The debug file, uploaded after the first queries, is used next.
        server.upload(&build_id, "debuginfo", &debug);
        let from_dwarf = symbolize(&server, &build_id, &addresses);
        assert_eq!(from_dwarf["status"], "ok", "{label}: {from_dwarf}");
        let from_index = symbolize_from_index(&server, &build_id, &addresses);
        for result in [&from_dwarf, &from_index] {
            let ours: Vec<Vec<(String, u64)>> = result["addresses"]
                .as_array()
                .unwrap()
                .iter()
                .map(frames_of)
                .collect();
            let differ = ours.iter().zip(&reference).filter(|(o, r)| o != r).count();
            assert_eq!(
                differ, 0,
                "{label} ({}): {differ} addresses differ from llvm-symbolizer",
                result["tier"]
            );
            let inlined = result["addresses"]
                .as_array()
                .unwrap()
                .iter()
                .filter(|a| a["frames"][0]["inlined"] == true)
                .count();
            assert!(
                inlined > 20,
                "{label}: only {inlined} addresses with inline frames"
            );
        }
        assert!(server.metric("symtrace_symbol_index_builds_total", &[("result", "ok")]) >= 1.0);

        // After a restart the stored index answers the first request.
        server.kill9();
        server.spawn();
        let again = symbolize(&server, &build_id, &addresses[..10]);
        assert_eq!(again["tier"], "index", "{label}: {again}");

        // A batch over several build-IDs, one of them unknown.
        let (status, body) = post(
            &server,
            &json!({ "requests": [
                { "build_id": build_id, "addresses": [addresses[0], format!("{:#x}", addresses[1])] },
                { "build_id": "00112233445566778899aabbccddeeff00112233", "addresses": ["0x10"] },
            ]}),
        );
        assert_eq!(status, 200, "{body}");
        assert_eq!(body["results"][0]["addresses"][0]["status"], "found");
        assert_eq!(body["results"][0]["addresses"][1]["status"], "found");
        assert_eq!(body["results"][1]["status"], "unknown_build_id");

        // An address outside every function.
        let outside = symbolize(&server, &build_id, &[0x10]);
        assert_eq!(outside["addresses"][0]["status"], "outside_functions");

        // The operator command.
        let out = run(Command::new(support::server_bin()).args([
            "symbolize",
            &build_id,
            &format!("{:#x}", addresses[5]),
            "--server",
            &server.url,
        ]));
        let text = String::from_utf8(out.stdout).unwrap();
        assert!(
            text.contains("heavy.cpp") || text.contains("/usr/include"),
            "{text}"
        );
    }
}

#[test]
fn bad_symbolize_requests_get_clear_errors() {
    let server = Server::start(&Backend::local(), &["--max-symbolize-addresses", "1000"]);
    let cases = [
        (
            json!({ "build_id": "xyz", "addresses": ["0x1"] }),
            400,
            "build-ID",
        ),
        (
            json!({ "build_id": "aabb", "addresses": ["0xzz"] }),
            400,
            "is not a number",
        ),
        (json!({ "addresses": ["0x1"] }), 400, "either build_id"),
        (
            json!({ "build_id": "aabbccdd", "addresses": ["0x1"], "extra": 1 }),
            400,
            "unknown field",
        ),
        (
            json!({ "build_id": "aabbccdd", "addresses": vec!["0x1"; 1001] }),
            413,
            "at most 1000",
        ),
    ];
    for (body, want, needle) in cases {
        let (status, answer) = post(&server, &body);
        support::assert_error(status, &answer, want, needle);
    }
    let resp = client()
        .post(format!("{}/api/v1/symbolize", server.url))
        .header("content-type", "application/json")
        .body("{not json")
        .send()
        .unwrap();
    let (status, answer) = support::json_of(resp);
    support::assert_error(status, &answer, 400, "invalid symbolize request");
}

/// A build-ID stored only upstream is fetched, stored and symbolized; a dwz
/// file's supplementary file is found by its own build-ID.
#[test]
fn upstream_files_and_dwz_supplementary_files_are_used() {
    for tool in ["g++", "dwz", "llvm-symbolizer-19"] {
        if !have(tool) {
            return;
        }
    }
    let dir = tempfile::tempdir().unwrap();
    let extra = HEAVY_CPP.replace("heavy.cpp", "extra.cpp");
    for (name, define) in [("a", "-DONE"), ("b", "-DTWO")] {
        run(Command::new("g++")
            .args(["-O2", "-g", define, "-o"])
            .arg(dir.path().join(name))
            .args([HEAVY_CPP, extra.as_str()]));
    }
    // The reference: the binary before dwz.
    let original = dir.path().join("a.orig");
    std::fs::copy(dir.path().join("a"), &original).unwrap();
    let addresses = addresses_of(&original);
    let reference = llvm_frames(&original, &addresses);
    let build_id = build_id_of(&original);
    let common = dir.path().join("common.debug");
    run(Command::new("dwz")
        .arg("-m")
        .arg(&common)
        .arg(dir.path().join("a"))
        .arg(dir.path().join("b")));
    let common_id = build_id_of(&common);

    // Upstream has the files; ours has nothing and asks it.
    let upstream = Server::start(&Backend::local(), &[]);
    upstream.upload(&build_id, "debuginfo", &original);
    upstream.upload(&common_id, "debuginfo", &common);
    let server = Server::start(&Backend::local(), &["--upstream-urls", &upstream.url]);
    let result = symbolize(&server, &build_id, &addresses);
    assert_eq!(result["status"], "ok", "{result}");
    let ours: Vec<_> = result["addresses"]
        .as_array()
        .unwrap()
        .iter()
        .map(frames_of)
        .collect();
    assert_eq!(
        ours, reference,
        "answers from the upstream's files differ from llvm-symbolizer"
    );

    // The dwz'd file, with its supplementary file stored separately.
    assert_eq!(
        build_id_of(&dir.path().join("a")),
        build_id,
        "dwz keeps the build-ID"
    );
    let local = Server::start(&Backend::local(), &[]);
    local.upload(&build_id, "debuginfo", &dir.path().join("a"));
    local.upload(&common_id, "debuginfo", &common);
    for result in [
        symbolize(&local, &build_id, &addresses),
        symbolize_from_index(&local, &build_id, &addresses),
    ] {
        let ours: Vec<_> = result["addresses"]
            .as_array()
            .unwrap()
            .iter()
            .map(frames_of)
            .collect();
        assert_eq!(
            ours, reference,
            "dwz -m ({}): frames differ",
            result["tier"]
        );
    }
}

/// A stored index goes when the file it was built from goes.
#[test]
fn an_index_is_collected_with_its_debug_file() {
    if !have("g++") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let binary = build_heavy(dir.path(), "-O1");
    let build_id = build_id_of(&binary);
    let server = Server::start(
        &Backend::local(),
        &["--gc-interval", "1", "--gc-grace", "0"],
    );
    let objects = server.data_dir.join("objects");
    let count = || count_files(&objects);
    server.upload(&build_id, "debuginfo", &binary);
    let addresses = addresses_of(&binary);
    symbolize_from_index(&server, &build_id, &addresses[..5]);
    assert_eq!(count(), 2, "the debug file and its index");

    let status = client()
        .delete(format!("{}/api/v1/debuginfo/{build_id}", server.url))
        .send()
        .unwrap()
        .status();
    assert!(status.is_success(), "delete: {status}");
    let deadline = Instant::now() + Duration::from_secs(20);
    while count() > 0 {
        assert!(
            Instant::now() < deadline,
            "not collected:\n{}",
            server.log_text()
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    let result = symbolize(&server, &build_id, &addresses[..1]);
    assert_eq!(result["status"], "unknown_build_id", "{result}");
}
