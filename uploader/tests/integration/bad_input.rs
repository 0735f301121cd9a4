//! Bad input: each case a clear line and the right exit code, nothing
//! partially published.

use std::process::Command;

use symtrace_testkit::*;

use crate::{compile, tools, upload, UPLOAD};

#[test]
fn files_that_cannot_be_published_are_reported() {
    if !tools(&["gcc", "objcopy", "strip", "readelf"]) {
        return;
    }
    let server = Server::start(&Backend::local(), &[]);
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("hello.c"), HELLO_C).unwrap();
    std::fs::write(dir.path().join("util.h"), UTIL_H).unwrap();
    let good = compile(
        dir.path(),
        "gcc",
        &["-g", "-Wl,--build-id", "hello.c"],
        "good",
    );
    let no_build_id = compile(
        dir.path(),
        "gcc",
        &["-g", "-Wl,--build-id=none", "hello.c"],
        "no-build-id",
    );
    std::os::unix::fs::symlink(dir.path().join("vanished"), dir.path().join("dangling")).unwrap();
    std::fs::write(dir.path().join("notes.txt"), "not an ELF file").unwrap();

    let (code, summary, stderr) = upload(&server.url, &[], &[dir.path()]);
    assert_eq!(code, 1, "{stderr}");
    assert!(stderr.contains("dangling"), "{stderr}");
    // A file without a GNU build-ID is no longer refused: it is published
    // whole under its htlhash (it has no Go build-ID either).
    let htlhash = symtrace_elf::htlhash_bytes(&std::fs::read(&no_build_id).unwrap());
    let (status, details) = json_of(server.get(&format!("/api/v1/debuginfo/{htlhash}")));
    assert_eq!(status, 200, "{details}\n{stderr}");
    let artifacts = details["artifacts"].as_array().unwrap();
    assert_eq!(artifacts.len(), 1, "whole, not split: {details}");
    assert_eq!(artifacts[0]["kind"], "executable", "{details}");
    assert_eq!(artifacts[0]["has_dwarf"], true, "{details}");
    // …and never stripped: a stripped copy would have another htlhash.
    let before = std::fs::read(&no_build_id).unwrap();
    let (code, _, stderr) = upload(&server.url, &["--strip"], &[&no_build_id]);
    assert_eq!(code, 1, "{stderr}");
    assert!(stderr.contains("no GNU or Go build-ID"), "{stderr}");
    assert_eq!(
        std::fs::read(&no_build_id).unwrap(),
        before,
        "left as built"
    );
    assert!(summary["non_elf_files"].as_u64().unwrap() >= 1, "{summary}");
    // The good file was still published.
    let id = build_id_of(&good);
    assert_eq!(
        server.get(&format!("/buildid/{id}/debuginfo")).status(),
        200
    );
}

#[test]
fn server_down_wrong_token_and_refusals_have_exit_codes() {
    if !tools(&["gcc", "objcopy", "strip", "readelf"]) {
        return;
    }
    let fx = Fixture::hello("src", "hello.c", &["-g"]);
    // Nothing listens on port 9 of loopback.
    let (code, _, stderr) = upload("http://127.0.0.1:9", &["--retries", "1"], &[&fx.unstripped]);
    assert_eq!(code, 1, "{stderr}");
    assert!(stderr.contains("failed after 1 attempts"), "{stderr}");

    let guarded = Server::start(&Backend::local(), &["--upload-tokens", "right"]);
    let (code, _, stderr) = upload(&guarded.url, &["--token", "wrong"], &[&fx.unstripped]);
    assert_eq!(code, 2, "{stderr}");
    assert!(stderr.contains("refused the token (403)"), "{stderr}");

    // The server refuses the files (too large): reported per file, exit 1,
    // and nothing of that build-ID is visible.
    let small = Server::start(&Backend::local(), &["--max-upload-bytes", "1000"]);
    let (code, summary, stderr) = upload(&small.url, &["--retries", "1"], &[&fx.unstripped]);
    assert_eq!(code, 1, "{stderr}");
    assert!(stderr.contains("server refused (413)"), "{stderr}");
    assert!(summary["failed"].as_u64().unwrap() >= 2, "{summary}");
    assert_eq!(
        small
            .get(&format!("/buildid/{}/debuginfo", fx.build_id))
            .status(),
        404
    );
    assert_eq!(
        small
            .get(&format!("/buildid/{}/executable", fx.build_id))
            .status(),
        404
    );

    // Usage errors exit 2.
    let out = Command::new(UPLOAD).output().unwrap();
    assert_eq!(out.status.code(), Some(2));
    let out = Command::new(UPLOAD)
        .args(["--server", "ftp://x", "/tmp"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
}

#[test]
fn strip_waits_for_the_debug_info_to_be_published() {
    if !tools(&["gcc", "readelf"]) {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("hello.c"), HELLO_C).unwrap();
    std::fs::write(dir.path().join("util.h"), UTIL_H).unwrap();
    let exe = compile(
        dir.path(),
        "gcc",
        &["-g", "-Wl,--build-id", "hello.c"],
        "app",
    );
    // Server down: the binary keeps its DWARF.
    let (code, _, stderr) = upload(
        "http://127.0.0.1:9",
        &["--strip", "--retries", "1"],
        &[&exe],
    );
    assert_eq!(code, 1, "{stderr}");
    assert!(
        crate::has_section(&exe, ".debug_info"),
        "--strip destroyed the DWARF of an unpublished binary"
    );

    // Published: both hard-linked names (like cargo's target/release/app and
    // deps/app-HASH) are stripped, and an object file without build-ID is
    // ignored, not a failure.
    let deps = dir.path().join("deps");
    std::fs::create_dir_all(&deps).unwrap();
    std::fs::hard_link(&exe, deps.join("app-1234")).unwrap();
    compile(dir.path(), "gcc", &["-c", "hello.c"], "deps/hello.o");
    let server = Server::start(&Backend::local(), &[]);
    let (code, summary, stderr) = upload(&server.url, &["--strip"], &[dir.path()]);
    assert_eq!(code, 0, "{stderr}");
    assert_eq!(summary["objects_ignored"], 1, "{summary}");
    for name in [exe.clone(), deps.join("app-1234")] {
        assert!(
            !crate::has_section(&name, ".debug_info"),
            "{} not stripped",
            name.display()
        );
    }
    let id = build_id_of(&exe);
    assert_eq!(
        server.get(&format!("/buildid/{id}/debuginfo")).status(),
        200
    );
}

#[test]
fn an_answer_that_is_not_from_a_symtrace_server_is_a_failure() {
    if !tools(&["gcc", "objcopy", "strip", "readelf"]) {
        return;
    }
    // Anything at a wrong URL answering 200 with a web page.
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    std::thread::spawn(move || {
        for stream in listener.incoming().take(8) {
            use std::io::{Read, Write};
            let Ok(mut stream) = stream else { continue };
            let mut buf = [0u8; 65536];
            let _ = stream.read(&mut buf);
            let _ = stream.write_all(
                b"HTTP/1.1 200 OK\r\nContent-Length: 6\r\nConnection: close\r\n\r\n<html>",
            );
        }
    });
    let fx = Fixture::hello("src", "hello.c", &["-g"]);
    let (code, _, stderr) = upload(&url, &["--retries", "1"], &[&fx.unstripped]);
    assert_eq!(code, 1, "{stderr}");
    assert!(
        stderr.contains("did not answer like a symtrace server"),
        "{stderr}"
    );
}
