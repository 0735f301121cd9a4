//! Black-box conformance with elfutils' debuginfod clients, on every storage
//! backend: what `debuginfod-find` fetches is byte-identical to what was
//! uploaded, plus the behaviours of elfutils' own portable tests
//! (response-headers, section, percent-escape, artifact-running,
//! negative-cache, sizetime, webapi-concurrency, find-metadata).

use std::process::Command;

use crate::support::*;

fn tools() -> bool {
    [
        "gcc",
        "objcopy",
        "strip",
        "readelf",
        "debuginfod-find",
        "curl",
    ]
    .iter()
    .all(|t| have(t))
}

#[test]
fn debuginfod_find_fetches_byte_identical_files() {
    if !tools() {
        return;
    }
    for backend in Backend::all() {
        eprintln!("backend {}", backend.name);
        let server = Server::start(&backend, &[]);
        let fx = Fixture::hello("src", "hello.c", &["-g"]);
        fx.publish(&server);
        let cache = tempfile::tempdir().unwrap();
        let id = fx.build_id.as_str();

        for (artifact, expected) in [("debuginfo", &fx.debug), ("executable", &fx.stripped)] {
            let fetched = server.debuginfod_fetch(cache.path(), &[artifact, id]);
            assert_eq!(
                fetched,
                std::fs::read(expected).unwrap(),
                "{} {artifact} differs",
                backend.name
            );
        }
        for src in &fx.sources {
            let fetched =
                server.debuginfod_fetch(cache.path(), &["source", id, src.to_str().unwrap()]);
            assert_eq!(fetched, std::fs::read(src).unwrap());
        }
        // Sections: .debug_info from the debuginfo; .text is NOBITS there, so
        // it comes from the executable (elfutils' section test).
        for (section, from) in [(".debug_info", &fx.debug), (".text", &fx.stripped)] {
            let fetched = server.debuginfod_fetch(cache.path(), &["section", id, section]);
            assert_eq!(fetched, section_bytes(from, section), "{section}");
        }
        // Negative result: a clean failure, and a 404 over HTTP.
        let out = server.debuginfod_find(cache.path(), &["debuginfo", &"0".repeat(40)]);
        assert!(!out.status.success());
        assert!(
            String::from_utf8_lossy(&out.stderr).contains("No such file"),
            "{:?}",
            stderr_lines(&out)
        );
        assert_eq!(
            server
                .get(&format!("/buildid/{}/debuginfo", "0".repeat(40)))
                .status(),
            404
        );
        // A source the DWARF names (stdio.h) but nobody uploaded: 404.
        assert_eq!(
            server
                .get(&format!("/buildid/{id}/source/usr/include/stdio.h"))
                .status(),
            404
        );
    }
}

#[test]
fn response_headers_match_elfutils() {
    if !tools() {
        return;
    }
    let server = Server::start(&Backend::local(), &[]);
    let fx = Fixture::hello("src", "hello.c", &["-g"]);
    fx.publish(&server);
    let size = std::fs::metadata(&fx.debug).unwrap().len();
    let url = format!("/buildid/{}/debuginfo", fx.build_id);
    let resp = server.get(&url);
    assert_eq!(resp.status(), 200);
    let h = resp.headers();
    assert_eq!(h["x-debuginfod-size"].to_str().unwrap(), size.to_string());
    assert!(h.contains_key("x-debuginfod-file"));
    assert!(httpdate_parse(h["last-modified"].to_str().unwrap()));
    assert_eq!(h["cache-control"], "public");
    assert_eq!(h["content-type"], "application/octet-stream");
    assert_eq!(h["content-length"].to_str().unwrap(), size.to_string());

    // HEAD: the same headers, no body.
    let head = client()
        .head(format!("{}{url}", server.url))
        .send()
        .unwrap();
    assert_eq!(head.status(), 200);
    assert_eq!(
        head.headers()["x-debuginfod-size"].to_str().unwrap(),
        size.to_string()
    );
    assert!(head.bytes().unwrap().is_empty());

    // Range requests and conditional requests.
    let ranged = client()
        .get(format!("{}{url}", server.url))
        .header("range", "bytes=0-3")
        .send()
        .unwrap();
    assert_eq!(ranged.status(), 206);
    assert_eq!(
        ranged.headers()["content-range"].to_str().unwrap(),
        format!("bytes 0-3/{size}")
    );
    assert_eq!(&ranged.bytes().unwrap()[..], b"\x7fELF");
    let beyond = client()
        .get(format!("{}{url}", server.url))
        .header("range", format!("bytes={size}-"))
        .send()
        .unwrap();
    assert_eq!(beyond.status(), 416);
    let etag = server.get(&url).headers()["etag"].clone();
    let cached = client()
        .get(format!("{}{url}", server.url))
        .header("if-none-match", etag)
        .send()
        .unwrap();
    assert_eq!(cached.status(), 304);

    // DEBUGINFOD_MAXSIZE: 406 and "File too large" in the client.
    let cache = tempfile::tempdir().unwrap();
    let out = Command::new("debuginfod-find")
        .args(["debuginfo", &fx.build_id])
        .env("DEBUGINFOD_URLS", &server.url)
        .env("DEBUGINFOD_CACHE_PATH", cache.path())
        .env("DEBUGINFOD_MAXSIZE", "1")
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("too large"),
        "{:?}",
        stderr_lines(&out)
    );
    assert!(!cache.path().join(&fx.build_id).join("debuginfo").exists());

    // Malformed requests get 400 with a message, not 404.
    for bad in [
        "/buildid/ABCDEF/debuginfo",
        "/buildid/abc/debuginfo",
        "/buildid/abcd/bogus",
        "/buildid/abcd",
    ] {
        let (status, body) = json_of(server.get(bad));
        assert_eq!(status, 400, "{bad}: {body}");
        assert!(body["error"]["message"].is_string());
    }
}

fn httpdate_parse(s: &str) -> bool {
    s.ends_with(" GMT") && s.len() == 29
}

#[test]
fn source_paths_percent_escapes_and_canonical_forms() {
    if !tools() {
        return;
    }
    let server = Server::start(&Backend::local(), &[]);
    // elfutils' percent-escape test uses a name like this one.
    let fx = Fixture::hello("my proj/sub", "p++r$#o^^g.c", &["-g"]);
    fx.publish(&server);
    let id = &fx.build_id;
    let c = &fx.sources[0];
    let cache = tempfile::tempdir().unwrap();
    let got = server.debuginfod_fetch(cache.path(), &["source", id, c.to_str().unwrap()]);
    assert_eq!(got, std::fs::read(c).unwrap());

    // Raw and canonical spellings of the same path (elfutils'
    // artifact-running test), sent as-is.
    let util = fx.src.join("util.h");
    let util_s = escape_path(&util.display().to_string());
    let dir_s = escape_path(&fx.src.display().to_string());
    let base = util_s
        .rsplit_once('/')
        .unwrap()
        .0
        .rsplit_once('/')
        .unwrap()
        .1
        .to_owned();
    let variants = [
        util_s.clone(),
        format!("/{util_s}"),
        format!("{dir_s}/./util.h"),
        format!("{dir_s}/../{base}/util.h"),
        format!("{dir_s}//util.h"),
        format!("{dir_s}/util%2Eh"),
    ];
    let expected = std::fs::read(&util).unwrap();
    for v in variants {
        let out = Command::new("curl")
            .args(["-s", "--path-as-is", "-o", "-", "-w", "\n%{http_code}"])
            .arg(format!("{}/buildid/{id}/source{v}", server.url))
            .output()
            .unwrap();
        let body = out.stdout;
        let (content, code) = body.split_at(body.len() - 4);
        assert_eq!(code, b"\n200", "variant {v}");
        assert_eq!(content, &expected[..], "variant {v}");
    }
    // Traversal resolves at the root and never escapes to the filesystem.
    let out = Command::new("curl")
        .args([
            "-s",
            "--path-as-is",
            "-o",
            "/dev/null",
            "-w",
            "%{http_code}",
        ])
        .arg(format!(
            "{}/buildid/{id}/source/../../../../etc/passwd",
            server.url
        ))
        .output()
        .unwrap();
    assert_eq!(out.stdout, b"404");
}

#[test]
fn unstripped_executable_answers_debuginfo_requests() {
    if !tools() {
        return;
    }
    let server = Server::start(&Backend::local(), &[]);
    let fx = Fixture::hello("src", "hello.c", &["-g"]);
    server.upload(&fx.build_id, "executable", &fx.unstripped);
    let cache = tempfile::tempdir().unwrap();
    let got = server.debuginfod_fetch(cache.path(), &["debuginfo", &fx.build_id]);
    assert_eq!(got, std::fs::read(&fx.unstripped).unwrap());
    // Its DWARF names its sources, so they can be uploaded now.
    server.upload_source(&fx.build_id, &fx.sources[0]);
}

#[test]
fn concurrent_fetches_all_succeed() {
    if !tools() {
        return;
    }
    let server = Server::start(&Backend::local(), &[]);
    let fx = Fixture::hello("src", "hello.c", &["-g"]);
    fx.publish(&server);
    let expected = std::fs::read(&fx.debug).unwrap();
    let url = format!("{}/buildid/{}/debuginfo", server.url, fx.build_id);
    let handles: Vec<_> = (0..64)
        .map(|_| {
            let url = url.clone();
            std::thread::spawn(move || client().get(url).send().unwrap())
        })
        .collect();
    for h in handles {
        let resp = h.join().unwrap();
        assert_eq!(resp.status(), 200);
        assert_eq!(resp.bytes().unwrap(), expected);
    }
}

#[test]
fn metadata_finds_files_by_name_glob_and_build_id() {
    if !tools() {
        return;
    }
    let server = Server::start(&Backend::local(), &[]);
    let fx = Fixture::hello("src", "hello.c", &["-g"]);
    let exe_path = fx.stripped.display().to_string();
    let (status, body) = server.put_bytes(
        &format!(
            "/api/v1/debuginfo/{}/executable?file={}",
            fx.build_id,
            escape_path(&exe_path)
        ),
        std::fs::read(&fx.stripped).unwrap(),
        None,
    );
    assert_eq!(status, 201, "{body}");
    server.upload(&fx.build_id, "debuginfo", &fx.debug);

    let q = |key: &str, value: &str| {
        let url = format!("{}/metadata", server.url);
        json_of(
            client()
                .get(url)
                .query(&[("key", key), ("value", value)])
                .send()
                .unwrap(),
        )
    };
    let (status, by_file) = q("file", &exe_path);
    assert_eq!(status, 200);
    assert_eq!(by_file["complete"], true);
    let results = by_file["results"].as_array().unwrap();
    assert_eq!(results.len(), 1, "{by_file}");
    assert_eq!(results[0]["buildid"], fx.build_id.as_str());
    assert_eq!(results[0]["type"], "executable");
    assert_eq!(results[0]["file"], exe_path.as_str());

    let dir = fx.stripped.parent().unwrap().display().to_string();
    let (_, by_glob) = q("glob", &format!("{dir}/*.stripped"));
    assert_eq!(by_glob["results"].as_array().unwrap().len(), 1, "{by_glob}");
    // FNM_PATHNAME: `*` does not cross `/`.
    let (_, no_cross) = q("glob", "/*.stripped");
    assert_eq!(
        no_cross["results"].as_array().unwrap().len(),
        0,
        "{no_cross}"
    );
    let (_, by_id) = q("buildid", &fx.build_id);
    assert_eq!(by_id["results"].as_array().unwrap().len(), 2, "{by_id}");
    let (_, none) = q("file", "/no/such/file");
    assert_eq!(none["results"].as_array().unwrap().len(), 0);
    let (status, _) = q("bogus", "x");
    assert_eq!(status, 400);
}

#[test]
fn large_files_ranges_and_sections_are_exact() {
    if !tools() {
        return;
    }
    let server = Server::start(&Backend::local(), &[]);
    let fx = Fixture::hello("src", "hello.c", &["-g"]);
    // A 6 MB executable: the reference binary plus a section of noise.
    let payload: Vec<u8> = (0..6_000_000u32)
        .map(|i| (i.wrapping_mul(2654435761) >> 13) as u8)
        .collect();
    let payload_file = fx.dir.path().join("payload.bin");
    std::fs::write(&payload_file, &payload).unwrap();
    let big = fx.dir.path().join("big");
    run(Command::new("objcopy")
        .arg(format!("--add-section=.payload={}", payload_file.display()))
        .arg(&fx.stripped)
        .arg(&big));
    server.upload(&fx.build_id, "executable", &big);
    let expected = std::fs::read(&big).unwrap();
    let url = format!("{}/buildid/{}/executable", server.url, fx.build_id);

    let handles: Vec<_> = (0..6)
        .map(|_| {
            let url = url.clone();
            std::thread::spawn(move || client().get(url).send().unwrap().bytes().unwrap())
        })
        .collect();
    for h in handles {
        assert!(
            h.join().unwrap() == expected,
            "a concurrent full download differs"
        );
    }
    let len = expected.len();
    for (start, end) in [
        (0, 0),
        (1, 4096),
        (4095, 4097),
        (len / 2, len / 2 + 1_000_000),
        (len - 10, len - 1),
    ] {
        let got = client()
            .get(&url)
            .header("range", format!("bytes={start}-{end}"))
            .send()
            .unwrap();
        assert_eq!(got.status(), 206);
        assert!(
            got.bytes().unwrap() == expected[start..=end],
            "range {start}-{end} differs"
        );
    }
    let section = server.get(&format!("/buildid/{}/section/.payload", fx.build_id));
    assert_eq!(
        section.headers()["x-debuginfod-size"].to_str().unwrap(),
        payload.len().to_string()
    );
    assert!(section.bytes().unwrap() == payload, "section bytes differ");
}
