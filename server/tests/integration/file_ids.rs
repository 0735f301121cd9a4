//! Files without a GNU build-ID (stored under their htlhash, found by it
//! and by their Go build-ID), agents' claims, and agent uploads ranking
//! below a CI's.

use serde_json::{json, Value};

use crate::query::{assert_named, flamegraph, Demo, SPAN_A, SPAN_B, TRACE};
use crate::support::*;

fn send_by_file_id(
    python: &std::path::Path,
    server: &Server,
    demo: &Demo,
    id: &str,
    service: &str,
) {
    send_with_content(python, server, demo, id, "htlhash", None, service);
}

/// The demo's stacks under `id` (of `id_kind`), their mapping carrying
/// `content` as its content hash when given (as symtrace-agent sends it).
pub fn send_with_content(
    python: &std::path::Path,
    server: &Server,
    demo: &Demo,
    id: &str,
    id_kind: &str,
    content: Option<&str>,
    service: &str,
) {
    send_as(python, server, None, demo, id, id_kind, content, service);
}

/// [`send_with_content`] with a token.
#[allow(clippy::too_many_arguments)]
pub fn send_as(
    python: &std::path::Path,
    server: &Server,
    token: Option<&str>,
    demo: &Demo,
    id: &str,
    id_kind: &str,
    content: Option<&str>,
    service: &str,
) {
    let mut binary = json!({"path": "/usr/local/bin/demo", "build_id": id, "id_kind": id_kind});
    if let Some(c) = content {
        binary["content_sha256"] = json!(c);
    }
    let text = crate::memory::send(
        python,
        server,
        json!({
            "service": service,
            "tenant": "q",
            "token": token,
            "binary": binary,
            "stacks": [
                {"frames": [demo.alpha, demo.main], "count": 60, "trace_id": TRACE, "span_id": SPAN_A},
                {"frames": [demo.inlined, demo.main], "count": 30, "trace_id": TRACE, "span_id": SPAN_B},
                {"frames": ["schedule", demo.alpha, demo.main], "count": 10},
            ],
        }),
    );
    assert!(text.contains("sent 100 events"), "{text}");
}

fn claim(server: &Server, id: &str, id_kind: &str, quality: i32, holder: &str) -> Value {
    let resp = client()
        .post(format!("{}/api/v1/debuginfo/missing", server.url))
        .json(
            &json!({"items": [{"build_id": id, "id_kind": id_kind, "kind": "executable",
                                  "quality": quality, "claim": holder}]}),
        )
        .send()
        .unwrap();
    let (status, body) = json_of(resp);
    assert_eq!(status, 200, "{body}");
    body
}

fn status_of(fg: &Value) -> String {
    fg["build_ids"][0]["status"].as_str().unwrap().to_owned()
}

#[test]
fn a_file_without_a_gnu_build_id_is_stored_claimed_and_named_by_its_htlhash() {
    let Some(python) = python() else { return };
    if !require(
        have("llvm-symbolizer-19") && have("gcc"),
        "llvm-symbolizer-19 and gcc",
    ) {
        return;
    }
    for backend in Backend::all() {
        let server = Server::start(&backend, &[]);
        let demo = Demo::without_build_id(7);
        let htl = symtrace_elf::htlhash_bytes(&std::fs::read(&demo.exe).unwrap());

        // Frames sent under the htlhash, before anything is stored.
        send_by_file_id(&python, &server, &demo, &htl, "nobid");
        let fg = flamegraph(&server, "q", "nobid", "");
        assert_eq!(status_of(&fg), "unknown_build_id", "{fg}");
        let module = &fg["build_ids"][0];
        assert_eq!(module["id_kind"], "htlhash", "{fg}");
        assert_eq!(module["module"], "/usr/local/bin/demo", "{fg}");
        assert_eq!(module["unnamed"], module["addresses"], "{fg}");
        assert!(
            module["reason"]
                .as_str()
                .unwrap()
                .contains("symtrace-upload"),
            "{fg}"
        );

        // One agent of two gets the claim; the query says an upload is on its way.
        let first = claim(&server, &htl, "htlhash", 3, "host-a");
        assert_eq!(first["missing"][0]["upload_as"], htl.as_str(), "{first}");
        let second = claim(&server, &htl, "htlhash", 3, "host-b");
        assert_eq!(second["missing"], json!([]), "{second}");
        let again = claim(&server, &htl, "htlhash", 3, "host-a");
        assert_eq!(
            again["missing"][0]["upload_as"],
            htl.as_str(),
            "the holder renews: {again}"
        );
        assert_eq!(
            status_of(&flamegraph(&server, "q", "nobid", "")),
            "upload_pending"
        );
        // Hostile claims are refused.
        for (id, kind, holder) in [
            ("xyz", "htlhash", "h"),
            (htl.as_str(), "sha1", "h"),
            (htl.as_str(), "htlhash", ""),
        ] {
            let resp = client()
                .post(format!("{}/api/v1/debuginfo/missing", server.url))
                .json(&json!({"items": [{"build_id": id, "id_kind": kind, "kind": "executable", "claim": holder}]}))
                .send()
                .unwrap();
            let (status, body) = json_of(resp);
            assert_error(status, &body, 400, "item 0");
        }

        // At most 1,024 claims a request.
        let many: Vec<Value> = (0..1025)
            .map(|i| {
                json!({"build_id": format!("{i:032x}"), "id_kind": "htlhash",
                            "kind": "executable", "claim": "h"})
            })
            .collect();
        let resp = client()
            .post(format!("{}/api/v1/debuginfo/missing", server.url))
            .json(&json!({ "items": many }))
            .send()
            .unwrap();
        let (status, body) = json_of(resp);
        assert_error(status, &body, 413, "1024 claims");
        // Under another key: refused, and told the right one.
        let wrong = "ab".repeat(16);
        let (status, body) =
            server.put_file(&format!("/api/v1/debuginfo/{wrong}/executable"), &demo.exe);
        assert_error(status, &body, 422, &htl);
        // The stripped copy has another htlhash and no Go build-ID to tie
        // it to the original: not under the original's key.
        let (status, body) = server.put_file(
            &format!("/api/v1/debuginfo/{htl}/executable"),
            &demo.stripped,
        );
        assert_error(status, &body, 422, "Go build-ID");

        let (status, body) = server.put_file(
            &format!("/api/v1/debuginfo/{htl}/executable?origin=agent"),
            &demo.exe,
        );
        assert_eq!(status, 201, "{body}");
        // An agent's file names the frames of the content it was taken
        // from (their mapping carries its hash), no others.
        let fg = flamegraph(&server, "q", "nobid", "");
        assert_ne!(status_of(&fg), "ok", "frames without a content hash: {fg}");
        let sha = body["sha256"].as_str().unwrap().to_owned();
        send_with_content(
            &python,
            &server,
            &demo,
            &htl,
            "htlhash",
            Some(&sha),
            "bound",
        );
        let fg = flamegraph(&server, "q", "bound", "");
        assert_eq!(status_of(&fg), "ok", "{fg}");
        assert_eq!(fg["build_ids"][0]["unnamed"], 0, "{fg}");
        assert_named(&fg, "stored under its htlhash");
        // Stored with DWARF: nobody is asked for it again.
        assert_eq!(
            claim(&server, &htl, "htlhash", 3, "host-b")["missing"],
            json!([])
        );
        // debuginfod clients use GNU build-IDs; the store lists it.
        let (status, listed) = json_of(server.get(&format!("/api/v1/debuginfo/{htl}")));
        assert_eq!(status, 200, "{listed}");
        assert_eq!(listed["artifacts"][0]["origin"], "agent", "{listed}");
        let unknown = "cd".repeat(16);
        send_by_file_id(&python, &server, &demo, &unknown, "other");
        assert_eq!(
            status_of(&flamegraph(&server, "q", "other", "")),
            "unknown_build_id"
        );
    }
}

#[test]
fn an_agent_upload_ranks_below_a_ci_upload_of_the_same_quality() {
    if !require(
        have("llvm-symbolizer-19") && have("gcc"),
        "llvm-symbolizer-19 and gcc",
    ) {
        return;
    }
    let server = Server::start(&Backend::local(), &[]);
    let demo = Demo::build(8);
    let served = |server: &Server| {
        let (_, v) = json_of(server.get(&format!("/api/v1/debuginfo/{}", demo.build_id)));
        v["served"]["debuginfo"]
            .as_str()
            .unwrap_or_default()
            .to_owned()
    };
    // The agent's (the whole binary, DWARF) first, then the CI's split file.
    let (status, agent) = server.put_file(
        &format!(
            "/api/v1/debuginfo/{}/executable?origin=agent",
            demo.build_id
        ),
        &demo.exe,
    );
    assert_eq!(status, 201, "{agent}");
    // Stored, and what names the frames of its content; but an agent's
    // file is never served to debuginfod clients (they cannot say which
    // content they hold).
    assert_eq!(agent["served_sha256"], agent["sha256"], "{agent}");
    assert_eq!(served(&server), "");
    let (_, listed) = json_of(server.get(&format!("/api/v1/debuginfo/{}", demo.build_id)));
    assert_eq!(
        listed["artifacts"][0]["content_sha256"], agent["sha256"],
        "{listed}"
    );
    assert_eq!(
        server
            .get(&format!("/buildid/{}/debuginfo", demo.build_id))
            .status(),
        404
    );
    let ci = server.upload(&demo.build_id, "debuginfo", &demo.debug);
    assert_eq!(served(&server), ci["sha256"].as_str().unwrap());
    // A later agent upload does not take its place.
    let again = server.put_file(
        &format!(
            "/api/v1/debuginfo/{}/executable?origin=agent",
            demo.build_id
        ),
        &demo.exe,
    );
    assert_eq!(again.0, 200, "{}", again.1);
    assert_eq!(served(&server), ci["sha256"].as_str().unwrap());
    let (status, body) = server.put_file(
        &format!("/api/v1/debuginfo/{}/executable?origin=ci", demo.build_id),
        &demo.exe,
    );
    assert_error(status, &body, 400, "origin");
}
