//! The loadtest's scenarios against a real server: the table and the exit
//! code, a server killed mid-run, and the verification of acknowledged
//! data (which must catch data a server acknowledged and does not have).

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Command, Output, Stdio};
use std::time::Duration;

use serde_json::Value;
use symtrace_testkit::{self as kit, Backend, Server};

fn loadtest() -> Command {
    Command::new(env!("CARGO_BIN_EXE_symtrace-loadtest"))
}

/// stdout, and the JSON summary (its last line).
fn outcome(out: &Output) -> (String, Value) {
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let json = text
        .lines()
        .rev()
        .find(|l| l.starts_with('{'))
        .and_then(|l| serde_json::from_str(l).ok())
        .unwrap_or_else(|| {
            panic!(
                "no JSON summary in\n{text}\n{}",
                String::from_utf8_lossy(&out.stderr)
            )
        });
    (text, json)
}

fn op<'a>(json: &'a Value, scenario: &str, name: &str) -> &'a Value {
    json["ops"]
        .as_array()
        .unwrap()
        .iter()
        .find(|o| o["scenario"] == scenario && o["op"] == name)
        .unwrap_or_else(|| panic!("no {scenario} {name} in {json}"))
}

#[test]
fn otlp_for_20_seconds_prints_a_table_and_exits_0() {
    let server = Server::start(&Backend::local(), &[]);
    let out = loadtest()
        .args(["otlp", "--url", &server.url, "--duration", "20s"])
        .args(["--connections", "2"])
        .output()
        .unwrap();
    let (text, json) = outcome(&out);
    assert!(out.status.success(), "{text}");
    assert!(text.contains("scenario   op"), "{text}");
    assert!(text.contains("errors            none"), "{text}");
    let export = op(&json, "otlp", "export");
    assert!(export["ok"].as_u64().unwrap() > 0, "{json}");
    assert!(
        export["latency_ms"]["p99"].as_f64().unwrap() > 0.0,
        "{json}"
    );
    assert!(json["seconds"].as_f64().unwrap() >= 20.0, "{json}");
    // The server runs here: its CPU and memory come from /proc.
    let s = &json["servers"][0];
    assert!(
        s["source"].as_str().unwrap().starts_with("/proc/"),
        "{json}"
    );
    assert!(s["cpu_cores"].as_f64().unwrap() > 0.0, "{json}");
    assert!(s["rss_max_bytes"].as_u64().unwrap() > 1_000_000, "{json}");
    // Every acknowledged export is stored: the one-frame sample naming it
    // is in the store.
    let folded = kit::client()
        .get(format!(
            "{}/api/v1/flamegraph?service=loadtest-exports&from=now-1h&to=now&format=folded&max_nodes=100000",
            server.url
        ))
        .header("X-Scope-OrgID", "loadtest")
        .send()
        .unwrap()
        .text()
        .unwrap();
    assert_eq!(
        folded.lines().filter(|l| l.starts_with("export-")).count() as u64,
        export["ok"].as_u64().unwrap(),
        "{folded}"
    );
    let events = export["units"].as_u64().unwrap();
    assert_eq!(
        json["figures"]["exports ok"].as_u64(),
        export["ok"].as_u64(),
        "{json}"
    );
    assert!(events > export["ok"].as_u64().unwrap() * 1000, "{json}");
}

#[test]
fn otlp_reports_the_errors_and_fails_when_the_server_dies_mid_run() {
    let mut server = Server::start(&Backend::local(), &[]);
    let mut child = loadtest()
        .args(["otlp", "--url", &server.url, "--duration", "10s"])
        .args(["--connections", "2"])
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    // The first line comes once the payloads are generated and sending
    // starts (seconds in a debug build on a busy machine).
    let (started, lines) = std::sync::mpsc::channel();
    let stdout = child.stdout.take().unwrap();
    let reader = std::thread::spawn(move || {
        let mut text = String::new();
        for line in BufReader::new(stdout).lines() {
            let line = line.unwrap();
            let _ = started.send(());
            text.push_str(&line);
            text.push('\n');
        }
        text
    });
    lines.recv_timeout(Duration::from_secs(120)).unwrap();
    std::thread::sleep(Duration::from_secs(3));
    server.kill9();
    let status = child.wait().unwrap();
    let text = reader.join().unwrap();
    let json: Value = serde_json::from_str(text.lines().last().unwrap()).unwrap();
    assert_eq!(status.code(), Some(1), "{text}");
    let export = op(&json, "otlp", "export");
    assert!(export["ok"].as_u64().unwrap() > 0, "{json}");
    let errors = export["errors"].as_object().unwrap();
    assert!(
        errors.contains_key("connection refused"),
        "errors by kind: {errors:?}"
    );
    assert!(text.contains("otlp export: connection refused ×"), "{text}");
    assert!(text.contains("unreachable for"), "{text}");
}

#[test]
fn debuginfod_serves_hits_and_misses() {
    let elf = Path::new("/usr/bin/ls");
    if !kit::require(elf.exists(), "/usr/bin/ls (an ELF file with a build-ID)") {
        return;
    }
    let server = Server::start(&Backend::local(), &[]);
    let out = loadtest()
        .args(["debuginfod", "--url", &server.url, "--duration", "3s"])
        .args(["--files", "10", "--seed", "7"])
        .output()
        .unwrap();
    let (text, json) = outcome(&out);
    assert!(out.status.success(), "{text}");
    let size = std::fs::metadata(elf).unwrap().len();
    let hit = op(&json, "debuginfod", "hit");
    assert!(hit["ok"].as_u64().unwrap() > 10, "{json}");
    assert_eq!(
        hit["units"].as_u64().unwrap(),
        hit["ok"].as_u64().unwrap() * size
    );
    assert!(
        op(&json, "debuginfod", "miss")["ok"].as_u64().unwrap() > 0,
        "{json}"
    );
    // The uploaded set is really there, under its own build-IDs.
    assert_eq!(
        server.metric("symtrace_uploads_total", &[("result", "created")]),
        10.0,
        "{}",
        server.get("/metrics").text().unwrap()
    );
}

/// `mixed --verify` finds every acknowledged export and upload; aimed at
/// two servers that do not share a store, it reports what the other one
/// acknowledged as missing and fails: the check can fail.
#[test]
fn mixed_verifies_what_was_acknowledged_and_catches_what_is_missing() {
    if !kit::require(Path::new("/usr/bin/ls").exists(), "/usr/bin/ls") {
        return;
    }
    let a = Server::start(&Backend::local(), &[]);
    let mixed = |urls: &[&str]| {
        let mut cmd = loadtest();
        cmd.args(["mixed", "--duration", "6s", "--verify", "--files", "5"]);
        for url in urls {
            cmd.args(["--url", url]);
        }
        cmd.output().unwrap()
    };
    let out = mixed(&[&a.url]);
    let (text, json) = outcome(&out);
    assert!(out.status.success(), "{text}");
    assert!(
        text.contains(&format!("verify {}", a.url))
            && text.contains(", 0 missing; 0 uploads missing"),
        "{text}"
    );
    assert_eq!(json["figures"]["verified"], "yes", "{json}");
    for (scenario, name) in [
        ("otlp", "export"),
        ("debuginfod", "hit"),
        ("query", "flamegraph"),
        ("query", "trace"),
    ] {
        assert!(
            op(&json, scenario, name)["ok"].as_u64().unwrap() > 0,
            "{scenario} {name}: {json}"
        );
    }

    let b = Server::start(&Backend::local(), &[]);
    let out = mixed(&[&a.url, &b.url]);
    let (text, json) = outcome(&out);
    assert_eq!(out.status.code(), Some(1), "{text}");
    assert!(text.contains("NO: acknowledged data missing"), "{text}");
    let missing = json["figures"][format!("verify {}", a.url)]
        .as_str()
        .unwrap();
    assert!(!missing.contains(" 0 missing"), "{missing}");
}
