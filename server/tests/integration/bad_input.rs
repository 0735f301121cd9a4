//! Bad input gets the right status and a clear JSON message, and nothing
//! already stored changes.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::Duration;

use crate::support::*;

fn tools() -> bool {
    ["gcc", "objcopy", "strip", "readelf"]
        .iter()
        .all(|t| have(t))
}

/// Asserts the published fixture is still served exactly.
fn still_served(server: &Server, fx: &Fixture) {
    let got = server.get(&format!("/buildid/{}/debuginfo", fx.build_id));
    assert_eq!(got.status(), 200);
    assert_eq!(got.bytes().unwrap(), std::fs::read(&fx.debug).unwrap());
    let got = server.get(&format!("/buildid/{}/executable", fx.build_id));
    assert_eq!(got.bytes().unwrap(), std::fs::read(&fx.stripped).unwrap());
}

#[test]
fn bad_uploads_are_refused_clearly_and_change_nothing() {
    if !tools() {
        return;
    }
    let server = Server::start(&Backend::local(), &["--max-upload-bytes", "100000"]);
    let fx = Fixture::hello("src", "hello.c", &["-g"]);
    fx.publish(&server);
    let other = Fixture::hello("src", "hello.c", &["-g", "-DOTHER"]);
    assert_ne!(other.build_id, fx.build_id);
    let id = &fx.build_id;
    let url = |kind: &str| format!("/api/v1/debuginfo/{id}/{kind}");

    // Not ELF.
    let (s, b) = server.put_bytes(
        &url("debuginfo"),
        b"#!/bin/sh\necho not elf\n".to_vec(),
        None,
    );
    assert_error(s, &b, 422, "not an ELF file");
    // The wrong build-ID.
    let (s, b) = server.put_file(&url("debuginfo"), &other.debug);
    assert_error(s, &b, 422, &format!("build-ID is {}", other.build_id));
    // A truncated ELF (complete HTTP body, half a file).
    let half = std::fs::read(&fx.unstripped).unwrap();
    let (s, b) = server.put_bytes(&url("executable"), half[..half.len() / 2].to_vec(), None);
    assert_eq!(s, 422, "{b}");
    // The wrong kind: a debug-only file as executable, a stripped one as debuginfo.
    let (s, b) = server.put_file(&url("executable"), &fx.debug);
    assert_error(s, &b, 422, "upload it as debuginfo");
    let (s, b) = server.put_file(&url("debuginfo"), &fx.stripped);
    assert_error(s, &b, 422, "upload it as executable");
    // Invalid build-IDs and kinds in the URL.
    let (s, b) = server.put_file("/api/v1/debuginfo/ABCD/debuginfo", &fx.debug);
    assert_error(s, &b, 400, "lowercase hex");
    let (s, b) = server.put_file("/api/v1/debuginfo/abc/debuginfo", &fx.debug);
    assert_error(s, &b, 400, "even number");
    let (s, b) = server.put_file(&url("symbols"), &fx.debug);
    assert_error(s, &b, 400, "unknown kind");
    // Oversized, with and without Content-Length.
    let big = vec![0x7fu8; 200_000];
    let (s, b) = server.put_bytes(&url("debuginfo"), big.clone(), None);
    assert_error(s, &b, 413, "limit");
    let chunked = client()
        .put(format!("{}{}", server.url, url("debuginfo")))
        .body(reqwest::blocking::Body::new(std::io::Cursor::new(big)))
        .send()
        .unwrap();
    let (s, b) = json_of(chunked);
    assert_error(s, &b, 413, "limit");
    // Path traversal in source paths: never stored, never served.
    for path in [
        "source/../../etc/passwd",
        "source/..%2F..%2Fetc/passwd",
        "source/tmp/../../../../root/.ssh/id_rsa",
    ] {
        let (s, b) = raw_request(
            &server,
            "PUT",
            &format!("/api/v1/debuginfo/{id}/{path}"),
            b"x",
        );
        assert_error(s, &b, 422, "not among");
    }
    let (s, b) = raw_request(
        &server,
        "GET",
        &format!("/buildid/{id}/source/../../../etc/passwd"),
        b"",
    );
    assert_eq!(s, 404, "{b}");
    // A source for a build-ID without DWARF yet.
    let (s, b) = server.put_bytes(
        &format!("/api/v1/debuginfo/{}/source/tmp/a.c", other.build_id),
        b"x".to_vec(),
        None,
    );
    assert_error(s, &b, 422, "upload its debuginfo first");
    // An undecodable Content-Encoding body.
    let resp = client()
        .put(format!("{}{}", server.url, url("debuginfo")))
        .header("content-encoding", "zstd")
        .body(b"this is not zstd".to_vec())
        .send()
        .unwrap();
    let (s, b) = json_of(resp);
    assert_eq!(s, 400, "{b}");
    // An unsupported Content-Encoding.
    let resp = client()
        .put(format!("{}{}", server.url, url("debuginfo")))
        .header("content-encoding", "br")
        .body(b"x".to_vec())
        .send()
        .unwrap();
    assert_eq!(resp.status(), 415);

    still_served(&server, &fx);
    assert!(spool_is_empty(&server));
    let (_, details) = json_of(server.get(&format!("/api/v1/debuginfo/{id}")));
    assert_eq!(
        details["artifacts"].as_array().unwrap().len(),
        2,
        "{details}"
    );
}

#[test]
fn a_connection_dropped_mid_body_stores_nothing() {
    if !tools() {
        return;
    }
    let server = Server::start(&Backend::local(), &[]);
    let fx = Fixture::hello("src", "hello.c", &["-g"]);
    fx.publish(&server);
    let replacement = std::fs::read(&fx.unstripped).unwrap();
    let url = format!("/api/v1/debuginfo/{}/debuginfo", fx.build_id);
    let stream = partial_upload(&server, &url, &replacement, 1.0 / 3.0);
    let addr = server.url.trim_start_matches("http://").to_owned();
    wait_until_spooled(&server);
    drop(stream);
    // The cut upload's file goes (a partial upload is never left behind).
    symtrace_testkit::wait_until(
        "the partial upload's file removed",
        Duration::from_secs(30),
        || spool_is_empty(&server).then_some(()),
    );

    still_served(&server, &fx);
    let (_, details) = json_of(server.get(&format!("/api/v1/debuginfo/{}", fx.build_id)));
    assert_eq!(
        details["artifacts"].as_array().unwrap().len(),
        2,
        "{details}"
    );
    // The server is fine afterwards.
    let mut s = TcpStream::connect(&addr).unwrap();
    write!(
        s,
        "GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
    )
    .unwrap();
    let mut reply = String::new();
    s.read_to_string(&mut reply).unwrap();
    assert!(reply.starts_with("HTTP/1.1 200"), "{reply}");
}

#[test]
fn tokens_guard_uploads_and_deletes() {
    if !tools() {
        return;
    }
    let server = Server::start(
        &Backend::local(),
        &[
            "--upload-tokens",
            "up-secret",
            "--admin-tokens",
            "admin-secret",
        ],
    );
    let fx = Fixture::hello("src", "hello.c", &["-g"]);
    let url = format!("/api/v1/debuginfo/{}/debuginfo", fx.build_id);
    let body = std::fs::read(&fx.debug).unwrap();
    let (s, b) = server.put_bytes(&url, body.clone(), None);
    assert_error(s, &b, 401, "Authorization");
    let (s, b) = server.put_bytes(&url, body.clone(), Some("wrong"));
    assert_error(s, &b, 403, "not valid");
    let (s, b) = server.put_bytes(&url, body.clone(), Some("up-secret"));
    assert_eq!(s, 201, "{b}");
    // Reads stay public.
    assert_eq!(
        server
            .get(&format!("/buildid/{}/debuginfo", fx.build_id))
            .status(),
        200
    );
    // Deleting needs the admin token.
    let del = |token: Option<&str>| {
        let mut r = client().delete(format!("{}/api/v1/debuginfo/{}", server.url, fx.build_id));
        if let Some(t) = token {
            r = r.bearer_auth(t);
        }
        json_of(r.send().unwrap())
    };
    let (s, b) = del(Some("up-secret"));
    assert_error(s, &b, 403, "not valid");
    assert_eq!(
        server
            .get(&format!("/buildid/{}/debuginfo", fx.build_id))
            .status(),
        200
    );
    let (s, b) = del(Some("admin-secret"));
    assert_eq!(s, 200, "{b}");
    assert_eq!(
        server
            .get(&format!("/buildid/{}/debuginfo", fx.build_id))
            .status(),
        404
    );
    // Tokens never reach the log.
    let log = server.log_text();
    assert!(
        !log.contains("up-secret") && !log.contains("admin-secret"),
        "a token was logged"
    );
}

#[test]
fn read_tokens_guard_reads_and_keep_shared_caches_out() {
    if !tools() {
        return;
    }
    let server = Server::start(&Backend::local(), &["--read-tokens", "reader"]);
    let fx = Fixture::hello("src", "hello.c", &["-g"]);
    server.upload(&fx.build_id, "debuginfo", &fx.debug);
    let url = format!("{}/buildid/{}/debuginfo", server.url, fx.build_id);
    assert_eq!(client().get(&url).send().unwrap().status(), 401);
    let ok = client().get(&url).bearer_auth("reader").send().unwrap();
    assert_eq!(ok.status(), 200);
    assert_eq!(ok.headers()["cache-control"], "private");
    assert_eq!(ok.headers()["vary"], "authorization");
    // Deletes from a loopback client relayed by a proxy are not trusted.
    let relayed = client()
        .delete(format!("{}/api/v1/debuginfo/{}", server.url, fx.build_id))
        .header("x-forwarded-for", "198.51.100.7")
        .send()
        .unwrap();
    assert_eq!(relayed.status(), 403);
}

/// `ch_size` (little-endian u64 at offset 8 of the Elf64_Chdr) of the
/// compressed `.debug_info` of `data` set to `size`.
fn claim_debug_info(data: &[u8], size: u64) -> Vec<u8> {
    let info = symtrace_elf::inspect(data).unwrap();
    assert!(info.is_64 && info.compressed_debug);
    let at = info.section(".debug_info").unwrap().offset as usize;
    let mut out = data.to_vec();
    // ELFCOMPRESS_ZLIB: the section really is SHF_COMPRESSED.
    assert_eq!(u32::from_le_bytes(out[at..at + 4].try_into().unwrap()), 1);
    out[at + 8..at + 16].copy_from_slice(&size.to_le_bytes());
    out
}

fn main_address(binary: &std::path::Path) -> String {
    let out = run(std::process::Command::new("nm").arg(binary));
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .find_map(|l| l.strip_suffix(" T main").map(|a| format!("0x{a}")))
        .expect("main in nm's output")
}

fn symbolize_main(server: &Server, build_id: &str, address: &str) -> (u16, serde_json::Value) {
    json_of(
        client()
            .post(format!("{}/api/v1/symbolize", server.url))
            .header("content-type", "application/json")
            .body(serde_json::json!({"build_id": build_id, "addresses": [address]}).to_string())
            .send()
            .unwrap(),
    )
}

/// A DWARF file whose compressed `.debug_info` claims 1 TiB (or more or
/// fewer bytes than its stream holds) is refused at upload, naming the
/// section, instead of being stored and ranked above a good file; the
/// server keeps serving. A stored file over a lowered budget fails
/// symbolization with a clear 422.
#[test]
fn compressed_debug_sections_that_lie_about_their_size_are_refused() {
    if !tools() || !have("nm") {
        return;
    }
    let mut server = Server::start(&Backend::local(), &[]);
    let fx = Fixture::hello("src", "hello.c", &["-g", "-gz=zlib"]);
    let id = fx.build_id.clone();
    let url = format!("/api/v1/debuginfo/{id}/debuginfo");
    // A good upload of lower rank: the symbol table only.
    let symtab_only = fx.dir.path().join("hello.symtab");
    run(std::process::Command::new("strip")
        .args(["--strip-debug", "-o"])
        .arg(&symtab_only)
        .arg(&fx.unstripped));
    let body = server.upload(&id, "debuginfo", &symtab_only);
    assert_eq!(body["quality"], "symtab", "{body}");

    let good = std::fs::read(&fx.unstripped).unwrap();
    let bad = claim_debug_info(&good, 1 << 40);
    let (s, b) = server.put_bytes(&url, bad, None);
    assert_error(
        s,
        &b,
        422,
        "section .debug_info: claims 1099511627776 uncompressed bytes (zlib), over the \
         4294967296-byte budget",
    );
    assert_eq!(b["error"]["code"], "invalid_content", "{b}");
    assert!(
        b["error"]["message"]
            .as_str()
            .unwrap()
            .contains("SYMTRACE_MAX_DECOMPRESSED_BYTES"),
        "{b}"
    );
    // A claim the stream does not fill, and one it overruns.
    let real = {
        let at = symtrace_elf::inspect(&good)
            .unwrap()
            .section(".debug_info")
            .unwrap()
            .offset as usize;
        u64::from_le_bytes(good[at + 8..at + 16].try_into().unwrap())
    };
    let (s, b) = server.put_bytes(&url, claim_debug_info(&good, real + 1), None);
    assert_error(s, &b, 422, ".debug_info: zlib stream ends after");
    let (s, b) = server.put_bytes(&url, claim_debug_info(&good, real - 1), None);
    assert_error(s, &b, 422, ".debug_info: zlib stream inflates to more than");

    // Nothing was stored; the good file is still what is served, and the
    // server still serves.
    let got = server.get(&format!("/buildid/{id}/debuginfo"));
    assert_eq!(got.status(), 200);
    assert_eq!(got.bytes().unwrap(), std::fs::read(&symtab_only).unwrap());
    let (_, details) = json_of(server.get(&format!("/api/v1/debuginfo/{id}")));
    assert_eq!(
        details["artifacts"].as_array().unwrap().len(),
        1,
        "{details}"
    );
    assert!(spool_is_empty(&server));
    assert_eq!(server.get("/healthz").status(), 200);

    // The honest compressed file is accepted and ranked DWARF.
    let body = server.upload(&id, "debuginfo", &fx.unstripped);
    assert_eq!(body["quality"], "dwarf", "{body}");
    let address = main_address(&fx.unstripped);

    // The same stored file under a budget smaller than its DWARF (set by the
    // setting's environment twin), before any symbol index was built from
    // it: symbolizing fails with a clear 422, and uploading it again is
    // refused.
    server.kill9();
    let mut small = Server::start_on(&server, &[("SYMTRACE_MAX_DECOMPRESSED_BYTES", "64")]);
    let (s, b) = symbolize_main(&small, &id, &address);
    assert_error(s, &b, 422, "section .debug_");
    assert_eq!(b["error"]["code"], "unusable_debug_file", "{b}");
    assert!(
        b["error"]["message"]
            .as_str()
            .unwrap()
            .contains("over the 64-byte budget"),
        "{b}"
    );
    let (s, b) = small.put_file(&url, &fx.unstripped);
    assert_error(s, &b, 422, "over the 64-byte budget");
    assert_eq!(small.get("/healthz").status(), 200);

    // Under the default budget it symbolizes.
    small.kill9();
    let default = Server::start_on(&server, &[]);
    let (s, b) = symbolize_main(&default, &id, &address);
    assert_eq!(s, 200, "{b}");
    assert_eq!(
        b["results"][0]["addresses"][0]["frames"][0]["function"], "main",
        "{b}"
    );
}
