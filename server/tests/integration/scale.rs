//! What a query costs and who compacts (issue #21): a trace lookup among
//! thousands of uncompacted segments reads only the segments that hold the
//! trace, and of a fleet's export only the part of the service the trace
//! ran in; two replicas compact two tenants' windows at the same time,
//! each window once.

use std::time::{Duration, Instant};

use serde_json::Value;
use symtrace_profiles::testing::{self, cpu_profile, named_frames};
use symtrace_proto::collector::ExportProfilesServiceRequest;
use symtrace_proto::profiles::{Link, Sample};

use super::hostile::{linked_request, now_ns};
use super::profiles::dump;
use super::profiles_bad_input::export_http as export;
use crate::support::*;

/// One sample at `time_ns` linked to `trace`.
fn linked(service: &str, trace: [u8; 16], time_ns: u64) -> ExportProfilesServiceRequest {
    linked_request(service, 3, time_ns, trace, [1; 8], Vec::new())
}

/// The object store requests of one kind a server made so far.
fn object_requests(server: &Server, op: &str) -> u64 {
    let text = server.get("/metrics").text().unwrap();
    let prefix = format!("symtrace_object_store_requests_total{{op=\"{op}\"}} ");
    text.lines()
        .find_map(|l| l.strip_prefix(&prefix))
        .map_or(0, |v| v.trim().parse::<f64>().unwrap() as u64)
}

fn trace_id(i: u32) -> [u8; 16] {
    let mut t = [0x42u8; 16];
    t[..4].copy_from_slice(&i.to_be_bytes());
    t
}

#[test]
fn a_trace_among_thousands_of_uncompacted_segments_reads_only_its_segments() {
    let Some(backend) = Backend::postgres_s3() else {
        return;
    };
    // No compaction: every segment stays level 0.
    let server = Server::start(&backend, &["--compaction-interval", "0"]);
    let tenant = &unique("traces");
    let base = now_ns() - 600_000_000_000;
    let wanted = trace_id(u32::MAX);
    let holders = [17usize, 1_500, 2_999];
    // 3,000 exports, each its own segment and trace; three also hold the
    // wanted trace (the last one only in a second profile).
    std::thread::scope(|scope| {
        for part in 0..4usize {
            let server = &server;
            scope.spawn(move || {
                for i in (part..3_000).step_by(4) {
                    let time = base + i as u64 * 1_000_000;
                    let mut req = linked("svc", trace_id(i as u32), time);
                    if holders.contains(&i) {
                        let other = linked("svc", wanted, time + 500);
                        req.resource_profiles.extend(other.resource_profiles);
                        req.dictionary = other.dictionary.map(|mut d| {
                            // Both profiles share one dictionary: the wanted
                            // trace at link 2.
                            d.link_table.insert(
                                1,
                                Link {
                                    trace_id: trace_id(i as u32).to_vec(),
                                    span_id: vec![1; 8],
                                },
                            );
                            d
                        });
                        let samples =
                            &mut req.resource_profiles[1].scope_profiles[0].profiles[0].samples[0];
                        samples.link_index = 2;
                    }
                    export(server, tenant, &req);
                }
            });
        }
    });
    // Counted in the database: reading them through the API would fill
    // the segment cache.
    let segments = psql(
        &backend,
        &format!("SELECT count(*) FROM profile_segments WHERE tenant = '{tenant}' AND level = 0"),
    );
    assert_eq!(segments, "3000");

    let gets = object_requests(&server, "get");
    let (status, body) = json_of(
        client()
            .get(format!(
                "{}/api/v1/traces/{}",
                server.url,
                hex::encode(wanted)
            ))
            .header("X-Scope-OrgID", tenant.as_str())
            .send()
            .unwrap(),
    );
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["segments_read"], 3, "{body}");
    let spans = body["spans"].as_array().unwrap();
    assert_eq!(spans.len(), 1, "{body}");
    assert_eq!(spans[0]["samples"], 3, "{body}");
    assert_eq!(
        object_requests(&server, "get") - gets,
        3,
        "the lookup's object reads"
    );
    // A trace no segment holds reads nothing.
    let gets = object_requests(&server, "get");
    let (status, body) = json_of(
        client()
            .get(format!(
                "{}/api/v1/traces/{}",
                server.url,
                hex::encode(trace_id(u32::MAX - 1))
            ))
            .header("X-Scope-OrgID", tenant.as_str())
            .send()
            .unwrap(),
    );
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["segments_read"], 0, "{body}");
    assert_eq!(object_requests(&server, "get"), gets);
    // The flamegraph of the trace reads the same three.
    let resp = client()
        .get(format!(
            "{}/api/v1/flamegraph?trace_id={}",
            server.url,
            hex::encode(wanted)
        ))
        .header("X-Scope-OrgID", tenant.as_str())
        .send()
        .unwrap();
    let body: Value = resp.json().unwrap();
    assert_eq!(body["segments_read"], 3, "{body}");
    assert_eq!(body["samples"], 3, "{body}");
}

/// `SELECT` through psql against the backend's database.
fn psql(backend: &Backend, sql: &str) -> String {
    let out = std::process::Command::new("psql")
        .arg(backend.database_url().expect("PostgreSQL"))
        .args(["-qAtc", sql])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).trim().to_owned()
}

#[test]
fn two_replicas_compact_two_tenants_windows_at_once_and_each_window_once() {
    let Some(backend) = Backend::postgres_s3() else {
        return;
    };
    // Ingest (its compactor's next pass is a minute away: the replicas
    // below are done by then).
    let ingest = Server::start(&backend, &[]);
    let tenants = [unique("left"), unique("right")];
    let hour = 3_600_000_000_000u64;
    let window = (now_ns() / hour - 2) * hour;
    for tenant in &tenants {
        for i in 0..3u64 {
            export(
                &ingest,
                tenant,
                &linked("svc", trace_id(i as u32), window + i * 1_000_000_000),
            );
        }
    }
    // Two compactors that hold each window's lease for 4 s before merging.
    let env = [
        ("SYMTRACE_COMPACTION_INTERVAL", "1"),
        ("SYMTRACE_COMPACTION_DELAY", "0"),
        ("SYMTRACE_PAUSE_AT", "compaction-window:4000"),
    ];
    let (a, b) = std::thread::scope(|scope| {
        let a = scope.spawn(|| Server::start_on(&ingest, &env));
        let b = scope.spawn(|| Server::start_on(&ingest, &env));
        (a.join().unwrap(), b.join().unwrap())
    });
    // Both leases held at once, by two holders.
    let live = "SELECT count(DISTINCT holder) || ' ' || count(*) FROM leases \
                WHERE name LIKE 'compact/%' AND expires_at > \
                (extract(epoch from now()) * 1000)::bigint";
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let held = psql(&backend, live);
        if held == "2 2" {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "never two leases at once (last: {held}):\n{}\n{}",
            a.log_text(),
            b.log_text()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    // Each tenant's window becomes one segment holding its three exports.
    let deadline = Instant::now() + Duration::from_secs(60);
    for tenant in &tenants {
        loop {
            let d = dump(&a, tenant);
            let segments = d["segments"].as_array().unwrap();
            if segments.iter().all(|s| s["level"] == 1) {
                assert_eq!(segments.len(), 1, "{d}");
                let events: usize = d["samples"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .map(|s| s["timestamps"].as_array().unwrap().len())
                    .sum();
                assert_eq!(events, 3, "each export once");
                break;
            }
            assert!(Instant::now() < deadline, "not compacted: {d}");
            std::thread::sleep(Duration::from_millis(200));
        }
    }
    // Once each: the inputs were swapped out by one replica, so the other's
    // later passes found nothing (no second output ever committed).
    let level1 = psql(
        &backend,
        &format!(
            "SELECT count(*) FROM profile_segments WHERE level = 1 AND tenant IN ('{}', '{}')",
            tenants[0], tenants[1]
        ),
    );
    assert_eq!(level1, "2");
    // Released leases leave no rows behind (one per window would pile up).
    let deadline = Instant::now() + Duration::from_secs(20);
    while psql(
        &backend,
        "SELECT count(*) FROM leases WHERE name LIKE 'compact/%'",
    ) != "0"
    {
        assert!(Instant::now() < deadline, "lease rows left behind");
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// One export of `services` services, each with `n` events over 8 named
/// frames, from `time_ns`; `svc-17`'s linked to `trace` when given.
fn fleet_export(
    services: usize,
    n: u64,
    time_ns: u64,
    trace: Option<[u8; 16]>,
) -> ExportProfilesServiceRequest {
    let mut dictionary = named_frames(8);
    if let Some(trace) = trace {
        dictionary.link_table = vec![
            Link {
                trace_id: vec![0; 16],
                span_id: vec![0; 8],
            },
            Link {
                trace_id: trace.to_vec(),
                span_id: vec![1; 8],
            },
        ];
    }
    let mut req = testing::request(None, Vec::new(), dictionary);
    req.resource_profiles.clear();
    for s in 0..services {
        let sample = Sample {
            stack_index: 1,
            link_index: i32::from(trace.is_some() && s == 17),
            timestamps_unix_nano: (0..n).map(|i| time_ns + s as u64 * 1_000 + i).collect(),
            ..Default::default()
        };
        let one = testing::request(
            Some(&format!("svc-{s}")),
            vec![cpu_profile(time_ns, vec![sample])],
            named_frames(8),
        );
        req.resource_profiles.extend(one.resource_profiles);
    }
    req
}

fn flamegraph_read(server: &Server, tenant: &str, query: &str) -> (u64, u64, u64) {
    let resp = client()
        .get(format!("{}/api/v1/flamegraph?{query}", server.url))
        .header("X-Scope-OrgID", tenant)
        .send()
        .unwrap();
    assert_eq!(resp.status(), 200);
    let body: Value = resp.json().unwrap();
    (
        body["bytes_read"].as_u64().unwrap(),
        body["segments_read"].as_u64().unwrap(),
        body["samples"].as_u64().unwrap(),
    )
}

#[test]
fn a_one_service_query_reads_only_that_services_parts_before_and_after_compaction() {
    // With `--ingest-layout whole`, ingested segments are one part, read
    // whole; compacted ones are by series still.
    whole_layout_reads_whole_exports_and_compacted_parts();
    for backend in Backend::all() {
        // By default ingested segments are by series, as compacted ones are.
        let ingest = Server::start(&backend, &[]);
        let tenant = &unique("fleet");
        // Five exports of a 200-service fleet, five minutes ago (closed
        // one-minute windows for the compactor below).
        let base = (now_ns() - 300_000_000_000) / 60_000_000_000 * 60_000_000_000 + 1_000;
        // The third export links svc-17's samples to a trace.
        let trace = trace_id(17);
        for e in 0..5u64 {
            let linked = (e == 2).then_some(trace);
            export(
                &ingest,
                tenant,
                &fleet_export(200, 20, base + e * 1_000_000, linked),
            );
        }
        let range = format!("from={}&to={}", base - 1, base + 60_000_000_000);
        let check = |server: &Server, segments: u64, when: &str| {
            // The trace view first (nothing cached yet): it reads the one
            // part of the one segment that holds the trace.
            let gets = object_requests(server, "get");
            let (status, body) = json_of(
                client()
                    .get(format!(
                        "{}/api/v1/traces/{}",
                        server.url,
                        hex::encode(trace)
                    ))
                    .header("X-Scope-OrgID", tenant.as_str())
                    .send()
                    .unwrap(),
            );
            assert_eq!(status, 200, "{body}");
            assert_eq!(
                body["segments_read"], 1,
                "[{}] {when}: {body}",
                backend.name
            );
            assert_eq!(body["spans"][0]["samples"], 20, "{body}");
            let trace_bytes = body["bytes_read"].as_u64().unwrap();
            if backend.name == "postgres+s3" {
                assert_eq!(object_requests(server, "get") - gets, 1, "{when}");
            }
            // The one-service query first: the whole-fleet one caches every
            // part under the key the one-service query would read.
            let gets = object_requests(server, "get");
            let (bytes, read, samples) =
                flamegraph_read(server, tenant, &format!("service=svc-17&{range}"));
            let service_gets = object_requests(server, "get") - gets;
            let (all_bytes, all_segments, all_samples) = flamegraph_read(server, tenant, &range);
            assert_eq!(
                (all_segments, all_samples),
                (segments, 5 * 200 * 20),
                "{when}"
            );
            assert_eq!(
                (read, samples),
                (segments, 5 * 20),
                "[{}] {when}",
                backend.name
            );
            // Its parts are a 200th of the data, give or take the per-part
            // framing: at most twice that share.
            assert!(
                bytes * 100 <= all_bytes,
                "[{}] {when}: one service read {bytes} of {all_bytes} bytes",
                backend.name
            );
            // The trace's one part is a 200th of one of `segments` parts.
            assert!(
                trace_bytes * 100 * segments <= all_bytes,
                "[{}] {when}: the trace view read {trace_bytes} of {all_bytes} bytes",
                backend.name
            );
            if backend.name == "postgres+s3" {
                // One ranged GET per segment but the one whose svc-17 part
                // the trace view read: cached under the same key.
                assert_eq!(service_gets, segments - 1, "{when}");
                // The whole-fleet query again: every part is cached and
                // the segments' part directories known, nothing is fetched.
                let gets = object_requests(server, "get");
                assert_eq!(flamegraph_read(server, tenant, &range).2, 5 * 200 * 20);
                assert_eq!(object_requests(server, "get") - gets, 0, "{when}");
            }
            // A diff of one service against the fleet counts each sample
            // once on each side (one side lists the service's parts, the
            // other the same segments whole).
            let diff: Value = client()
                .get(format!(
                    "{}/api/v1/diff?baseline_service=svc-17&{range}",
                    server.url
                ))
                .header("X-Scope-OrgID", tenant)
                .send()
                .unwrap()
                .json()
                .unwrap();
            assert_eq!(
                (&diff["baseline"]["samples"], &diff["comparison"]["samples"]),
                (&Value::from(5 * 20), &Value::from(5 * 200 * 20)),
                "[{}] {when}",
                backend.name
            );
        };
        check(&ingest, 5, "as ingested");
        let compactor = compacted(&ingest, tenant);
        check(&compactor, 1, "compacted");
    }
}

fn whole_layout_reads_whole_exports_and_compacted_parts() {
    let backend = Backend::local();
    let ingest = Server::start(&backend, &["--ingest-layout", "whole"]);
    let tenant = &unique("fleet-whole");
    let base = (now_ns() - 300_000_000_000) / 60_000_000_000 * 60_000_000_000 + 1_000;
    for e in 0..3u64 {
        export(
            &ingest,
            tenant,
            &fleet_export(50, 20, base + e * 1_000_000, None),
        );
    }
    let range = format!("from={}&to={}", base - 1, base + 60_000_000_000);
    let one = format!("service=svc-7&{range}");
    let (all, _, _) = flamegraph_read(&ingest, tenant, &range);
    let (bytes, read, samples) = flamegraph_read(&ingest, tenant, &one);
    assert_eq!((bytes, read, samples), (all, 3, 3 * 20), "whole exports");
    let compactor = compacted(&ingest, tenant);
    let (all, _, _) = flamegraph_read(&compactor, tenant, &range);
    let (bytes, read, samples) = flamegraph_read(&compactor, tenant, &one);
    assert_eq!((read, samples), (1, 3 * 20));
    assert!(bytes * 25 <= all, "compacted: {bytes} of {all} bytes");
}

/// A server on `ingest`'s storage, with nothing cached, once another one
/// that compacts one-minute windows at once has merged `tenant`'s segments
/// into one.
fn compacted(ingest: &Server, tenant: &str) -> Server {
    let compactor = Server::start_on(
        ingest,
        &[
            ("SYMTRACE_COMPACTION_INTERVAL", "1"),
            ("SYMTRACE_COMPACTION_WINDOW", "60"),
            ("SYMTRACE_COMPACTION_DELAY", "0"),
        ],
    );
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let d = dump(&compactor, tenant);
        let segments = d["segments"].as_array().unwrap();
        if segments.len() == 1 && segments[0]["level"] == 1 {
            // The samples read above are cached in the compactor.
            drop(compactor);
            return Server::start_on(ingest, &[]);
        }
        assert!(Instant::now() < deadline, "not compacted: {d}");
        std::thread::sleep(Duration::from_millis(300));
    }
}
