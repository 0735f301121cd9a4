//! Whole stacks through code built without frame pointers (issue #40): the
//! agent for real (BPF as root) walks Debian's own libc and zlib, a vendor
//! unit built with `-O2 -fomit-frame-pointer`, and programs built with
//! plain `-O2`, by the unwind tables it builds from their `.eh_frame`;
//! checked through a real server's folded flamegraphs. A stack that
//! reaches `_start` has no `[truncated …]` marker; a stack whose frames
//! were overwritten still has one.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use symtrace_testkit::agent::{
    bpf_test, early_walks, evidence, excuse_early, number_after, walks_early, Agent,
};
use symtrace_testkit::stacks::{folded_stacks, has_path, run, samples_where};
use symtrace_testkit::{self as kit, Backend, Killed, Server};

const HZ: f64 = 97.0;
const MARKER: &str = "[truncated: unverifiable frame-pointer chain]";
/// The share of samples that must show their whole chain.
const WHOLE: f64 = 0.95;
const LIBZ: &str = "/lib/x86_64-linux-gnu/libz.so.1";
const LIBC: &str = "/lib/x86_64-linux-gnu/libc.so.6";

/// The unwind-table pool docs/agent.md recommends for a build host (the
/// tests run on one, beside compiles whose rustc alone holds 9.2 MB of
/// rows: with the default 16 MiB, the files measured here can be refused
/// for room while rustc runs).
const BUILD_HOST_POOL: &[&str] = &["--unwind-table-bytes", "33554432"];

fn workload(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/workload")
        .join(name)
}

/// cfi_cases.c with its frameless vendor unit and Debian's zlib: built
/// with frame pointers (clang, the mission's flags) or with plain gcc -O2.
fn build_cases(dir: &Path, framed: bool) -> PathBuf {
    let vendor = dir.join("cfi_vendor.o");
    if !vendor.exists() {
        kit::run(
            Command::new("gcc")
                .args(["-O2", "-g", "-fomit-frame-pointer", "-c"])
                .arg(workload("cfi_vendor.c"))
                .arg("-o")
                .arg(&vendor),
        );
    }
    let (compiler, flags, name): (&str, &[&str], &str) = if framed {
        (
            "clang-19",
            &[
                "-O2",
                "-g",
                "-fno-omit-frame-pointer",
                "-mno-omit-leaf-frame-pointer",
            ],
            "cfi_cases-framed",
        )
    } else {
        ("gcc", &["-O2", "-g"], "cfi_cases-plain")
    };
    let bin = dir.join(name);
    kit::run(
        Command::new(compiler)
            .args(flags)
            .arg(workload("cfi_cases.c"))
            .arg(&vendor)
            .arg(LIBZ)
            .arg("-o")
            .arg(&bin),
    );
    bin
}

/// tests/workload/cfi_cases.c and cfi_vendor.c built with `-g` and no
/// unwind tables (as some embedded and legacy builds are): their code is
/// described by `.debug_frame` only (the C runtime's start files still
/// bring a few FDEs of `.eh_frame`).
fn build_debug_frame_only(dir: &Path) -> PathBuf {
    let bin = dir.join("cfi_cases-debug-frame");
    kit::run(
        Command::new("gcc")
            .args([
                "-O2",
                "-g",
                "-fomit-frame-pointer",
                "-fno-asynchronous-unwind-tables",
                "-fno-unwind-tables",
            ])
            .arg(workload("cfi_cases.c"))
            .arg(workload("cfi_vendor.c"))
            .arg(LIBZ)
            .arg("-o")
            .arg(&bin),
    );
    bin
}

/// The position of the first frame named `name`.
fn at(stack: &[String], name: &str) -> Option<usize> {
    stack.iter().position(|f| f == name)
}

/// Whether a stack is whole: from `_start`, no marker, through `path`.
fn whole(stack: &[String], path: &str) -> bool {
    stack.first().is_some_and(|f| f == "_start") && has_path(stack, path)
}

struct Case<'a> {
    what: &'a str,
    bin: &'a Path,
    args: &'a [&'a str],
}

/// The stacks of one run, and how many stacks the agent walked meanwhile
/// before their process's unwind ranges were set and could not make whole
/// from their stack's copy (the copy failed, or its walk did not reach
/// the stack's end).
struct Profiled {
    stacks: Vec<(Vec<String>, u64)>,
    early: u64,
}

/// Runs `case` as a new service; its stacks.
fn profile(agent: &Agent, server: &Server, case: &Case<'_>) -> Profiled {
    let service = kit::unique(&format!("cfi-{}-", case.what));
    let before = walks_early(agent);
    let used = run(case.bin, &service, case.args);
    let seconds: f64 = used.values().sum();
    let stacks = folded_stacks(server, &service, seconds * HZ);
    // The stats line of the flush that sent the last of them counts the
    // whole run (a line is printed at every flush).
    let early = kit::wait_until(
        "a stats line after the run's samples",
        Duration::from_secs(10),
        || {
            let after = walks_early(agent);
            (after >= before).then_some(after - before)
        },
    );
    Profiled { stacks, early }
}

/// Asserts that of the samples for which `of` holds (at least 20), at
/// least WHOLE are whole through `path` — but for those the agent says it
/// walked before the process's unwind ranges were set (a new process's
/// first samples, by frame pointer alone: longer on a busy machine);
/// returns the share. A failure's first line says what failed; the
/// agent's counters and the top stacks follow.
fn check_whole(
    agent: &Agent,
    what: &str,
    profiled: &Profiled,
    of: impl Fn(&[String]) -> bool,
    path: &str,
) -> f64 {
    let stacks = &profiled.stacks;
    let n = samples_where(stacks, &of);
    let ok = samples_where(stacks, |s| of(s) && whole(s, path));
    // (A run of 2 s: most samples are after the process's first moments.)
    let (share, early) = excuse_early(what, ok, n, profiled.early, || evidence(agent, stacks));
    let cut = samples_where(stacks, |s| of(s) && s.first().is_some_and(|f| f == MARKER));
    assert!(
        n >= 20,
        "{what}: only {n} samples\n{}",
        evidence(agent, stacks)
    );
    assert!(
        share >= WHOLE,
        "{what}: {ok} of {n} samples whole through {path} ({:.1}% with the {early} walked \
         before the process's ranges), {cut} with the marker\n{}",
        share * 100.0,
        evidence(agent, stacks)
    );
    eprintln!(
        "{what}: {ok} of {n} samples whole through {path} ({:.1}% with the {early} walked \
         before the process's ranges); {cut} with the marker",
        share * 100.0
    );
    share
}

/// Waits until every table the agent started building is loaded (or
/// failed, or refused, or loaded and since evicted for room: other
/// processes on the machine have tables too): the workloads measured next
/// find their files' tables from their first sample. Returns the stats
/// line.
fn tables_settled(agent: &Agent, at_least: u64) -> String {
    let deadline = Instant::now() + Duration::from_secs(90);
    loop {
        if let Some(line) = agent.last_line("stats:") {
            let tables = &line[line.find("unwind tables:").expect("unwind tables")..];
            let loaded = number_after(tables, ", files");
            let builds = number_after(tables, "builds");
            let failed = number_after(tables, "(failed");
            let refused = number_after(tables, "refused for room");
            let evicted = number_after(tables, "evictions");
            if loaded >= at_least && loaded + evicted + failed + refused >= builds {
                return line;
            }
            assert!(
                Instant::now() < deadline,
                "tables still building: {line}\n{}",
                agent.stderr()
            );
        }
        std::thread::sleep(Duration::from_millis(200));
    }
}

#[test]
fn whole_stacks_through_libc_zlib_vendor_code_and_plain_o2_builds() {
    let Some(_one) = bpf_test(&["clang-19", "gcc", "g++"]) else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(&Backend::local(), &[]);
    let framed = build_cases(dir.path(), true);
    let plain = build_cases(dir.path(), false);
    let debug_frame = build_debug_frame_only(dir.path());
    // Its table comes from both sections (as the agent prints it).
    let agent_bin = Path::new(env!("CARGO_BIN_EXE_symtrace-agent"));
    let described = Command::new(agent_bin)
        .arg("unwind-table")
        .arg(&debug_frame)
        .output()
        .unwrap();
    let described = String::from_utf8_lossy(&described.stdout);
    assert!(
        described.contains(".eh_frame + .debug_frame") && described.contains("frameless code"),
        "{described}"
    );
    let sort = dir.path().join("cfi_sort");
    kit::run(
        Command::new("g++")
            .args(["-O2", "-g"])
            .arg(workload("cfi_sort.cpp"))
            .arg("-o")
            .arg(&sort),
    );
    for bin in [&framed, &plain, &sort, &debug_frame] {
        server.upload(&kit::build_id_of(bin), "debuginfo", bin);
    }
    // Debian's libc as published (its dynamic symbols name qsort).
    let libc = std::fs::canonicalize(LIBC).unwrap();
    server.upload(&kit::build_id_of(&libc), "executable", &libc);
    let mut agent = Agent::start(agent_bin, &server.grpc_addr, BUILD_HOST_POOL);

    // Every binary once, briefly: the agent builds the tables of the files
    // they map (tables are per file, so the runs measured below find them).
    for bin in [&framed, &plain, &debug_frame] {
        run(bin, &kit::unique("cfi-warm-"), &["zlib", "0.3"]);
    }
    run(&sort, &kit::unique("cfi-warm-"), &["0.3"]);
    let before = tables_settled(&agent, 5);
    eprintln!("tables: {before}");

    // 1. glibc's qsort calling back the framed comparator.
    for (what, bin) in [("qsort", &framed), ("qsort-plain-O2", &plain)] {
        let profiled = profile(
            &agent,
            &server,
            &Case {
                what,
                bin,
                args: &["qsort", "2.0"],
            },
        );
        let stacks = &profiled.stacks;
        // main → run → libc's qsort (named as the published libc names
        // it) → … → cmp_ints.
        let through_qsort = |s: &[String]| {
            let (Some(r), Some(c)) = (at(s, "run"), at(s, "cmp_ints")) else {
                return false;
            };
            r < c && s[r + 1..c].iter().any(|f| f.contains("qsort"))
        };
        check_whole(
            &agent,
            what,
            &profiled,
            |s| s.last().is_some_and(|f| f == "cmp_ints"),
            "main;run",
        );
        let in_cmp = samples_where(stacks, |s| s.last().is_some_and(|f| f == "cmp_ints"));
        let named = samples_where(stacks, |s| {
            s.last().is_some_and(|f| f == "cmp_ints") && through_qsort(s)
        });
        let early = profiled.early.min(in_cmp - named.min(in_cmp));
        assert!(
            (named + early) as f64 >= WHOLE * in_cmp as f64,
            "{what}: {named} of {in_cmp} comparator samples go through qsort ({early} walked \
             before the process's ranges)\n{}",
            evidence(&agent, stacks)
        );
    }

    // 2. A framed caller → two frameless vendor levels (the inner one
    // uses %rbp for data) → a framed callback.
    for (what, bin) in [
        ("vendor", &framed),
        ("vendor-plain-O2", &plain),
        ("vendor-debug-frame", &debug_frame),
    ] {
        let profiled = profile(
            &agent,
            &server,
            &Case {
                what,
                bin,
                args: &["vendor", "2.0"],
            },
        );
        check_whole(
            &agent,
            what,
            &profiled,
            |s| s.last().is_some_and(|f| f == "framed_cb"),
            "main;run;vendor_outer;vendor_inner;framed_cb",
        );
        check_whole(
            &agent,
            what,
            &profiled,
            |s| s.iter().any(|f| f == "vendor_inner"),
            "main;run;vendor_outer;vendor_inner",
        );
    }

    // 3. Time in Debian's zlib (built without frame pointers).
    let profiled = profile(
        &agent,
        &server,
        &Case {
            what: "zlib",
            bin: &framed,
            args: &["zlib", "2.0"],
        },
    );
    check_whole(
        &agent,
        "zlib",
        &profiled,
        |s| {
            s.last()
                .is_some_and(|f| f.starts_with("libz.so") || f.contains("crc32"))
        },
        "main;run;zwork",
    );

    // 4. std::sort with a comparator, all of it plain g++ -O2.
    let profiled = profile(
        &agent,
        &server,
        &Case {
            what: "std-sort",
            bin: &sort,
            args: &["2.0"],
        },
    );
    let stacks = &profiled.stacks;
    // (C++ names come with their parameters.)
    check_whole(
        &agent,
        "std::sort",
        &profiled,
        |s| s.last().is_some_and(|f| f.starts_with("by_key(")),
        "main;sort_work(double)",
    );
    let through_sort = samples_where(stacks, |s| {
        s.last().is_some_and(|f| f.starts_with("by_key("))
            && s.iter().any(|f| f.starts_with("void std::sort<"))
    });
    let in_key = samples_where(stacks, |s| {
        s.last().is_some_and(|f| f.starts_with("by_key("))
    });
    let early = profiled.early.min(in_key - through_sort.min(in_key));
    assert!(
        (through_sort + early) as f64 >= WHOLE * in_key as f64,
        "{through_sort} of {in_key} comparator samples go through std::sort ({early} walked \
         before the process's ranges)\n{}",
        evidence(&agent, stacks)
    );

    // 5. A stack that cannot be walked (its frame overwritten) is cut,
    // and says so.
    let stacks = profile(
        &agent,
        &server,
        &Case {
            what: "corrupt",
            bin: &framed,
            args: &["corrupt", "1.5"],
        },
    )
    .stacks;
    let spinning = samples_where(&stacks, |s| s.iter().any(|f| f == "corrupt_spin"));
    let marked = samples_where(&stacks, |s| {
        s.iter().any(|f| f == "corrupt_spin") && s.first().is_some_and(|f| f == MARKER)
    });
    let false_roots = samples_where(&stacks, |s| {
        s.iter().any(|f| f == "corrupt_spin") && s.iter().any(|f| f == "main" || f == "_start")
    });
    assert!(
        spinning >= 20,
        "{spinning} samples in corrupt_spin\n{}",
        evidence(&agent, &stacks)
    );
    assert!(
        marked as f64 >= WHOLE * spinning as f64 && false_roots == 0,
        "{marked} of {spinning} corrupted stacks carry the marker, {false_roots} claim a root\n{}",
        evidence(&agent, &stacks)
    );

    // 6. Stacks walked from their copy: a new process's first samples,
    // taken before the agent set its unwind ranges, carry a copy of the
    // stack that user space walks by CFI. Here a main thread 9.5 KiB deep
    // in a frameless libc: its copy must reach the initial stack (one of
    // 8 KiB stops short of main's callers, one of 16 KiB runs past the
    // stack's end unless the kernel's random padding above it is wide).
    // Short runs (an empty environment: the stack's mapping ends near the
    // initial stack pointer), 40 at least and until 20 stacks were copied
    // (most copies are of the dynamic loader's first milliseconds, before
    // the comparator runs).
    let service = kit::unique("cfi-deep-");
    let at_start = early_walks(&agent);
    let deadline = Instant::now() + Duration::from_secs(120);
    let (mut seconds, mut runs) = (0.0, 0);
    let (mut early, mut copied, mut whole_copies) = (0, 0, 0);
    while copied < 20 || runs < 40 {
        assert!(
            Instant::now() < deadline,
            "{copied} stacks copied in {runs} short runs\n{}",
            evidence(&agent, &[])
        );
        let out = kit::run(
            Command::new(&framed)
                .args(["deep-qsort", "0.05"])
                .env_clear()
                .env("OTEL_SERVICE_NAME", &service)
                .stdin(Stdio::null()),
        );
        let out = String::from_utf8_lossy(&out.stdout);
        seconds += out
            .trim()
            .strip_prefix("deep-qsort ")
            .and_then(|s| s.parse::<f64>().ok())
            .unwrap_or_else(|| panic!("deep-qsort printed {out:?}"));
        runs += 1;
        let now = early_walks(&agent);
        (early, copied, whole_copies) = (
            now.early - at_start.early,
            now.copied - at_start.copied,
            now.whole - at_start.whole,
        );
    }
    let stacks = folded_stacks(&server, &service, seconds * HZ);
    // The agent's word on each copy it could not walk whole.
    let cut_copies = || {
        let log = agent.stderr();
        let cut: Vec<&str> = log
            .lines()
            .filter(|l| l.contains("a stack copy's walk did not reach"))
            .collect();
        cut[cut.len().saturating_sub(8)..].join("\n")
    };
    // (Counted on the whole host: another process's copy counts too.)
    assert!(
        whole_copies as f64 >= 0.9 * copied as f64,
        "{whole_copies} of {copied} stacks copied in {runs} runs walked whole from the copy\n{}\n{}",
        cut_copies(),
        evidence(&agent, &stacks)
    );
    let of = |s: &[String]| s.last().is_some_and(|f| f == "cmp_ints");
    let n = samples_where(&stacks, of);
    let ok = samples_where(&stacks, |s| of(s) && whole(s, "main;deep;run"));
    // Excused: the early walks not copied (the ring buffer behind).
    let (share, _) = excuse_early("deep", ok, n, early.saturating_sub(copied), || {
        evidence(&agent, &stacks)
    });
    // The comparator's samples walked from a copy are a few of them (most
    // copies are the loader's): this does not tell copies of 8 KiB from
    // copies up to the initial stack pointer (with either, 0 to 4 of ~180
    // samples were cut in runs here: a process's first milliseconds).
    assert!(
        n >= 20 && share >= WHOLE,
        "deep: {ok} of {n} comparator samples whole through main;deep;run, {early} walked \
         early, {copied} copied\n{}",
        evidence(&agent, &stacks)
    );
    eprintln!(
        "deep: {ok} of {n} samples whole in {runs} runs; {early} walked early, {copied} \
         copied, {whole_copies} whole from the copy\n{}",
        cut_copies()
    );

    let stats = agent.last_line("stats:").expect("a stats line");
    assert!(number_after(&stats, "by CFI") > 0, "{stats}");
    // The walks above went through each CPU's rule memo (their stacks
    // repeat), and came out whole: the memo's answers are the tables'.
    assert!(number_after(&stats, "answered by the memo") > 0, "{stats}");
    assert!(number_after(&stats, "leaves stepped in BPF") > 0, "{stats}");
    assert_eq!(number_after(&stats, "malformed records"), 0, "{stats}");
    assert!(agent.stop().success(), "{}", agent.stderr());
    eprintln!("{stats}");
}

#[test]
fn node_stacks_run_from_js_through_node_and_libuv_to_main() {
    let Some(_one) = bpf_test(&["node"]) else {
        return;
    };
    let server = Server::start(&Backend::local(), &[]);
    let node = PathBuf::from(
        String::from_utf8(kit::run(Command::new("sh").args(["-c", "command -v node"])).stdout)
            .unwrap()
            .trim(),
    );
    let node = std::fs::canonicalize(node).unwrap();
    server.upload(&kit::build_id_of(&node), "debuginfo", &node);
    let agent_bin = Path::new(env!("CARGO_BIN_EXE_symtrace-agent"));
    let mut agent = Agent::start(agent_bin, &server.grpc_addr, BUILD_HOST_POOL);
    // node's tables first (its .eh_frame is 2.7 MB here).
    kit::run(
        Command::new(&node)
            .args([
                "-e",
                "let s = 0; const t = Date.now(); while (Date.now() - t < 300) s++;",
            ])
            .env("OTEL_SERVICE_NAME", kit::unique("node-warm-")),
    );
    tables_settled(&agent, 3);

    let service = kit::unique("node-cfi-");
    let mut child = Killed(
        Command::new(&node)
            .args(["--perf-basic-prof"])
            .arg(workload("jit_service.js"))
            .env("OTEL_SERVICE_NAME", &service)
            .stdout(Stdio::piped())
            .spawn()
            .unwrap(),
    );
    let pid = child.0.id();
    let mut first = String::new();
    BufReader::new(child.0.stdout.take().unwrap())
        .read_line(&mut first)
        .unwrap();
    let port: u16 = first
        .trim()
        .strip_prefix("listening ")
        .unwrap()
        .parse()
        .unwrap();
    // Requests for 5 seconds, one after another: JS under libuv's loop.
    let started = Instant::now();
    let client = kit::client();
    while started.elapsed() < Duration::from_secs(5) {
        let resp = client
            .get(format!("http://127.0.0.1:{port}/work"))
            .send()
            .unwrap();
        assert_eq!(resp.status(), 200);
    }
    let cpu = kit::process_cpu_seconds(pid);
    let stacks = folded_stacks(&server, &service, cpu * HZ);
    drop(child);
    let _ = std::fs::remove_file(format!("/tmp/perf-{pid}.map"));
    let js = |s: &[String]| s.iter().any(|f| f == "innerLoop" || f == "lighterLoop");
    // JS frames, node's C++ frames and libuv, down to _start. (node's
    // main tail-calls node::Start: main's frame is node::Start's.)
    let chain = |s: &[String]| {
        let (Some(m), Some(uv), Some(task)) = (
            at(s, "node::Start(int, char**)"),
            at(s, "uv_run"),
            at(s, "executeHeavyTask"),
        ) else {
            return false;
        };
        s.first().is_some_and(|f| f == "_start") && m < uv && uv < task
    };
    let in_js = samples_where(&stacks, js);
    let whole = samples_where(&stacks, |s| js(s) && chain(s));
    let marked = samples_where(&stacks, |s| s.first().is_some_and(|f| f == MARKER));
    let all = samples_where(&stacks, |_| true);
    assert!(
        in_js >= 100,
        "{in_js} JS samples of {all}\n{}",
        evidence(&agent, &stacks)
    );
    assert!(
        whole as f64 >= 0.9 * in_js as f64,
        "{whole} of {in_js} JS samples go from _start through node::Start and uv_run\n{}",
        evidence(&agent, &stacks)
    );
    assert!(
        (marked as f64) <= 0.1 * all as f64,
        "{marked} of {all} samples carry the marker\n{}",
        evidence(&agent, &stacks)
    );
    eprintln!(
        "node: {whole} of {in_js} JS samples ({:.1}%) whole from _start; {marked} of {all} marked",
        100.0 * whole as f64 / in_js.max(1) as f64
    );
    let stats = agent.last_line("stats:").expect("a stats line");
    assert!(agent.stop().success(), "{}", agent.stderr());
    eprintln!("{stats}");
}
