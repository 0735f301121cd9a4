//! Bad queries get 400 with a message naming the mistake; a selection over
//! the read limit is refused rather than read.

use crate::query::{get, send_demo, Demo, TRACE};
use crate::support::*;

fn assert_400(server: &Server, path: &str, needle: &str) {
    let (status, body) = get(server, "b", path);
    let body: serde_json::Value = serde_json::from_slice(&body).unwrap();
    assert_error(status, &body, 400, needle);
}

#[test]
fn bad_queries_are_400_with_a_reason() {
    let Some(python) = python() else { return };
    if !have("llvm-symbolizer-19") {
        return;
    }
    let server = Server::start(&Backend::local(), &[]);
    let demo = Demo::build(5);
    send_demo(&python, &server, &demo, "bad-svc", "b");
    let fg = "/api/v1/flamegraph?service=bad-svc";
    for (query, needle) in [
        ("&selector=region=\"eu\"", "enclosed in {"),
        ("&selector={region=eu}", "double-quoted"),
        ("&selector={region=\"eu\"", "enclosed in {"),
        ("&selector={region=~\"(\"}", "bad regex"),
        ("&selector={region}", "expected =, !=, =~ or !~"),
        ("&from=now&to=now-1h", "inverted"),
        ("&from=200&to=100", "inverted"),
        ("&from=yesterday", "neither unix nanoseconds"),
        ("&max_nodes=0", "max_nodes"),
        ("&max_nodes=1000000000", "from 1 to 100000"),
        ("&max_nodes=lots", "max_nodes"),
        ("&format=png", "format \"png\""),
        ("&trace_id=xyz", "32 hex digits"),
        ("&trace_id=00000000000000000000000000000000", "all zeros"),
        (&format!("&trace_id={TRACE}&span_id=12"), "16 hex digits"),
        ("&span_id=0102030405060708", "needs a trace_id"),
        ("&type=cpu", "sample_type:unit:period_type:unit"),
        ("&colour=red", "unknown query parameter(s) colour"),
    ] {
        assert_400(&server, &format!("{fg}{query}"), needle);
    }
    assert_400(
        &server,
        "/api/v1/flamegraph?service=no-such-svc",
        "unknown service \"no-such-svc\"",
    );
    assert_400(
        &server,
        "/api/v1/diff?service=bad-svc&comparison_selector={x=}",
        "comparison: selector",
    );
    assert_400(
        &server,
        "/api/v1/diff?service=bad-svc&format=pprof",
        "not one of json, svg",
    );
    assert_400(&server, "/api/v1/traces/not-a-trace", "32 hex digits");
    assert_400(&server, "/api/v1/services?from=now&to=now-1d", "inverted");
    assert_400(
        &server,
        "/api/v1/labels?service=bad-svc&selector={a=\"b\"}",
        "unknown query parameter(s) selector",
    );
    // A known service with nothing in range is an empty answer, not an error.
    let (status, body) = get(
        &server,
        "b",
        "/api/v1/flamegraph?service=bad-svc&from=0&to=1000",
    );
    let body: serde_json::Value = serde_json::from_slice(&body).unwrap();
    assert_eq!((status, body["total"].as_i64()), (200, Some(0)), "{body}");
    // The good query still works after all of that.
    let (status, body) = get(&server, "b", fg);
    let body: serde_json::Value = serde_json::from_slice(&body).unwrap();
    assert_eq!((status, body["total"].as_i64()), (200, Some(100)), "{body}");
}

#[test]
fn selections_over_the_read_limit_are_refused() {
    let Some(python) = python() else { return };
    if !have("llvm-symbolizer-19") {
        return;
    }
    let server = Server::start(&Backend::local(), &[]);
    let demo = Demo::build(6);
    send_demo(&python, &server, &demo, "big-svc", "b");
    let limited = Server::start_on(&server, &[("SYMTRACE_QUERY_MAX_BYTES", "100")]);
    assert_400(
        &limited,
        "/api/v1/flamegraph?service=big-svc",
        "over the limit of 100 (SYMTRACE_QUERY_MAX_BYTES)",
    );
}
