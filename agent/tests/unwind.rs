//! Stacks that are right for gcc's code too (issue #18): the agent for real
//! (BPF as root), against `tests/workload/unwind_cases.c` built by the
//! machine's gcc and by clang with exactly the mission's flags, checked
//! through a real server's folded flamegraphs.

use std::path::{Path, PathBuf};
use std::process::Command;

use symtrace_testkit::agent::{bpf_test, evidence, excuse_early, number_after, walks_early, Agent};
use symtrace_testkit::stacks::{folded_stacks, has_path, run, samples_where};
use symtrace_testkit::{self as kit, Backend, Server};

const HZ: f64 = 97.0;
const MARKER: &str = "[truncated: unverifiable frame-pointer chain]";

/// The mission's flags, nothing else.
fn build(dir: &Path, compiler: &str, opt: &str) -> PathBuf {
    let bin = dir.join(format!("unwind_cases-{compiler}-{opt}"));
    let source = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/workload/unwind_cases.c");
    kit::run(
        Command::new(compiler)
            .args([
                opt,
                "-g",
                "-fno-omit-frame-pointer",
                "-mno-omit-leaf-frame-pointer",
            ])
            .arg(&source)
            .arg("-o")
            .arg(&bin),
    );
    bin
}

/// A stack a user could not trust: frames of our workload that are no
/// function of it, or unknown memory.
fn garbage_frames(stacks: &[(Vec<String>, u64)], exe: &str) -> Vec<String> {
    stacks
        .iter()
        // A sample in execve, before the new image is mapped, has an unknown
        // leaf: that is the leaf, not a frame unwinding made up.
        .filter(|(s, _)| {
            !s.iter()
                .any(|f| f == "begin_new_exec" || f == "__x64_sys_execve")
        })
        .flat_map(|(s, _)| s.iter())
        .filter(|f| {
            f.starts_with(&format!("{exe}+"))
                || f.starts_with("[unknown]")
                || f.starts_with("[anon]")
        })
        .cloned()
        .collect()
}

/// The stacks the agent walked during `run` before their process's unwind
/// ranges were set (counted host-wide: at most what `run` missed is
/// excused, and never more than half of what it is measured on).
fn early_during<T>(agent: &Agent, run: impl FnOnce() -> T) -> (T, u64) {
    let before = walks_early(agent);
    let out = run();
    // The stats line of the flush that sent the run's last samples (the
    // run waited for them) counts the whole run.
    (out, walks_early(agent).saturating_sub(before))
}

fn check_split(agent: &Agent, server: &Server, bin: &Path, what: &str) {
    let service = kit::unique(&format!("leaf-split-{what}-"));
    let ((used, stacks), early) = early_during(agent, || {
        let used = run(bin, &service, &["split", "1.2", "0.4"]);
        let expected = (used["gamma_work"] + used["delta_work"]) * HZ;
        (used.clone(), folded_stacks(server, &service, expected))
    });
    let (gamma, delta) = (used["gamma_work"], used["delta_work"]);
    let expected = (gamma + delta) * HZ;
    let total = samples_where(&stacks, |_| true) as f64;
    let in_leaf = samples_where(&stacks, |s| s.last().is_some_and(|f| f == "leaf_spin"));
    let g = samples_where(&stacks, |s| {
        has_path(s, "main;dispatch;gamma_work;leaf_spin")
    });
    let d = samples_where(&stacks, |s| {
        has_path(s, "main;dispatch;delta_work;leaf_spin")
    });
    let text = format!("{what}: {stacks:?}\n{}", evidence(agent, &stacks));
    assert!(
        total >= 0.6 * expected,
        "{what}: {total} samples for {expected:.0} expected; {text}"
    );
    let (whole, _) = excuse_early(what, g + d, in_leaf, early, || text.clone());
    assert!(
        whole >= 0.9,
        "{what}: {} of {in_leaf} samples in leaf_spin have the full chain ({early} walked before \
         the process's ranges); {text}",
        g + d
    );
    let share = g as f64 / (g + d).max(1) as f64;
    let measured = gamma / (gamma + delta);
    assert!(
        (share - measured).abs() <= 0.10,
        "{what}: gamma_work has {:.1}% of the full-chain samples, {:.1}% of the CPU time; {text}",
        share * 100.0,
        measured * 100.0
    );
    eprintln!(
        "{what}: {total} samples, {in_leaf} in leaf_spin, {} with the full chain, gamma share {share:.3} (measured {measured:.3})",
        g + d
    );
}

fn check_tiny(agent: &Agent, server: &Server, bin: &Path, what: &str) {
    let service = kit::unique(&format!("tiny-{what}-"));
    let (stacks, early) = early_during(agent, || {
        let used = run(bin, &service, &["tiny", "2.0"]);
        folded_stacks(server, &service, used["tiny"] * HZ)
    });
    let in_tiny = samples_where(&stacks, |s| s.last().is_some_and(|f| f == "tiny"));
    let with_caller = samples_where(&stacks, |s| has_path(s, "main;tiny_loop;tiny"));
    // tiny's body is most of the loop's time (sixteen dependent steps: on
    // any CPU, however its timer interrupts skid, most samples are in it).
    let in_loop = samples_where(&stacks, |s| s.iter().any(|f| f == "tiny_loop"));
    let all = samples_where(&stacks, |_| true);
    assert!(
        in_tiny >= 20 && in_tiny * 2 >= all,
        "{what}: {in_tiny} samples in tiny of {all} ({in_loop} under tiny_loop): {stacks:?}"
    );
    let text = format!("{stacks:?}\n{}", evidence(agent, &stacks));
    assert!(
        excuse_early(what, with_caller, in_tiny, early, || text.clone()).0 >= 0.95,
        "{what}: {with_caller} of {in_tiny} samples in tiny keep main;tiny_loop ({early} walked \
         before the process's ranges): {text}"
    );
    eprintln!("{what}: {with_caller} of {in_tiny} samples in tiny keep their caller");
}

#[test]
fn stacks_through_frameless_leaves_prologues_libc_and_the_vdso() {
    let Some(_one) = bpf_test(&["clang-19", "gcc"]) else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(&Backend::local(), &[]);
    let bins: Vec<(String, PathBuf)> = [("gcc", "-O1"), ("gcc", "-O2"), ("clang-19", "-O1")]
        .into_iter()
        .map(|(c, o)| (format!("{c}{o}"), build(dir.path(), c, o)))
        .collect();
    for (_, bin) in &bins {
        server.upload(&kit::build_id_of(bin), "debuginfo", bin);
    }
    let agent_bin = Path::new(env!("CARGO_BIN_EXE_symtrace-agent"));
    let mut agent = Agent::start(agent_bin, &server.grpc_addr, &[]);

    // 1. Frameless leaves (gcc) and framed ones (clang): the full chain
    // and the 3:1 split.
    for (what, bin) in &bins {
        check_split(&agent, &server, bin, what);
    }
    // 2. A tiny function called in a tight loop: samples in its prologue
    // and epilogue (clang) or in a frameless body (gcc) keep the caller.
    for (what, bin) in [&bins[0], &bins[2]] {
        check_tiny(&agent, &server, bin, what);
    }

    // 3. qsort's comparator: frames through a libc built without frame
    // pointers. Report how many samples reach main; none may hold garbage.
    let (what, bin) = &bins[0];
    let service = kit::unique("qsort-");
    let used = run(bin, &service, &["qsort", "1.5"]);
    let stacks = folded_stacks(&server, &service, used["qsort"] * HZ);
    let exe = bin.file_name().unwrap().to_str().unwrap();
    let garbage = garbage_frames(&stacks, exe);
    assert!(
        garbage.is_empty(),
        "{what}: garbage frames {garbage:?} in {stacks:?}"
    );
    let total = samples_where(&stacks, |_| true);
    let in_cmp = samples_where(&stacks, |s| s.iter().any(|f| f == "cmp_ints"));
    let reach_main = samples_where(&stacks, |s| has_path(s, "main;sort_work"));
    let cmp_reach_main = samples_where(&stacks, |s| {
        s.iter().any(|f| f == "cmp_ints") && has_path(s, "main;sort_work")
    });
    let cut = samples_where(&stacks, |s| s.first().is_some_and(|f| f == MARKER));
    // Every stack that names our functions names them in call order.
    for (s, _) in &stacks {
        let ours: Vec<&str> = s
            .iter()
            .map(String::as_str)
            .filter(|f| ["main", "sort_work", "cmp_ints"].contains(f))
            .collect();
        let order = ["main", "sort_work", "cmp_ints"];
        let positions: Vec<usize> = ours
            .iter()
            .map(|f| order.iter().position(|o| o == f).unwrap())
            .collect();
        assert!(
            positions.windows(2).all(|w| w[0] < w[1]),
            "out of order: {s:?}"
        );
    }
    assert!(in_cmp > 0, "no sample in the comparator: {stacks:?}");
    eprintln!(
        "qsort ({what}): {total} samples; {reach_main} ({:.0}%) reach main; of {in_cmp} in cmp_ints {cmp_reach_main} ({:.0}%) reach main; {cut} cut with the marker",
        100.0 * reach_main as f64 / total.max(1) as f64,
        100.0 * cmp_reach_main as f64 / in_cmp.max(1) as f64,
    );

    // 4. The vDSO: clock_gettime named, no raw [vdso] address.
    let service = kit::unique("vdso-");
    let used = run(bin, &service, &["vdso", "1.0"]);
    let stacks = folded_stacks(&server, &service, used["vdso"] * HZ);
    let named = samples_where(&stacks, |s| {
        s.iter()
            .any(|f| f == "clock_gettime" || f == "__vdso_clock_gettime")
    });
    assert!(
        named >= 10,
        "{named} samples name the vDSO's clock_gettime: {stacks:?}"
    );
    let raw = samples_where(&stacks, |s| s.iter().any(|f| f.starts_with("[vdso]")));
    assert_eq!(raw, 0, "raw vDSO addresses: {stacks:?}");
    let total = samples_where(&stacks, |_| true);
    let in_clock_work = samples_where(&stacks, |s| has_path(s, "main;clock_work"));
    eprintln!("vdso: {named} of {total} samples name clock_gettime; {in_clock_work} reach main;clock_work");

    let stats = agent.last_line("stats:").expect("a stats line");
    // Leaves stepped out of by their CFI: in the BPF walk once their
    // file's table is loaded, in userspace before.
    assert!(
        number_after(&stats, "leaf callers recovered")
            + number_after(&stats, "leaves stepped in BPF")
            > 0,
        "{stats}"
    );
    assert_eq!(number_after(&stats, "malformed records"), 0, "{stats}");
    assert!(agent.stop().success(), "{}", agent.stderr());
    eprintln!("{}", agent.last_line("total:").unwrap_or_default());
}
