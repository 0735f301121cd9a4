//! The agent opens container files safely (issue #19): a process whose
//! mapped file's path, inside its root, is now a symlink out to the host; a
//! mapped file replaced by a FIFO; one truncated while mapped. The agent
//! (without CAP_SYS_ADMIN, as it runs: no /proc/PID/map_files) neither
//! follows, blocks nor crashes, and counts what it skipped.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use symtrace_testkit::agent::{bpf_test, number_after, Agent};
use symtrace_testkit::{self as kit, Backend, Server};

fn mapper(dir: &Path, name: &str, extra: &[&str]) -> PathBuf {
    let bin = dir.join(name);
    let source = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/workload/mapper.c");
    kit::run(
        Command::new("gcc")
            .args(["-O1", "-g", "-fno-omit-frame-pointer"])
            .args(extra)
            .arg(&source)
            .arg("-o")
            .arg(&bin),
    );
    bin
}

/// Starts a workload and waits for its "ready".
fn ready(mut cmd: Command) -> Child {
    let mut child = cmd
        .stdout(Stdio::piped())
        .stdin(Stdio::null())
        .spawn()
        .unwrap();
    let mut line = String::new();
    BufReader::new(child.stdout.as_mut().unwrap())
        .read_line(&mut line)
        .unwrap();
    assert_eq!(line.trim(), "ready", "the workload did not start");
    child
}

/// CPU seconds each of the test's processes burns: more than they can get
/// before the agent, started after them, samples them (its BPF programs'
/// verification shares the 2 CPUs with the three of them: 16 s in CI); they
/// are killed at the end.
const BURN: &str = "120";

#[test]
fn symlinks_out_of_a_container_fifos_and_truncated_files_are_skipped() {
    let Some(_one) = bpf_test(&["gcc", "capsh", "chroot"]) else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    // A host ELF with a build-ID of its own: what a naive open would read.
    let host_elf = mapper(dir.path(), "host-elf", &[]);
    let host_id = kit::build_id_of(&host_elf);

    // 1. A "container": a root with a static program at /app/prog. Once it
    // runs, /app/prog becomes a symlink to the host ELF's absolute path.
    let root = dir.path().join("root");
    std::fs::create_dir_all(root.join("app")).unwrap();
    let prog = mapper(&root.join("app"), "prog", &["-static"]);
    let mut contained = ready({
        let mut c = Command::new("chroot");
        c.arg(&root).args(["/app/prog", "-", BURN]);
        c.env("OTEL_SERVICE_NAME", kit::unique("contained-"));
        c
    });
    let contained_service = {
        let environ = std::fs::read(format!("/proc/{}/environ", contained.id())).unwrap();
        String::from_utf8_lossy(&environ)
            .split('\0')
            .find_map(|kv| kv.strip_prefix("OTEL_SERVICE_NAME=").map(str::to_owned))
            .unwrap()
    };
    std::fs::remove_file(&prog).unwrap();
    std::os::unix::fs::symlink(&host_elf, &prog).unwrap();

    // 2. A mapped file replaced by a FIFO at its path.
    let fifo_target = dir.path().join("lib-fifo.so");
    std::fs::copy(&host_elf, &fifo_target).unwrap();
    let mut fifo_proc = ready({
        let mut c = Command::new(&host_elf);
        c.args([fifo_target.to_str().unwrap(), BURN]);
        c
    });
    std::fs::remove_file(&fifo_target).unwrap();
    kit::run(Command::new("mkfifo").arg(&fifo_target));

    // 3. A mapped file truncated (same inode) while mapped.
    let truncated = dir.path().join("lib-truncated.so");
    std::fs::copy(&host_elf, &truncated).unwrap();
    let mut truncated_proc = ready({
        let mut c = Command::new(&host_elf);
        c.args([truncated.to_str().unwrap(), BURN]);
        c
    });
    std::fs::OpenOptions::new()
        .write(true)
        .open(&truncated)
        .unwrap()
        .set_len(64)
        .unwrap();

    // The agent without CAP_SYS_ADMIN and CAP_CHECKPOINT_RESTORE, started
    // now: it reads every running process's mappings at start.
    let wrapper = dir.path().join("agent-without-map-files");
    std::fs::write(
        &wrapper,
        format!(
            "#!/bin/sh\nexec capsh --drop=cap_sys_admin,cap_checkpoint_restore -- -c 'exec \"$0\" \"$@\"' {} \"$@\"\n",
            env!("CARGO_BIN_EXE_symtrace-agent")
        ),
    )
    .unwrap();
    kit::run(Command::new("chmod").arg("755").arg(&wrapper));
    let server = Server::start(&Backend::local(), &[]);
    let mut agent = Agent::start(&wrapper, &server.grpc_addr, &[]);

    // It keeps sampling (no open blocked) and exports the contained
    // process's samples without the host file's build-ID.
    let deadline = Instant::now() + Duration::from_secs(30);
    let samples = loop {
        let (status, body) = kit::json_of(server.get(&format!(
            "/api/v1/profiles/samples?service={contained_service}&limit=50"
        )));
        if status == 200 && body["samples"].as_array().is_some_and(|s| !s.is_empty()) {
            break body;
        }
        assert!(
            Instant::now() < deadline,
            "no samples of the contained process: {}",
            agent.stderr()
        );
        std::thread::sleep(Duration::from_millis(500));
    };
    assert!(
        !samples.to_string().contains(&host_id),
        "the host file was read: {samples}"
    );
    // Its stats go on (the agent is not blocked) and count each file it
    // would not read.
    let skipped_all = |stats: &str| {
        number_after(stats, "Unreachable") >= 1
            && number_after(stats, "NotRegular") >= 1
            && number_after(stats, "Unparsable") >= 1
    };
    let stats = kit::wait_until_ok(Duration::from_secs(30), || {
        let stats = agent.last_line("stats:").unwrap_or_default();
        if skipped_all(&stats) {
            Ok(stats)
        } else {
            Err(stats)
        }
    });
    let stats = stats.unwrap_or_else(|stats| stats);
    assert!(
        number_after(&stats, "Unreachable") >= 1,
        "the symlink out: {stats}"
    );
    assert!(number_after(&stats, "NotRegular") >= 1, "the FIFO: {stats}");
    assert!(
        number_after(&stats, "Unparsable") >= 1,
        "the truncated file: {stats}"
    );
    for child in [&mut contained, &mut fifo_proc, &mut truncated_proc] {
        let _ = child.kill();
        let _ = child.wait();
    }
    assert!(agent.stop().success(), "{}", agent.stderr());
}
