//! gdb, the debugger users actually run, against the stripped binary with the
//! source tree gone: separate debug info and sources both come from us.

use std::process::Command;

use crate::support::*;

#[test]
fn gdb_breaks_backtraces_and_lists_sources_from_the_server() {
    if !["gcc", "objcopy", "strip", "readelf", "gdb"]
        .iter()
        .all(|t| have(t))
    {
        return;
    }
    for backend in Backend::all() {
        let server = Server::start(&backend, &[]);
        let fx = Fixture::hello("src", "hello.c", &["-g"]);
        fx.publish(&server);
        // The program runs from elsewhere, without its .debug beside it...
        let run_dir = fx.dir.path().join("run");
        std::fs::create_dir_all(&run_dir).unwrap();
        let exe = run_dir.join("hello");
        std::fs::copy(&fx.stripped, &exe).unwrap();
        // ...and the source tree is gone.
        std::fs::rename(&fx.src, fx.dir.path().join("moved-away")).unwrap();
        let cache = tempfile::tempdir().unwrap();
        let out = Command::new("gdb")
            .args(["-q", "-nx", "-batch", "-iex", "set debuginfod enabled on"])
            .args([
                "-ex",
                "break add",
                "-ex",
                "run",
                "-ex",
                "bt",
                "-ex",
                "list main",
                "-ex",
                "info source",
            ])
            .arg(&exe)
            .env("DEBUGINFOD_URLS", &server.url)
            .env("DEBUGINFOD_CACHE_PATH", cache.path())
            .env("HOME", cache.path())
            .output()
            .unwrap();
        let text = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        let text = text.replace('\r', "\n");
        for needle in [
            "Breakpoint 1, add (a=1, b=41) at",
            "util.h:1",
            "main (argc=1",
            "hello.c:6",
            "int n = add(argc, 41);",
            "printf(\"hello, debuginfod: %d\\n\", n);",
            "Located in",
        ] {
            assert!(
                text.contains(needle),
                "[{}] gdb output lacks {needle:?}:\n{text}",
                backend.name
            );
        }
        assert!(
            text.contains(&cache.path().display().to_string()),
            "source not from the debuginfod cache:\n{text}"
        );
    }
}
