//! Symbol trust (issue #37): what an agent publishes is an agent's (the
//! token's scope says so, not the request), ranks below CI's and upstream
//! files, is replaced by a CI upload (bound to a tenant or not), and names
//! only the frames of the content it was taken from — a forged file under
//! a real build-ID, or with a copied Go build-ID, names nobody else's
//! frames, in any tenant. Claims are per content, expire and are bounded
//! per token; a client that stops reading cannot hold a connection.

use std::io::{Read, Write};
use std::process::Command;

use serde_json::{json, Value};
use sha2::Digest;

use crate::file_ids::send_as;
use crate::query::{flamegraph, Demo};
use crate::support::*;

const CI: &str = "ci-token";
const AGENT: &str = "agent-token";

fn trusted_server() -> Server {
    Server::start(
        &Backend::local(),
        &[
            "--upload-tokens",
            &format!("{CI},ci-t1={}", "t1"),
            "--agent-tokens",
            AGENT,
        ],
    )
}

fn sha256(file: &std::path::Path) -> String {
    hex::encode(sha2::Sha256::digest(std::fs::read(file).unwrap()))
}

fn put(server: &Server, token: &str, path: &str, file: &std::path::Path) -> (u16, Value) {
    let resp = client()
        .put(format!("{}{path}", server.url))
        .bearer_auth(token)
        .body(std::fs::read(file).unwrap())
        .send()
        .unwrap();
    json_of(resp)
}

/// The functions the flamegraph names (every node's name).
fn names(fg: &Value) -> Vec<String> {
    let mut out = Vec::new();
    let mut todo = vec![&fg["tree"]];
    while let Some(node) = todo.pop() {
        if let Some(n) = node["name"].as_str() {
            out.push(n.to_owned());
        }
        if let Some(children) = node["children"].as_array() {
            todo.extend(children);
        }
    }
    out
}

/// A program linked with build-ID `build_id` whose functions are
/// `FORGED_*` (with DWARF), spanning what the real program's do: what a
/// user of any host can build and run.
fn forged(dir: &std::path::Path, build_id: &str) -> std::path::PathBuf {
    let src = dir.join("forged.c");
    let mut text = String::new();
    for i in 0..64 {
        text.push_str(&format!(
            "__attribute__((noinline)) long FORGED_{i}(long n) {{ long s = 0; for (long k = 0; k < n; k++) s += k * {i}; return s; }}\n"
        ));
    }
    text.push_str("int main(int argc, char **argv) { return (int)FORGED_1(argc); }\n");
    std::fs::write(&src, text).unwrap();
    let out = dir.join("forged");
    run(Command::new("gcc")
        .args(["-O0", "-g"])
        .arg(format!("-Wl,--build-id=0x{build_id}"))
        .arg(&src)
        .arg("-o")
        .arg(&out));
    assert_eq!(build_id_of(&out), build_id);
    out
}

#[test]
fn agent_tokens_publish_only_as_agents_and_read_nothing() {
    if !have("gcc") {
        return;
    }
    let server = Server::start(
        &Backend::local(),
        &[
            "--upload-tokens",
            CI,
            "--agent-tokens",
            AGENT,
            "--read-tokens",
            "reader",
        ],
    );
    let fixture = Fixture::hello("trust", "hello.c", &[]);
    let id = &fixture.build_id;
    // Whatever the request says, an agent token's upload is an agent's.
    for query in ["", "?origin=upload"] {
        let (status, body) = put(
            &server,
            AGENT,
            &format!("/api/v1/debuginfo/{id}/executable{query}"),
            &fixture.unstripped,
        );
        assert!(status == 201 || status == 200, "{body}");
    }
    let details = client()
        .get(format!("{}/api/v1/debuginfo/{id}", server.url))
        .bearer_auth("reader")
        .send()
        .unwrap();
    let (_, details) = json_of(details);
    let artifacts = details["artifacts"].as_array().unwrap();
    assert!(
        artifacts.iter().all(|a| a["origin"] == "agent"),
        "{details}"
    );
    assert_eq!(
        artifacts[0]["content_sha256"],
        sha256(&fixture.unstripped).as_str(),
        "{details}"
    );
    // Not sources, not reads, not CI's `missing`.
    let src = fixture.sources[0].clone();
    let (status, body) = put(
        &server,
        AGENT,
        &format!("/api/v1/debuginfo/{id}/source{}", src.display()),
        &src,
    );
    assert_error(status, &body, 403, "sources");
    let read = client()
        .get(format!("{}/buildid/{id}/executable", server.url))
        .bearer_auth(AGENT)
        .send()
        .unwrap();
    assert_eq!(read.status(), 403);
    let (status, body) = json_of(
        client()
            .post(format!("{}/api/v1/debuginfo/missing", server.url))
            .bearer_auth(AGENT)
            .json(&json!({"items": [{"build_id": id, "kind": "executable", "sha256": "00".repeat(32)}]}))
            .send()
            .unwrap(),
    );
    assert_error(status, &body, 403, "claim");
    // An agent's file is never served to debuginfod clients.
    let served = client()
        .get(format!("{}/buildid/{id}/executable", server.url))
        .bearer_auth("reader")
        .send()
        .unwrap();
    assert_eq!(served.status(), 404);
    // A CI token may publish as an agent (never the other way round).
    let (status, body) = put(
        &server,
        CI,
        &format!("/api/v1/debuginfo/{id}/debuginfo?origin=agent"),
        &fixture.unstripped,
    );
    assert_error(status, &body, 422, "content_sha256");
}

#[test]
fn a_forged_file_under_a_real_build_id_names_only_its_own_frames() {
    let Some(python) = python() else { return };
    if !require(
        have("llvm-symbolizer-19") && have("gcc"),
        "llvm-symbolizer-19 and gcc",
    ) {
        return;
    }
    let server = trusted_server();
    let real = Demo::build(41);
    let dir = tempfile::tempdir().unwrap();
    let forged = forged(dir.path(), &real.build_id);
    // What a distribution ships: the symbol table, no DWARF.
    let symtab = dir.path().join("real-symtab");
    run(Command::new("objcopy")
        .arg("--strip-debug")
        .arg(&real.exe)
        .arg(&symtab));
    let (real_sha, forged_sha) = (sha256(&symtab), sha256(&forged));
    // Two agents publish what they found: the real library's symbol table
    // (a distro's stripped .so) on one host, a user's forgery with DWARF
    // under the same build-ID on another. Each claim is granted: a file of
    // another content is another claim.
    for (sha, quality, holder) in [(&real_sha, 2, "host-a"), (&forged_sha, 3, "host-b")] {
        let (status, body) = json_of(
            client()
                .post(format!("{}/api/v1/debuginfo/missing", server.url))
                .bearer_auth(AGENT)
                .json(
                    &json!({"items": [{"build_id": real.build_id, "kind": "executable",
                    "quality": quality, "claim": holder, "content_sha256": sha}]}),
                )
                .send()
                .unwrap(),
        );
        assert_eq!(status, 200, "{body}");
        assert_eq!(
            body["missing"][0]["upload_as"],
            real.build_id.as_str(),
            "{body}"
        );
    }
    for file in [&symtab, &forged] {
        let (status, body) = put(
            &server,
            AGENT,
            &format!("/api/v1/debuginfo/{}/executable", real.build_id),
            file,
        );
        assert_eq!(status, 201, "{body}");
    }
    // The victim's frames (two tenants), the forger's own.
    for tenant_service in ["victim-1", "victim-2"] {
        send_as(
            &python,
            &server,
            Some(AGENT),
            &real,
            &real.build_id,
            "gnu",
            Some(&real_sha),
            tenant_service,
        );
    }
    send_as(
        &python,
        &server,
        Some(AGENT),
        &real,
        &real.build_id,
        "gnu",
        Some(&forged_sha),
        "forger",
    );
    send_as(
        &python,
        &server,
        Some(AGENT),
        &real,
        &real.build_id,
        "gnu",
        None,
        "no-hash",
    );
    for service in ["victim-1", "victim-2"] {
        let fg = flamegraph(&server, "q", service, "");
        let names = names(&fg);
        assert!(names.iter().any(|n| n == "alpha_work"), "{names:?}");
        assert!(
            !names.iter().any(|n| n.starts_with("FORGED")),
            "a forged file named a victim's frame: {names:?}"
        );
    }
    let names_forger = names(&flamegraph(&server, "q", "forger", ""));
    assert!(
        names_forger.iter().any(|n| n.starts_with("FORGED")),
        "{names_forger:?}"
    );
    // A mapping without a content hash (another profiler's) is named by
    // no agent's file at all.
    let unhashed = names(&flamegraph(&server, "q", "no-hash", ""));
    assert!(
        !unhashed
            .iter()
            .any(|n| n == "alpha_work" || n.starts_with("FORGED")),
        "{unhashed:?}"
    );

    // A tenant-bound CI upload of the DWARF replaces the agents' files (it
    // is not refused because of them) and names every tenant's frames.
    let (status, body) = put(
        &server,
        "ci-t1",
        &format!("/api/v1/debuginfo/{}/debuginfo", real.build_id),
        &real.debug,
    );
    assert_eq!(status, 201, "{body}");
    for service in ["victim-1", "forger", "no-hash"] {
        let fg = flamegraph(&server, "q", service, "");
        assert_eq!(fg["build_ids"][0]["status"], "ok", "{service}: {fg}");
        let names = names(&fg);
        assert!(names.iter().any(|n| n == "gamma_inline"), "{names:?}");
        assert!(!names.iter().any(|n| n.starts_with("FORGED")), "{names:?}");
    }
    let (_, details) = json_of(server.get(&format!("/api/v1/debuginfo/{}", real.build_id)));
    assert_eq!(details["served"]["debuginfo"], body["sha256"], "{details}");
    // A CI upload of the very bytes an agent sent makes them CI's.
    let (status, body) = put(
        &server,
        CI,
        &format!("/api/v1/debuginfo/{}/executable", real.build_id),
        &symtab,
    );
    assert!(status == 200 || status == 201, "{body}");
    let (_, details) = json_of(server.get(&format!("/api/v1/debuginfo/{}", real.build_id)));
    let stripped = details["artifacts"]
        .as_array()
        .unwrap()
        .iter()
        .find(|a| a["sha256"] == real_sha.as_str())
        .unwrap()
        .clone();
    assert_eq!(stripped["origin"], "upload", "{details}");
}

/// A `.note.go.buildid` note of `id` (what `go build` writes).
fn go_note(id: &str) -> Vec<u8> {
    let mut note = Vec::new();
    note.extend_from_slice(&4u32.to_le_bytes());
    note.extend_from_slice(&(id.len() as u32).to_le_bytes());
    note.extend_from_slice(&4u32.to_le_bytes());
    note.extend_from_slice(b"Go\0\0");
    note.extend_from_slice(id.as_bytes());
    while note.len() % 4 != 0 {
        note.push(0);
    }
    note
}

#[test]
fn a_copied_go_build_id_redirects_no_frames() {
    let Some(python) = python() else { return };
    if !require(
        have("llvm-symbolizer-19") && have("gcc") && have("objcopy"),
        "llvm-symbolizer-19, gcc and objcopy",
    ) {
        return;
    }
    let server = trusted_server();
    let dir = tempfile::tempdir().unwrap();
    let go_id =
        "aBcDeFgHiJkLmNoPqRsT/uVwXyZaBcDeFgHiJkLm/nOpQrStUvWxYzAbCdEfG/hIjKlMnOpQrStUvWxYzA";
    let note = dir.path().join("go.note");
    std::fs::write(&note, go_note(go_id)).unwrap();
    let add_note = |input: &std::path::Path, out: &std::path::Path| {
        run(Command::new("objcopy")
            .arg(format!("--add-section=.note.go.buildid={}", note.display()))
            .arg("--set-section-flags=.note.go.buildid=alloc,readonly")
            .arg(input)
            .arg(out));
    };
    // The victim: a binary without a GNU build-ID, known by its Go
    // build-ID, published by CI.
    let victim_src = Demo::without_build_id(43);
    let victim = dir.path().join("victim");
    add_note(&victim_src.exe, &victim);
    let info = symtrace_elf::inspect(&std::fs::read(&victim).unwrap()).unwrap();
    assert_eq!(info.go_build_id.as_deref(), Some(go_id));
    let key = info.storage_key().to_string();
    let (status, body) = put(
        &server,
        CI,
        &format!("/api/v1/debuginfo/{key}/executable"),
        &victim,
    );
    assert_eq!(status, 201, "{body}");
    // Later, an agent publishes a forgery: a fresh GNU build-ID and the
    // victim's Go build-ID note (the newest key that ID leads to).
    let fresh = "f00dface".repeat(5);
    let forged_plain = forged(dir.path(), &fresh);
    let forged = dir.path().join("forged-go");
    add_note(&forged_plain, &forged);
    let (status, body) = put(
        &server,
        AGENT,
        &format!("/api/v1/debuginfo/{fresh}/executable"),
        &forged,
    );
    assert_eq!(status, 201, "{body}");
    // Frames sent by the Go build-ID (as the OpenTelemetry eBPF profiler
    // does), with and without a content hash: the victim's file names them.
    let victim_named = |plain: &str, hashed: &str| {
        for (service, content) in [(plain, None), (hashed, Some(sha256(&victim)))] {
            send_as(
                &python,
                &server,
                Some(AGENT),
                &victim_src,
                go_id,
                "go",
                content.as_deref(),
                service,
            );
            let names = names(&flamegraph(&server, "q", service, ""));
            assert!(
                names.iter().any(|n| n == "alpha_work"),
                "{service}: {names:?}"
            );
            assert!(
                !names.iter().any(|n| n.starts_with("FORGED")),
                "{service}: {names:?}"
            );
        }
    };
    victim_named("go-plain", "go-hashed");
    // An agent's file under a build-ID CI published (CI's file names
    // `FORGED_*`), carrying the victim's Go build-ID: the ID must not lead
    // the victim's frames to that key, where CI's file would name them.
    let other = tempfile::tempdir().unwrap();
    let ci_id = "c1c1c1c1".repeat(5);
    let ci_file = self::forged(other.path(), &ci_id);
    let (status, body) = put(
        &server,
        CI,
        &format!("/api/v1/debuginfo/{ci_id}/executable"),
        &ci_file,
    );
    assert_eq!(status, 201, "{body}");
    let noted = other.path().join("ci-noted");
    add_note(&ci_file, &noted);
    let (status, body) = put(
        &server,
        AGENT,
        &format!("/api/v1/debuginfo/{ci_id}/executable"),
        &noted,
    );
    assert!(status == 200 || status == 201, "{body}");
    victim_named("go-plain-2", "go-hashed-2");
}

#[test]
fn an_extract_said_to_be_of_a_content_never_beats_the_whole_file() {
    let Some(python) = python() else { return };
    if !require(
        have("llvm-symbolizer-19") && have("gcc"),
        "llvm-symbolizer-19 and gcc",
    ) {
        return;
    }
    let server = trusted_server();
    let real = Demo::build(44);
    let dir = tempfile::tempdir().unwrap();
    let forged = forged(dir.path(), &real.build_id);
    let real_sha = sha256(&real.exe);
    // A token holder sends a forged extract (DWARF, quality 3) saying it
    // was taken from the real file's content: the hash of a public file is
    // no secret.
    let (status, body) = put(
        &server,
        AGENT,
        &format!(
            "/api/v1/debuginfo/{}/debuginfo?content_sha256={real_sha}",
            real.build_id
        ),
        &forged,
    );
    assert_eq!(status, 201, "{body}");
    // An honest agent's claim for the whole file of that content is still
    // granted (an extract is only its sender's word)…
    let (status, body) = json_of(
        client()
            .post(format!("{}/api/v1/debuginfo/missing", server.url))
            .bearer_auth(AGENT)
            .json(
                &json!({"items": [{"build_id": real.build_id, "kind": "executable",
                "quality": 3, "claim": "honest", "content_sha256": real_sha}]}),
            )
            .send()
            .unwrap(),
    );
    assert_eq!(status, 200, "{body}");
    assert_eq!(
        body["missing"][0]["upload_as"],
        real.build_id.as_str(),
        "{body}"
    );
    // …and its upload, whose hash the server checks, names the frames.
    let (status, body) = put(
        &server,
        AGENT,
        &format!("/api/v1/debuginfo/{}/executable", real.build_id),
        &real.exe,
    );
    assert_eq!(status, 201, "{body}");
    send_as(
        &python,
        &server,
        Some(AGENT),
        &real,
        &real.build_id,
        "gnu",
        Some(&real_sha),
        "whole-wins",
    );
    let names = names(&flamegraph(&server, "q", "whole-wins", ""));
    assert!(names.iter().any(|n| n == "alpha_work"), "{names:?}");
    assert!(!names.iter().any(|n| n.starts_with("FORGED")), "{names:?}");
}

#[test]
fn claims_are_per_content_bounded_per_token_and_expire() {
    if !have("gcc") {
        return;
    }
    let server = Server::start(
        &Backend::local(),
        &[
            "--agent-tokens",
            "a1,a2",
            "--upload-tokens",
            CI,
            "--claims-per-minute",
            "20",
        ],
    );
    let claim = |token: &str, id: &str, content: &str, holder: &str| {
        json_of(
            client()
                .post(format!("{}/api/v1/debuginfo/missing", server.url))
                .bearer_auth(token)
                .json(
                    &json!({"items": [{"build_id": id, "kind": "executable", "quality": 2,
                    "claim": holder, "content_sha256": content}]}),
                )
                .send()
                .unwrap(),
        )
    };
    let id = "ab".repeat(20);
    let (c1, c2) = ("11".repeat(32), "22".repeat(32));
    let (_, first) = claim("a1", &id, &c1, "host-a");
    assert_eq!(first["missing"][0]["upload_as"], id.as_str(), "{first}");
    // Another host, the same content: not granted while the claim holds.
    let (_, second) = claim("a1", &id, &c1, "host-b");
    assert_eq!(second["missing"], json!([]), "{second}");
    // Another content under the same build-ID (a forgery, or the real
    // file a forger claimed first): its own claim.
    let (_, other) = claim("a1", &id, &c2, "host-b");
    assert_eq!(other["missing"][0]["upload_as"], id.as_str(), "{other}");
    // A token's claims are bounded: 20 a minute, then 429 with when.
    let mut refused = None;
    for i in 0..30 {
        let (status, body) = claim("a1", &format!("{i:040x}"), &c1, "host-a");
        if status == 429 {
            refused = Some(body);
            break;
        }
    }
    let refused = refused.expect("the quota ran out");
    assert!(
        refused["error"]["message"]
            .as_str()
            .unwrap()
            .contains("SYMTRACE_CLAIMS_PER_MINUTE"),
        "{refused}"
    );
    // Another token still has its own.
    let (status, _) = claim("a2", &"cd".repeat(20), &c1, "host-c");
    assert_eq!(status, 200);
}

#[test]
fn a_probe_claims_nothing_and_only_ci_files_answer_it() {
    if !require(
        have("llvm-symbolizer-19") && have("gcc"),
        "llvm-symbolizer-19 and gcc",
    ) {
        return;
    }
    let server = trusted_server();
    let real = Demo::build(43);
    let dir = tempfile::tempdir().unwrap();
    let symtab = dir.path().join("real-symtab");
    run(Command::new("objcopy")
        .arg("--strip-debug")
        .arg(&real.exe)
        .arg(&symtab));
    let ask = |item: Value| {
        let (status, body) = json_of(
            client()
                .post(format!("{}/api/v1/debuginfo/missing", server.url))
                .bearer_auth(AGENT)
                .json(&json!({ "items": [item] }))
                .send()
                .unwrap(),
        );
        assert_eq!(status, 200, "{body}");
        body
    };
    let probe = |quality: i32| {
        let body = ask(json!({"build_id": real.build_id, "kind": "executable",
            "quality": quality, "claim": "host-a", "probe": true}));
        let missing = body["missing"].as_array().unwrap();
        assert!(
            missing.iter().all(|m| m.get("upload_as").is_none()),
            "a probe is never granted: {body}"
        );
        !missing.is_empty()
    };
    // Nothing stored: the agent must hash its file.
    assert!(probe(2));
    // The probe held nothing: another host's claim of the file is granted.
    let sha = sha256(&symtab);
    let claim = ask(json!({"build_id": real.build_id, "kind": "executable",
        "quality": 2, "claim": "host-b", "content_sha256": sha}));
    assert_eq!(
        claim["missing"][0]["upload_as"],
        real.build_id.as_str(),
        "{claim}"
    );
    let (status, body) = put(
        &server,
        AGENT,
        &format!("/api/v1/debuginfo/{}/executable", real.build_id),
        &symtab,
    );
    assert_eq!(status, 201, "{body}");
    // An agent's file names only its own content: it vouches for no other.
    assert!(probe(2), "an agent's file answered a probe");
    // CI's symbol table answers for its quality, not for DWARF.
    let (status, body) = put(
        &server,
        CI,
        &format!("/api/v1/debuginfo/{}/executable", real.build_id),
        &symtab,
    );
    assert_eq!(status, 201, "{body}");
    assert!(!probe(2), "CI's file of the ID vouches for a symbol table");
    assert!(probe(3), "a symbol table does not vouch for DWARF");
    // An unknown ID, and an htlhash nothing leads to.
    let body = ask(json!({"build_id": "ef".repeat(20), "kind": "executable",
        "quality": 1, "claim": "host-a", "probe": true}));
    assert_eq!(body["missing"].as_array().unwrap().len(), 1, "{body}");
    let body = ask(json!({"build_id": "ab".repeat(16), "id_kind": "htlhash",
        "kind": "executable", "quality": 1, "claim": "host-a", "probe": true}));
    assert_eq!(body["missing"].as_array().unwrap().len(), 1, "{body}");
}

#[test]
fn a_client_that_stops_reading_is_cut_off() {
    // A client pipelining requests for a large file and never reading the
    // answers (its receive window closes) holds its connection only as long
    // as the response write timeout.
    let server = Server::start(
        &Backend::local(),
        &["--max-connections", "2", "--response-write-timeout", "2"],
    );
    let fixture = Fixture::hello("stall", "hello.c", &[]);
    // A file of 16 MiB: far more than the socket buffers hold.
    let pad = fixture.dir.path().join("pad");
    std::fs::write(&pad, vec![7u8; 16 << 20]).unwrap();
    let big = fixture.dir.path().join("big");
    run(Command::new("objcopy")
        .arg(format!("--add-section=.pad={}", pad.display()))
        .arg(&fixture.unstripped)
        .arg(&big));
    server.upload(&fixture.build_id, "executable", &big);
    let addr = server.url.trim_start_matches("http://").to_owned();
    let mut stalled = Vec::new();
    for _ in 0..2 {
        let mut stream = std::net::TcpStream::connect(&addr).unwrap();
        let request = format!(
            "GET /buildid/{}/executable HTTP/1.1\r\nHost: {addr}\r\n\r\n",
            fixture.build_id
        );
        // Pipelined, never read.
        for _ in 0..4 {
            stream.write_all(request.as_bytes()).unwrap();
        }
        stalled.push(stream);
    }
    // Both slots are taken; once the timeout cuts both stalled clients
    // off, two new clients are served at once (one served alone would
    // show only one slot free: reading the other stalled client below
    // would then let it go on, not show it was cut).
    let healthz = || -> Option<std::net::TcpStream> {
        let mut s = std::net::TcpStream::connect(&addr).ok()?;
        s.set_read_timeout(Some(std::time::Duration::from_secs(3)))
            .ok()?;
        s.write_all(format!("GET /healthz HTTP/1.1\r\nHost: {addr}\r\n\r\n").as_bytes())
            .ok()?;
        let mut head = [0u8; 12];
        s.read_exact(&mut head).ok()?;
        (&head == b"HTTP/1.1 200").then_some(s)
    };
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    loop {
        // The first one is kept open (its slot held) while the second asks.
        let first = healthz();
        if first.is_some() && healthz().is_some() {
            break;
        }
        drop(first);
        assert!(
            std::time::Instant::now() < deadline,
            "no two slots came free: the stalled clients hold them"
        );
        std::thread::sleep(std::time::Duration::from_millis(200));
    }
    // The server closed them (what they read ends).
    for mut s in stalled {
        s.set_read_timeout(Some(std::time::Duration::from_secs(10)))
            .unwrap();
        let mut buf = vec![0u8; 1 << 20];
        let mut total = 0usize;
        loop {
            match s.read(&mut buf) {
                Ok(0) => break,
                Ok(n) => total += n,
                Err(e) => {
                    assert_ne!(e.kind(), std::io::ErrorKind::WouldBlock, "still open");
                    break;
                }
            }
            assert!(total < 1 << 30);
        }
    }
}
