//! The frame-pointer gate flags an -O2 build without frame pointers and
//! passes the same build with them.

use symtrace_testkit::*;

use crate::{compile, tools, upload};

const PROGRAM: &str = "#include <stdio.h>\n\
__attribute__((noinline)) static long mix(long a, long b) { return a * 31 + b; }\n\
__attribute__((noinline)) static long fold(const long *v, int n) { long h = 7; for (int i = 0; i < n; i++) h = mix(h, v[i]); return h; }\n\
__attribute__((noinline)) static void fill(long *v, int n) { for (int i = 0; i < n; i++) v[i] = i * i; }\n\
int main(int argc, char **argv) { long v[64]; fill(v, 64); printf(\"%ld\\n\", fold(v, 64 - argc)); return 0; }\n";

#[test]
fn frame_pointer_gate() {
    if !tools(&["gcc"]) {
        return;
    }
    let server = Server::start(&Backend::local(), &[]);
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("p.c"), PROGRAM).unwrap();
    let without = compile(
        dir.path(),
        "gcc",
        &["-O2", "-g", "-Wl,--build-id", "p.c"],
        "without",
    );
    let with = compile(
        dir.path(),
        "gcc",
        &[
            "-O2",
            "-g",
            "-fno-omit-frame-pointer",
            "-Wl,--build-id",
            "p.c",
        ],
        "with",
    );

    let (code, summary, stderr) = upload(&server.url, &["--require-frame-pointers"], &[&without]);
    assert_eq!(code, 1, "{stderr}");
    assert!(stderr.contains("frame pointers FAILED"), "{stderr}");
    let fp = &summary["files"][0]["frame_pointers"];
    assert!(fp["share_without_percent"].as_f64().unwrap() > 5.0, "{fp}");
    assert!(
        fp["without"].as_u64().unwrap() >= 2,
        "main and fold call others without a frame: {fp}"
    );
    assert_eq!(summary["files"][0]["frame_pointer_gate_failed"], true);

    let (code, summary, stderr) = upload(&server.url, &["--require-frame-pointers"], &[&with]);
    assert_eq!(code, 0, "{stderr}");
    assert_eq!(
        summary["files"][0]["frame_pointers"]["without"], 0,
        "{summary}"
    );
    // gcc leaves `mix` and `fill` frameless even so: reported, not counted,
    // because the agent recovers their callers from .eh_frame …
    let fp = &summary["files"][0]["frame_pointers"];
    assert!(fp["leaves_without"].as_u64().unwrap() >= 2, "{fp}");
    assert_eq!(fp["eh_frame"], true, "{fp}");
    assert!(
        stderr.contains("recovers their callers from .eh_frame"),
        "{stderr}"
    );
    // … which a file without .eh_frame does not allow: the gate fails.
    if !tools(&["objcopy"]) {
        return;
    }
    let stripped = dir.path().join("with-no-eh-frame");
    run(std::process::Command::new("objcopy")
        .args([
            "--remove-section=.eh_frame",
            "--remove-section=.eh_frame_hdr",
        ])
        .arg(&with)
        .arg(&stripped));
    let (code, summary, stderr) = upload(&server.url, &["--require-frame-pointers"], &[&stripped]);
    assert_eq!(code, 1, "{stderr}");
    assert!(stderr.contains("the file has no .eh_frame"), "{stderr}");
    assert_eq!(summary["files"][0]["frame_pointers"]["eh_frame"], false);
}
