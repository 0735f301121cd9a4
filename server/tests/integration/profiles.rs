//! OTLP profiles ingest and storage: PyPI's opentelemetry-proto client over
//! gRPC, OTLP/HTTP protobuf and OTLP/JSON; bad input; kill -9 while a
//! client exports; compaction by two servers at once.

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::Value;

use crate::support::*;

fn client_cmd(python: &Path, server: &Server, args: &[&str]) -> Command {
    let mut cmd = Command::new(python);
    cmd.arg(otlp_client_script()).args(args).args([
        "--grpc",
        &server.grpc_addr,
        "--http",
        &server.url,
    ]);
    cmd
}

/// The raw samples of a tenant.
pub fn dump(server: &Server, tenant: &str) -> Value {
    dump_query(server, tenant, "")
}

/// The raw samples of a tenant matching a query string (`?…`).
pub fn dump_query(server: &Server, tenant: &str, query: &str) -> Value {
    let resp = client()
        .get(format!("{}/api/v1/profiles/samples{query}", server.url))
        .header("X-Scope-OrgID", tenant)
        .send()
        .unwrap();
    let (status, body) = json_of(resp);
    assert_eq!(status, 200, "{body}");
    body
}

/// Events (timestamps, or values without timestamps) in a dump.
fn events(dump: &Value) -> usize {
    dump["samples"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| {
            let n = s["timestamps"].as_array().unwrap().len();
            n.max(s["values"].as_array().unwrap().len())
        })
        .sum()
}

#[test]
fn independent_client_round_trip_on_every_backend() {
    let Some(python) = python() else { return };
    for backend in Backend::all() {
        let server = Server::start(&backend, &[]);
        let out = run(&mut client_cmd(&python, &server, &["roundtrip"]));
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success(),
            "[{}] {stdout}{}",
            backend.name,
            String::from_utf8_lossy(&out.stderr)
        );
        for transport in ["grpc", "http-protobuf", "http-json"] {
            assert!(
                stdout.contains(&format!("{transport}: ok:")),
                "[{}] {stdout}",
                backend.name
            );
        }
        // Tenants are apart: the default tenant sees none of it.
        assert_eq!(events(&dump(&server, "default")), 0);
        assert!(events(&dump(&server, "grpc")) > 1000);
    }
}

#[test]
fn kill_9_while_exporting_loses_no_acknowledged_export() {
    let Some(python) = python() else { return };
    for backend in Backend::all() {
        for transport in ["grpc", "http-protobuf"] {
            let mut server = Server::start(&backend, &[]);
            let prefix = format!("{transport}-");
            let mut child = client_cmd(
                &python,
                &server,
                &["loop", "--transport", transport, "--tenant-prefix", &prefix],
            )
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
            let acked: Arc<Mutex<BTreeMap<String, usize>>> = Default::default();
            let reader = {
                let acked = acked.clone();
                let stdout = child.stdout.take().unwrap();
                std::thread::spawn(move || {
                    for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                        let parts: Vec<&str> = line.split_whitespace().collect();
                        if let ["acked", id, events] = parts[..] {
                            acked
                                .lock()
                                .unwrap()
                                .insert(id.to_owned(), events.parse().unwrap());
                        }
                    }
                })
            };
            let deadline = Instant::now() + Duration::from_secs(30);
            while acked.lock().unwrap().len() < 20 {
                assert!(
                    Instant::now() < deadline,
                    "client made no progress:\n{}",
                    server.log_text()
                );
                std::thread::sleep(Duration::from_millis(20));
            }
            server.kill9();
            let _ = child.kill();
            let _ = child.wait();
            reader.join().unwrap();
            server.spawn();

            let body = dump(&server, &format!("{prefix}loop"));
            let mut stored: BTreeMap<String, usize> = BTreeMap::new();
            for s in body["samples"].as_array().unwrap() {
                let id = s["resource"]["export.id"].as_str().unwrap().to_owned();
                *stored.entry(id).or_default() += s["timestamps"].as_array().unwrap().len();
            }
            let acked = acked.lock().unwrap();
            for (id, events) in acked.iter() {
                assert_eq!(
                    stored.get(id),
                    Some(events),
                    "[{} {transport}] acknowledged export {id} is not all there ({} acked)",
                    backend.name,
                    acked.len()
                );
            }
        }
    }
}

/// Per (service, type, stack, labels, link): the sum of values (1 per
/// timestamp without values) and the number of events.
fn totals(dump: &Value) -> BTreeMap<String, (i64, usize)> {
    let mut out: BTreeMap<String, (i64, usize)> = BTreeMap::new();
    for s in dump["samples"].as_array().unwrap() {
        let key = format!(
            "{} {} {} {} {} {}",
            s["service"], s["profile_type"], s["stack"], s["labels"], s["resource"], s["trace_id"]
        );
        let values = s["values"].as_array().unwrap();
        let n = s["timestamps"].as_array().unwrap().len().max(values.len());
        let sum: i64 = if values.is_empty() {
            n as i64
        } else {
            values.iter().map(|v| v.as_i64().unwrap()).sum()
        };
        let e = out.entry(key).or_default();
        e.0 += sum;
        e.1 += n;
    }
    out
}

#[test]
fn compaction_by_two_servers_at_once_preserves_every_sample() {
    let Some(python) = python() else { return };
    let backend = Backend::postgres_s3().unwrap_or_else(Backend::local);
    // With the default hour-long windows, nothing ingested here is due for
    // compaction until the two compactors below (1 s windows) start.
    let ingest = Server::start(&backend, &[]);
    // Many small exports (one segment each) over a few seconds.
    let mut child = client_cmd(&python, &ingest, &["loop", "--transport", "http-protobuf"])
        .stdout(Stdio::null())
        .spawn()
        .unwrap();
    symtrace_testkit::wait_until("ten exports stored", Duration::from_secs(60), || {
        let listed = dump_query(&ingest, "loop", "?limit=0");
        (listed["segments"].as_array().unwrap().len() >= 10).then_some(())
    });
    let _ = child.kill();
    let _ = child.wait();
    run(&mut client_cmd(
        &python,
        &ingest,
        &["roundtrip", "--tenant-prefix", "c-"],
    ));
    let tenants = ["loop", "c-grpc", "c-http-protobuf", "c-http-json"];
    let before: Vec<Value> = tenants.iter().map(|t| dump(&ingest, t)).collect();
    let segments_before = before[0]["segments"].as_array().unwrap().len();
    assert!(segments_before >= 10, "{segments_before} segments");

    let compactor = [
        ("SYMTRACE_COMPACTION_INTERVAL", "1"),
        ("SYMTRACE_COMPACTION_WINDOW", "1"),
        ("SYMTRACE_COMPACTION_DELAY", "0"),
    ];
    let a = Server::start_on(&ingest, &compactor);
    let b = Server::start_on(&ingest, &compactor);
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        let all_compacted = tenants.iter().all(|t| {
            dump_query(&a, t, "?limit=0")["segments"]
                .as_array()
                .unwrap()
                .iter()
                .all(|s| s["level"] == 1)
        });
        if all_compacted {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "not compacted:\n{}\n{}",
            a.log_text(),
            b.log_text()
        );
        std::thread::sleep(Duration::from_millis(500));
    }
    for (tenant, before) in tenants.iter().zip(&before) {
        for server in [&a, &b, &ingest] {
            let after = dump(server, tenant);
            assert_eq!(
                totals(&after),
                totals(before),
                "[{}] tenant {tenant}",
                backend.name
            );
        }
    }
    // Traces are found through the index written by compaction.
    let samples = before[1]["samples"].as_array().unwrap();
    let traces: Vec<&str> = samples
        .iter()
        .filter_map(|s| s["trace_id"].as_str())
        .take(5)
        .collect();
    assert!(!traces.is_empty());
    for trace in traces {
        let want: Vec<&Value> = samples.iter().filter(|s| s["trace_id"] == trace).collect();
        let got = dump_query(&a, "c-grpc", &format!("?trace_id={trace}"));
        assert_eq!(
            totals(&got),
            totals(&serde_json::json!({ "samples": want })),
            "trace {trace}"
        );
    }
    let segments_after = dump(&a, "loop")["segments"].as_array().unwrap().len();
    assert!(
        segments_after * 2 <= segments_before,
        "{segments_before} segments became {segments_after}"
    );
    let log = a.log_text() + &b.log_text();
    assert!(log.contains("compaction"), "{log}");
}

#[test]
fn crash_between_segment_and_index_acknowledges_nothing_and_leaves_an_orphan() {
    let Some(python) = python() else { return };
    let base = Server::start(
        &Backend::local(),
        &["--gc-interval", "1", "--gc-grace", "0"],
    );
    let blobs = base.data_dir.join("objects/blobs");
    let crashing = Server::start_on(&base, &[("SYMTRACE_CRASH_AT", "segment-before-commit")]);
    let out = client_cmd(&python, &crashing, &["roundtrip"])
        .output()
        .unwrap();
    assert!(!out.status.success(), "the export was acknowledged");
    assert!(count_files(&blobs) >= 1, "the segment object was written");
    // Nothing is visible, and the collector removes the orphan.
    assert_eq!(events(&dump(&base, "grpc")), 0);
    let deadline = Instant::now() + Duration::from_secs(30);
    while count_files(&blobs) > 0 {
        assert!(
            Instant::now() < deadline,
            "orphan not collected:\n{}",
            base.log_text()
        );
        std::thread::sleep(Duration::from_millis(200));
    }
}
