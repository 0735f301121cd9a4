//! Profiles through the OpenTelemetry Collector (issue #39): PyPI's OTLP
//! client sends into a real Collector (its gRPC and its OTLP/HTTP
//! receiver), which exports to symtrace over OTLP/gRPC and over OTLP/HTTP,
//! each to a tenant of its own; the same profiles go straight to symtrace
//! too. What comes out through the Collector must be what went in
//! directly: every sample event for event (attributes, frames, trace
//! links), and the flamegraphs, label values and trace views built from
//! them.

use std::process::Command;

use serde_json::Value;

use crate::support::collector::{self, Collector, Export};
use crate::support::*;

const TENANTS: [&str; 3] = ["direct", "via-grpc", "via-http"];

fn get(server: &Server, tenant: &str, path: &str) -> (u16, Value) {
    json_of(
        client()
            .get(format!("{}{path}", server.url))
            .header("X-Scope-OrgID", tenant)
            .send()
            .unwrap(),
    )
}

fn folded_text(server: &Server, tenant: &str, service: &str) -> Vec<String> {
    let resp = client()
        .get(format!(
            "{}/api/v1/flamegraph?service={service}&from=now-1h&to=now&format=folded",
            server.url
        ))
        .header("X-Scope-OrgID", tenant)
        .send()
        .unwrap();
    assert_eq!(resp.status(), 200, "{tenant} {service}");
    let mut lines: Vec<String> = resp.text().unwrap().lines().map(str::to_owned).collect();
    lines.sort();
    lines
}

#[test]
fn profiles_through_the_collector_are_what_was_sent() {
    let Some(python) = python() else { return };
    let Some(bin) = collector::binary() else {
        return;
    };
    let server = Server::start(&Backend::local(), &[]);
    let mut otelcol = Collector::start(
        &bin,
        &[
            Export::Grpc {
                endpoint: server.grpc_addr.clone(),
                tenant: TENANTS[1].into(),
            },
            Export::Http {
                endpoint: server.url.clone(),
                tenant: TENANTS[2].into(),
            },
        ],
    );
    let out = Command::new(&python)
        .arg(otlp_client_script())
        .args(["collector", "--collector-grpc", &otelcol.grpc_addr])
        .args(["--collector-http", &otelcol.http_url])
        .args(["--grpc", &server.grpc_addr, "--http", &server.url])
        .args(["--tenants", &TENANTS[1..].join(",")])
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}{}\n--- Collector ---\n{}",
        String::from_utf8_lossy(&out.stderr),
        otelcol.log_text()
    );
    for tenant in &TENANTS[1..] {
        assert!(stdout.contains(&format!("{tenant}: ok")), "{stdout}");
    }

    // The queries built on them agree too.
    let (status, services) = get(&server, "direct", "/api/v1/services?from=now-1h&to=now");
    assert_eq!(status, 200, "{services}");
    let names: Vec<String> = services["services"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["name"].as_str().unwrap().to_owned())
        .collect();
    assert!(names.len() >= 6, "{services}");
    for tenant in &TENANTS[1..] {
        let (_, theirs) = get(&server, tenant, "/api/v1/services?from=now-1h&to=now");
        assert_eq!(theirs, services, "{tenant}: services");
        for name in &names {
            assert_eq!(
                folded_text(&server, tenant, name),
                folded_text(&server, "direct", name),
                "{tenant}: the flamegraph of {name}"
            );
        }
        for path in [
            "/api/v1/labels?from=now-1h&to=now",
            "/api/v1/profile-types?from=now-1h&to=now",
        ] {
            assert_eq!(
                get(&server, tenant, path),
                get(&server, "direct", path),
                "{tenant}: {path}"
            );
        }
    }
    let (_, samples) = get(&server, "direct", "/api/v1/profiles/samples?limit=100000");
    let mut traces: Vec<&str> = samples["samples"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|s| s["trace_id"].as_str())
        .filter(|t| !t.is_empty())
        .collect();
    traces.sort();
    traces.dedup();
    assert!(!traces.is_empty(), "the profiles carry trace links");
    // The trace view, but for what says how it was read (the tenant, the
    // stored segments' sizes and count: each tenant's are its own).
    let view = |tenant: &str, trace: &str| {
        let (status, mut v) = get(&server, tenant, &format!("/api/v1/traces/{trace}"));
        assert_eq!(status, 200, "{v}");
        for key in ["tenant", "bytes_read", "segments_read"] {
            assert!(
                v.as_object_mut().unwrap().remove(key).is_some(),
                "{key} in {v}"
            );
        }
        v
    };
    for trace in traces.iter().take(5) {
        let direct = view("direct", trace);
        assert!(
            direct["spans"].as_array().is_some_and(|s| !s.is_empty()),
            "{direct}"
        );
        for tenant in &TENANTS[1..] {
            assert_eq!(
                view(tenant, trace),
                direct,
                "{tenant}: the trace view of {trace}"
            );
        }
    }
    assert!(otelcol.stop().is_some());
}

/// The Collector crashes while symtrace is down: what it acknowledged to
/// its sender is delivered once both are up again — with its sending
/// queue on disk (contrib's `file_storage`, as docs/opentelemetry.md
/// configures it). With the default in-memory queue a Collector crash
/// loses what it held: that is the Collector's own promise, not ours.
#[test]
fn what_the_collector_acknowledged_survives_its_crash() {
    let Some(python) = python() else { return };
    let Some(bin) = collector::binary() else {
        return;
    };
    let mut server = Server::start(&Backend::local(), &[]);
    let queue = tempfile::tempdir().unwrap();
    let mut otelcol = Collector::start_with(
        &bin,
        &[Export::Grpc {
            endpoint: server.grpc_addr.clone(),
            tenant: "queued".into(),
        }],
        Some(queue.path()),
    );
    server.kill9();
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos()
        .to_string();
    let (receiver, url) = (otelcol.grpc_addr.clone(), server.url.clone());
    let client = |mode: &str| {
        let out = Command::new(&python)
            .arg(otlp_client_script())
            .arg(mode)
            .args(["--collector-grpc", &receiver])
            .args(["--http", &url, "--tenants", "queued"])
            .args(["--now", &now, "--requests", "4", "--timeout", "60"])
            .output()
            .unwrap();
        (
            out.status.success(),
            String::from_utf8_lossy(&out.stdout).into_owned()
                + &String::from_utf8_lossy(&out.stderr),
        )
    };
    let (sent, text) = client("send");
    assert!(sent, "{text}\n--- Collector ---\n{}", otelcol.log_text());
    otelcol.kill9();
    otelcol.restart();
    server.spawn();
    let (arrived, text) = client("expect");
    assert!(
        arrived && text.contains("queued: ok"),
        "{text}\n--- Collector ---\n{}",
        otelcol.log_text()
    );
    assert!(otelcol.stop().is_some());
}
