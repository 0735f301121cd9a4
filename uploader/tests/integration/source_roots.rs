//! Sources are published only from under the source roots (issue #19): a
//! `#line` directive naming a secret file, or a symlink out of the tree,
//! publishes nothing; the summary says what was skipped and why.

use std::process::Command;

use symtrace_testkit::*;

use crate::{compile, tools, upload, upload_in};

#[test]
fn a_line_directive_naming_a_secret_publishes_nothing() {
    if !tools(&["gcc", "debuginfod-find"]) {
        return;
    }
    let server = Server::start(&Backend::local(), &[]);
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path().join("src");
    let outside = dir.path().join("home");
    std::fs::create_dir_all(&src).unwrap();
    std::fs::create_dir_all(&outside).unwrap();
    let secret = outside.join("credentials");
    std::fs::write(&secret, "aws_secret_access_key = hunter2\n").unwrap();
    let linked = outside.join("linked-secret.h");
    std::fs::write(&linked, "token = hunter3\n").unwrap();
    std::os::unix::fs::symlink(&linked, src.join("config.h")).unwrap();
    std::fs::write(
        src.join("main.c"),
        format!(
            "#line 1 \"{}\"\nint from_secret(void) {{ return 1; }}\n\
             #line 1 \"{}\"\nint from_link(void) {{ return 2; }}\n\
             #line 10 \"{}\"\nint main(void) {{ return from_secret() + from_link(); }}\n",
            secret.display(),
            src.join("config.h").display(),
            src.join("main.c").display(),
        ),
    )
    .unwrap();
    // A prebuilt object of a "dependency" built in the home directory: its
    // compilation directory is there, and its DWARF names the secret too.
    std::fs::write(
        outside.join("dep.c"),
        format!(
            "#line 1 \"{}\"\nint dep(void) {{ return 3; }}\n",
            secret.display()
        ),
    )
    .unwrap();
    run(Command::new("gcc")
        .current_dir(&outside)
        .args(["-g", "-O0", "-c", "dep.c", "-o", "dep.o"]));
    let dep = outside.join("dep.o");
    let bin = compile(
        &src,
        "gcc",
        &["-g", "-O0", "main.c", dep.to_str().unwrap()],
        "prog",
    );

    // The job runs in its checkout (src): the dependency's compilation
    // directory is outside it, so it is no root.
    let (code, summary, stderr) = upload_in(&src, &server.url, &[], &[&bin]);
    assert_eq!(code, 0, "{stderr}");
    let file = &summary["files"][0];
    let skipped: Vec<(String, String)> = file["skipped_sources"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| {
            (
                s["path"].as_str().unwrap().to_owned(),
                s["reason"].as_str().unwrap().to_owned(),
            )
        })
        .collect();
    let reason_of = |p: &std::path::Path| {
        skipped
            .iter()
            .find(|(path, _)| path == p.to_str().unwrap())
            .map(|(_, r)| r.clone())
            .unwrap_or_else(|| panic!("{} not skipped: {summary}", p.display()))
    };
    assert!(reason_of(&secret).contains("outside the source roots"));
    assert!(reason_of(&src.join("config.h")).contains("resolves to"));
    assert!(reason_of(&outside.join("dep.c")).contains("outside the source roots"));
    assert!(stderr.contains("3 skipped"), "{stderr}");
    let uploaded: Vec<&str> = file["items"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|i| i["kind"] == "source")
        .map(|i| i["path"].as_str().unwrap())
        .collect();
    assert!(
        uploaded.iter().any(|n| n.ends_with("/src/main.c")),
        "{summary}"
    );
    assert!(!uploaded
        .iter()
        .any(|n| n.contains("credentials") || n.contains("config.h")));

    // debuginfod clients cannot fetch it.
    let id = build_id_of(&bin);
    let cache = tempfile::tempdir().unwrap();
    let out = Command::new("debuginfod-find")
        .args(["source", &id, secret.to_str().unwrap()])
        .env("DEBUGINFOD_URLS", &server.url)
        .env("DEBUGINFOD_CACHE_PATH", cache.path())
        .output()
        .unwrap();
    assert!(!out.status.success(), "the secret was served");
    let resp = client()
        .get(format!(
            "{}/buildid/{id}/source{}",
            server.url,
            secret.display()
        ))
        .send()
        .unwrap();
    assert_eq!(resp.status(), 404);

    // The same file under a --source-root is published: the bound is the
    // roots, not the file.
    let (code, summary, stderr) = upload(
        &server.url,
        &["--source-root", outside.to_str().unwrap()],
        &[&bin],
    );
    assert_eq!(code, 0, "{stderr}");
    let skipped = summary["files"][0]["skipped_sources"]
        .as_array()
        .unwrap()
        .len();
    assert_eq!(skipped, 0, "{summary}");
}
