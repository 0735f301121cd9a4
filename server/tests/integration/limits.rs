//! What one client may hold: connections that never finish their headers,
//! bodies that stop arriving, and work that fills every slot of its kind.
//! Each bound is crossed, the refusal checked, and other clients are
//! served meanwhile.

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use prost::Message;
use symtrace_proto::collector::{
    profiles_service_client::ProfilesServiceClient, ExportProfilesServiceRequest,
};
use symtrace_proto::common::{any_value, AnyValue};
use symtrace_proto::profiles::{KeyValueAndUnit, Mapping};

use crate::support::*;

fn healthy(server: &Server) {
    let resp = client()
        .get(format!("{}/healthz", server.url))
        .timeout(Duration::from_secs(10))
        .send()
        .unwrap();
    assert_eq!(resp.status(), 200);
}

/// Whether the server closed (or answered and closed) this connection
/// within `wait`.
fn closed_within(s: &mut TcpStream, wait: Duration) -> bool {
    s.set_read_timeout(Some(wait)).unwrap();
    let mut buf = [0u8; 256];
    loop {
        match s.read(&mut buf) {
            Ok(0) => return true,
            // hyper may answer 408 before closing: read on to the end.
            Ok(_) => continue,
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => return true,
            Err(_) => return false,
        }
    }
}

#[test]
fn slow_header_clients_are_cut_off_and_never_starve_a_debuginfod_client() {
    // 100 connections at most: 500 slow-loris clients would hold them all
    // forever without the header timeout.
    let server = Server::start(
        &Backend::local(),
        &["--header-timeout", "2", "--max-connections", "100"],
    );
    let fixture = Fixture::hello("src", "hello.c", &["-g"]);
    fixture.publish(&server);
    let addr = server.url.trim_start_matches("http://").to_owned();
    let mut slow: Vec<TcpStream> = (0..500)
        .map(|_| {
            let mut s = TcpStream::connect(&addr).unwrap();
            // Half a request line, then nothing.
            s.write_all(b"GET /buildid/").unwrap();
            s
        })
        .collect();
    let started = Instant::now();
    let cache = tempfile::tempdir().unwrap();
    let got = server.debuginfod_fetch(cache.path(), &["debuginfo", &fixture.build_id]);
    assert_eq!(got, std::fs::read(&fixture.debug).unwrap());
    let answered = started.elapsed();
    assert!(
        answered < Duration::from_secs(60),
        "answered after {answered:?}"
    );
    let open = slow
        .iter_mut()
        .map(|s| closed_within(s, Duration::from_secs(30)))
        .filter(|closed| !closed)
        .count();
    assert_eq!(open, 0, "slow connections left open by the server");
    healthy(&server);
}

#[test]
fn a_body_that_stops_arriving_is_refused_with_408() {
    let server = Server::start(&Backend::local(), &["--body-idle-timeout", "2"]);
    let addr = server.url.trim_start_matches("http://").to_owned();
    for (path, content_type) in [
        (
            "/api/v1/debuginfo/0123456789abcdef0123456789abcdef01234567/debuginfo",
            "application/octet-stream",
        ),
        ("/v1development/profiles", "application/json"),
    ] {
        let method = if path.starts_with("/api") {
            "PUT"
        } else {
            "POST"
        };
        let mut s = TcpStream::connect(&addr).unwrap();
        write!(
            s,
            "{method} {path} HTTP/1.1\r\nHost: {addr}\r\nContent-Type: {content_type}\r\n\
             Content-Length: 100000\r\n\r\n{{\"resourceProfiles\""
        )
        .unwrap();
        s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
        let started = Instant::now();
        let mut reply = Vec::new();
        let _ = s.read_to_end(&mut reply);
        let text = String::from_utf8_lossy(&reply);
        assert!(text.starts_with("HTTP/1.1 408"), "{path}: {text}");
        assert!(
            text.contains("SYMTRACE_BODY_IDLE_TIMEOUT"),
            "{path}: {text}"
        );
        assert!(
            started.elapsed() >= Duration::from_secs(1),
            "{path}: too early"
        );
        healthy(&server);
    }
}

/// An upstream debuginfod server that accepts connections and never
/// answers; reports each connection it accepted.
fn stalled_upstream() -> (
    String,
    mpsc::Receiver<()>,
    std::thread::JoinHandle<()>,
    TcpListener,
) {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let (tx, rx) = mpsc::channel();
    let accept = listener.try_clone().unwrap();
    let handle = std::thread::spawn(move || {
        let mut held = Vec::new();
        for s in accept.incoming() {
            let Ok(s) = s else { break };
            // The test's sentinel connection ends the thread.
            if held.len() > 50 || tx.send(()).is_err() {
                break;
            }
            held.push(s);
        }
    });
    (url, rx, handle, listener)
}

/// An export of one native frame in a file with this GNU build-ID (a
/// flamegraph of it symbolizes that build-ID).
fn native_export(service: &str, build_id: &str) -> ExportProfilesServiceRequest {
    let mut request =
        super::hostile::deep_request(service, 1, super::hostile::now_ns() - 60_000_000_000);
    let dict = request.dictionary.as_mut().unwrap();
    dict.string_table
        .push("process.executable.build_id.gnu".into());
    dict.attribute_table = vec![
        KeyValueAndUnit::default(),
        KeyValueAndUnit {
            key_strindex: dict.string_table.len() as i32 - 1,
            value: Some(AnyValue {
                value: Some(any_value::Value::StringValue(build_id.into())),
            }),
            unit_strindex: 0,
        },
    ];
    dict.mapping_table = vec![
        Mapping::default(),
        Mapping {
            memory_start: 0x1000,
            memory_limit: 0x9000,
            attribute_indices: vec![1],
            ..Default::default()
        },
    ];
    let location = &mut dict.location_table[1];
    location.mapping_index = 1;
    location.address = 0x1234;
    location.lines.clear();
    request
}

fn post_export(
    server: &Server,
    request: &ExportProfilesServiceRequest,
) -> reqwest::blocking::Response {
    client()
        .post(format!("{}/v1development/profiles", server.url))
        .header("Content-Type", "application/x-protobuf")
        .body(request.encode_to_vec())
        .send()
        .unwrap()
}

/// Polls `done` every 100 ms until it holds, for at most 30 s.
fn wait_until(what: &str, mut done: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(30);
    while !done() {
        assert!(Instant::now() < deadline, "{what}");
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// A thread that sends `request` until it is not refused for a full slot:
/// then it holds that slot for as long as its request waits. (A poll of the
/// test may take the slot first for a moment; the holder then tries again.)
fn hold(
    request: impl Fn() -> reqwest::Result<reqwest::blocking::Response> + Send + 'static,
) -> std::thread::JoinHandle<()> {
    std::thread::spawn(move || loop {
        match request() {
            Ok(resp) if resp.status() == 503 => std::thread::sleep(Duration::from_millis(20)),
            _ => return,
        }
    })
}

fn busy(resp: reqwest::blocking::Response, setting: &str) {
    let status = resp.status().as_u16();
    let retry = resp.headers().get("retry-after").cloned();
    let body = resp.text().unwrap();
    assert_eq!(status, 503, "{body}");
    assert!(retry.is_some(), "no Retry-After: {body}");
    assert!(body.contains(setting), "{body}");
}

#[test]
fn full_slots_answer_503_with_retry_after_and_other_clients_are_served() {
    let (upstream, accepted, upstream_thread, upstream_listener) = stalled_upstream();
    let server = Server::start(
        &Backend::local(),
        &[
            "--upstream-urls",
            &upstream,
            "--upstream-timeout",
            "60",
            "--max-concurrent-fetches",
            "1",
            "--max-concurrent-symbolize",
            "1",
            "--max-concurrent-exports",
            "1",
            "--max-concurrent-queries",
            "1",
        ],
    );
    let held = "aa".repeat(20);
    // A profile whose only frame is in the file the upstream will stall on.
    let request = native_export("held-svc", &held);
    assert_eq!(post_export(&server, &request).status(), 200);
    // 1. A debuginfod miss holds the one fetch slot (the upstream stalls).
    let url = server.url.clone();
    let path = format!("/buildid/{held}/debuginfo");
    let first = std::thread::spawn(move || {
        let _ = client()
            .get(format!("{url}{path}"))
            .timeout(Duration::from_secs(120))
            .send();
    });
    accepted
        .recv_timeout(Duration::from_secs(30))
        .expect("the fetch started");
    busy(
        server.get(&format!("/buildid/{}/debuginfo", "bb".repeat(20))),
        "SYMTRACE_MAX_CONCURRENT_FETCHES",
    );
    // 2. A symbolize request for the same build-ID shares that fetch and
    // holds the one symbolize slot.
    let url = server.url.clone();
    let body = format!(r#"{{"build_id":"{held}","addresses":["0x1000"]}}"#);
    let second = hold(move || {
        client()
            .post(format!("{url}/api/v1/symbolize"))
            .body(body.clone())
            .timeout(Duration::from_secs(120))
            .send()
    });
    wait_until("the symbolize slot was never full", || {
        let resp = client()
            .post(format!("{}/api/v1/symbolize", server.url))
            .body(format!(
                r#"{{"build_id":"{}","addresses":["0x1"]}}"#,
                "cc".repeat(20)
            ))
            .send()
            .unwrap();
        resp.status() == 503
            && resp
                .text()
                .unwrap()
                .contains("SYMTRACE_MAX_CONCURRENT_SYMBOLIZE")
    });
    // 3. A flamegraph of that profile waits for the same fetch (its frame
    // is symbolized at query time) and holds the one query slot.
    let url = server.url.clone();
    let third = hold(move || {
        client()
            .get(format!(
                "{url}/api/v1/flamegraph?service=held-svc&from=now-1h"
            ))
            .timeout(Duration::from_secs(120))
            .send()
    });
    // Polled with a query that cannot wait (no such service: 400 at once
    // whenever it gets the slot).
    wait_until("the query slot was never full", || {
        let resp = server.get("/api/v1/flamegraph?service=no-such-svc&from=now-1h&format=folded");
        let full = resp.status() == 503;
        if full {
            busy(resp, "SYMTRACE_MAX_CONCURRENT_QUERIES");
        }
        full
    });
    // The raw samples are queries too.
    busy(
        server.get("/api/v1/profiles/samples?limit=1"),
        "SYMTRACE_MAX_CONCURRENT_QUERIES",
    );
    // 4. An export whose body stalls holds the one export slot.
    let addr = server.url.trim_start_matches("http://").to_owned();
    let mut stalled = TcpStream::connect(&addr).unwrap();
    write!(
        stalled,
        "POST /v1development/profiles HTTP/1.1\r\nHost: {addr}\r\n\
         Content-Type: application/x-protobuf\r\nContent-Length: 1000\r\n\r\n"
    )
    .unwrap();
    let request = ExportProfilesServiceRequest::default();
    wait_until("the export slot was never full", || {
        let resp = post_export(&server, &request);
        let full = resp.status() == 503;
        if full {
            busy(resp, "SYMTRACE_MAX_CONCURRENT_EXPORTS");
        }
        full
    });
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        let mut grpc = ProfilesServiceClient::connect(format!("http://{}", server.grpc_addr))
            .await
            .unwrap();
        let err = grpc.export(request.clone()).await.unwrap_err();
        assert_eq!(err.code(), tonic::Code::Unavailable, "{err}");
        assert!(
            err.message().contains("SYMTRACE_MAX_CONCURRENT_EXPORTS"),
            "{err}"
        );
    });
    // Everything else is served meanwhile, and the refusals are counted.
    healthy(&server);
    let resp = server.get(&format!("/buildid/{held}/executable"));
    assert_eq!(resp.status(), 503, "the fetch slot is still held");
    assert!(
        server.metric(
            "symtrace_busy_refusals_total",
            &[("work", "upstream fetches")]
        ) >= 2.0
    );
    assert!(server.metric("symtrace_busy_refusals_total", &[("work", "OTLP exports")]) >= 2.0);
    // Release: the export slot frees when its client goes away.
    drop(stalled);
    wait_until("the export slot was not freed", || {
        post_export(&server, &request).status() == 200
    });
    // The upstream goes away: the held fetch fails and frees its slot.
    drop(accepted);
    let _ = TcpStream::connect(upstream_listener.local_addr().unwrap());
    upstream_thread.join().unwrap();
    drop(upstream_listener);
    first.join().unwrap();
    second.join().unwrap();
    third.join().unwrap();
}

#[test]
fn every_read_that_scans_segments_obeys_the_byte_cap() {
    let server = Server::start(&Backend::local(), &["--query-max-bytes", "100"]);
    let trace = "5b".repeat(16);
    for k in 0..3 {
        let request = native_export(&format!("svc-{k}"), &"cd".repeat(20));
        assert_eq!(post_export(&server, &request).status(), 200);
    }
    for path in [
        "/api/v1/flamegraph?from=now-1h".to_owned(),
        "/api/v1/diff?from=now-1h".to_owned(),
        format!("/api/v1/traces/{trace}"),
        "/api/v1/profiles/samples".to_owned(),
        format!("/api/v1/profiles/samples?trace_id={trace}"),
    ] {
        let (status, body) = json_of(server.get(&path));
        assert!(status == 400, "{path}: {status} {body}");
        assert_error(status, &body, 400, "SYMTRACE_QUERY_MAX_BYTES");
    }
    healthy(&server);
}

#[test]
fn index_builds_beyond_the_limit_are_answered_from_dwarf_and_built_later() {
    // Each build pauses 3 s before it starts, so the first is surely still
    // running when the second build-ID is asked for.
    let base = Server::start(&Backend::local(), &["--max-concurrent-index-builds", "1"]);
    let server = Server::start_on(&base, &[("SYMTRACE_PAUSE_AT", "index-build:3000")]);
    let a = Fixture::hello("src", "hello.c", &["-g"]);
    let b = Fixture::hello("src", "hello.c", &["-g", "-O1"]);
    assert_ne!(a.build_id, b.build_id);
    for f in [&a, &b] {
        server.upload(&f.build_id, "debuginfo", &f.debug);
    }
    let tier = |build_id: &str| -> String {
        let resp = client()
            .post(format!("{}/api/v1/symbolize", server.url))
            .body(format!(
                r#"{{"build_id":"{build_id}","addresses":["0x1139"]}}"#
            ))
            .send()
            .unwrap();
        let (status, body) = json_of(resp);
        assert_eq!(status, 200, "{body}");
        body["results"][0]["tier"]
            .as_str()
            .unwrap_or_default()
            .to_owned()
    };
    assert_eq!(
        tier(&a.build_id),
        "dwarf",
        "answered while its index builds"
    );
    assert_eq!(
        tier(&b.build_id),
        "dwarf",
        "answered from DWARF, no second build"
    );
    assert_eq!(
        server.metric("symtrace_busy_refusals_total", &[("work", "index builds")]),
        1.0
    );
    wait_until("the first index was never built", || {
        tier(&a.build_id) == "index"
    });
    // Now the slot is free: the next request for the second starts its build.
    wait_until("the second index was never built", || {
        tier(&b.build_id) == "index"
    });
    healthy(&server);
}

#[test]
fn grpc_connections_are_told_the_stream_limit() {
    // HTTP/2 enforces SETTINGS_MAX_CONCURRENT_STREAMS at the client and the
    // server alike: what is checked is that the server sends ours.
    let server = Server::start(&Backend::local(), &["--grpc-max-streams", "3"]);
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        let tcp = tokio::net::TcpStream::connect(&server.grpc_addr)
            .await
            .unwrap();
        let (client, connection) = h2::client::handshake(tcp).await.unwrap();
        tokio::spawn(connection);
        let mut client = client.ready().await.unwrap();
        // One round trip, so that the server's SETTINGS are in effect.
        let request = http::Request::post(format!("http://{}/", server.grpc_addr))
            .body(())
            .unwrap();
        let (response, _) = client.send_request(request, true).unwrap();
        let _ = response.await;
        assert_eq!(client.current_max_send_streams(), 3);
    });
    healthy(&server);
}
