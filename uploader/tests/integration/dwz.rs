//! dwz supplementary files named by `.gnu_debugaltlink` are published under
//! their own build-IDs, which is where debuginfod clients ask for them.

use std::process::Command;

use symtrace_testkit::*;

use crate::{compile, tools, upload};

#[test]
fn dwz_supplementary_files_are_published_under_their_build_id() {
    if !tools(&["gcc", "dwz", "readelf", "debuginfod-find"]) {
        return;
    }
    let server = Server::start(&Backend::local(), &[]);
    let dir = tempfile::tempdir().unwrap();
    let (bin, alt_dir) = (dir.path().join("bin"), dir.path().join("alt"));
    std::fs::create_dir_all(&bin).unwrap();
    std::fs::create_dir_all(&alt_dir).unwrap();
    std::fs::write(bin.join("hello.c"), HELLO_C).unwrap();
    std::fs::write(bin.join("util.h"), UTIL_H).unwrap();
    let a = compile(
        &bin,
        "gcc",
        &["-g", "-O0", "-Wl,--build-id", "hello.c"],
        "a",
    );
    let b = compile(
        &bin,
        "gcc",
        &["-g", "-O1", "-Wl,--build-id", "hello.c"],
        "b",
    );
    let alt = alt_dir.join("common.dwz");
    run(Command::new("dwz")
        .arg("-m")
        .arg(&alt)
        .arg("-M")
        .arg(&alt)
        .arg(&a)
        .arg(&b));
    let alt_id = build_id_of(&alt);
    std::fs::remove_file(bin.join("hello.c")).unwrap();

    // Only bin/ is given: the supplementary file is found through the link.
    let (code, summary, stderr) = upload(&server.url, &[], &[&bin]);
    assert_eq!(code, 0, "{stderr}\n{summary}");
    let ids: Vec<&str> = summary["files"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| f["build_id"].as_str().unwrap())
        .collect();
    assert!(ids.contains(&alt_id.as_str()), "{summary}");
    let cache = tempfile::tempdir().unwrap();
    let got = server.debuginfod_fetch(cache.path(), &["debuginfo", &alt_id]);
    assert_eq!(got, std::fs::read(&alt).unwrap());
    // The programs' own debuginfo is there too.
    for exe in [&a, &b] {
        let id = build_id_of(exe);
        assert_eq!(
            server.get(&format!("/buildid/{id}/debuginfo")).status(),
            200
        );
    }
}
