//! Test support shared by the integration tests of every symtrace crate:
//! storage backends (SQLite + directory, PostgreSQL + S3), a real
//! `symtrace-server` process, fixtures built with gcc/binutils, and the rule
//! that a missing tool fails under CI instead of skipping.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use serde_json::Value;

pub mod agent;
pub mod collector;
pub mod ebpf_profiler;
pub mod split;
pub mod stacks;
mod wait;

pub use wait::{wait_until, wait_until_ok};

/// The `symtrace-server` binary of this build: `SYMTRACE_SERVER_BIN`, or the
/// one beside the test executable's `deps/` directory (cargo builds it for
/// `cargo test --workspace`).
pub fn server_bin() -> PathBuf {
    if let Ok(bin) = std::env::var("SYMTRACE_SERVER_BIN") {
        return PathBuf::from(bin);
    }
    workspace_bin("symtrace-server")
}

/// A binary of this workspace, beside the test executable's `deps/`
/// directory (cargo builds every binary for `cargo test --workspace`).
pub fn workspace_bin(name: &str) -> PathBuf {
    let bin = target_dir().join(name);
    assert!(
        bin.exists(),
        "{} not built: run `cargo build -p {name}` (or `cargo test --workspace`)",
        bin.display()
    );
    bin
}

/// `target/debug` (or the profile's directory) of this test run.
pub fn target_dir() -> PathBuf {
    let exe = std::env::current_exe().expect("test executable path");
    exe.parent()
        .and_then(Path::parent)
        .expect("target directory")
        .to_owned()
}

/// The newest `libsymtrace_context-*.a` cargo built (symtrace-context's
/// staticlib: its `crate-type` includes it), for C programs that publish
/// trace contexts.
pub fn context_staticlib() -> PathBuf {
    let deps = target_dir().join("deps");
    std::fs::read_dir(&deps)
        .unwrap()
        .filter_map(|e| e.ok())
        .filter(|e| {
            let name = e.file_name().to_string_lossy().into_owned();
            name.starts_with("libsymtrace_context-") && name.ends_with(".a")
        })
        .max_by_key(|e| e.metadata().unwrap().modified().unwrap())
        .map(|e| e.path())
        .expect(
            "libsymtrace_context-*.a in target/*/deps (cargo builds symtrace-context's staticlib)",
        )
}

fn in_ci() -> bool {
    std::env::var("CI").is_ok_and(|v| !v.is_empty() && v != "0" && v != "false")
}

/// Records that the running test skips (part of) its work for `why`: on
/// stderr, and as a line `test-name<TAB>why` in `target/test-skips.txt`,
/// which scripts/test.sh counts into its summary (a skipped test still
/// reports "ok" to cargo).
pub fn skip(why: &str) {
    eprintln!("SKIP: {why}");
    let test = std::thread::current()
        .name()
        .unwrap_or("unnamed test")
        .to_owned();
    let log = Path::new(env!("CARGO_MANIFEST_DIR")).join("../target/test-skips.txt");
    if let Ok(mut f) = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(log)
    {
        use std::io::Write;
        let _ = writeln!(f, "{test}\t{why}");
    }
}

/// Whether something a test needs (root, a kernel feature) is there.
/// Missing under `CI=true` is a failure, not a skip.
pub fn require(available: bool, what: &str) -> bool {
    if !available {
        assert!(!in_ci(), "{what} is required in CI");
        skip(&format!("{what} is not available"));
    }
    available
}

/// Whether a tool is on PATH. Missing under `CI=true` is a failure, not a skip.
pub fn have(tool: &str) -> bool {
    let found = Command::new("sh")
        .arg("-c")
        .arg(format!("command -v {tool}"))
        .stdout(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    if !found {
        assert!(
            !in_ci(),
            "{tool} is required in CI (scripts/test-services.sh installs it)"
        );
        skip(&format!(
            "{tool} not installed (run scripts/test-services.sh)"
        ));
    }
    found
}

/// `prefix` followed by the pid and a per-process counter: a name no other
/// call or concurrent test run uses (databases, S3 prefixes).
pub fn unique(prefix: &str) -> String {
    static N: AtomicU32 = AtomicU32::new(0);
    format!(
        "{prefix}{}_{}_{}",
        std::process::id(),
        N.fetch_add(1, Ordering::SeqCst),
        Instant::now().elapsed().subsec_nanos() % 1000
    )
}

/// A TCP port on loopback no socket holds now (another process may take it
/// before the caller binds it).
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// Where a server keeps metadata and blobs.
#[derive(Clone, Debug)]
pub struct Backend {
    /// Label for test output: `sqlite+local` or `postgres+s3`.
    pub name: &'static str,
    database_url: Option<String>,
    storage_url: Option<String>,
    env: Vec<(String, String)>,
}

impl Backend {
    /// SQLite + a local directory (the embedded defaults).
    pub fn local() -> Self {
        Self {
            name: "sqlite+local",
            database_url: None,
            storage_url: None,
            env: vec![],
        }
    }

    /// A fresh PostgreSQL database and a fresh prefix in the S3 bucket, when
    /// the test services are configured (always under CI).
    pub fn postgres_s3() -> Option<Self> {
        let vars = [
            "SYMTRACE_TEST_POSTGRES_URL",
            "SYMTRACE_TEST_S3_ENDPOINT",
            "SYMTRACE_TEST_S3_BUCKET",
            "SYMTRACE_TEST_S3_ACCESS_KEY",
            "SYMTRACE_TEST_S3_SECRET_KEY",
        ];
        let values: Vec<Option<String>> = vars.iter().map(|v| std::env::var(v).ok()).collect();
        if values.iter().any(Option::is_none) {
            assert!(
                !in_ci(),
                "PostgreSQL/S3 test services are required in CI: set {vars:?}"
            );
            skip(&format!(
                "postgres+s3 backend: run scripts/test.sh (sets {vars:?})"
            ));
            return None;
        }
        let [admin, endpoint, bucket, access, secret] = <[Option<String>; 5]>::try_from(values)
            .unwrap()
            .map(Option::unwrap);
        let db = unique("symtrace_t_");
        let out = Command::new("psql")
            .args([admin.as_str(), "-qAtc", &format!("CREATE DATABASE {db}")])
            .output()
            .expect("run psql");
        assert!(
            out.status.success(),
            "create database: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let database_url = admin.replacen("/postgres?", &format!("/{db}?"), 1);
        Some(Self {
            name: "postgres+s3",
            database_url: Some(database_url),
            storage_url: Some(format!("s3://{bucket}/{}", unique("t"))),
            env: vec![
                ("AWS_ACCESS_KEY_ID".into(), access),
                ("AWS_SECRET_ACCESS_KEY".into(), secret),
                ("AWS_ENDPOINT_URL".into(), endpoint),
                ("AWS_ALLOW_HTTP".into(), "true".into()),
                ("AWS_REGION".into(), "us-east-1".into()),
            ],
        })
    }

    /// The PostgreSQL URL of this backend's own database (None for SQLite).
    pub fn database_url(&self) -> Option<&str> {
        self.database_url.as_deref()
    }

    /// Every configured combination: the local one, and PostgreSQL + S3.
    pub fn all() -> Vec<Self> {
        let mut v = vec![Self::local()];
        v.extend(Self::postgres_s3());
        v
    }
}

/// A running `symtrace-server`, killed on drop.
pub struct Server {
    child: Option<Child>,
    /// `http://host:port` of the HTTP listener.
    pub url: String,
    /// host:port of the OTLP gRPC listener.
    pub grpc_addr: String,
    /// The `--data-dir`, shared by servers started with [`Server::start_on`].
    pub data_dir: PathBuf,
    log: PathBuf,
    backend: Backend,
    args: Vec<String>,
    env: Vec<(String, String)>,
    _tmp: Option<tempfile::TempDir>,
}

impl Server {
    /// Starts a server on `backend` with the extra command-line `args`, on
    /// free local ports and a new temporary data directory, and waits until
    /// `/readyz` answers 200.
    pub fn start(backend: &Backend, args: &[&str]) -> Self {
        let tmp = tempfile::tempdir().unwrap();
        let data_dir = tmp.path().join("data");
        let mut server = Self {
            child: None,
            url: String::new(),
            grpc_addr: String::new(),
            log: tmp.path().join("server.log"),
            data_dir,
            backend: backend.clone(),
            args: args.iter().map(|s| s.to_string()).collect(),
            env: vec![],
            _tmp: Some(tmp),
        };
        server.spawn();
        server
    }

    /// Another process on the same data directory and backend (a new port),
    /// with extra environment variables.
    pub fn start_on(other: &Server, env: &[(&str, &str)]) -> Self {
        let tmp = tempfile::tempdir().unwrap();
        let mut server = Self {
            child: None,
            url: String::new(),
            grpc_addr: String::new(),
            log: tmp.path().join("server.log"),
            data_dir: other.data_dir.clone(),
            backend: other.backend.clone(),
            args: other.args.clone(),
            env: env
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
            _tmp: Some(tmp),
        };
        server.spawn();
        server
    }

    /// Starts the process (again, on the same data dir and port if known).
    pub fn spawn(&mut self) {
        let addr = if self.url.is_empty() {
            "127.0.0.1:0".to_owned()
        } else {
            self.url.trim_start_matches("http://").to_owned()
        };
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.log)
            .unwrap();
        let mut cmd = Command::new(server_bin());
        if !self.args.iter().any(|a| a == "--http-addr") {
            cmd.arg("--http-addr").arg(&addr);
        }
        if !self.args.iter().any(|a| a == "--grpc-addr") {
            let grpc = if self.grpc_addr.is_empty() {
                "127.0.0.1:0"
            } else {
                &self.grpc_addr
            };
            cmd.arg("--grpc-addr").arg(grpc);
        }
        cmd.arg("--data-dir").arg(&self.data_dir);
        assert!(
            !self.args.iter().any(|a| a == "--ready-file"),
            "the harness sets --ready-file itself"
        );
        let ready = self.log.with_extension("ready.json");
        let _ = std::fs::remove_file(&ready);
        cmd.arg("--ready-file").arg(&ready);
        if let Some(db) = &self.backend.database_url {
            cmd.arg("--database-url").arg(db);
        }
        if let Some(s) = &self.backend.storage_url {
            cmd.arg("--storage-url").arg(s);
        }
        cmd.args(&self.args);
        for (k, _) in std::env::vars() {
            if k.starts_with("SYMTRACE_") || k.starts_with("AWS_") || k.starts_with("DEBUGINFOD_") {
                cmd.env_remove(k);
            }
        }
        cmd.envs(self.backend.env.iter().map(|(k, v)| (k, v)));
        cmd.envs(self.env.iter().map(|(k, v)| (k, v)));
        cmd.env(
            "RUST_LOG",
            "info,symtrace_server=debug,symtrace_service=debug",
        );
        cmd.env("NO_COLOR", "1");
        let child = cmd
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("spawn symtrace-server");
        self.child = Some(child);
        let deadline = Instant::now() + Duration::from_secs(60);
        // The bound addresses, from the file the server writes once both
        // listeners are bound (never from its log).
        loop {
            if let Ok(text) = std::fs::read_to_string(&ready) {
                let v: Value = serde_json::from_str(&text)
                    .unwrap_or_else(|e| panic!("ready file {text:?}: {e}"));
                self.url = format!("http://{}", v["http"].as_str().expect("http address"));
                self.grpc_addr = v["grpc"].as_str().expect("grpc address").to_owned();
                break;
            }
            if let Some(status) = self.child.as_mut().unwrap().try_wait().unwrap() {
                panic!(
                    "server exited with {status} during start-up:\n{}",
                    self.log_text()
                );
            }
            assert!(
                Instant::now() < deadline,
                "server did not start:\n{}",
                self.log_text()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        let http = client();
        loop {
            if http
                .get(format!("{}/readyz", self.url))
                .send()
                .is_ok_and(|r| r.status() == 200)
            {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "server not ready:\n{}",
                self.log_text()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// The server process's pid (to signal it).
    pub fn pid(&self) -> u32 {
        self.child.as_ref().expect("running").id()
    }

    /// Everything the server has logged (its stderr) so far.
    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// SIGKILL, as a crash.
    pub fn kill9(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// GETs `path` (e.g. `/metrics`); panics if no response arrives.
    pub fn get(&self, path: &str) -> reqwest::blocking::Response {
        client().get(format!("{}{path}", self.url)).send().unwrap()
    }

    /// PUTs a file's contents to `path`; returns as [`json_of`].
    pub fn put_file(&self, path: &str, file: &Path) -> (u16, Value) {
        self.put_bytes(path, std::fs::read(file).unwrap(), None)
    }

    /// PUTs `body` to `path`, with `token` as bearer token if given;
    /// returns as [`json_of`].
    pub fn put_bytes(&self, path: &str, body: Vec<u8>, token: Option<&str>) -> (u16, Value) {
        let mut req = client().put(format!("{}{path}", self.url)).body(body);
        if let Some(t) = token {
            req = req.bearer_auth(t);
        }
        json_of(req.send().unwrap())
    }

    /// Uploads an artifact and checks it was accepted.
    pub fn upload(&self, build_id: &str, kind: &str, file: &Path) -> Value {
        let (status, body) = self.put_file(&format!("/api/v1/debuginfo/{build_id}/{kind}"), file);
        assert!(
            status == 200 || status == 201,
            "upload {kind}: {status} {body}"
        );
        body
    }

    /// Uploads a source file for `build_id` under its own path (as the
    /// DWARF names it) and checks it was accepted.
    pub fn upload_source(&self, build_id: &str, path: &Path) -> Value {
        let url = format!(
            "/api/v1/debuginfo/{build_id}/source{}",
            escape_path(&path.display().to_string())
        );
        let (status, body) = self.put_file(&url, path);
        assert!(
            status == 200 || status == 201,
            "upload source {}: {status} {body}",
            path.display()
        );
        body
    }

    /// Runs a debuginfod client against this server with a private cache.
    pub fn debuginfod_find(&self, cache: &Path, args: &[&str]) -> Output {
        Command::new("debuginfod-find")
            .args(args)
            .env("DEBUGINFOD_URLS", &self.url)
            .env("DEBUGINFOD_CACHE_PATH", cache)
            .env_remove("DEBUGINFOD_PROGRESS")
            .output()
            .expect("run debuginfod-find")
    }

    /// Fetches with `debuginfod-find` (private cache), asserting success;
    /// returns the fetched file's bytes.
    pub fn debuginfod_fetch(&self, cache: &Path, args: &[&str]) -> Vec<u8> {
        let out = self.debuginfod_find(cache, args);
        assert!(
            out.status.success(),
            "debuginfod-find {args:?}: {:?}",
            stderr_lines(&out)
        );
        let path = String::from_utf8(out.stdout).expect("a path");
        std::fs::read(path.trim()).expect("the fetched file")
    }

    /// A counter from /metrics with all the given label pairs (summed).
    pub fn metric(&self, name: &str, labels: &[(&str, &str)]) -> f64 {
        let text = self.get("/metrics").text().unwrap();
        text.lines()
            .filter(|l| l.starts_with(name) && !l.starts_with('#'))
            .filter(|l| {
                labels
                    .iter()
                    .all(|(k, v)| l.contains(&format!("{k}=\"{v}\"")))
            })
            .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
            .sum()
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.kill9();
        if std::thread::panicking() {
            eprintln!("---- server log ----\n{}", self.log_text());
        }
    }
}

/// The lines of a folded flamegraph (`frame;frame;… value`) as (stack,
/// value) pairs; panics on a line without a value.
pub fn folded<T: std::str::FromStr>(text: &str) -> Vec<(String, T)>
where
    T::Err: std::fmt::Debug,
{
    text.lines()
        .map(|l| {
            let (frames, n) = l
                .rsplit_once(' ')
                .unwrap_or_else(|| panic!("no value in {l:?}"));
            (frames.to_owned(), n.parse().unwrap())
        })
        .collect()
}

/// A blocking HTTP client with a 60 s timeout that ignores proxy settings.
pub fn client() -> reqwest::blocking::Client {
    reqwest::blocking::Client::builder()
        .timeout(Duration::from_secs(60))
        .no_proxy()
        .build()
        .unwrap()
}

/// The status and the body as JSON (a JSON string when the body is not
/// JSON).
pub fn json_of(resp: reqwest::blocking::Response) -> (u16, Value) {
    let status = resp.status().as_u16();
    let text = resp.text().unwrap();
    (
        status,
        serde_json::from_str(&text).unwrap_or(Value::String(text)),
    )
}

/// Asserts a JSON error body with a code and a message containing `needle`.
pub fn assert_error(status: u16, body: &Value, want_status: u16, needle: &str) {
    assert_eq!(status, want_status, "{body}");
    let message = body["error"]["message"].as_str().unwrap_or_default();
    assert!(body["error"]["code"].is_string(), "no error code in {body}");
    assert!(
        message.contains(needle),
        "message {message:?} should mention {needle:?}"
    );
}

/// Runs `cmd` and returns its output; panics with its stdout and stderr
/// unless it exits successfully.
pub fn run(cmd: &mut Command) -> Output {
    let out = cmd.output().unwrap_or_else(|e| panic!("{cmd:?}: {e}"));
    assert!(
        out.status.success(),
        "{cmd:?} failed: {}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

/// `BIN --help`: the text clap writes, flags with their `[env: …]` twins.
pub fn help_of(bin: &Path) -> String {
    let out = run(Command::new(bin).arg("--help"));
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Whether clap's `--help` text lists `var` as a flag's environment twin
/// (`[env: VAR=]`, or `[env: VAR]` for flags without a default).
pub fn is_env_flag(help: &str, var: &str) -> bool {
    help.contains(&format!("env: {var}=")) || help.contains(&format!("env: {var}]"))
}

/// The words of `text` (a manifest, a compose file) that start with
/// `prefix`, such as `SYMTRACE_`.
pub fn words_with_prefix<'a>(text: &'a str, prefix: &str) -> Vec<&'a str> {
    text.split(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
        .filter(|w| w.starts_with(prefix))
        .collect()
}

/// A C program built with DWARF and split like distributions do.
pub struct Fixture {
    /// The temporary directory holding sources and outputs (removed on drop).
    pub dir: tempfile::TempDir,
    /// The directory the sources are in and gcc ran in.
    pub src: PathBuf,
    /// GNU build-ID, lowercase hex.
    pub build_id: String,
    /// As linked, with DWARF.
    pub unstripped: PathBuf,
    /// `objcopy --only-keep-debug`.
    pub debug: PathBuf,
    /// `strip --strip-debug --strip-unneeded` + `--add-gnu-debuglink`.
    pub stripped: PathBuf,
    /// The source files, by absolute path: the `.c` file and `util.h`.
    pub sources: Vec<PathBuf>,
}

/// The fixture's C source: `main` prints the result of [`UTIL_H`]'s `add`.
pub const HELLO_C: &str = "#include <stdio.h>\n#include \"util.h\"\n\nint main(int argc, char **argv)\n{\n  int n = add(argc, 41);\n  printf(\"hello, debuginfod: %d\\n\", n);\n  return 0;\n}\n";
/// The fixture's `util.h`: a `static inline` `add`.
pub const UTIL_H: &str = "static inline int add(int a, int b) { return a + b; }\n";

impl Fixture {
    /// hello.c + util.h (the reference recipe), in `src_subdir` of a new
    /// temporary directory, built with `extra_cflags`.
    pub fn hello(src_subdir: &str, c_name: &str, extra_cflags: &[&str]) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let src = dir.path().join(src_subdir);
        std::fs::create_dir_all(&src).unwrap();
        let c = src.join(c_name);
        std::fs::write(&c, HELLO_C).unwrap();
        std::fs::write(src.join("util.h"), UTIL_H).unwrap();
        let out = dir.path().join("out");
        std::fs::create_dir_all(&out).unwrap();
        let unstripped = out.join("hello");
        run(Command::new("gcc")
            .current_dir(&src)
            .args(["-O0", "-Wl,--build-id"])
            .args(extra_cflags)
            .arg("-o")
            .arg(&unstripped)
            .arg(c_name));
        let debug = out.join("hello.debug");
        let stripped = out.join("hello.stripped");
        run(Command::new("objcopy")
            .arg("--only-keep-debug")
            .arg(&unstripped)
            .arg(&debug));
        run(Command::new("strip")
            .args(["--strip-debug", "--strip-unneeded", "-o"])
            .arg(&stripped)
            .arg(&unstripped));
        run(Command::new("objcopy")
            .arg(format!("--add-gnu-debuglink={}", debug.display()))
            .arg(&stripped));
        let build_id = build_id_of(&unstripped);
        Self {
            sources: vec![c, src.join("util.h")],
            dir,
            src,
            build_id,
            unstripped,
            debug,
            stripped,
        }
    }

    /// Uploads debuginfo, stripped executable and sources.
    pub fn publish(&self, server: &Server) {
        server.upload(&self.build_id, "debuginfo", &self.debug);
        server.upload(&self.build_id, "executable", &self.stripped);
        for s in &self.sources {
            server.upload_source(&self.build_id, s);
        }
    }
}

/// A file's GNU build-ID as `readelf -n` prints it (lowercase hex);
/// panics when it has none.
pub fn build_id_of(file: &Path) -> String {
    let out = run(Command::new("readelf").arg("-n").arg(file));
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .find_map(|l| {
            l.trim()
                .strip_prefix("Build ID: ")
                .map(|s| s.trim().to_owned())
        })
        .expect("build-id note")
}

/// Raw bytes of a section, as binutils sees them.
pub fn section_bytes(file: &Path, section: &str) -> Vec<u8> {
    let dir = tempfile::tempdir().unwrap();
    let dump = dir.path().join("dump");
    run(Command::new("objcopy")
        .arg(format!("--dump-section={section}={}", dump.display()))
        .arg(file)
        .arg(dir.path().join("scratch")));
    std::fs::read(dump).unwrap()
}

/// Lines of a child's stderr, for diagnostics.
pub fn stderr_lines(out: &Output) -> Vec<String> {
    BufReader::new(&out.stderr[..])
        .lines()
        .map_while(Result::ok)
        .collect()
}

pub use symtrace_elf::escape_path;

/// Sends one HTTP/1.1 request exactly as written (no URL normalisation,
/// unlike reqwest, which resolves `..`), and reads the reply.
pub fn raw_request(server: &Server, method: &str, path: &str, body: &[u8]) -> (u16, Value) {
    use std::io::{Read, Write};
    let addr = server.url.trim_start_matches("http://");
    let mut s = std::net::TcpStream::connect(addr).unwrap();
    write!(
        s,
        "{method} {path} HTTP/1.1\r\nHost: {addr}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    )
    .unwrap();
    s.write_all(body).unwrap();
    let mut reply = Vec::new();
    s.read_to_end(&mut reply).unwrap();
    let text = String::from_utf8_lossy(&reply).into_owned();
    let status: u16 = text
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .expect("status line");
    let body = text.split_once("\r\n\r\n").map(|(_, b)| b).unwrap_or("");
    (
        status,
        serde_json::from_str(body).unwrap_or(Value::String(body.to_owned())),
    )
}

/// Runs gdb in batch mode on `exe` with `commands`; debuginfod is on when
/// `debuginfod_url` is given (with a private cache). Returns stdout+stderr.
pub fn gdb_batch(
    exe: &Path,
    commands: &[&str],
    debuginfod_url: Option<&str>,
    env: &[(&str, &str)],
) -> String {
    let cache = tempfile::tempdir().unwrap();
    let mut cmd = Command::new("gdb");
    let setting = if debuginfod_url.is_some() {
        "set debuginfod enabled on"
    } else {
        "set debuginfod enabled off"
    };
    cmd.args(["-q", "-nx", "-batch", "-iex", setting]);
    for c in commands {
        cmd.args(["-ex", c]);
    }
    cmd.arg(exe)
        .env("DEBUGINFOD_CACHE_PATH", cache.path())
        .env("HOME", cache.path())
        .envs(env.iter().copied());
    match debuginfod_url {
        Some(url) => cmd.env("DEBUGINFOD_URLS", url),
        None => cmd.env_remove("DEBUGINFOD_URLS"),
    };
    let out = cmd.output().expect("run gdb");
    format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
    .replace('\r', "\n")
}

/// Starts a `PUT` of `body` to `path` declaring its full length, sends only
/// `fraction` of it, and returns the open connection (drop it to cut it).
pub fn partial_upload(
    server: &Server,
    path: &str,
    body: &[u8],
    fraction: f64,
) -> std::net::TcpStream {
    use std::io::Write;
    let addr = server.url.trim_start_matches("http://");
    let mut stream = std::net::TcpStream::connect(addr).unwrap();
    write!(
        stream,
        "PUT {path} HTTP/1.1\r\nHost: {addr}\r\nContent-Length: {}\r\n\r\n",
        body.len()
    )
    .unwrap();
    stream
        .write_all(&body[..(body.len() as f64 * fraction) as usize])
        .unwrap();
    stream.flush().unwrap();
    stream
}

/// Whether the server's spool, where an upload's body is written as it
/// arrives, holds no file.
pub fn spool_is_empty(server: &Server) -> bool {
    std::fs::read_dir(server.data_dir.join("spool")).map_or(true, |mut d| d.next().is_none())
}

/// Waits until the server spools what [`partial_upload`] sent (the body's
/// first bytes are the server's).
pub fn wait_until_spooled(server: &Server) {
    wait_until(
        "the body's first bytes spooled",
        Duration::from_secs(30),
        || (!spool_is_empty(server)).then_some(()),
    );
}

/// Regular files below `dir` (0 when it does not exist): how many objects a
/// local blob store holds.
pub fn count_files(dir: &Path) -> usize {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return 0;
    };
    entries
        .flatten()
        .map(|e| {
            let path = e.path();
            if path.is_dir() {
                count_files(&path)
            } else {
                1
            }
        })
        .sum()
}

/// The Python with PyPI's opentelemetry-proto and grpcio (the independent
/// OTLP client), from SYMTRACE_TEST_PYTHON. Missing under `CI=true` is a
/// failure.
pub fn python() -> Option<PathBuf> {
    let found = std::env::var_os("SYMTRACE_TEST_PYTHON")
        .map(PathBuf::from)
        .filter(|p| p.exists());
    if found.is_none() {
        assert!(
            !in_ci(),
            "SYMTRACE_TEST_PYTHON is required in CI (scripts/test-services.sh sets it)"
        );
        skip("no SYMTRACE_TEST_PYTHON (run scripts/test.sh)");
    }
    found
}

/// The independent OTLP client script.
pub fn otlp_client_script() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../server/tests/python/otlp_client.py")
}

/// `node_modules` with npm's playwright-core and pprof-format (the UI test's
/// browser driver and the independent pprof reader), from
/// SYMTRACE_TEST_NODE_MODULES. Missing under `CI=true` is a failure.
pub fn node_modules() -> Option<PathBuf> {
    let found = std::env::var_os("SYMTRACE_TEST_NODE_MODULES")
        .map(PathBuf::from)
        .filter(|p| p.join("playwright-core").exists() && p.join("pprof-format").exists());
    if found.is_none() {
        assert!(
            !in_ci(),
            "SYMTRACE_TEST_NODE_MODULES is required in CI (scripts/test-services.sh sets it)"
        );
        skip("no SYMTRACE_TEST_NODE_MODULES (run scripts/test.sh)");
    }
    found
}

/// A `node` command running one of `server/tests/js/`, with `modules` on
/// NODE_PATH.
pub fn node_script(modules: &Path, script: &str) -> Command {
    let mut cmd = Command::new("node");
    cmd.arg(
        Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../server/tests/js")
            .join(script),
    )
    .env("NODE_PATH", modules);
    cmd
}

/// Where tests leave artefacts worth keeping (screenshots): target/test-artifacts.
pub fn artifacts_dir() -> PathBuf {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../target/test-artifacts");
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// Waits for `child` to end and returns its exit status and the CPU
/// seconds (user + system) it used in all, read from its zombie before it
/// is reaped: what a workload that runs by the clock really got, on a busy
/// machine less than its wall time.
pub fn wait_with_cpu(child: &mut std::process::Child) -> (std::process::ExitStatus, f64) {
    let pid = child.id();
    loop {
        // SAFETY: an all-zero siginfo_t is valid; waitid writes into it.
        let mut info: libc::siginfo_t = unsafe { std::mem::zeroed() };
        // SAFETY: `info` is a valid out-pointer; WNOWAIT leaves the child
        // a zombie, so its /proc entry (and times) stay until `wait`.
        let r = unsafe { libc::waitid(libc::P_PID, pid, &mut info, libc::WEXITED | libc::WNOWAIT) };
        if r == 0 {
            break;
        }
        let e = std::io::Error::last_os_error();
        assert_eq!(
            e.kind(),
            std::io::ErrorKind::Interrupted,
            "waitid {pid}: {e}"
        );
    }
    let cpu = process_cpu_seconds(pid);
    (child.wait().unwrap(), cpu)
}

/// CPU seconds (user + system) process `pid` has used so far.
pub fn process_cpu_seconds(pid: u32) -> f64 {
    cpu_seconds_of(&format!("/proc/{pid}/stat"))
}

/// CPU seconds (user + system) thread `tid` of process `pid` has used so
/// far: what a span entered on that thread can be charged at most (the
/// process's other threads — a runtime's collector and compiler — run
/// outside it, and take a larger share of a process a busy machine
/// starves).
pub fn thread_cpu_seconds(pid: u32, tid: u32) -> f64 {
    cpu_seconds_of(&format!("/proc/{pid}/task/{tid}/stat"))
}

fn cpu_seconds_of(path: &str) -> f64 {
    let stat = std::fs::read_to_string(path).unwrap();
    // The fields after the command (which may hold spaces and parentheses):
    // utime is the 14th field, stime the 15th, in clock ticks.
    let rest = &stat[stat.rfind(')').unwrap() + 2..];
    let fields: Vec<&str> = rest.split(' ').collect();
    let ticks: f64 = fields[11].parse::<f64>().unwrap() + fields[12].parse::<f64>().unwrap();
    // SAFETY: sysconf has no memory preconditions.
    ticks / unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as f64
}

/// A child process killed (and reaped) when dropped: a workload a test
/// stops once what it checks has happened, or on its way out of a failure.
pub struct Killed(pub std::process::Child);

impl Drop for Killed {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}
