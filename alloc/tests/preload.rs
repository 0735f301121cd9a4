//! The LD_PRELOAD library, built with its Makefile: its USDT notes are
//! real (`readelf -n`, `bpftrace -l`), it keeps every allocation function
//! correct with everything sampled and with nothing sampled, real programs
//! run under it unchanged, and the weights its `otel_memory:alloc` probe
//! reports add up to the bytes allocated (read with bpftrace, as root).

use std::path::{Path, PathBuf};
use std::process::Command;

use symtrace_testkit as kit;
use symtrace_testkit::agent::bpf_test;

mod common;

fn root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

fn build_c(dir: &Path, name: &str) -> PathBuf {
    let out = dir.join(name);
    kit::run(
        Command::new("clang-19")
            .args(["-O1", "-g", "-fno-omit-frame-pointer", "-pthread"])
            .arg(root().join(format!("tests/c/{name}.c")))
            .arg("-o")
            .arg(&out),
    );
    out
}

fn run_with(bin: &Path, preload: Option<&Path>, interval: Option<&str>) -> String {
    let mut cmd = Command::new(bin);
    if let Some(lib) = preload {
        cmd.env("LD_PRELOAD", lib);
    }
    match interval {
        Some(i) => cmd.env("OTEL_MEMORY_SAMPLING_INTERVAL", i),
        None => cmd.env_remove("OTEL_MEMORY_SAMPLING_INTERVAL"),
    };
    let out = kit::run(&mut cmd);
    String::from_utf8(out.stdout).unwrap()
}

/// "blocks N sampled M" → (N, M).
fn counts(line: &str) -> (u64, u64) {
    let words: Vec<&str> = line.split_whitespace().collect();
    assert_eq!(words.len(), 4, "{line}");
    (words[1].parse().unwrap(), words[3].parse().unwrap())
}

#[test]
fn the_probes_are_real_usdt_notes() {
    if !kit::have("clang-19") || !kit::have("bpftrace") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let lib = common::build_preload(dir.path());
    let notes =
        String::from_utf8(kit::run(Command::new("readelf").arg("-n").arg(&lib)).stdout).unwrap();
    for probe in ["alloc", "free"] {
        let at = notes
            .find(&format!("Name: {probe}\n"))
            .unwrap_or_else(|| panic!("no probe {probe} in {notes}"));
        assert!(
            notes[..at].rfind("Provider: otel_memory").is_some(),
            "{notes}"
        );
    }
    assert_eq!(notes.matches("Provider: otel_memory").count(), 2, "{notes}");
    assert!(notes.contains("Build ID"), "{notes}");
    common::check_parsed_probes(&lib, &notes);
    let listed = String::from_utf8(
        kit::run(
            Command::new("bpftrace")
                .arg("-l")
                .arg(format!("usdt:{}:otel_memory:*", lib.display())),
        )
        .stdout,
    )
    .unwrap();
    assert!(listed.contains("otel_memory:alloc"), "{listed}");
    assert!(listed.contains("otel_memory:free"), "{listed}");
}

#[test]
fn every_allocation_function_stays_correct_sampled_or_not() {
    if !kit::have("clang-19") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let lib = common::build_preload(dir.path());
    let bin = build_c(dir.path(), "exercise");

    // Without the library: nothing carries a header.
    let (blocks, sampled) = counts(&run_with(&bin, None, None));
    assert!(blocks > 50_000, "{blocks}");
    assert_eq!(sampled, 0);
    // Sampling off: the same.
    let (_, sampled) = counts(&run_with(&bin, Some(&lib), Some("0")));
    assert_eq!(sampled, 0);
    // Everything sampled (a point every byte on average): every block
    // below page alignment has its header, and all of it still works.
    let (blocks, sampled) = counts(&run_with(&bin, Some(&lib), Some("1")));
    assert!(
        sampled as f64 > 0.85 * blocks as f64,
        "{sampled} of {blocks} sampled at interval 1"
    );
    // Mixed: sampled and unsampled blocks side by side, reallocated into
    // each other.
    for interval in ["64", "4096"] {
        let (blocks, sampled) = counts(&run_with(&bin, Some(&lib), Some(interval)));
        assert!(
            sampled > 0 && sampled < blocks,
            "{sampled} of {blocks} at {interval}"
        );
    }
    // The default (512 KiB): ~one block in a few dozen here (their mean
    // size is ~16 KiB); the exact share is the sampler's unit tests' job.
    let (blocks, sampled) = counts(&run_with(&bin, Some(&lib), None));
    assert!(
        sampled > 0 && (sampled as f64) < 0.2 * blocks as f64,
        "{sampled} of {blocks} sampled at the default interval"
    );
}

#[test]
fn real_programs_run_unchanged_under_it() {
    if !kit::have("clang-19") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let lib = common::build_preload(dir.path());
    let input = dir.path().join("input");
    let lines: String = (0..200_000u64)
        .map(|i| format!("{:016x} {}\n", i.wrapping_mul(0x9e37_79b9_7f4a_7c15), i))
        .collect();
    std::fs::write(&input, lines).unwrap();
    let sort = |preload: Option<&Path>| {
        let mut cmd = Command::new("sort");
        cmd.arg(&input).env("OTEL_MEMORY_SAMPLING_INTERVAL", "64");
        if let Some(lib) = preload {
            cmd.env("LD_PRELOAD", lib);
        }
        kit::run(&mut cmd).stdout
    };
    assert_eq!(sort(Some(&lib)), sort(None));
    // A Rust program with SampledAllocator under the library: both layers
    // sample, each recognising only its own blocks.
    let rust = kit::target_dir().join("examples/big_small");
    let out = kit::run(
        Command::new(&rust)
            .env("LD_PRELOAD", &lib)
            .env("OTEL_MEMORY_SAMPLING_INTERVAL", "64"),
    );
    let printed = String::from_utf8(out.stdout).unwrap();
    assert!(
        printed.contains("big ") && printed.contains("small "),
        "{printed}"
    );
    if kit::have("python3") {
        let script = "import json; d = {str(i): [i] * (i % 50) for i in range(100000)}; \
                      s = json.dumps(d); print(len(s), sum(len(v) for v in json.loads(s).values()))";
        let py = |preload: Option<&Path>| {
            let mut cmd = Command::new("python3");
            cmd.args(["-c", script])
                .env("OTEL_MEMORY_SAMPLING_INTERVAL", "256");
            if let Some(lib) = preload {
                cmd.env("LD_PRELOAD", lib);
            }
            kit::run(&mut cmd).stdout
        };
        assert_eq!(py(Some(&lib)), py(None));
    }
}

#[test]
fn weights_add_up_to_the_bytes_each_thread_allocated() {
    let Some(_one) = bpf_test(&["clang-19", "bpftrace"]) else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let lib = common::build_preload(dir.path());
    let bin = build_c(dir.path(), "big_small");
    // A point every 64 KiB: ~16,000 samples, so ±10% is many deviations.
    let lib_path = lib.to_str().unwrap();
    let w = common::check_weights(
        &lib,
        &bin,
        &[
            ("LD_PRELOAD", lib_path),
            ("OTEL_MEMORY_SAMPLING_INTERVAL", "65536"),
        ],
        &["big", "small"],
    );
    let (big, small) = (w[0], w[1]);
    let ratio = big / small;
    assert!((2.7..3.3).contains(&ratio), "big : small = {ratio}");
}
