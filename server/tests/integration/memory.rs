//! Memory profile types through the server, sent by PyPI's OTLP client:
//! allocated bytes add up over a range (a counter), in-use bytes do not
//! (a gauge: each process's latest snapshot in the range, or with
//! `gauge=average` the mean of its snapshots, added over processes), and
//! the trace view gives each span's allocated bytes.

use std::path::Path;
use std::process::Command;

use serde_json::{json, Value};

use crate::query::{get_json, Demo};
use crate::query::{SPAN_A, TRACE};
use crate::support::*;

const MIB: i64 = 1 << 20;

/// Sends one request made from `spec` (see the client's `stacks` mode)
/// with PyPI's OTLP client; returns what the client printed.
pub fn send(python: &Path, server: &Server, spec: Value) -> String {
    let file = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(file.path(), spec.to_string()).unwrap();
    let out = run(Command::new(python)
        .arg(otlp_client_script())
        .arg("stacks")
        .arg("--spec")
        .arg(file.path())
        .args(["--grpc", &server.grpc_addr, "--http", &server.url]));
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(text.contains("sent "), "{text}");
    text
}

/// Allocations of `service`: main→alpha_work 3 × 1 MiB in span A,
/// main→beta_work→gamma_inline 1 × 1 MiB.
pub fn send_allocations(python: &Path, server: &Server, demo: &Demo, service: &str) {
    send(
        python,
        server,
        json!({
            "service": service,
            "type": "alloc_space:bytes",
            "binary": {"path": "/usr/local/bin/demo", "build_id": demo.build_id},
            "stacks": [
                {"frames": [demo.alpha, demo.main], "count": 3, "value": MIB,
                 "trace_id": TRACE, "span_id": SPAN_A},
                {"frames": [demo.inlined, demo.main], "count": 1, "value": MIB},
            ],
        }),
    );
}

/// In use: process 1 at two snapshots (alpha_work 10 MiB in both,
/// gamma_inline 4 MiB in the first only), process 2 at one (gamma_inline
/// 5 MiB).
pub fn send_in_use(python: &Path, server: &Server, demo: &Demo, service: &str) {
    let binary = json!({"path": "/usr/local/bin/demo", "build_id": demo.build_id});
    send(
        python,
        server,
        json!({
            "service": service, "type": "inuse_space:bytes", "snapshots": 2,
            "resource": {"process.pid": "1"}, "binary": binary,
            "stacks": [
                {"frames": [demo.alpha, demo.main], "count": 2, "value": 10 * MIB},
                {"frames": [demo.inlined, demo.main], "count": 1, "value": 4 * MIB},
            ],
        }),
    );
    send(
        python,
        server,
        json!({
            "service": service, "type": "inuse_space:bytes", "snapshots": 2,
            "resource": {"process.pid": "2"}, "binary": binary,
            "stacks": [{"frames": [demo.inlined, demo.main], "count": 1, "value": 5 * MIB}],
        }),
    );
}

fn total(server: &Server, query: &str) -> i64 {
    get_json(server, "default", &format!("/api/v1/flamegraph?{query}"))["total"]
        .as_i64()
        .unwrap()
}

#[test]
fn allocated_bytes_add_up_and_in_use_bytes_are_a_gauge() {
    let Some(python) = python() else { return };
    let server = Server::start(&Backend::local(), &[]);
    let demo = Demo::build(5);
    demo.publish(&server);
    send_allocations(&python, &server, &demo, "mem-svc");
    send_in_use(&python, &server, &demo, "mem-svc");
    let types = get_json(&server, "default", "/api/v1/services");
    assert!(
        types.to_string().contains("alloc_space:bytes::")
            && types.to_string().contains("inuse_space:bytes::"),
        "{types}"
    );
    // A counter: every event adds.
    assert_eq!(
        total(&server, "service=mem-svc&type=alloc_space:bytes::"),
        4 * MIB
    );
    // A gauge: per process the latest snapshot (10 + 5 MiB), not the sum
    // of snapshots (29 MiB); the average is 12 + 5 MiB.
    let inuse = "service=mem-svc&type=inuse_space:bytes::";
    assert_eq!(total(&server, inuse), 15 * MIB);
    assert_eq!(total(&server, &format!("{inuse}&gauge=latest")), 15 * MIB);
    assert_eq!(total(&server, &format!("{inuse}&gauge=average")), 17 * MIB);
    let (status, body) = crate::query::get(
        &server,
        "default",
        &format!("/api/v1/flamegraph?{inuse}&gauge=sum"),
    );
    assert_eq!(status, 400, "{}", String::from_utf8_lossy(&body));
    // Named frames, as for CPU profiles.
    let folded = crate::query::get(
        &server,
        "default",
        &format!("/api/v1/flamegraph?{inuse}&format=folded"),
    )
    .1;
    let folded = String::from_utf8(folded).unwrap();
    assert!(
        folded.contains("alpha_work") && folded.contains("gamma_inline"),
        "{folded}"
    );
    // The trace view: span A allocated 3 MiB, with its allocation
    // flamegraph.
    let view = get_json(&server, "default", &format!("/api/v1/traces/{TRACE}"));
    let row = view["by_span"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["span_id"] == SPAN_A)
        .unwrap_or_else(|| panic!("{view}"));
    assert_eq!(row["alloc_bytes"], 3 * MIB, "{row}");
    assert_eq!(view["alloc_bytes"], 3 * MIB, "{view}");
    let url = row["alloc_flamegraph"].as_str().unwrap();
    assert_eq!(get_json(&server, "default", url)["total"], 3 * MIB);
}
