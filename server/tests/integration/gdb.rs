//! gdb, the debugger users actually run, against the stripped binary with the
//! source tree gone: separate debug info and sources both come from us.

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
        let commands = ["break add", "run", "bt", "list main", "info source"];
        let text = gdb_batch(&exe, &commands, Some(&server.url), &[]);
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
        // "Located in <cache>/<id>/source##tmp##…##hello.c": listed from the server.
        assert!(
            text.contains("source##"),
            "source not from the debuginfod cache:\n{text}"
        );
    }
}
