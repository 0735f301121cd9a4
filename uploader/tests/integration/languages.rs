//! C (gcc and clang, plain and with compressed DWARF), C++, Rust and a shared
//! library: after `symtrace-upload --strip`, the stripped binaries are
//! debuggable through the server alone.

use std::path::Path;
use std::process::Command;

use symtrace_testkit::*;

use crate::{compile, has_section, tools, upload};

const LIB_C: &str = "int scale(int x) { int y = x * 3; return y + 1; }\n";
const USE_LIB_C: &str = "#include <stdio.h>\nint scale(int);\nint main(void) { printf(\"%d\\n\", scale(14)); return 0; }\n";
const CPP: &str = "#include <cstdio>\ntemplate <typename T> struct Box { T v; T twice() const { return v + v; } };\nstatic int work(int n) { Box<int> b{n}; return b.twice(); }\nint main() { std::printf(\"%d\\n\", work(21)); return 0; }\n";
const RUST: &str = "#[inline(never)]\nfn crunch(n: u64) -> u64 {\n    let mut acc = 0;\n    for i in 0..n {\n        acc += i * 3;\n    }\n    acc\n}\n\nfn main() {\n    println!(\"{}\", crunch(std::env::args().count() as u64 + 10));\n}\n";

fn assert_debuggable(
    server: &Server,
    exe: &Path,
    breakpoint: &str,
    needles: &[&str],
    env: &[(&str, &str)],
) {
    assert!(
        !has_section(exe, ".debug_info"),
        "{} still has DWARF after --strip",
        exe.display()
    );
    assert!(
        has_section(exe, ".gnu_debuglink"),
        "{} has no .gnu_debuglink",
        exe.display()
    );
    let commands = [
        format!("break {breakpoint}"),
        "run".into(),
        "bt".into(),
        "list".into(),
        "info source".into(),
    ];
    let commands: Vec<&str> = commands.iter().map(String::as_str).collect();
    let text = gdb_batch(exe, &commands, Some(&server.url), env);
    // "Located in <cache>/<id>/source##…": the source came from the server.
    for n in needles.iter().chain(&["Located in", "source##"]) {
        assert!(
            text.contains(n),
            "gdb on {} lacks {n:?}:\n{text}",
            exe.display()
        );
    }
}

#[test]
fn c_cpp_rust_and_shared_libraries_are_debuggable_after_strip() {
    if !tools(&[
        "gcc",
        "g++",
        "rustc",
        "objcopy",
        "readelf",
        "gdb",
        "debuginfod-find",
    ]) {
        return;
    }
    let server = Server::start(&Backend::local(), &[]);
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path().join("src");
    std::fs::create_dir_all(&src).unwrap();
    std::fs::write(src.join("hello.c"), HELLO_C).unwrap();
    std::fs::write(src.join("util.h"), UTIL_H).unwrap();
    std::fs::write(src.join("lib.c"), LIB_C).unwrap();
    std::fs::write(src.join("uselib.c"), USE_LIB_C).unwrap();
    std::fs::write(src.join("prog.cpp"), CPP).unwrap();
    std::fs::write(src.join("prog.rs"), RUST).unwrap();
    let bin = dir.path().join("bin");
    std::fs::create_dir_all(&bin).unwrap();
    let out = |name: &str| format!("../bin/{name}");
    compile(
        &src,
        "gcc",
        &["-g", "-O0", "-Wl,--build-id", "hello.c"],
        &out("hello"),
    );
    compile(
        &src,
        "gcc",
        &["-g", "-O0", "-gz=zlib", "-Wl,--build-id", "-DZ", "hello.c"],
        &out("hello-zlib"),
    );
    // -O1: other code, so another build-ID than `hello`.
    compile(
        &src,
        "gcc",
        &["-g", "-O1", "-Wl,--build-id", "hello.c"],
        &out("hello-zstd"),
    );
    run(Command::new("objcopy")
        .arg("--compress-debug-sections=zstd")
        .arg(bin.join("hello-zstd")));
    compile(
        &src,
        "g++",
        &["-g", "-O0", "-Wl,--build-id", "prog.cpp"],
        &out("prog-cpp"),
    );
    compile(
        &src,
        "gcc",
        &["-g", "-O0", "-shared", "-fPIC", "-Wl,--build-id", "lib.c"],
        &out("libscale.so"),
    );
    compile(
        &src,
        "gcc",
        &[
            "-g",
            "-O0",
            "-Wl,--build-id",
            "uselib.c",
            "-L../bin",
            "-lscale",
        ],
        &out("uselib"),
    );
    run(Command::new("rustc")
        .current_dir(&src)
        .args([
            "-g",
            "-C",
            "link-arg=-Wl,--build-id",
            "-C",
            "force-frame-pointers=yes",
            "prog.rs",
            "-o",
        ])
        .arg(bin.join("prog-rs")));
    let clang = have("clang");
    if clang {
        compile(
            &src,
            "clang",
            &["-g", "-O0", "-Wl,--build-id", "-DCLANG", "hello.c"],
            &out("hello-clang"),
        );
    }

    let (code, summary, stderr) = upload(&server.url, &["--strip"], &[&bin]);
    assert_eq!(code, 0, "{stderr}\n{summary}");
    let files = summary["files"].as_array().unwrap();
    assert_eq!(files.len(), 7 + usize::from(clang), "{summary}");
    for f in files {
        let kinds: Vec<&str> = f["items"]
            .as_array()
            .unwrap()
            .iter()
            .map(|i| i["kind"].as_str().unwrap())
            .collect();
        assert!(
            kinds.contains(&"debuginfo") && kinds.contains(&"executable"),
            "{f}"
        );
    }
    // Sources read from DWARF, zstd-compressed DWARF included.
    let zstd = files
        .iter()
        .find(|f| f["path"].as_str().unwrap().ends_with("hello-zstd"))
        .unwrap();
    assert!(
        zstd["items"].as_array().unwrap().iter().any(|i| i["kind"] == "source" && i["path"].as_str().unwrap().ends_with("/src/hello.c")),
        "{zstd}"
    );

    // The source tree goes away: everything must come from the server.
    std::fs::rename(&src, dir.path().join("moved-away")).unwrap();
    let hello_needles = ["Breakpoint 1, add (a=1, b=41) at", "util.h:1", "hello.c:6"];
    assert_debuggable(&server, &bin.join("hello"), "add", &hello_needles, &[]);
    assert_debuggable(&server, &bin.join("hello-zlib"), "add", &hello_needles, &[]);
    if clang {
        assert_debuggable(
            &server,
            &bin.join("hello-clang"),
            "add",
            &["Breakpoint 1, add (a=1, b=41) at", "util.h:1"],
            &[],
        );
    }
    assert_debuggable(
        &server,
        &bin.join("prog-cpp"),
        "Box<int>::twice",
        &[
            "Box<int>::twice",
            "prog.cpp:2",
            "work (n=21) at",
            "prog.cpp:3",
        ],
        &[],
    );
    let libdir = bin.display().to_string();
    assert_debuggable(
        &server,
        &bin.join("uselib"),
        "scale",
        &["scale (x=14) at", "lib.c:1", "uselib.c:3"],
        &[("LD_LIBRARY_PATH", &libdir)],
    );
    assert_debuggable(
        &server,
        &bin.join("prog-rs"),
        "prog::crunch",
        &["prog::crunch", "prog.rs:", "prog::main"],
        &[],
    );

    // debuginfod-find sees the stripped executable and its debuginfo.
    let cache = tempfile::tempdir().unwrap();
    let id = build_id_of(&bin.join("hello-zstd"));
    let debuginfo = server.debuginfod_fetch(cache.path(), &["debuginfo", &id]);
    let fetched = cache.path().join("fetched.debug");
    std::fs::write(&fetched, &debuginfo).unwrap();
    assert!(
        has_section(&fetched, ".debug_info"),
        "the served debuginfo has no DWARF"
    );
    let exe = server.debuginfod_fetch(cache.path(), &["executable", &id]);
    assert_eq!(exe, std::fs::read(bin.join("hello-zstd")).unwrap());
}
