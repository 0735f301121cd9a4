//! Federation: misses are fetched from upstream debuginfod servers (elfutils'
//! own server among them), validated, stored and served; concurrent requests
//! share one fetch; misses are remembered; loops stop at the hop limit.

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::support::*;

struct Elfutils(Child);

impl Drop for Elfutils {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[test]
fn misses_are_fetched_from_an_elfutils_upstream_and_kept() {
    if ![
        "gcc",
        "objcopy",
        "strip",
        "readelf",
        "debuginfod",
        "debuginfod-find",
    ]
    .iter()
    .all(|t| have(t))
    {
        return;
    }
    let fx = Fixture::hello("src", "hello.c", &["-g"]);
    let tree = fx.dir.path().join("F");
    std::fs::create_dir_all(&tree).unwrap();
    std::fs::copy(&fx.stripped, tree.join("hello")).unwrap();
    std::fs::copy(&fx.debug, tree.join("hello.debug")).unwrap();
    let port = free_port();
    let upstream_url = format!("http://127.0.0.1:{port}");
    let upstream = Elfutils(
        Command::new("debuginfod")
            .args(["-F", "-p", &port.to_string(), "-t0", "-g0", "-d"])
            .arg(fx.dir.path().join("upstream.sqlite"))
            .arg(&tree)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap(),
    );
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let ok = client()
            .get(format!("{upstream_url}/buildid/{}/debuginfo", fx.build_id))
            .send()
            .is_ok_and(|r| r.status() == 200);
        if ok {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "elfutils debuginfod did not index the fixture"
        );
        std::thread::sleep(Duration::from_millis(200));
    }

    for backend in Backend::all() {
        let server = Server::start(&backend, &["--upstream-urls", &upstream_url]);
        let cache = tempfile::tempdir().unwrap();
        for (artifact, expected) in [("debuginfo", &fx.debug), ("executable", &fx.stripped)] {
            let path = server.debuginfod_fetch(cache.path(), &[artifact, &fx.build_id]);
            assert_eq!(path, std::fs::read(expected).unwrap());
        }
        // elfutils serves the sources it indexed from the DWARF.
        let c = fx.sources[0].to_str().unwrap();
        let out = server.debuginfod_find(cache.path(), &["source", &fx.build_id, c]);
        assert!(
            out.status.success(),
            "[{}] source: {:?}",
            backend.name,
            stderr_lines(&out)
        );
        let (_, details) = json_of(server.get(&format!("/api/v1/debuginfo/{}", fx.build_id)));
        let origins: Vec<&str> = details["artifacts"]
            .as_array()
            .unwrap()
            .iter()
            .map(|a| a["origin"].as_str().unwrap())
            .collect();
        assert!(
            origins
                .iter()
                .all(|o| o.starts_with("upstream:http://127.0.0.1")),
            "{details}"
        );
    }
    // Once stored, served without the upstream.
    let server = Server::start(&Backend::local(), &["--upstream-urls", &upstream_url]);
    let got = server.get(&format!("/buildid/{}/debuginfo", fx.build_id));
    assert_eq!(got.status(), 200);
    drop(upstream);
    let again = server.get(&format!("/buildid/{}/executable", fx.build_id));
    assert_eq!(
        again.status(),
        404,
        "executable was never fetched, and the upstream is gone"
    );
    let got = server.get(&format!("/buildid/{}/debuginfo", fx.build_id));
    assert_eq!(got.bytes().unwrap(), std::fs::read(&fx.debug).unwrap());
}

#[test]
fn concurrent_misses_share_one_fetch_and_misses_are_remembered() {
    if !["gcc", "objcopy", "strip", "readelf"]
        .iter()
        .all(|t| have(t))
    {
        return;
    }
    let upstream = Server::start(&Backend::local(), &[]);
    let fx = Fixture::hello("src", "hello.c", &["-g"]);
    fx.publish(&upstream);
    let server = Server::start(&Backend::local(), &["--upstream-urls", &upstream.url]);
    let url = format!("{}/buildid/{}/debuginfo", server.url, fx.build_id);
    let handles: Vec<_> = (0..16)
        .map(|_| {
            let url = url.clone();
            std::thread::spawn(move || client().get(url).send().unwrap().bytes().unwrap())
        })
        .collect();
    let expected = std::fs::read(&fx.debug).unwrap();
    for h in handles {
        assert_eq!(h.join().unwrap(), expected);
    }
    let upstream_hits = upstream.metric(
        "symtrace_debuginfod_requests_total",
        &[("artifact", "debuginfo"), ("result", "hit")],
    );
    assert_eq!(
        upstream_hits, 1.0,
        "16 concurrent misses should make one upstream fetch"
    );

    let missing = format!("/buildid/{}/debuginfo", "ab".repeat(20));
    assert_eq!(server.get(&missing).status(), 404);
    assert_eq!(server.get(&missing).status(), 404);
    let upstream_misses = upstream.metric(
        "symtrace_debuginfod_requests_total",
        &[("artifact", "debuginfo"), ("result", "miss")],
    );
    assert_eq!(
        upstream_misses, 1.0,
        "the second miss should come from the negative cache"
    );
}

#[test]
fn servers_federating_with_each_other_stop_at_the_hop_limit() {
    let (pa, pb) = (free_port(), free_port());
    let (ua, ub) = (
        format!("http://127.0.0.1:{pa}"),
        format!("http://127.0.0.1:{pb}"),
    );
    let a = Server::start(
        &Backend::local(),
        &[
            "--http-addr",
            &format!("127.0.0.1:{pa}"),
            "--upstream-urls",
            &ub,
            "--upstream-negative-ttl",
            "0",
        ],
    );
    let b = Server::start(
        &Backend::local(),
        &[
            "--http-addr",
            &format!("127.0.0.1:{pb}"),
            "--upstream-urls",
            &ua,
            "--upstream-negative-ttl",
            "0",
        ],
    );
    let _ = &b;
    let start = Instant::now();
    let resp = client()
        .get(format!("{}/buildid/{}/debuginfo", a.url, "cd".repeat(20)))
        .send()
        .unwrap();
    assert_eq!(resp.status(), 404);
    assert!(
        start.elapsed() < Duration::from_secs(20),
        "loop took {:?}",
        start.elapsed()
    );
    let forwarded = a.metric(
        "symtrace_debuginfod_requests_total",
        &[("artifact", "debuginfo"), ("result", "miss")],
    ) + b.metric(
        "symtrace_debuginfod_requests_total",
        &[("artifact", "debuginfo"), ("result", "miss")],
    );
    assert!(
        (8.0..=10.0).contains(&forwarded),
        "expected about hop-limit (8) lookups, saw {forwarded}"
    );
}
