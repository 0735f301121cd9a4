//! Hostile exports: stacks thousands of frames deep, exports that would
//! decode into gigabytes, attribute lists built to make validation
//! quadratic; and compaction, which must never change an answer.

use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use prost::Message;
use serde_json::Value;
use symtrace_profiles::testing::{self, cpu_profile, named_frames, strings};
use symtrace_proto::collector::{
    profiles_service_client::ProfilesServiceClient, ExportProfilesServiceRequest,
};
use symtrace_proto::common::{any_value, AnyValue};
use symtrace_proto::profiles::{
    Function, KeyValueAndUnit, Line, Link, Location, Profile, ProfilesDictionary, Sample, Stack,
};

use super::profiles::dump;
use super::profiles_bad_input::{export_http as export, post};
use crate::support::*;

pub const TRACE: [u8; 16] = [0x5b; 16];
const SPAN: [u8; 8] = [0xee; 8];

pub fn now_ns() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_nanos() as u64
}

fn with_service(
    service: &str,
    profiles: Vec<Profile>,
    dictionary: ProfilesDictionary,
) -> ExportProfilesServiceRequest {
    testing::request(Some(service), profiles, dictionary)
}

/// One sample whose stack is `depth` named frames `f0` (leaf) … `f{depth-1}`
/// (root), linked to [`TRACE`]/[`SPAN`].
pub fn deep_request(service: &str, depth: usize, time_ns: u64) -> ExportProfilesServiceRequest {
    linked_request(service, depth, time_ns, TRACE, SPAN, vec![5])
}

/// One sample at `time_ns + 1` of `depth` named frames, linked to
/// `trace`/`span`, with `values` (empty: the timestamp counts 1).
pub fn linked_request(
    service: &str,
    depth: usize,
    time_ns: u64,
    trace: [u8; 16],
    span: [u8; 8],
    values: Vec<i64>,
) -> ExportProfilesServiceRequest {
    let mut dictionary = named_frames(depth);
    dictionary.link_table = vec![
        Link {
            trace_id: vec![0; 16],
            span_id: vec![0; 8],
        },
        Link {
            trace_id: trace.to_vec(),
            span_id: span.to_vec(),
        },
    ];
    let sample = Sample {
        stack_index: 1,
        link_index: 1,
        values,
        timestamps_unix_nano: vec![time_ns + 1],
        ..Default::default()
    };
    with_service(
        service,
        vec![cpu_profile(time_ns, vec![sample])],
        dictionary,
    )
}

pub fn get(server: &Server, tenant: &str, path: &str) -> (u16, String) {
    let resp = client()
        .get(format!("{}{path}", server.url))
        .header("X-Scope-OrgID", tenant)
        .timeout(Duration::from_secs(120))
        .send()
        .unwrap();
    (resp.status().as_u16(), resp.text().unwrap())
}

/// The `nodes` count, the depth and the leaf's name of a nested JSON tree
/// answer. A 1,025-frame tree nests 2,050 JSON levels: more than
/// serde_json's default limit (128) or Python's recursion allows, so it is
/// parsed without the limit, on a thread with a large stack (the Value is
/// built and dropped recursively; the server never builds one).
fn tree_shape(body: String) -> (u64, usize, String) {
    std::thread::Builder::new()
        .stack_size(512 << 20)
        .spawn(move || {
            let mut de = serde_json::Deserializer::from_str(&body);
            de.disable_recursion_limit();
            let v: Value = serde::Deserialize::deserialize(&mut de).unwrap();
            let mut node = &v["tree"];
            let mut levels = 0;
            while let Some(child) = node["children"].get(0) {
                node = child;
                levels += 1;
            }
            let leaf = node["name"].as_str().unwrap_or_default().to_owned();
            (v["nodes"].as_u64().unwrap_or(0), levels, leaf)
        })
        .unwrap()
        .join()
        .unwrap()
}

fn alive(server: &Server) {
    let (status, body) = get(server, "default", "/healthz");
    assert_eq!(status, 200, "{body}\n{}", server.log_text());
}

#[test]
fn stacks_of_ten_and_a_hundred_thousand_frames_are_truncated_and_every_format_answers() {
    let server = Server::start(&Backend::local(), &[]);
    let tenant = "deep";
    let t = now_ns() - 120_000_000_000;
    for (service, depth) in [("deep-10k", 10_000), ("deep-100k", 100_000)] {
        let response = export(&server, tenant, &deep_request(service, depth, t));
        assert!(response.partial_success.is_none(), "{response:?}");
    }
    assert_eq!(
        server.metric("symtrace_ingest_truncated_stacks_total", &[]),
        2.0
    );
    let range = format!("from={}&to={}", t - 1_000_000_000, t + 10_000_000_000);
    let trace = hex::encode(TRACE);
    for (service, depth) in [("deep-10k", 10_000usize), ("deep-100k", 100_000)] {
        let base = format!("service={service}&{range}");
        // The folded stack: the leaf-most 1,024 frames under one marker.
        let (status, folded) = get(
            &server,
            tenant,
            &format!("/api/v1/flamegraph?{base}&format=folded"),
        );
        assert_eq!(status, 200, "{folded}");
        let line = folded.lines().next().expect("one line");
        let (stack, value) = line.rsplit_once(' ').unwrap();
        assert_eq!(value, "5");
        let frames: Vec<&str> = stack.split(';').collect();
        assert_eq!(frames.len(), 1025, "1,024 frames and the marker");
        assert!(
            frames[0].starts_with(&format!("[truncated: {} root-most frames", depth - 1024)),
            "{}",
            frames[0]
        );
        assert_eq!(frames[1], "f1023");
        assert_eq!(frames[1024], "f0", "the leaf is kept");
        for query in [
            format!("/api/v1/flamegraph?{base}"),
            format!("/api/v1/flamegraph?{base}&max_nodes=100000"),
            format!("/api/v1/flamegraph?{base}&format=flamebearer&max_nodes=100000"),
            format!("/api/v1/flamegraph?{base}&format=svg"),
            format!("/api/v1/flamegraph?{base}&format=pprof"),
            format!("/api/v1/flamegraph?{base}&trace_id={trace}&max_nodes=100000"),
            format!("/api/v1/diff?{base}&max_nodes=100000"),
            format!("/api/v1/diff?{base}&format=svg"),
            format!("/api/v1/traces/{trace}"),
            format!("/api/v1/profiles/samples?{range}"),
        ] {
            let (status, body) = get(&server, tenant, &query);
            assert_eq!(status, 200, "{query}: {}", &body[..body.len().min(500)]);
            if query.contains("max_nodes=100000") && !query.contains("flamebearer") {
                let (nodes, levels, leaf) = tree_shape(body);
                assert_eq!(nodes, 1026, "{query}: root + 1,025 frames");
                assert_eq!(levels, 1025, "{query}");
                assert_eq!(leaf, "f0", "{query}");
            }
        }
        alive(&server);
    }
}

#[test]
fn the_samples_listing_takes_the_time_forms_every_query_takes() {
    let server = Server::start(&Backend::local(), &[]);
    let tenant = "forms";
    let hour = 3_600_000_000_000u64;
    let now = now_ns();
    // One sample a minute ago, one two hours ago (each its own trace).
    for (service, t) in [("recent", now - 60_000_000_000), ("old", now - 2 * hour)] {
        let response = export(&server, tenant, &deep_request(service, 3, t));
        assert!(response.partial_success.is_none(), "{response:?}");
    }
    let services = |query: &str| -> Vec<String> {
        let (status, body) = get(&server, tenant, &format!("/api/v1/profiles/samples{query}"));
        assert_eq!(status, 200, "{query}: {body}");
        let body: Value = serde_json::from_str(&body).unwrap();
        let mut names: Vec<String> = body["samples"]
            .as_array()
            .unwrap()
            .iter()
            .map(|s| s["service"].as_str().unwrap_or_default().to_owned())
            .collect();
        names.sort();
        names.dedup();
        names
    };
    let trace = hex::encode(TRACE);
    assert_eq!(services(""), ["old", "recent"], "all time by default");
    assert_eq!(services("?from=now-1h"), ["recent"]);
    assert_eq!(services("?from=now-1h&to=now"), ["recent"]);
    assert_eq!(services("?from=now-3h&to=now-1h"), ["old"]);
    assert_eq!(
        services(&format!("?from={}&to={}", now - hour, now + 1)),
        ["recent"],
        "unix nanoseconds"
    );
    assert_eq!(
        services(&format!("?trace_id={trace}&from=now-1h")),
        ["recent"]
    );
    assert_eq!(services(&format!("?trace_id={trace}")), ["old", "recent"]);
    // The same errors as the query API's.
    for (query, says) in [
        ("?from=yesterday", "now-<n><unit>"),
        ("?from=now-1h&to=now-2h", "must be before"),
        ("?trace_id=00000000000000000000000000000000", "all zeros"),
        ("?trace_id=5b5b", "32 hex digits"),
    ] {
        let (status, body) = get(&server, tenant, &format!("/api/v1/profiles/samples{query}"));
        assert_eq!(status, 400, "{query}: {body}");
        assert!(body.contains(says), "{query}: {body}");
    }
    alive(&server);
}

/// Every endpoint that selects samples takes the same time forms (`now-1h`,
/// Unix nanoseconds) and trace ID, and refuses a bad one in the same words
/// (one parser under all of them).
#[test]
fn every_selecting_endpoint_takes_the_same_forms_and_refuses_the_same_way() {
    let server = Server::start(&Backend::local(), &[]);
    let tenant = "forms-all";
    let now = now_ns();
    let response = export(
        &server,
        tenant,
        &deep_request("recent", 3, now - 60_000_000_000),
    );
    assert!(response.partial_success.is_none(), "{response:?}");
    let hour = 3_600_000_000_000u64;
    let trace = hex::encode(TRACE);
    let unix = format!("from={}&to={}", now - hour, now + 1);
    // (endpoint with its own parameters, what a good answer holds)
    let endpoints: [(&str, &str); 7] = [
        ("/api/v1/services?", "\"recent\""),
        (
            "/api/v1/profile-types?service=recent&",
            "samples:count:cpu:nanoseconds",
        ),
        ("/api/v1/labels?service=recent&", "labels"),
        (
            "/api/v1/labels/service.name/values?service=recent&",
            "values",
        ),
        ("/api/v1/flamegraph?service=recent&format=folded&", "f0"),
        ("/api/v1/diff?service=recent&", "tree"),
        ("/api/v1/profiles/samples?service=recent&", "\"stack\""),
    ];
    for (endpoint, holds) in endpoints {
        for form in ["from=now-1h", "from=now-1h&to=now", unix.as_str()] {
            let (status, body) = get(&server, tenant, &format!("{endpoint}{form}"));
            assert_eq!(status, 200, "{endpoint}{form}: {body}");
            assert!(body.contains(holds), "{endpoint}{form}: {body}");
        }
        let (status, body) = get(&server, tenant, &format!("{endpoint}from=yesterday"));
        assert_eq!(status, 400, "{endpoint}: {body}");
        assert!(body.contains("now-<n><unit>"), "{endpoint}: {body}");
        let (status, body) = get(&server, tenant, &format!("{endpoint}from=now-1h&to=now-2h"));
        assert_eq!(status, 400, "{endpoint}: {body}");
        assert!(body.contains("must be before"), "{endpoint}: {body}");
    }
    // The trace forms, where a trace selects.
    for endpoint in [
        "/api/v1/flamegraph?format=folded&",
        "/api/v1/diff?",
        "/api/v1/profiles/samples?",
    ] {
        for form in [
            format!("trace_id={trace}"),
            format!("trace_id={trace}&from=now-1h"),
        ] {
            let (status, body) = get(&server, tenant, &format!("{endpoint}{form}"));
            assert_eq!(status, 200, "{endpoint}{form}: {body}");
            assert!(body.len() > 2, "{endpoint}{form}: {body}");
        }
        for (bad, says) in [("5b5b", "32 hex digits"), (&*"0".repeat(32), "all zeros")] {
            let (status, body) = get(&server, tenant, &format!("{endpoint}trace_id={bad}"));
            assert_eq!(status, 400, "{endpoint}{bad}: {body}");
            assert!(body.contains(says), "{endpoint}{bad}: {body}");
        }
    }
    let (status, body) = get(&server, tenant, &format!("/api/v1/traces/{trace}"));
    assert_eq!(status, 200, "{body}");
    let (status, body) = get(&server, tenant, "/api/v1/traces/5b5b");
    assert_eq!(status, 400, "{body}");
    assert!(body.contains("32 hex digits"), "{body}");
    alive(&server);
}

#[test]
fn exports_over_the_element_limit_are_refused_before_decoding_and_others_are_served() {
    let server = Server::start(&Backend::local(), &["--max-export-elements", "5000"]);
    let small = deep_request("small", 100, now_ns() - 60_000_000_000);
    let big = deep_request("big", 10_000, now_ns() - 60_000_000_000);
    export(&server, "limits", &small);
    let (status, body) = post(
        &server,
        "limits",
        "application/x-protobuf",
        None,
        big.encode_to_vec(),
    );
    assert_eq!(status, 413, "{}", String::from_utf8_lossy(&body));
    let text = String::from_utf8_lossy(&body);
    assert!(text.contains("more than 5000 elements"), "{text}");
    assert!(text.contains("SYMTRACE_MAX_EXPORT_ELEMENTS"), "{text}");
    // OTLP/JSON: bounded by its structure, before parsing.
    let json = symtrace_proto::json::encode_export_request(&big);
    let (status, body) = post(&server, "limits", "application/json", None, json);
    assert_eq!(status, 413, "{}", String::from_utf8_lossy(&body));
    let small_json = symtrace_proto::json::encode_export_request(&small);
    let (status, body) = post(&server, "limits", "application/json", None, small_json);
    assert_eq!(status, 200, "{}", String::from_utf8_lossy(&body));
    // gRPC: RESOURCE_EXHAUSTED with the same message.
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        let mut client = ProfilesServiceClient::connect(format!("http://{}", server.grpc_addr))
            .await
            .unwrap();
        let err = client.export(big.clone()).await.unwrap_err();
        assert_eq!(err.code(), tonic::Code::ResourceExhausted, "{err}");
        assert!(
            err.message().contains("SYMTRACE_MAX_EXPORT_ELEMENTS"),
            "{err}"
        );
        client.export(small.clone()).await.unwrap();
    });
    let stored = dump(&server, "limits");
    let services: Vec<&str> = stored["samples"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["service"].as_str().unwrap())
        .collect();
    assert!(services.iter().all(|s| *s == "small"), "{services:?}");
    assert_eq!(
        server.metric("symtrace_ingest_refused_total", &[("reason", "elements")]),
        3.0
    );
    alive(&server);
}

#[test]
fn long_attribute_lists_are_checked_in_linear_time_and_repeats_named() {
    let server = Server::start(&Backend::local(), &[]);
    let n = 50_000usize;
    let mut request = deep_request("attrs", 3, now_ns() - 60_000_000_000);
    let dict = request.dictionary.as_mut().unwrap();
    let first_key = dict.string_table.len() as i32;
    dict.string_table.extend((0..n).map(|i| format!("k{i}")));
    // (index 0, the empty attribute, is there already)
    for i in 0..n {
        dict.attribute_table.push(KeyValueAndUnit {
            key_strindex: first_key + i as i32,
            value: Some(AnyValue {
                value: Some(any_value::Value::IntValue(i as i64)),
            }),
            unit_strindex: 0,
        });
    }
    // Two profiles: one with every key once, one whose last attribute
    // repeats the first key.
    let good = request.resource_profiles[0].scope_profiles[0].profiles[0].clone();
    let mut bad = good.clone();
    let all: Vec<i32> = (1..=n as i32).collect();
    let profile = &mut request.resource_profiles[0].scope_profiles[0].profiles;
    profile[0].samples[0].attribute_indices = all.clone();
    bad.samples[0].attribute_indices = all.iter().copied().chain([1]).collect();
    profile.push(bad);
    let started = Instant::now();
    let response = export(&server, "attrs", &request);
    let partial = response.partial_success.expect("one rejected");
    assert_eq!(partial.rejected_profiles, 1);
    assert!(
        partial.error_message.contains("repeat the key \"k0\""),
        "{}",
        partial.error_message
    );
    // Not a timing claim: a quadratic check of 50,000 keys would take
    // minutes, a linear one milliseconds.
    assert!(started.elapsed() < Duration::from_secs(60));
    alive(&server);
}

/// Value-only (pprof-shaped) and timestamped exports across several
/// compaction windows.
fn invariance_exports(base: u64) -> Vec<ExportProfilesServiceRequest> {
    let dictionary = || ProfilesDictionary {
        string_table: strings(["a", "b", "c"].map(String::from)),
        function_table: vec![
            Function::default(),
            Function {
                name_strindex: 5,
                ..Default::default()
            },
            Function {
                name_strindex: 6,
                ..Default::default()
            },
            Function {
                name_strindex: 7,
                ..Default::default()
            },
        ],
        location_table: (0..4)
            .map(|i| Location {
                lines: if i == 0 {
                    vec![]
                } else {
                    vec![Line {
                        function_index: i,
                        ..Default::default()
                    }]
                },
                ..Default::default()
            })
            .collect(),
        stack_table: vec![
            Stack::default(),
            Stack {
                location_indices: vec![1],
            },
            Stack {
                location_indices: vec![2, 1],
            },
            Stack {
                location_indices: vec![3, 1],
            },
        ],
        ..Default::default()
    };
    let s = 1_000_000_000u64;
    let mut out = Vec::new();
    // Value-only: one every 35 s over 5 minutes, values that differ.
    for k in 0..9u64 {
        let t = base + k * 35 * s;
        let samples = vec![
            Sample {
                stack_index: 2,
                values: vec![100 + k as i64],
                ..Default::default()
            },
            Sample {
                stack_index: 1,
                values: vec![7 * (k as i64 + 1)],
                ..Default::default()
            },
        ];
        let mut p = cpu_profile(t, samples);
        p.duration_nano = 10 * s;
        out.push(with_service("pprof-shaped", vec![p], dictionary()));
    }
    // Timestamped: events every 3 s over the same 5 minutes, both stacks.
    for k in 0..10u64 {
        let t0 = base + k * 30 * s;
        let samples = vec![
            Sample {
                stack_index: 3,
                timestamps_unix_nano: (0..10).map(|i| t0 + i * 3 * s).collect(),
                ..Default::default()
            },
            Sample {
                stack_index: 2,
                values: (0..5).map(|i| i + 1).collect(),
                timestamps_unix_nano: (0..5).map(|i| t0 + i * 5 * s + 1).collect(),
                ..Default::default()
            },
        ];
        let mut p = cpu_profile(t0, samples);
        p.duration_nano = 30 * s;
        out.push(with_service("ebpf-shaped", vec![p], dictionary()));
    }
    out
}

/// Every answer of a grid of sub-ranges, services and formats.
fn grid(server: &Server, tenant: &str, base: u64) -> Vec<(String, String)> {
    let s = 1_000_000_000u64;
    let mut answers = Vec::new();
    let cuts: Vec<u64> = [
        0, 1, 17, 35, 36, 59, 60, 61, 90, 119, 120, 121, 200, 240, 299, 330,
    ]
    .iter()
    .map(|&c| base + c * s)
    .collect();
    for (i, &from) in cuts.iter().enumerate() {
        for &to in &cuts[i + 1..] {
            for service in ["pprof-shaped", "ebpf-shaped", ""] {
                let query = format!(
                    "/api/v1/flamegraph?service={service}&from={from}&to={to}&format=folded"
                );
                let (status, body) = get(server, tenant, &query);
                assert_eq!(status, 200, "{query}: {body}");
                let mut lines: Vec<&str> = body.lines().collect();
                lines.sort_unstable();
                answers.push((query, lines.join("\n")));
            }
        }
    }
    // The JSON tree's totals too, over a range that cuts a window.
    let query = format!(
        "/api/v1/flamegraph?from={}&to={}",
        base + 50 * s,
        base + 130 * s
    );
    let (status, body) = get(server, tenant, &query);
    assert_eq!(status, 200, "{body}");
    let v: Value = serde_json::from_str(&body).unwrap();
    answers.push((
        query,
        format!("{} {} {}", v["total"], v["samples"], v["tree"]),
    ));
    answers
}

/// A second server on `ingest`'s store that compacts every second, in
/// one-minute windows, as soon as they end.
fn compactor_of(ingest: &Server) -> Server {
    Server::start_on(
        ingest,
        &[
            ("SYMTRACE_COMPACTION_INTERVAL", "1"),
            ("SYMTRACE_COMPACTION_WINDOW", "60"),
            ("SYMTRACE_COMPACTION_DELAY", "0"),
        ],
    )
}

#[test]
fn compaction_never_changes_an_answer_and_a_retry_after_it_is_not_counted_twice() {
    let backend = Backend::postgres_s3().unwrap_or_else(Backend::local);
    let ingest = Server::start(&backend, &[]);
    let tenant = &unique("invariance");
    // Five minutes, well in the past, so 60 s windows are closed.
    let base = (now_ns() - 3_600_000_000_000) / 60_000_000_000 * 60_000_000_000 + 13_000_000_000;
    let exports = invariance_exports(base);
    for r in &exports {
        export(&ingest, tenant, r);
    }
    let before = grid(&ingest, tenant, base);
    let segments_before = dump(&ingest, tenant)["segments"].as_array().unwrap().len();
    assert_eq!(segments_before, exports.len());

    let compactor = compactor_of(&ingest);
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        let d = dump(&compactor, tenant);
        let segments = d["segments"].as_array().unwrap();
        if segments.iter().all(|s| s["level"] == 1) {
            assert!(
                segments.len() < segments_before,
                "{} segments",
                segments.len()
            );
            break;
        }
        assert!(
            Instant::now() < deadline,
            "not compacted:\n{}",
            compactor.log_text()
        );
        std::thread::sleep(Duration::from_millis(300));
    }
    let after = grid(&compactor, tenant, base);
    assert_eq!(before.len(), after.len());
    for ((query, a), (_, b)) in before.iter().zip(&after) {
        assert_eq!(a, b, "[{}] {query} changed with compaction", backend.name);
    }
    // Senders retry: every export again, after its segment was merged away.
    for r in &exports {
        export(&compactor, tenant, r);
    }
    let retried = grid(&compactor, tenant, base);
    for ((query, a), (_, b)) in before.iter().zip(&retried) {
        assert_eq!(a, b, "[{}] {query} changed with retries", backend.name);
    }
}

#[test]
fn an_unreadable_segment_is_quarantined_and_the_rest_compacted() {
    let ingest = Server::start(&Backend::local(), &[]);
    let tenant = "quarantine";
    let base = (now_ns() - 3_600_000_000_000) / 60_000_000_000 * 60_000_000_000;
    for k in 0..4u64 {
        export(
            &ingest,
            tenant,
            &deep_request("q", 5, base + k * 5_000_000_000),
        );
    }
    let segments = dump(&ingest, tenant)["segments"]
        .as_array()
        .unwrap()
        .clone();
    assert_eq!(segments.len(), 4);
    // One segment's object is damaged on disk (a disk error, a bad copy).
    let bad = segments[1]["sha256"].as_str().unwrap().to_owned();
    let object = ingest
        .data_dir
        .join("objects/blobs")
        .join(&bad[..2])
        .join(&bad);
    std::fs::write(&object, b"not a segment").unwrap();
    let compactor = compactor_of(&ingest);
    let deadline = Instant::now() + Duration::from_secs(60);
    while compactor.metric("symtrace_compaction_quarantined_total", &[]) < 1.0 {
        assert!(
            Instant::now() < deadline,
            "nothing quarantined:\n{}",
            compactor.log_text()
        );
        std::thread::sleep(Duration::from_millis(300));
    }
    // The other three were merged into one; the damaged one is left as it
    // was, and later passes do not try it again.
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let resp = client()
            .get(format!("{}/api/v1/profiles/samples?limit=0", compactor.url))
            .header("X-Scope-OrgID", tenant)
            .send()
            .unwrap();
        let (_, body) = json_of(resp);
        let levels: Vec<(String, i64)> = body["segments"]
            .as_array()
            .unwrap()
            .iter()
            .map(|s| {
                (
                    s["sha256"].as_str().unwrap().to_owned(),
                    s["level"].as_i64().unwrap(),
                )
            })
            .collect();
        if levels.iter().filter(|(_, l)| *l == 1).count() == 1 {
            assert_eq!(levels.len(), 2, "{levels:?}");
            assert!(levels.contains(&(bad.clone(), 0)), "{levels:?}");
            break;
        }
        assert!(
            Instant::now() < deadline,
            "not compacted: {levels:?}\n{}",
            compactor.log_text()
        );
        std::thread::sleep(Duration::from_millis(300));
    }
    // Counted once (the metric comes after the swap: wait for it).
    symtrace_testkit::wait_until("the quarantine counted", Duration::from_secs(30), || {
        (compactor.metric("symtrace_compaction_quarantined_total", &[]) >= 1.0).then_some(())
    });
    assert_eq!(
        compactor.metric("symtrace_compaction_quarantined_total", &[]),
        1.0
    );
    let log = compactor.log_text();
    assert!(log.contains("quarantining an unreadable segment"), "{log}");
    assert!(log.contains(&bad), "the log names the segment");
}

#[test]
fn retention_runs_with_compaction_off() {
    let server = Server::start(
        &Backend::local(),
        &[
            "--compaction-interval",
            "0",
            "--profile-retention",
            "1",
            "--retention-interval",
            "1",
        ],
    );
    let tenant = "retention";
    let hour = 3_600_000_000_000u64;
    export(
        &server,
        tenant,
        &deep_request("old", 3, now_ns() - 3 * hour),
    );
    export(
        &server,
        tenant,
        &deep_request("new", 3, now_ns() - 60_000_000_000),
    );
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let services: Vec<String> = dump(&server, tenant)["samples"]
            .as_array()
            .unwrap()
            .iter()
            .map(|s| s["service"].as_str().unwrap().to_owned())
            .collect();
        if services == ["new"] {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "{services:?}\n{}",
            server.log_text()
        );
        std::thread::sleep(Duration::from_millis(300));
    }
}
