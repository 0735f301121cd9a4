//! What the tests share: the preload library's build, and what both
//! programs' tests read with bpftrace. (Each test file uses some of it.)
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use symtrace_elf::usdt::{usdt_probes, ArgLocation};
use symtrace_testkit as kit;

/// `make -C alloc/preload` into `dir`, as a user builds it.
pub fn build_preload(dir: &Path) -> PathBuf {
    kit::run(
        Command::new("make")
            .arg("-C")
            .arg(Path::new(env!("CARGO_MANIFEST_DIR")).join("preload"))
            .arg(format!("O={}", dir.display()))
            .arg("CC=clang-19"),
    );
    dir.join("libsymtrace_alloc_preload.so")
}

/// symtrace-elf's reading of the file's `otel_memory` probes agrees with
/// `readelf -n` (`notes`): the same locations and argument text, every
/// argument readable, three for `alloc` and one for `free`, and the
/// probe's file offset on its `nop`.
pub fn check_parsed_probes(file: &Path, notes: &str) {
    let data = std::fs::read(file).unwrap();
    let probes: Vec<_> = usdt_probes(&data)
        .unwrap()
        .into_iter()
        .filter(|p| p.provider == "otel_memory")
        .collect();
    assert_eq!(probes.len(), 2, "{probes:?}");
    for p in &probes {
        let location = format!("Location: 0x{:016x}", p.address);
        assert!(notes.contains(&location), "{location} not in {notes}");
        assert!(
            notes.contains(&format!("Arguments: {}", p.args_text)),
            "{p:?}"
        );
        let args = p.args.as_ref().unwrap_or_else(|e| panic!("{p:?}: {e}"));
        let want = if p.name == "alloc" { 3 } else { 1 };
        assert_eq!(args.len(), want, "{p:?}");
        assert!(args
            .iter()
            .all(|a| a.size == 8 && !matches!(a.location, ArgLocation::Constant(_))));
        let at = p.file_offset.expect("a probe in a loadable segment") as usize;
        assert_eq!(data[at], 0x90, "{p:?}: no nop at its file offset");
        assert_eq!(p.semaphore, None);
    }
}

/// Runs `program` (which prints `NAME BYTES` per allocating thread) with
/// `env` while bpftrace sums `otel_memory:alloc`'s weight (arg2) in
/// `probe_file` by thread name — the probe as any USDT consumer sees it,
/// attached by file for every process, as a profiler attaches — and checks
/// each thread's weights against the bytes it says it allocated, within
/// 10%. Returns the weights by name.
pub fn check_weights(
    probe_file: &Path,
    program: &Path,
    env: &[(&str, &str)],
    names: &[&str],
) -> Vec<f64> {
    let dir = tempfile::tempdir().unwrap();
    let out_path = dir.path().join("bpftrace.out");
    let script = format!(
        "BEGIN {{ printf(\"attached\\n\"); }} \
         usdt:{}:otel_memory:alloc {{ @w[comm] = sum(arg2); }}",
        probe_file.display()
    );
    let mut tracer = Command::new("bpftrace")
        .args(["-e", &script])
        .stdout(std::fs::File::create(&out_path).unwrap())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(60);
    while !std::fs::read_to_string(&out_path)
        .unwrap()
        .contains("attached")
    {
        assert!(Instant::now() < deadline, "bpftrace did not attach");
        assert!(tracer.try_wait().unwrap().is_none(), "bpftrace exited");
        std::thread::sleep(Duration::from_millis(100));
    }
    let mut cmd = Command::new(program);
    cmd.envs(env.iter().copied());
    let printed = String::from_utf8(kit::run(&mut cmd).stdout).unwrap();
    // bpftrace prints its maps and exits on SIGINT, but has been seen to
    // miss one (a CI run hung 12 minutes in `wait` until a second SIGINT
    // ended it, with its maps): signalled again each second until it
    // exits, within a deadline.
    let deadline = Instant::now() + Duration::from_secs(30);
    let status = loop {
        // SAFETY: signals our own child, which has not been waited for.
        unsafe { libc::kill(tracer.id() as i32, libc::SIGINT) };
        let sent = Instant::now();
        let exited = loop {
            if let Some(status) = tracer.try_wait().unwrap() {
                break Some(status);
            }
            if sent.elapsed() >= Duration::from_secs(1) {
                break None;
            }
            std::thread::sleep(Duration::from_millis(50));
        };
        if let Some(status) = exited {
            break status;
        }
        if Instant::now() > deadline {
            let _ = tracer.kill();
            panic!("bpftrace did not exit on SIGINT");
        }
    };
    assert!(status.success(), "bpftrace: {status}");
    let traced = std::fs::read_to_string(&out_path).unwrap();
    let value = |text: &str, prefix: &str| -> f64 {
        text.lines()
            .find_map(|l| l.strip_prefix(prefix))
            .unwrap_or_else(|| panic!("no {prefix:?} in {text}"))
            .trim()
            .parse()
            .unwrap()
    };
    names
        .iter()
        .map(|name| {
            let weights = value(&traced, &format!("@w[{name}]: "));
            let bytes = value(&printed, &format!("{name} "));
            assert!(
                (weights / bytes - 1.0).abs() < 0.1,
                "{name}: weights {weights} for {bytes} bytes\n{traced}"
            );
            weights
        })
        .collect()
}
