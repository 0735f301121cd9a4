//! Durability proven, not assumed: the order of the syscalls that make an
//! upload and an export durable, seen by strace; a damaged local blob is
//! never trusted for its name; an upload whose claimed blob the collector
//! took meanwhile is stored again, not committed without its object.

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use prost::Message;

use crate::support::*;

/// The stored object of a blob in a local store.
fn blob_path(server: &Server, sha256: &str) -> std::path::PathBuf {
    server
        .data_dir
        .join("objects/blobs")
        .join(&sha256[..2])
        .join(sha256)
}

#[test]
fn a_damaged_local_blob_of_the_right_size_is_replaced_not_trusted() {
    let server = Server::start(&Backend::local(), &[]);
    let fixture = Fixture::hello("src", "hello.c", &["-g"]);
    let uploaded = server.upload(&fixture.build_id, "debuginfo", &fixture.debug);
    let sha = uploaded["sha256"].as_str().unwrap().to_owned();
    let good = std::fs::read(&fixture.debug).unwrap();
    let object = blob_path(&server, &sha);
    assert_eq!(std::fs::read(&object).unwrap(), good);
    // The artifact goes (its blob stays until collected) and the object is
    // damaged in place: same size, other bytes.
    let resp = client()
        .delete(format!(
            "{}/api/v1/debuginfo/{}/debuginfo",
            server.url, fixture.build_id
        ))
        .send()
        .unwrap();
    assert!(resp.status().is_success(), "{:?}", resp.text());
    std::fs::write(&object, vec![0x5a; good.len()]).unwrap();
    // The same file uploaded again must not be "already stored".
    let again = server.upload(&fixture.build_id, "debuginfo", &fixture.debug);
    assert_eq!(again["sha256"], sha.as_str());
    assert_eq!(
        std::fs::read(&object).unwrap(),
        good,
        "the damaged object was kept"
    );
    let cache = tempfile::tempdir().unwrap();
    let fetched = server.debuginfod_fetch(cache.path(), &["debuginfo", &fixture.build_id]);
    assert_eq!(fetched, good);
    assert!(server.log_text().contains("replacing a damaged local blob"));
}

#[test]
fn an_upload_whose_claimed_blob_is_collected_meanwhile_is_stored_again() {
    // The collector runs every second with no grace, and the upload pauses
    // between writing its object and committing its row: the collector
    // takes the (still unreferenced) blob in between.
    let base = Server::start(
        &Backend::local(),
        &["--gc-interval", "1", "--gc-grace", "0"],
    );
    // (`base` owns the data directory: it lives as long as the test.)
    let server = Server::start_on(&base, &[("SYMTRACE_PAUSE_AT", "after_blob_put:3500")]);
    let fixture = Fixture::hello("src", "hello.c", &["-g"]);
    let uploaded = server.upload(&fixture.build_id, "debuginfo", &fixture.debug);
    let sha = uploaded["sha256"].as_str().unwrap().to_owned();
    let log = server.log_text();
    assert!(log.contains("SYMTRACE_PAUSE_AT: pausing"), "{log}");
    assert!(
        log.contains("orphan collection"),
        "the collector did not run:\n{log}"
    );
    // Committed with its object: the file is served, and stays — through
    // two more passes of the collector (every second).
    let passes = |log: &str| log.matches("orphan collection").count();
    let after = passes(&server.log_text());
    wait_until(
        "two more passes of the orphan collector",
        Duration::from_secs(30),
        || (passes(&server.log_text()) >= after + 2).then_some(()),
    );
    assert!(
        blob_path(&server, &sha).exists(),
        "committed without its object"
    );
    let cache = tempfile::tempdir().unwrap();
    let fetched = server.debuginfod_fetch(cache.path(), &["debuginfo", &fixture.build_id]);
    assert_eq!(fetched, std::fs::read(&fixture.debug).unwrap());
}

/// The traced syscalls, one a line, in the order they happened.
fn syscalls(log: &Path) -> Vec<String> {
    std::fs::read_to_string(log)
        .unwrap()
        .lines()
        .map(str::to_owned)
        .collect()
}

fn position(lines: &[String], what: &str, pred: impl Fn(&str) -> bool) -> usize {
    lines
        .iter()
        .position(|l| pred(l))
        .unwrap_or_else(|| panic!("no {what} in the trace:\n{}", lines.join("\n")))
}

/// strace and the server it traces: both killed when dropped, the server
/// first (killing strace alone leaves its tracee running, detached: the
/// server outlived the test run).
struct Traced(std::process::Child);

impl Traced {
    fn stop(&mut self) {
        let pid = self.0.id();
        let children = std::fs::read_to_string(format!("/proc/{pid}/task/{pid}/children"));
        for child in children.unwrap_or_default().split_whitespace() {
            if let Ok(child) = child.parse::<i32>() {
                // SAFETY: kill has no memory preconditions.
                unsafe { libc::kill(child, libc::SIGKILL) };
            }
        }
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

impl Drop for Traced {
    fn drop(&mut self) {
        self.stop();
    }
}

#[test]
fn acknowledged_writes_are_synced_before_the_answer_is_written() {
    if !have("strace") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let trace = dir.path().join("strace.log");
    let stderr = dir.path().join("server.log");
    let child = Command::new("strace")
        .args(["-f", "-qq", "-y", "-s", "40", "-o"])
        .arg(&trace)
        .args([
            "-e",
            "trace=fsync,fdatasync,link,linkat,rename,renameat,renameat2,write,writev,sendto,sendmsg",
        ])
        .arg(server_bin())
        .args(["--http-addr", "127.0.0.1:0", "--grpc-addr", "127.0.0.1:0"])
        .arg("--data-dir")
        .arg(&data)
        .arg("--ready-file")
        .arg(dir.path().join("ready.json"))
        .env("RUST_LOG", "info")
        .env("NO_COLOR", "1")
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&stderr).unwrap())
        .spawn()
        .unwrap();
    let mut child = Traced(child);
    let deadline = Instant::now() + Duration::from_secs(60);
    let url = loop {
        if let Ok(text) = std::fs::read_to_string(dir.path().join("ready.json")) {
            let ready: serde_json::Value = serde_json::from_str(&text).unwrap();
            break format!("http://{}", ready["http"].as_str().unwrap());
        }
        let log = std::fs::read_to_string(&stderr).unwrap_or_default();
        assert!(Instant::now() < deadline, "server did not start:\n{log}");
        std::thread::sleep(Duration::from_millis(100));
    };
    let ready = Instant::now() + Duration::from_secs(30);
    while client()
        .get(format!("{url}/readyz"))
        .send()
        .map(|r| r.status())
        .ok()
        != Some(reqwest::StatusCode::OK)
    {
        assert!(Instant::now() < ready, "not ready");
        std::thread::sleep(Duration::from_millis(100));
    }
    // An upload, then an OTLP export.
    let fixture = Fixture::hello("src", "hello.c", &["-g"]);
    let resp = client()
        .put(format!(
            "{url}/api/v1/debuginfo/{}/debuginfo",
            fixture.build_id
        ))
        .body(std::fs::read(&fixture.debug).unwrap())
        .send()
        .unwrap();
    assert_eq!(resp.status(), 201, "{:?}", resp.text());
    let sha: String = resp.json::<serde_json::Value>().unwrap()["sha256"]
        .as_str()
        .unwrap()
        .to_owned();
    let export = super::hostile::deep_request("durable", 3, super::hostile::now_ns());
    let resp = client()
        .post(format!("{url}/v1development/profiles"))
        .header("Content-Type", "application/x-protobuf")
        .header("X-Scope-OrgID", "durable")
        .body(export.encode_to_vec())
        .send()
        .unwrap();
    assert_eq!(resp.status(), 200);
    child.stop();
    let lines = syscalls(&trace);

    // The upload: the spooled file synced, linked under its hash, the
    // directory synced, the database's WAL synced — then the 201.
    let answer = position(&lines, "the upload's 201", |l| {
        l.contains("HTTP/1.1 201") && (l.contains("TCP") || l.contains("socket"))
    });
    let link = position(&lines, "the blob link", |l| {
        (l.contains("link(") || l.contains("linkat(") || l.contains("rename"))
            && l.contains(&format!("blobs/{}/{sha}", &sha[..2]))
    });
    let before = &lines[..answer];
    assert!(link < answer, "the blob was linked after the answer");
    let file_sync = position(before, "the spooled file's fsync", |l| {
        (l.contains("fsync(") || l.contains("fdatasync(")) && l.contains("/spool/")
    });
    assert!(file_sync < link, "linked before the data was synced");
    let dir_sync = before[link..]
        .iter()
        .any(|l| l.contains("fsync(") && l.contains(&format!("objects/blobs/{}>", &sha[..2])));
    assert!(
        dir_sync,
        "the blob's directory was not synced before the answer"
    );
    let db_sync = before[link..]
        .iter()
        .any(|l| (l.contains("fsync(") || l.contains("fdatasync(")) && l.contains("symtrace.db"));
    assert!(db_sync, "the database was not synced before the answer");

    // The export: its segment synced and linked, the database synced, then
    // the 200.
    let answer = answer
        + position(&lines[answer..], "the export's 200", |l| {
            l.contains("HTTP/1.1 200") && (l.contains("TCP") || l.contains("socket"))
        });
    let since = &lines[link + 1..answer];
    let segment_link = since
        .iter()
        .rposition(|l| {
            (l.contains("linkat(") || l.contains("link(")) && l.contains("objects/blobs/")
        })
        .expect("the segment was linked before the answer");
    assert!(
        since[..segment_link]
            .iter()
            .any(|l| l.contains("fsync(") && l.contains("/spool/")),
        "the segment was linked before it was synced"
    );
    assert!(
        since[segment_link..].iter().any(
            |l| (l.contains("fsync(") || l.contains("fdatasync(")) && l.contains("symtrace.db")
        ),
        "the export was answered before the database was synced"
    );
}
