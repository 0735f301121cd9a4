//! The agent on a hostile host (issue #37): processes of an unprivileged
//! user (uid 65534) do what any user can — run patched binaries, crafted
//! ELF files, JIT files full of moves, perf maps that are FIFOs, a
//! hundred-MB `/proc/PID/maps`, a dlopen/dlclose loop, binaries with fresh
//! build-IDs by the dozen, forgeries under a real build-ID — while a root
//! service runs beside them. The agent must keep sampling the service (at
//! least 90% of its CPU time × the frequency), stay within its memory
//! bound, name none of its frames from another process's file, and count
//! what it refused. Real agents with their BPF programs loaded, a real
//! server; root and BTF needed.

use std::io::{BufRead, BufReader, Read};
use std::os::unix::fs::PermissionsExt;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use symtrace_testkit::agent::{
    bpf_test, clang_with_frame_pointers, folded, number_after, samples_with, summary, wait_for,
    Agent,
};
use symtrace_testkit::{self as kit, Backend, Killed, Server};

const HZ: f64 = 97.0;
const NOBODY: u32 = 65534;
/// The agent's memory bound in the manifests (DaemonSet and compose).
const MANIFEST_MEMORY_BYTES: u64 = 384 << 20;

fn agent_bin() -> &'static Path {
    Path::new(env!("CARGO_BIN_EXE_symtrace-agent"))
}

/// A directory every user may read and enter (tempdirs are 0700).
fn open_dir() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o777)).unwrap();
    dir
}

/// tests/workload/hostile.c, built into `dir` (readable by everyone).
fn hostile_bin(dir: &Path) -> PathBuf {
    let bin = dir.join("hostile");
    let source = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/workload/hostile.c");
    clang_with_frame_pointers(&bin, &[source], &["-ldl"]);
    bin
}

/// A command run as the unprivileged user.
fn as_nobody(cmd: &mut Command) -> &mut Command {
    cmd.uid(NOBODY).gid(NOBODY).env("HOME", "/tmp")
}

/// The service that must keep its profile: `hostile burn SECONDS` as root.
struct Service {
    child: Child,
    name: String,
}

impl Service {
    fn start(bin: &Path, seconds: f64) -> Service {
        let name = kit::unique("root-svc-");
        let child = Command::new(bin)
            .args(["burn", &seconds.to_string()])
            .env("OTEL_SERVICE_NAME", &name)
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        Service { child, name }
    }

    /// Waits for it to end; its CPU seconds.
    fn cpu(mut self) -> (String, f64) {
        let mut out = String::new();
        self.child
            .stdout
            .take()
            .unwrap()
            .read_to_string(&mut out)
            .unwrap();
        assert!(self.child.wait().unwrap().success());
        let cpu = out
            .lines()
            .find_map(|l| l.strip_prefix("cpu ")?.split(' ').next()?.parse().ok())
            .unwrap_or_else(|| panic!("no cpu line: {out}"));
        (self.name, cpu)
    }
}

/// Total samples of `service` in the flamegraph.
fn total(server: &Server, service: &str) -> u64 {
    folded(server, service).iter().map(|(_, n)| n).sum()
}

/// Asserts that the service kept ≥ 90% of its CPU time × frequency,
/// waiting (up to 30 s) for the samples to arrive.
fn assert_kept(server: &Server, service: &str, cpu: f64, agent: &Agent) {
    let expected = cpu * HZ;
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut got = total(server, service);
    while (got as f64) < 0.9 * expected && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(500));
        got = total(server, service);
    }
    assert!(
        got as f64 >= 0.9 * expected,
        "{service} kept {got} samples of the {expected:.0} its {cpu:.2} CPU seconds at {HZ} Hz \
         give\n{}\nthe services: {}\n{}",
        summary(&folded(server, service)),
        server.get("/api/v1/services").text().unwrap_or_default(),
        agent.last_line("stats:").unwrap_or_default()
    );
}

/// The agent's peak resident memory so far (`VmHWM`), in bytes.
fn peak_rss(agent: &Agent) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{}/status", agent.pid())).unwrap();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        .unwrap()
        * 1024
}

/// The ELF section headers of `bytes`: (header offset, name).
fn sections(bytes: &[u8]) -> Vec<(usize, String)> {
    let u16_at = |at: usize| u16::from_le_bytes(bytes[at..at + 2].try_into().unwrap()) as usize;
    let u32_at = |at: usize| u32::from_le_bytes(bytes[at..at + 4].try_into().unwrap()) as usize;
    let u64_at = |at: usize| u64::from_le_bytes(bytes[at..at + 8].try_into().unwrap()) as usize;
    let (shoff, shentsize, shnum, shstrndx) =
        (u64_at(0x28), u16_at(0x3a), u16_at(0x3c), u16_at(0x3e));
    let strtab = u64_at(shoff + shstrndx * shentsize + 0x18);
    (0..shnum)
        .map(|i| {
            let at = shoff + i * shentsize;
            let name = strtab + u32_at(at);
            let end = bytes[name..].iter().position(|&b| b == 0).unwrap();
            (
                at,
                String::from_utf8_lossy(&bytes[name..name + end]).into_owned(),
            )
        })
        .collect()
}

/// A copy of `bin` whose `.eh_frame` and `.eh_frame_hdr` section sizes say
/// that together they are more than u64 can hold (the kernel and ld.so
/// never read section headers: it runs as before).
fn patched_section_sizes(bin: &Path, out: &Path) {
    let mut bytes = std::fs::read(bin).unwrap();
    for (at, name) in sections(&bytes) {
        let size = match name.as_str() {
            ".eh_frame" => u64::MAX - 0x10,
            ".eh_frame_hdr" => 0x40,
            _ => continue,
        };
        bytes[at + 0x20..at + 0x28].copy_from_slice(&size.to_le_bytes());
    }
    std::fs::write(out, bytes).unwrap();
    std::fs::set_permissions(out, std::fs::Permissions::from_mode(0o755)).unwrap();
}

/// A copy of `bin` with 1,024 more sections whose names all point into one
/// 64 MiB string table without a NUL (the agent's parser asked for each
/// name: the ELF reader's cache kept a copy per name).
fn string_table_bomb(bin: &Path, out: &Path) {
    let mut bytes = std::fs::read(bin).unwrap();
    let original = bytes.clone();
    let u16_at = |at: usize| u16::from_le_bytes(original[at..at + 2].try_into().unwrap()) as usize;
    let u64_at = |at: usize| u64::from_le_bytes(original[at..at + 8].try_into().unwrap()) as usize;
    let (shoff, shentsize, shnum) = (u64_at(0x28), u16_at(0x3a), u16_at(0x3c));
    let strtab_at = bytes.len();
    let strtab_size = 64usize << 20;
    bytes.resize(strtab_at + strtab_size, b'A');
    let new_shoff = bytes.len();
    // The original headers, then the string table's, then 1,024 more.
    bytes.extend_from_slice(&original[shoff..shoff + shnum * shentsize]);
    let mut header = vec![0u8; shentsize];
    header[4..8].copy_from_slice(&3u32.to_le_bytes()); // SHT_STRTAB
    header[0x18..0x20].copy_from_slice(&(strtab_at as u64).to_le_bytes());
    header[0x20..0x28].copy_from_slice(&(strtab_size as u64).to_le_bytes());
    let strtab_index = shnum;
    bytes.extend_from_slice(&header);
    for i in 0..1024u32 {
        let mut h = vec![0u8; shentsize];
        h[0..4].copy_from_slice(&(i * 61_440).to_le_bytes()); // sh_name
        h[4..8].copy_from_slice(&1u32.to_le_bytes()); // SHT_PROGBITS
        bytes.extend_from_slice(&h);
    }
    // The original sections' names are in the new table now: all 'A's.
    bytes[0x28..0x30].copy_from_slice(&(new_shoff as u64).to_le_bytes());
    bytes[0x3c..0x3e].copy_from_slice(&((shnum + 1025) as u16).to_le_bytes());
    bytes[0x3e..0x40].copy_from_slice(&(strtab_index as u16).to_le_bytes());
    std::fs::write(out, bytes).unwrap();
    std::fs::set_permissions(out, std::fs::Permissions::from_mode(0o755)).unwrap();
}

/// A copy of `bin` under a fresh GNU build-ID (its note's bytes changed).
fn fresh_build_id(bin: &Path, out: &Path, n: u32) {
    let mut bytes = std::fs::read(bin).unwrap();
    let id = kit::build_id_of(bin);
    let raw: Vec<u8> = (0..id.len() / 2)
        .map(|i| u8::from_str_radix(&id[2 * i..2 * i + 2], 16).unwrap())
        .collect();
    let at = bytes
        .windows(raw.len())
        .position(|w| w == raw.as_slice())
        .unwrap();
    bytes[at..at + 4].copy_from_slice(&n.to_le_bytes());
    std::fs::write(out, bytes).unwrap();
    std::fs::set_permissions(out, std::fs::Permissions::from_mode(0o755)).unwrap();
}

/// A 4 KiB file under `dir` at a path of at least `len` bytes (200-byte
/// directories), which anyone may map.
fn deep_file(dir: &Path, len: usize) -> PathBuf {
    let mut deep = dir.to_path_buf();
    while deep.as_os_str().len() < len {
        deep = deep.join("d".repeat(200));
    }
    std::fs::create_dir_all(&deep).unwrap();
    let mut p = deep.clone();
    while p != dir {
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o755)).unwrap();
        p = p.parent().unwrap().to_path_buf();
    }
    let file = deep.join("f");
    std::fs::write(&file, vec![0u8; 4096]).unwrap();
    std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o644)).unwrap();
    file
}

fn start_agent(server: &Server, extra: &[&str]) -> Agent {
    Agent::start(agent_bin(), &server.grpc_addr, extra)
}

/// `hostile` burns 6 s as nobody while a root service (`bin`) burns 5 s
/// beside it; the service keeps its samples, and the hostile copy runs.
fn burn_beside_a_service(server: &Server, agent: &Agent, hostile: &Path, bin: &Path) {
    let mut hostile = as_nobody(Command::new(hostile).args(["burn", "6"]))
        .stdout(Stdio::null())
        .spawn()
        .unwrap();
    let service = Service::start(bin, 5.0);
    let (name, cpu) = service.cpu();
    assert!(hostile.wait().unwrap().success(), "the hostile copy runs");
    assert_kept(server, &name, cpu, agent);
}

#[test]
fn a_binary_with_wrapping_section_sizes_stops_no_ones_profile() {
    let Some(_one) = bpf_test(&["clang-19"]) else {
        return;
    };
    let server = Server::start(&Backend::local(), &[]);
    let dir = open_dir();
    let bin = hostile_bin(dir.path());
    let patched = dir.path().join("patched");
    patched_section_sizes(&bin, &patched);
    let mut agent = start_agent(&server, &[]);
    burn_beside_a_service(&server, &agent, &patched, &bin);
    // The patched file's own frames are still exported (unnamed CFI only).
    assert!(agent.stop().success(), "{}", agent.stderr());
}

#[test]
fn binaries_offered_during_another_upload_are_published() {
    let Some(_one) = bpf_test(&["clang-19", "objcopy"]) else {
        return;
    };
    let server = Server::start(&Backend::local(), &[]);
    let dir = open_dir();
    let bin = hostile_bin(dir.path());
    // A large binary (16 MiB of padding: 8 s at the agent's default 2 MiB/s)
    // is sampled first; while it is sent, a service and a library loaded
    // with dlopen by another are sampled.
    let pad = dir.path().join("pad");
    std::fs::write(&pad, vec![9u8; 16 << 20]).unwrap();
    let big = dir.path().join("big");
    kit::run(
        Command::new("objcopy")
            .arg(format!("--add-section=.pad={}", pad.display()))
            .arg(&bin)
            .arg(&big),
    );
    let service = dir.path().join("service");
    fresh_build_id(&bin, &service, 0x5e57_1ce0);
    let mut agent = start_agent(&server, &["--upload-url", &server.url]);
    let mut first = Command::new(&big)
        .args(["burn", "12"])
        .stdout(Stdio::null())
        .spawn()
        .unwrap();
    let big_id = kit::build_id_of(&big);
    // Its upload under way: claimed by the agent.
    let deadline = Instant::now() + Duration::from_secs(30);
    while !agent.stderr().contains("binaries") && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(100));
    }
    // Its body arriving at the server.
    kit::wait_until_spooled(&server);
    // Both run until their files are published (or the deadline): the
    // agent opens a file while a process maps it, and beside a busy build
    // its sampler reads a new process seconds late — a service that ended
    // after 2 s was gone by then ("mapped file not read … Unreachable"),
    // and its file is offered again only when a new process samples it.
    let svc = Command::new(&service)
        .args(["burn", "90"])
        .stdout(Stdio::null())
        .spawn()
        .unwrap();
    let loader = Command::new(&bin)
        .args(["maps", "90", "/dev/null", "0"])
        .stdout(Stdio::null())
        .spawn()
        .unwrap();
    let (_svc, _loader) = (Killed(svc), Killed(loader));
    let libz = std::fs::canonicalize("/lib/x86_64-linux-gnu/libz.so.1").unwrap();
    let wanted = [kit::build_id_of(&service), kit::build_id_of(&libz)];
    let published = |id: &str| {
        server
            .get(&format!("/api/v1/debuginfo/{id}"))
            .status()
            .is_success()
    };
    let deadline = Instant::now() + Duration::from_secs(60);
    while !wanted.iter().all(|id| published(id)) && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(200));
    }
    let big_done = published(&big_id);
    first.kill().ok();
    first.wait().ok();
    for id in &wanted {
        assert!(
            published(id),
            "{id} not published (the large upload was {} done)\n{}",
            if big_done { "" } else { "not" },
            agent.stderr()
        );
    }
    agent.stop();
}

#[test]
fn a_crafted_string_table_costs_the_agent_no_memory() {
    let Some(_one) = bpf_test(&["clang-19"]) else {
        return;
    };
    let server = Server::start(&Backend::local(), &[]);
    let dir = open_dir();
    let bin = hostile_bin(dir.path());
    let bomb = dir.path().join("bomb");
    string_table_bomb(&bin, &bomb);
    let mut agent = start_agent(&server, &[]);
    burn_beside_a_service(&server, &agent, &bomb, &bin);
    let peak = peak_rss(&agent);
    assert!(
        peak < 256 << 20,
        "the agent's peak RSS is {} MiB",
        peak >> 20
    );
    assert!(agent.stop().success());
}

#[test]
fn jit_files_full_of_moves_and_a_fifo_perf_map_cost_nothing_else() {
    let Some(_one) = bpf_test(&["clang-19"]) else {
        return;
    };
    let server = Server::start(&Backend::local(), &[]);
    let dir = open_dir();
    let bin = hostile_bin(dir.path());
    let fifo = dir.path().join("fifo");
    let c = std::ffi::CString::new(fifo.to_str().unwrap()).unwrap();
    // SAFETY: mkfifo and chown read a NUL-terminated path.
    unsafe {
        assert_eq!(libc::mkfifo(c.as_ptr(), 0o666), 0);
        assert_eq!(libc::chown(c.as_ptr(), NOBODY, NOBODY), 0);
    }
    // A writer blocked on the FIFO wakes the moment anyone opens it to read.
    let opened = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let watcher = {
        let (fifo, opened) = (fifo.clone(), opened.clone());
        std::thread::spawn(move || {
            let _w = std::fs::OpenOptions::new().write(true).open(&fifo);
            opened.store(true, std::sync::atomic::Ordering::SeqCst);
        })
    };
    let mut agent = start_agent(&server, &[]);
    let mut hostile = as_nobody(Command::new(&bin).args([
        "jit",
        "8",
        dir.path().to_str().unwrap(),
        fifo.to_str().unwrap(),
    ]))
    .stdout(Stdio::piped())
    .spawn()
    .unwrap();
    let mut line = String::new();
    BufReader::new(hostile.stdout.as_mut().unwrap())
        .read_line(&mut line)
        .unwrap();
    assert!(line.starts_with("ready"), "{line}");
    let service = Service::start(&bin, 6.0);
    let (name, cpu) = service.cpu();
    hostile.wait().unwrap();
    assert_kept(&server, &name, cpu, &agent);
    assert!(
        !opened.load(std::sync::atomic::Ordering::SeqCst),
        "the agent opened a FIFO a process named as its perf map"
    );
    // Unblock the watcher.
    let _ = std::fs::File::open(&fifo);
    watcher.join().unwrap();
    let stats = agent.last_line("stats:").unwrap();
    assert!(
        number_after(&stats, "bad lines ") > 0,
        "moves refused: {stats}"
    );
    assert!(agent.stop().success());
}

#[test]
fn a_hundred_mb_of_maps_and_a_dlopen_loop_stall_nothing() {
    let Some(_one) = bpf_test(&["clang-19"]) else {
        return;
    };
    let server = Server::start(&Backend::local(), &[]);
    let dir = open_dir();
    let bin = hostile_bin(dir.path());
    // A file at a path of about 4 KiB: every line of its maps that long.
    let file = deep_file(dir.path(), 3900);
    let mut agent = start_agent(&server, &[]);
    let cpu_before = agent_cpu(&agent);
    let hashing_before = hashing_cpu(&agent);
    let mut hostile =
        as_nobody(Command::new(&bin).args(["maps", "8", file.to_str().unwrap(), "30000"]))
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
    let mut line = String::new();
    BufReader::new(hostile.stdout.as_mut().unwrap())
        .read_line(&mut line)
        .unwrap();
    let mapped: u64 = line.trim().strip_prefix("ready ").unwrap().parse().unwrap();
    assert!(mapped > 25_000, "{line}");
    let started = Instant::now();
    let service = Service::start(&bin, 6.0);
    let (name, cpu) = service.cpu();
    hostile.wait().unwrap();
    let wall = started.elapsed().as_secs_f64();
    assert_kept(&server, &name, cpu, &agent);
    // The agent spent little: not a core re-reading 120 MB of maps. (Its
    // one-off content hashes of the host's binaries, which it reports, are
    // not the hostile process's doing: beside a build, a gigabyte of them.)
    let hashing = hashing_cpu(&agent) - hashing_before;
    let spent = agent_cpu(&agent) - cpu_before - hashing;
    assert!(
        spent < 0.5 * wall,
        "the agent used {spent:.2} CPU seconds in {wall:.1} s beside {hashing:.2} s hashing\n{}",
        agent.last_line("stats:").unwrap_or_default()
    );
    let peak = peak_rss(&agent);
    assert!(peak < 256 << 20, "peak RSS {} MiB", peak >> 20);
    let stats = agent.last_line("stats:").unwrap();
    assert!(number_after(&stats, "maps truncated ") > 0, "{stats}");
    assert!(agent.stop().success());
}

/// The agent's CPU time so far (seconds).
fn agent_cpu(agent: &Agent) -> f64 {
    kit::process_cpu_seconds(agent.pid())
}

/// CPU seconds the agent says its content hashes took so far ("content
/// hashes N (M MiB, T ms CPU)" in its last stats line; 0 before one).
fn hashing_cpu(agent: &Agent) -> f64 {
    let Some(line) = agent.last_line("stats:") else {
        return 0.0;
    };
    let rest = &line[line.find("content hashes ").expect("content hashes")..];
    let from = rest.find("MiB, ").expect("MiB") + "MiB, ".len();
    let to = rest.find(" ms CPU").expect("ms CPU");
    rest[from..to].parse::<f64>().expect("hash CPU ms") / 1000.0
}

#[test]
fn fresh_build_ids_by_the_dozen_do_not_delay_a_real_service() {
    let Some(_one) = bpf_test(&["clang-19"]) else {
        return;
    };
    let server = Server::start(&Backend::local(), &[]);
    let dir = open_dir();
    let bin = hostile_bin(dir.path());
    let mut agent = start_agent(
        &server,
        &[
            "--upload-url",
            &server.url,
            "--upload-max-files-per-minute",
            "10",
        ],
    );
    // The user's 40 binaries, each with a build-ID never seen, each run.
    let copies: Vec<PathBuf> = (0..40u32)
        .map(|i| {
            let out = dir.path().join(format!("fresh-{i}"));
            fresh_build_id(&bin, &out, 0xbad0_0000 + i);
            out
        })
        .collect();
    let mut flood: Vec<Child> = Vec::new();
    for copy in &copies {
        flood.push(
            as_nobody(Command::new(copy).args(["burn", "0.3"]))
                .stdout(Stdio::null())
                .spawn()
                .unwrap(),
        );
    }
    // Then root's service, never published.
    let real = dir.path().join("real-service");
    fresh_build_id(&bin, &real, 0x600d_0001);
    let real_id = kit::build_id_of(&real);
    let mut svc = Command::new(&real)
        .args(["burn", "3"])
        .stdout(Stdio::null())
        .spawn()
        .unwrap();
    svc.wait().unwrap();
    for mut c in flood {
        c.wait().unwrap();
    }
    let deadline = Instant::now() + Duration::from_secs(60);
    while !server
        .get(&format!("/api/v1/debuginfo/{real_id}"))
        .status()
        .is_success()
    {
        assert!(
            Instant::now() < deadline,
            "the real service was not published\n{}",
            agent.stderr()
        );
        std::thread::sleep(Duration::from_millis(250));
    }
    // The user's files went within the host's budget (10 a minute, and
    // the real one had its turn among them).
    let (_, listed) = kit::json_of(server.get("/api/v1/debuginfo?limit=1000"));
    let published = listed["artifacts"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|a| {
            a["build_id"]
                .as_str()
                .is_some_and(|id| copies.iter().any(|c| kit::build_id_of(c) == id))
        })
        .count();
    assert!(published <= 12, "{published} of the user's files published");
    agent.stop();
}

#[test]
fn a_forgery_under_a_real_build_id_names_no_one_elses_frames() {
    let Some(_one) = bpf_test(&["clang-19", "objcopy", "gcc"]) else {
        return;
    };
    let server = Server::start(&Backend::local(), &[]);
    let dir = open_dir();
    let bin = hostile_bin(dir.path());
    // Root's service as a vendor ships it: a symbol table, no DWARF.
    let service = dir.path().join("vendor-svc");
    kit::run(
        Command::new("objcopy")
            .arg("--strip-debug")
            .arg(&bin)
            .arg(&service),
    );
    let id = kit::build_id_of(&service);
    // The user's forgery: its build-ID, DWARF, and functions of its own
    // spanning the same addresses.
    let forged_src = dir.path().join("forged.c");
    let mut text = String::new();
    for i in 0..64 {
        text.push_str(&format!(
            "__attribute__((noinline)) long FORGED_{i}(long n) {{ long s = 0; for (long k = 0; k < n; k++) s += k ^ {i}; return s; }}\n"
        ));
    }
    text.push_str("int main(void) { long s = 0; for (;;) { for (int i = 0; i < 64; i++) s += FORGED_1(1000000); if (s == 42) break; } return 0; }\n");
    std::fs::write(&forged_src, text).unwrap();
    let forged = dir.path().join("forged");
    kit::run(
        Command::new("gcc")
            .args(["-O0", "-g", "-fno-omit-frame-pointer"])
            .arg(format!("-Wl,--build-id=0x{id}"))
            .arg(&forged_src)
            .arg("-o")
            .arg(&forged),
    );
    std::fs::set_permissions(&forged, std::fs::Permissions::from_mode(0o755)).unwrap();
    let mut agent = start_agent(
        &server,
        &[
            "--upload-url",
            &server.url,
            "--upload-bytes-per-second",
            "268435456",
        ],
    );
    // The forgery runs first (its upload goes first), then the service.
    let mut forger = as_nobody(&mut Command::new(&forged))
        .env("OTEL_SERVICE_NAME", "forger")
        .spawn()
        .unwrap();
    kit::wait_until("the forgery published", Duration::from_secs(60), || {
        server
            .get(&format!("/api/v1/debuginfo/{id}"))
            .status()
            .is_success()
            .then_some(())
    });
    let name = kit::unique("vendor-");
    let mut svc = Command::new(&service)
        .args(["burn", "5"])
        .env("OTEL_SERVICE_NAME", &name)
        .stdout(Stdio::null())
        .spawn()
        .unwrap();
    svc.wait().unwrap();
    forger.kill().ok();
    forger.wait().ok();
    // Named by the service's own file, or by the forgery.
    let stacks = wait_for(&server, &name, |s| {
        samples_with(s, "burn_here") > 0 || s.iter().any(|(f, _)| f.contains("FORGED"))
    });
    assert!(
        samples_with(&stacks, "burn_here") > 0,
        "{}",
        summary(&stacks)
    );
    assert!(
        !stacks.iter().any(|(s, _)| s.contains("FORGED")),
        "a forged file named the service's frames:\n{}",
        summary(&stacks)
    );
    let forger_stacks = wait_for(&server, "forger", |s| samples_with(s, "FORGED_1") > 0);
    assert!(
        samples_with(&forger_stacks, "FORGED_1") > 0,
        "{}",
        summary(&forger_stacks)
    );
    agent.stop();
}

#[test]
fn a_dead_sampler_thread_ends_the_agent() {
    let Some(_one) = bpf_test(&[]) else {
        return;
    };
    let server = Server::start(&Backend::local(), &[]);
    let dir = tempfile::tempdir().unwrap();
    let err = dir.path().join("stderr");
    let mut child = Command::new(agent_bin())
        .args(["--server", &format!("http://{}", server.grpc_addr)])
        .args(["--interval", "1s", "--no-upload-binaries"])
        .env("SYMTRACE_AGENT_TEST_FAULT", "sampler-panic")
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&err).unwrap())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(60);
    let status = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break s;
        }
        assert!(Instant::now() < deadline, "the agent did not end");
        std::thread::sleep(Duration::from_millis(100));
    };
    let log = std::fs::read_to_string(&err).unwrap();
    assert!(!status.success(), "{status}: {log}");
    assert!(log.contains("the sampler thread panicked"), "{log}");
}

#[test]
fn the_liveness_endpoint_says_when_samples_stop() {
    let Some(_one) = bpf_test(&[]) else {
        return;
    };
    let server = Server::start(&Backend::local(), &[]);
    let mut agent = Agent::start(
        agent_bin(),
        &server.grpc_addr,
        &["--health-addr", "127.0.0.1:0", "--health-max-silence", "3s"],
    );
    let addr = agent.health_addr();
    let get = |path: &str| {
        kit::client()
            .get(format!("http://{addr}{path}"))
            .timeout(Duration::from_secs(5))
            .send()
            .map(|r| (r.status().as_u16(), r.text().unwrap_or_default()))
    };
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        if get("/healthz").is_ok_and(|(s, _)| s == 200) {
            break;
        }
        assert!(Instant::now() < deadline, "never healthy");
        std::thread::sleep(Duration::from_millis(200));
    }
    let (status, metrics) = get("/metrics").unwrap();
    assert_eq!(status, 200);
    // Filled at the first export.
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut metrics = metrics;
    while !metrics.contains("symtrace_agent_contained_total") {
        assert!(Instant::now() < deadline, "{metrics}");
        std::thread::sleep(Duration::from_millis(200));
        metrics = get("/metrics").unwrap().1;
    }
    assert!(metrics.contains("cause=\"over_budget\""), "{metrics}");
    agent.stop();

    // A sampler thread that stops going round: 503 after the silence.
    let mut stalled = {
        let dir = tempfile::tempdir().unwrap();
        let (out, err) = (dir.path().join("out"), dir.path().join("err"));
        let child = Command::new(agent_bin())
            .args(["--server", &format!("http://{}", server.grpc_addr)])
            .args(["--interval", "1s", "--no-upload-binaries"])
            .args(["--health-addr", "127.0.0.1:0", "--health-max-silence", "3s"])
            .env("SYMTRACE_AGENT_TEST_FAULT", "sampler-stall")
            .env("RUST_LOG", "info")
            .env("NO_COLOR", "1")
            .stdout(std::fs::File::create(&out).unwrap())
            .stderr(std::fs::File::create(&err).unwrap())
            .spawn()
            .unwrap();
        (child, dir, err)
    };
    let deadline = Instant::now() + Duration::from_secs(30);
    let addr = loop {
        let log = std::fs::read_to_string(&stalled.2).unwrap_or_default();
        if let Some(a) = log
            .lines()
            .find(|l| l.contains("serving /healthz"))
            .and_then(|l| l.split("addr=").nth(1))
        {
            break a.split_whitespace().next().unwrap().to_owned();
        }
        assert!(Instant::now() < deadline, "{log}");
        std::thread::sleep(Duration::from_millis(100));
    };
    let deadline = Instant::now() + Duration::from_secs(30);
    let why = loop {
        let resp = kit::client()
            .get(format!("http://{addr}/healthz"))
            .timeout(Duration::from_secs(5))
            .send()
            .unwrap();
        if resp.status() == 503 {
            break resp.text().unwrap();
        }
        assert!(Instant::now() < deadline, "never unhealthy");
        std::thread::sleep(Duration::from_millis(250));
    };
    assert!(why.contains("loop"), "{why}");
    let _ = stalled.0.kill();
    let _ = stalled.0.wait();
}

#[test]
fn every_hostile_process_at_once_and_the_service_keeps_its_profile() {
    let Some(_one) = bpf_test(&["clang-19"]) else {
        return;
    };
    let server = Server::start(&Backend::local(), &[]);
    let dir = open_dir();
    let bin = hostile_bin(dir.path());
    let (patched, bomb) = (dir.path().join("patched"), dir.path().join("bomb"));
    patched_section_sizes(&bin, &patched);
    string_table_bomb(&bin, &bomb);
    let file = deep_file(dir.path(), 3000);
    let mut agent = start_agent(&server, &["--upload-url", &server.url]);
    let dirs = dir.path().to_str().unwrap().to_owned();
    let file = file.to_str().unwrap().to_owned();
    let mut hostile: Vec<Child> = [
        vec![patched.to_str().unwrap(), "burn", "8"],
        vec![bomb.to_str().unwrap(), "burn", "8"],
        vec![bin.to_str().unwrap(), "jit", "8", &dirs],
        vec![bin.to_str().unwrap(), "maps", "8", &file, "20000"],
    ]
    .iter()
    .map(|args| {
        as_nobody(Command::new(args[0]).args(&args[1..]))
            .stdout(Stdio::null())
            .spawn()
            .unwrap()
    })
    .collect();
    let service = Service::start(&bin, 6.0);
    let (name, cpu) = service.cpu();
    for h in &mut hostile {
        h.wait().unwrap();
    }
    assert_kept(&server, &name, cpu, &agent);
    let peak = peak_rss(&agent);
    assert!(
        peak < MANIFEST_MEMORY_BYTES,
        "peak RSS {} MiB over the manifests' bound",
        peak >> 20
    );
    let stats = agent.last_line("stats:").unwrap();
    assert!(agent.stop().success(), "{stats}");
}
