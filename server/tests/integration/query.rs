//! The query API end to end: a C program's raw addresses sent by PyPI's
//! OTLP client become named flamegraphs once its debug info is uploaded
//! (before or after the profile), with inline frames, kernel frames,
//! label selectors, spans, diffs; pprof checked by npm's pprof-format,
//! folded by inferno-flamegraph, the UI driven in headless Chromium.

use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::{json, Value};

use crate::support::*;

const DEMO_C: &str = r#"
#include <stdio.h>
#include <stdlib.h>

static inline __attribute__((always_inline)) long gamma_inline(long x)
{
  for (int i = 0; i < 7; i++)
    x = x * 31 + (x >> 3) + VARIANT;
  return x;
}

__attribute__((noinline)) long alpha_work(long n)
{
  long s = 0;
  for (long i = 0; i < n; i++)
    s += i * i;
  return s;
}

__attribute__((noinline)) long beta_work(long n)
{
  long s = 1;
  for (long i = 0; i < n; i++)
    s = gamma_inline(s + i);
  return s;
}

int main(int argc, char **argv)
{
  long n = argc > 1 ? atol(argv[1]) : 1000;
  printf("%ld %ld\n", alpha_work(n), beta_work(n));
  return 0;
}
"#;

/// The demo program built with DWARF, split, plus addresses to sample.
pub struct Demo {
    _dir: tempfile::TempDir,
    /// The GNU build-ID (empty when built without one).
    pub build_id: String,
    /// The program as linked (DWARF and symbols).
    pub exe: PathBuf,
    pub debug: PathBuf,
    pub stripped: PathBuf,
    pub alpha: u64,
    pub main: u64,
    /// An address of beta_work whose innermost frame is gamma_inline
    /// (found by llvm-symbolizer, not by us).
    pub inlined: u64,
}

fn symbol(nm: &str, name: &str) -> (u64, u64) {
    nm.lines()
        .find_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            (f.len() == 4 && f[3] == name).then(|| {
                (
                    u64::from_str_radix(f[0], 16).unwrap(),
                    u64::from_str_radix(f[1], 16).unwrap(),
                )
            })
        })
        .unwrap_or_else(|| panic!("{name} not in nm output"))
}

impl Demo {
    pub fn build(variant: u32) -> Self {
        Self::build_linked(variant, "-Wl,--build-id")
    }

    /// Linked with `-Wl,--build-id=none`: a file known only by its
    /// htlhash.
    pub fn without_build_id(variant: u32) -> Self {
        Self::build_linked(variant, "-Wl,--build-id=none")
    }

    fn build_linked(variant: u32, link: &str) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let src = dir.path().join("demo.c");
        std::fs::write(&src, DEMO_C).unwrap();
        let exe = dir.path().join("demo");
        run(Command::new("gcc")
            .current_dir(dir.path())
            .args(["-O2", "-g", "-fno-omit-frame-pointer", link])
            .arg(format!("-DVARIANT={variant}"))
            .args(["-o", "demo", "demo.c"]));
        let debug = dir.path().join("demo.debug");
        let stripped = dir.path().join("demo.stripped");
        run(Command::new("objcopy")
            .arg("--only-keep-debug")
            .arg(&exe)
            .arg(&debug));
        run(Command::new("strip")
            .args(["--strip-debug", "--strip-unneeded", "-o"])
            .arg(&stripped)
            .arg(&exe));
        let nm = run(Command::new("nm").args(["-S", "--defined-only"]).arg(&exe));
        let nm = String::from_utf8_lossy(&nm.stdout).into_owned();
        let (alpha, _) = symbol(&nm, "alpha_work");
        let (main, _) = symbol(&nm, "main");
        let (beta, beta_size) = symbol(&nm, "beta_work");
        // llvm-symbolizer names each address of beta_work; take the first
        // whose innermost frame is the inlined function.
        let input: String = (beta..beta + beta_size)
            .map(|a| format!("{a:#x}\n"))
            .collect();
        let out = Command::new("llvm-symbolizer-19")
            .args(["--output-style=JSON", "--inlines", "--obj"])
            .arg(&exe)
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .spawn()
            .and_then(|mut child| {
                use std::io::Write;
                child.stdin.take().unwrap().write_all(input.as_bytes())?;
                child.wait_with_output()
            })
            .unwrap();
        let inlined = String::from_utf8_lossy(&out.stdout)
            .lines()
            .filter_map(|l| serde_json::from_str::<Value>(l).ok())
            .find_map(|v| {
                let frames = v["Symbol"].as_array()?;
                (frames.len() == 2
                    && frames[0]["FunctionName"] == "gamma_inline"
                    && frames[1]["FunctionName"] == "beta_work")
                    .then(|| {
                        u64::from_str_radix(v["Address"].as_str()?.trim_start_matches("0x"), 16)
                            .ok()
                    })
                    .flatten()
            })
            .expect("an address inside the inlined gamma_inline");
        Self {
            build_id: if link.ends_with("=none") {
                String::new()
            } else {
                build_id_of(&exe)
            },
            exe,
            debug,
            stripped,
            alpha: alpha + 4,
            main: main + 4,
            inlined,
            _dir: dir,
        }
    }

    pub fn publish(&self, server: &Server) {
        server.upload(&self.build_id, "debuginfo", &self.debug);
        server.upload(&self.build_id, "executable", &self.stripped);
    }
}

pub const TRACE: &str = "5b8efff798038103d269b633813fc60c";
pub const SPAN_A: &str = "eee19b7ec3c1b174";
pub const SPAN_B: &str = "eee19b7ec3c1b175";
const PERIOD: i64 = 52_631_578;

/// Sends: main→alpha_work ×60 (span A, region=eu), main→beta_work→
/// gamma_inline ×30 (span B, region=us), main→alpha_work→schedule
/// (kernel) ×10 (no link).
pub fn send_demo(python: &Path, server: &Server, demo: &Demo, service: &str, tenant: &str) {
    let spec = json!({
        "service": service,
        "tenant": tenant,
        "period": PERIOD,
        "binary": {"path": "/usr/local/bin/demo", "build_id": demo.build_id},
        "stacks": [
            {"frames": [demo.alpha, demo.main], "count": 60, "trace_id": TRACE, "span_id": SPAN_A,
             "labels": {"region": "eu"}},
            {"frames": [demo.inlined, demo.main], "count": 30, "trace_id": TRACE, "span_id": SPAN_B,
             "labels": {"region": "us"}},
            {"frames": ["schedule", demo.alpha, demo.main], "count": 10},
        ],
    });
    let text = crate::memory::send(python, server, spec);
    assert!(text.contains("sent 100 events"), "{text}");
}

pub fn get(server: &Server, tenant: &str, path: &str) -> (u16, Vec<u8>) {
    let resp = client()
        .get(format!("{}{path}", server.url))
        .header("X-Scope-OrgID", tenant)
        .send()
        .unwrap();
    let status = resp.status().as_u16();
    (status, resp.bytes().unwrap().to_vec())
}

pub fn get_json(server: &Server, tenant: &str, path: &str) -> Value {
    let (status, body) = get(server, tenant, path);
    let v: Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(status, 200, "{path}: {v}");
    v
}

/// Root-first paths of names in a JSON tree with their totals.
fn paths(node: &Value, prefix: &str, out: &mut Vec<(String, i64, String)>) {
    for c in node["children"].as_array().unwrap() {
        let path = if prefix.is_empty() {
            c["name"].as_str().unwrap().to_owned()
        } else {
            format!("{prefix};{}", c["name"].as_str().unwrap())
        };
        out.push((
            path.clone(),
            c["total"].as_i64().unwrap(),
            c["kind"].as_str().unwrap().to_owned(),
        ));
        paths(c, &path, out);
    }
}

fn tree_paths(fg: &Value) -> Vec<(String, i64, String)> {
    let mut out = Vec::new();
    paths(&fg["tree"], "", &mut out);
    out
}

pub fn assert_named(fg: &Value, what: &str) {
    let p = tree_paths(fg);
    let find = |path: &str| {
        p.iter()
            .find(|(q, _, _)| q == path)
            .unwrap_or_else(|| panic!("{what}: no {path} in {p:?}"))
    };
    assert_eq!(fg["total"], 100, "{what}");
    assert_eq!(find("main").1, 100, "{what}");
    assert_eq!(find("main;alpha_work").1, 70, "{what}");
    assert_eq!(find("main;alpha_work;schedule").2, "kernel", "{what}");
    assert_eq!(find("main;beta_work").1, 30, "{what}");
    let inl = find("main;beta_work;gamma_inline");
    assert_eq!((inl.1, inl.2.as_str()), (30, "inlined"), "{what}");
    // file:line from DWARF on the functions.
    let alpha = &fg["tree"]["children"][0]["children"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["name"] == "alpha_work")
        .cloned()
        .unwrap();
    assert!(
        alpha["file"].as_str().unwrap().ends_with("demo.c"),
        "{alpha}"
    );
    assert!(alpha["line"].as_u64().unwrap() > 0, "{alpha}");
}

pub fn flamegraph(server: &Server, tenant: &str, service: &str, extra: &str) -> Value {
    get_json(
        server,
        tenant,
        &format!("/api/v1/flamegraph?service={service}&from=now-1h{extra}"),
    )
}

#[test]
fn flamegraphs_name_frames_whenever_debug_info_arrives() {
    let Some(python) = python() else { return };
    if !have("llvm-symbolizer-19") || !have("gcc") {
        return;
    }
    for backend in Backend::all() {
        let server = Server::start(&backend, &[]);
        let early = Demo::build(1);
        let late = Demo::build(2);
        assert_ne!(early.build_id, late.build_id);

        // Debug info first, then the profile.
        early.publish(&server);
        send_demo(&python, &server, &early, "early-svc", "q");
        assert_named(
            &flamegraph(&server, "q", "early-svc", ""),
            "uploaded before",
        );

        // Profile first: frames show as module+0xaddress with the build-ID…
        send_demo(&python, &server, &late, "late-svc", "q");
        let fg = flamegraph(&server, "q", "late-svc", "");
        assert_eq!(fg["total"], 100);
        let names: Vec<String> = tree_paths(&fg).into_iter().map(|p| p.0).collect();
        let want = format!("demo+{:#x}", late.main);
        assert!(names.contains(&want), "{want} not in {names:?}");
        assert!(
            names
                .iter()
                .any(|n| n.ends_with(&format!("demo+{:#x}", late.inlined))),
            "{names:?}"
        );
        assert_eq!(fg["build_ids"][0]["status"], "unknown_build_id", "{fg}");
        assert_eq!(
            fg["tree"]["children"][0]["build_id"],
            late.build_id.as_str()
        );
        // …and the same query names them once the debug info is uploaded.
        late.publish(&server);
        let fg = flamegraph(&server, "q", "late-svc", "");
        assert_named(&fg, "uploaded after");
        assert_eq!(fg["build_ids"][0]["status"], "ok", "{fg}");
        assert_eq!(fg["functions"][0]["name"], "alpha_work", "{fg}");
        assert_eq!(fg["functions"][0]["self"], 60, "{fg}");

        // Folded stacks, exactly.
        let (status, folded) = get(
            &server,
            "q",
            "/api/v1/flamegraph?service=late-svc&format=folded",
        );
        assert_eq!(status, 200);
        let folded = String::from_utf8(folded).unwrap();
        let mut lines: Vec<&str> = folded.lines().collect();
        lines.sort_unstable();
        assert_eq!(
            lines,
            [
                "main;alpha_work 60",
                "main;alpha_work;schedule 10",
                "main;beta_work;gamma_inline 30"
            ],
            "{folded}"
        );

        // Label selectors on sample attributes.
        let eu = flamegraph(&server, "q", "late-svc", "&selector={region=\"eu\"}");
        assert_eq!(eu["total"], 60, "{eu}");
        let not_us = flamegraph(&server, "q", "late-svc", "&selector={region!~\"u.*\"}");
        assert_eq!(not_us["total"], 70, "absent label is \"\": {not_us}");
        let values = get_json(
            &server,
            "q",
            "/api/v1/labels/region/values?service=late-svc",
        );
        assert_eq!(values["values"], json!(["eu", "us"]), "{values}");
        let services = get_json(&server, "q", "/api/v1/services");
        let names: Vec<&str> = services["services"]
            .as_array()
            .unwrap()
            .iter()
            .map(|s| s["name"].as_str().unwrap())
            .collect();
        assert_eq!(names, ["early-svc", "late-svc"], "{services}");
        let types = get_json(&server, "q", "/api/v1/profile-types?service=late-svc");
        assert_eq!(
            types["profile_types"],
            json!(["samples:count:cpu:nanoseconds"])
        );
        let labels = get_json(&server, "q", "/api/v1/labels?service=late-svc");
        assert!(
            labels["labels"]
                .as_array()
                .unwrap()
                .iter()
                .any(|l| l["name"] == "region" && l["values"] == 2),
            "{labels}"
        );

        // Spans: the trace view and each span's own flamegraph.
        let trace = get_json(&server, "q", &format!("/api/v1/traces/{TRACE}"));
        let spans = trace["spans"].as_array().unwrap();
        // Two services sent the same trace: 2 spans × 2 services.
        assert_eq!(spans.len(), 4, "{trace}");
        let a = spans
            .iter()
            .find(|s| s["span_id"] == SPAN_A && s["service"] == "late-svc")
            .unwrap();
        assert_eq!(a["samples"], 60);
        assert_eq!(a["cpu_ns"], 60 * PERIOD);
        let span_fg = get_json(&server, "q", a["flamegraph"].as_str().unwrap());
        // Both services' span A: 2 × 60, alpha_work only.
        assert_eq!(span_fg["total"], 120, "{span_fg}");
        let names: Vec<String> = tree_paths(&span_fg).into_iter().map(|p| p.0).collect();
        assert!(names.contains(&"main;alpha_work".to_owned()), "{names:?}");
        assert!(!names.iter().any(|n| n.contains("beta_work")), "{names:?}");
        let span_b = get_json(
            &server,
            "q",
            &format!("/api/v1/flamegraph?service=late-svc&trace_id={TRACE}&span_id={SPAN_B}"),
        );
        assert_eq!(span_b["total"], 30, "{span_b}");

        // Diff: eu (baseline) vs us (comparison).
        let diff = get_json(
            &server,
            "q",
            "/api/v1/diff?service=late-svc&baseline_selector={region=\"eu\"}&comparison_selector={region=\"us\"}",
        );
        assert_eq!(diff["baseline"]["total"], 60, "{diff}");
        assert_eq!(diff["comparison"]["total"], 30, "{diff}");
        let main = &diff["tree"]["children"][0];
        assert_eq!(
            (main["baseline"].as_i64(), main["comparison"].as_i64()),
            (Some(60), Some(30))
        );
        let (status, svg) = get(
            &server,
            "q",
            "/api/v1/diff?service=late-svc&format=svg&baseline_selector={region=\"eu\"}",
        );
        let svg = String::from_utf8(svg).unwrap();
        assert_eq!(status, 200);
        assert!(
            svg.contains("<svg") && svg.contains("beta_work"),
            "{}",
            &svg[..200]
        );

        // Flamebearer: one level per depth, numTicks = total.
        let fb = flamegraph(&server, "q", "late-svc", "&format=flamebearer");
        assert_eq!(fb["flamebearer"]["numTicks"], 100, "{fb}");
        let fb_names = fb["flamebearer"]["names"].as_array().unwrap();
        let levels = fb["flamebearer"]["levels"].as_array().unwrap();
        assert_eq!(
            levels.len(),
            4,
            "total, main, alpha/beta, schedule/gamma: {fb}"
        );
        let level2: Vec<(&str, i64)> = levels[2]
            .as_array()
            .unwrap()
            .chunks(4)
            .map(|c| {
                (
                    fb_names[c[3].as_u64().unwrap() as usize].as_str().unwrap(),
                    c[1].as_i64().unwrap(),
                )
            })
            .collect();
        assert_eq!(level2, [("alpha_work", 70), ("beta_work", 30)], "{fb}");
    }
}

#[test]
fn exports_open_in_independent_tools() {
    let Some(python) = python() else { return };
    let Some(modules) = node_modules() else {
        return;
    };
    if !have("inferno-flamegraph") || !have("llvm-symbolizer-19") {
        return;
    }
    let server = Server::start(&Backend::local(), &[]);
    let demo = Demo::build(3);
    demo.publish(&server);
    send_demo(&python, &server, &demo, "export-svc", "x");
    let dir = tempfile::tempdir().unwrap();

    // pprof, read by npm's pprof-format.
    let (status, pprof) = get(
        &server,
        "x",
        "/api/v1/flamegraph?service=export-svc&format=pprof",
    );
    assert_eq!(status, 200);
    let file = dir.path().join("profile.pb.gz");
    std::fs::write(&file, pprof).unwrap();
    let out = run(node_script(&modules, "check_pprof.cjs").arg(&file));
    let p: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(
        p["sample_types"],
        json!(["samples/count", "cpu/nanoseconds"]),
        "{p}"
    );
    assert_eq!(p["period"], PERIOD);
    assert_eq!(p["mappings"][0]["build_id"], demo.build_id.as_str(), "{p}");
    let mut stacks: Vec<(String, i64, i64)> = p["stacks"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| {
            let names: Vec<&str> = s["frames"]
                .as_array()
                .unwrap()
                .iter()
                .map(|f| f["name"].as_str().unwrap())
                .collect();
            (
                names.join(";"),
                s["values"][0].as_i64().unwrap(),
                s["values"][1].as_i64().unwrap(),
            )
        })
        .collect();
    stacks.sort();
    assert_eq!(
        stacks,
        [
            ("alpha_work;main".to_owned(), 60, 60 * PERIOD),
            ("gamma_inline;beta_work;main".to_owned(), 30, 30 * PERIOD),
            ("schedule;alpha_work;main".to_owned(), 10, 10 * PERIOD),
        ],
        "{p}"
    );
    let alpha = p["stacks"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|s| s["frames"].as_array().unwrap())
        .find(|f| f["name"] == "alpha_work")
        .unwrap();
    assert!(
        alpha["file"].as_str().unwrap().ends_with("demo.c"),
        "{alpha}"
    );

    // Folded, rendered by inferno's own command.
    let (_, folded) = get(
        &server,
        "x",
        "/api/v1/flamegraph?service=export-svc&format=folded",
    );
    let folded_file = dir.path().join("stacks.folded");
    std::fs::write(&folded_file, folded).unwrap();
    let out = run(Command::new("inferno-flamegraph").arg(&folded_file));
    let svg = String::from_utf8(out.stdout).unwrap();
    for name in ["alpha_work", "gamma_inline", "schedule"] {
        assert!(svg.contains(name), "inferno's SVG lacks {name}");
    }

    // Our SVG: well-formed XML naming the functions (opened in Chromium by
    // the UI test).
    let (status, svg) = get(
        &server,
        "x",
        "/api/v1/flamegraph?service=export-svc&format=svg",
    );
    assert_eq!(status, 200);
    let svg = String::from_utf8(svg).unwrap();
    assert!(svg.starts_with("<?xml") && svg.trim_end().ends_with("</svg>"));
    assert!(svg.contains("alpha_work") && svg.contains("gamma_inline"));
}

#[test]
fn web_ui_in_headless_chromium() {
    let Some(python) = python() else { return };
    let Some(modules) = node_modules() else {
        return;
    };
    if !have("chromium") || !have("llvm-symbolizer-19") {
        return;
    }
    let server = Server::start(&Backend::local(), &[]);
    let demo = Demo::build(4);
    demo.publish(&server);
    send_demo(&python, &server, &demo, "ui-svc", "default");
    // Span A also waited: three 40 ms reads of a pipe.
    let waits = json!({
        "service": "ui-svc",
        "type": "off_cpu",
        "binary": {"path": "/usr/local/bin/demo", "build_id": demo.build_id},
        "stacks": [{"frames": ["schedule", "pipe_read", demo.alpha, demo.main], "count": 3,
                    "value": 40_000_000, "trace_id": TRACE, "span_id": SPAN_A}],
    });
    let spec = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(spec.path(), waits.to_string()).unwrap();
    run(Command::new(&python)
        .arg(otlp_client_script())
        .arg("stacks")
        .arg("--spec")
        .arg(spec.path())
        .args(["--grpc", &server.grpc_addr, "--http", &server.url]));
    // Diff works on the off-CPU type: span B (no waits) against span A.
    let diff = get_json(
        &server,
        "default",
        &format!(
            "/api/v1/diff?service=ui-svc&type=off_cpu:nanoseconds::&trace_id={TRACE}\
             &baseline_span_id={SPAN_B}&comparison_span_id={SPAN_A}"
        ),
    );
    assert_eq!(diff["baseline"]["total"], 0, "{diff}");
    assert_eq!(diff["comparison"]["total"], 120_000_000, "{diff}");
    assert!(diff.to_string().contains("pipe_read"), "{diff}");
    // Memory: span A allocated 3 MiB; two processes' in-use snapshots.
    crate::memory::send_allocations(&python, &server, &demo, "ui-svc");
    crate::memory::send_in_use(&python, &server, &demo, "ui-svc");
    crate::memory::send(
        &python,
        &server,
        json!({
            "service": "ui-svc", "type": "alloc_objects:count",
            "binary": {"path": "/usr/local/bin/demo", "build_id": demo.build_id},
            "stacks": [{"frames": [demo.alpha, demo.main], "count": 2, "value": 4096}],
        }),
    );
    // JIT frames (as the agent names them from perf maps) above a native
    // frame.
    let jit = json!({
        "service": "ui-jit",
        "binary": {"path": "/usr/local/bin/demo", "build_id": demo.build_id},
        "stacks": [{"frames": [
            {"name": "innerLoop", "type": "v8js", "file": "/srv/app.js", "line": 12},
            {"name": "executeHeavyTask", "type": "v8js", "file": "/srv/app.js", "line": 20},
            demo.main], "count": 5}],
    });
    crate::memory::send(&python, &server, jit);
    // And a library nobody published.
    let vendor = json!({
        "service": "ui-jit",
        "binary": {"path": "/opt/vendor/libsecret.so", "build_id": "ab".repeat(20)},
        "stacks": [{"frames": [0x1234, 0x5678], "count": 2}],
    });
    crate::memory::send(&python, &server, vendor);
    let artifacts = artifacts_dir();
    let out = run(node_script(&modules, "ui.cjs").args([
        server.url.as_str(),
        "ui-svc",
        "alpha_work",
        "gamma",
        TRACE,
        artifacts.to_str().unwrap(),
        "ui-jit",
    ]));
    let r: Value = serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("{e}: {}", String::from_utf8_lossy(&out.stdout)));
    assert_eq!(r["errors"], json!([]), "{r}");
    assert!(
        r["summary"].as_str().unwrap().contains("100 samples"),
        "{r}"
    );
    assert!(
        r["top"][0].as_str().unwrap().starts_with("alpha_work"),
        "{r}"
    );
    assert!(r["tooltip"].as_str().unwrap().contains("demo.c:"), "{r}");
    assert!(
        r["zoom_label"].as_str().unwrap().contains("alpha_work"),
        "{r}"
    );
    assert!(
        r["width_after"].as_f64().unwrap() > r["width_before"].as_f64().unwrap() * 1.3,
        "zooming widens the frame: {r}"
    );
    assert_eq!(r["match_names"], json!(["gamma_inline"]), "{r}");
    assert!(
        r["search_stats"].as_str().unwrap().contains("30.00%"),
        "{r}"
    );
    assert_eq!(
        r["diff_summary"], "baseline 0 samples · comparison 100 samples",
        "{r}"
    );
    let diff_frames = r["diff_frames"].to_string();
    assert!(
        diff_frames.contains("alpha_work") && diff_frames.contains("gamma_inline"),
        "{r}"
    );
    // Span A's CPU, off-CPU and allocation rows, span B's CPU row.
    assert_eq!(r["spans"].as_array().unwrap().len(), 4, "{r}");
    let span_time: Vec<&str> = r["span_time"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_str().unwrap())
        .collect();
    let a = span_time
        .iter()
        .find(|t| t.contains(SPAN_A))
        .expect("span A's time");
    assert!(a.contains("pipe 100%") && a.contains("120"), "{r}");
    assert!(a.contains("3.0 MiB"), "span A's allocated bytes: {r}");
    let labels = r["type_labels"].to_string();
    for name in [
        "In-use bytes",
        "Allocated bytes",
        "Allocated objects",
        "CPU",
    ] {
        assert!(labels.contains(name), "{name} in {labels}");
    }
    assert_eq!(r["gauge_hidden_for_cpu"], true, "{r}");
    // Frames coloured by type: v8js in yellows, native in reds and oranges.
    assert_eq!(
        (&r["jit_kind"], &r["native_kind"]),
        (&json!("v8js"), &json!("native")),
        "{r}"
    );
    let (jit_hue, native_hue) = (
        r["jit_hue"].as_u64().unwrap(),
        r["native_hue"].as_u64().unwrap(),
    );
    assert!(
        (48..=82).contains(&jit_hue) && (8..=42).contains(&native_hue),
        "{r}"
    );
    // Unnamed frames: which module, how many, why.
    assert_eq!(r["modules_hidden_when_named"], true, "{r}");
    let modules = r["modules"].as_str().unwrap();
    assert!(
        modules.contains("libsecret.so")
            && modules.contains("2 of 2 addresses unnamed: unknown build id")
            && modules.contains("symtrace-upload"),
        "{r}"
    );
    assert!(!modules.contains("demo"), "{r}");
    let tip = r["jit_tooltip"].as_str().unwrap();
    assert!(
        tip.contains("[v8js]") && tip.contains("/srv/app.js:12"),
        "{r}"
    );
    assert_eq!(r["gauge_shown_for_inuse"], true, "{r}");
    let inuse = r["inuse_summary"].as_str().unwrap();
    assert!(
        inuse.contains("15.0 MiB") && inuse.contains("latest snapshot"),
        "{r}"
    );
    let average = r["inuse_average_summary"].as_str().unwrap();
    assert!(
        average.contains("17.0 MiB") && average.contains("average"),
        "{r}"
    );
    assert!(
        r["objects_summary"]
            .as_str()
            .unwrap()
            .contains("8,192 objects"),
        "{r}"
    );
    assert!(
        r["trace_summary"]
            .as_str()
            .unwrap()
            .contains("allocated 3.0 MiB"),
        "{r}"
    );
    assert!(
        r["alloc_span_summary"]
            .as_str()
            .unwrap()
            .contains("3.0 MiB"),
        "{r}"
    );
    assert!(
        r["split_titles"].to_string().contains("% waiting"),
        "the running/waiting bar: {r}"
    );
    assert!(
        r["off_cpu_summary"]
            .as_str()
            .unwrap()
            .contains("off_cpu:nanoseconds"),
        "{r}"
    );
    let off_frames = r["off_cpu_frames"].to_string();
    assert!(
        off_frames.contains("pipe_read") && off_frames.contains("alpha_work"),
        "{r}"
    );
    assert!(
        r["spans"][0].as_str().unwrap().contains(SPAN_A),
        "heaviest first: {r}"
    );
    assert!(
        r["span_summary"].as_str().unwrap().contains("60 samples"),
        "{r}"
    );
    let span_frames: Vec<&str> = r["span_frames"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_str().unwrap())
        .collect();
    assert!(
        span_frames.contains(&"alpha_work") && !span_frames.contains(&"beta_work"),
        "{r}"
    );
    let svg_texts = r["svg_texts"].to_string();
    assert!(svg_texts.contains("alpha_work"), "{r}");
    for shot in [
        "ui-flamegraph-zoomed.png",
        "ui-flamegraph-search.png",
        "ui-diff.png",
        "ui-trace.png",
        "ui-span.png",
        "ui-off-cpu.png",
        "ui-memory.png",
        "ui-svg.png",
    ] {
        let size = std::fs::metadata(artifacts.join(shot)).map_or(0, |m| m.len());
        assert!(size > 1000, "screenshot {shot} missing");
    }
}
