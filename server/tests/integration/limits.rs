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
        ],
    );
    let held = "aa".repeat(20);
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
    let second = std::thread::spawn(move || {
        let _ = client()
            .post(format!("{url}/api/v1/symbolize"))
            .body(body)
            .timeout(Duration::from_secs(120))
            .send();
    });
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let resp = client()
            .post(format!("{}/api/v1/symbolize", server.url))
            .body(format!(
                r#"{{"build_id":"{}","addresses":["0x1"]}}"#,
                "cc".repeat(20)
            ))
            .send()
            .unwrap();
        if resp.status() == 503 {
            let body = resp.text().unwrap();
            if body.contains("SYMTRACE_MAX_CONCURRENT_SYMBOLIZE") {
                break;
            }
        }
        assert!(
            Instant::now() < deadline,
            "the symbolize slot was never full"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    // 3. An export whose body stalls holds the one export slot.
    let addr = server.url.trim_start_matches("http://").to_owned();
    let mut stalled = TcpStream::connect(&addr).unwrap();
    write!(
        stalled,
        "POST /v1development/profiles HTTP/1.1\r\nHost: {addr}\r\n\
         Content-Type: application/x-protobuf\r\nContent-Length: 1000\r\n\r\n"
    )
    .unwrap();
    let request = ExportProfilesServiceRequest::default();
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let resp = client()
            .post(format!("{}/v1development/profiles", server.url))
            .header("Content-Type", "application/x-protobuf")
            .body(request.encode_to_vec())
            .send()
            .unwrap();
        if resp.status() == 503 {
            assert!(resp.headers().get("retry-after").is_some());
            break;
        }
        assert!(Instant::now() < deadline, "the export slot was never full");
        std::thread::sleep(Duration::from_millis(100));
    }
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
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let resp = client()
            .post(format!("{}/v1development/profiles", server.url))
            .header("Content-Type", "application/x-protobuf")
            .body(request.encode_to_vec())
            .send()
            .unwrap();
        if resp.status() == 200 {
            break;
        }
        assert!(Instant::now() < deadline, "the export slot was not freed");
        std::thread::sleep(Duration::from_millis(100));
    }
    // The upstream goes away: the held fetch fails and frees its slot.
    drop(accepted);
    let _ = TcpStream::connect(upstream_listener.local_addr().unwrap());
    upstream_thread.join().unwrap();
    drop(upstream_listener);
    first.join().unwrap();
    second.join().unwrap();
}
