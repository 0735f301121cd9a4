//! Ranking of candidates, the `missing` round trip, listing and source bundles.

use std::process::Command;

use serde_json::json;

use crate::support::*;

fn tools() -> bool {
    ["gcc", "objcopy", "strip", "readelf"]
        .iter()
        .all(|t| have(t))
}

#[test]
fn better_files_replace_worse_ones_and_never_the_reverse() {
    if !tools() {
        return;
    }
    let server = Server::start(&Backend::local(), &[]);
    let fx = Fixture::hello("src", "hello.c", &["-g"]);
    let id = &fx.build_id;
    // The same build-ID at lower quality: DWARF removed, .symtab kept.
    let symtab_only = fx.dir.path().join("hello.symtab.debug");
    run(Command::new("objcopy")
        .arg("--strip-debug")
        .arg(&fx.debug)
        .arg(&symtab_only));
    let symtab_variant = fx.dir.path().join("hello.symtab2.debug");
    run(Command::new("objcopy")
        .args(["--strip-debug", "--remove-section=.comment"])
        .arg(&fx.debug)
        .arg(&symtab_variant));
    assert_eq!(build_id_of(&symtab_only), *id);

    let first = server.upload(id, "debuginfo", &symtab_only);
    assert_eq!(first["status"], "created");
    assert_eq!(first["quality"], "symtab");
    let better = server.upload(id, "debuginfo", &fx.debug);
    assert_eq!(better["status"], "created");
    assert_eq!(better["quality"], "dwarf");
    let again = server.upload(id, "debuginfo", &symtab_only);
    assert_eq!(again["status"], "unchanged");
    let worse = server.upload(id, "debuginfo", &symtab_variant);
    assert_eq!(worse["status"], "superseded");
    assert_eq!(worse["served_sha256"], better["sha256"]);
    let served = server
        .get(&format!("/buildid/{id}/debuginfo"))
        .bytes()
        .unwrap();
    assert_eq!(served, std::fs::read(&fx.debug).unwrap());

    // Listing shows every candidate.
    let (status, list) = json_of(server.get(&format!(
        "/api/v1/debuginfo?build_id={}&kind=debuginfo",
        &id[..8]
    )));
    assert_eq!(status, 200);
    assert_eq!(list["artifacts"].as_array().unwrap().len(), 3, "{list}");

    // One `missing` round trip for a whole job.
    server.upload(id, "executable", &fx.stripped);
    let src = server.upload_source(id, &fx.sources[0]);
    let items = json!({ "items": [
        { "build_id": id, "kind": "debuginfo", "sha256": better["sha256"] },
        { "build_id": id, "kind": "debuginfo", "sha256": "ab".repeat(32), "quality": 2 },
        { "build_id": id, "kind": "debuginfo", "sha256": "cd".repeat(32), "quality": 3 },
        { "build_id": id, "kind": "executable", "sha256": "ef".repeat(32) },
        { "build_id": id, "kind": "source", "sha256": src["sha256"], "path": fx.sources[0] },
        { "build_id": id, "kind": "source", "sha256": "01".repeat(32), "path": fx.sources[1] },
        { "build_id": "00".repeat(20), "kind": "debuginfo", "sha256": "02".repeat(32) },
    ]});
    let (status, answer) = json_of(
        client()
            .post(format!("{}/api/v1/debuginfo/missing", server.url))
            .json(&items)
            .send()
            .unwrap(),
    );
    assert_eq!(status, 200, "{answer}");
    let missing: Vec<u64> = answer["missing"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["index"].as_u64().unwrap())
        .collect();
    assert_eq!(missing, vec![2, 3, 5, 6], "{answer}");
    let bad =
        json!({ "items": [{ "build_id": "XYZ", "kind": "debuginfo", "sha256": "00".repeat(32) }] });
    let (status, body) = json_of(
        client()
            .post(format!("{}/api/v1/debuginfo/missing", server.url))
            .json(&bad)
            .send()
            .unwrap(),
    );
    assert_error(status, &body, 400, "item 0");
}

#[test]
fn unstripped_executable_outranks_a_stripped_one() {
    if !tools() {
        return;
    }
    let server = Server::start(&Backend::local(), &[]);
    let fx = Fixture::hello("src", "hello.c", &["-g"]);
    server.upload(&fx.build_id, "executable", &fx.stripped);
    assert_eq!(
        server
            .get(&format!("/buildid/{}/debuginfo", fx.build_id))
            .status(),
        404
    );
    let up = server.upload(&fx.build_id, "executable", &fx.unstripped);
    assert_eq!(up["status"], "created");
    let exe = server
        .get(&format!("/buildid/{}/executable", fx.build_id))
        .bytes()
        .unwrap();
    assert_eq!(exe, std::fs::read(&fx.unstripped).unwrap());
    let down = server.upload(&fx.build_id, "executable", &fx.stripped);
    assert_eq!(down["status"], "unchanged");
}

#[test]
fn source_bundles_store_named_files_and_report_the_rest() {
    if !tools() || !have("tar") {
        return;
    }
    let server = Server::start(&Backend::local(), &[]);
    let fx = Fixture::hello("src", "hello.c", &["-g"]);
    server.upload(&fx.build_id, "debuginfo", &fx.debug);
    let mut builder = tar::Builder::new(Vec::new());
    for s in &fx.sources {
        let name = s.display().to_string();
        builder
            .append_path_with_name(s, name.trim_start_matches('/'))
            .unwrap();
    }
    let mut header = tar::Header::new_gnu();
    header.set_size(4);
    header.set_mode(0o644);
    header.set_cksum();
    builder
        .append_data(&mut header.clone(), "etc/passwd", &b"root"[..])
        .unwrap();
    // tar refuses to write `..` through the safe API; write the raw name.
    let mut evil = tar::Header::new_old();
    evil.as_old_mut().name[..13].copy_from_slice(b"../../x/evil.");
    evil.set_size(4);
    evil.set_mode(0o644);
    evil.set_cksum();
    builder.append(&evil, &b"evil"[..]).unwrap();
    let bundle = builder.into_inner().unwrap();
    let (status, report) = server.put_bytes(
        &format!("/api/v1/debuginfo/{}/sources", fx.build_id),
        bundle,
        None,
    );
    assert_eq!(status, 201, "{report}");
    assert_eq!(report["stored"].as_array().unwrap().len(), 2, "{report}");
    let rejected = report["rejected"].as_array().unwrap();
    assert_eq!(rejected.len(), 2, "{report}");
    assert!(
        rejected.iter().any(|r| r["path"] == "/etc/passwd"),
        "{report}"
    );
    for s in &fx.sources {
        let body = server.get(&format!(
            "/buildid/{}/source{}",
            fx.build_id,
            escape_path(&s.display().to_string())
        ));
        assert_eq!(body.status(), 200);
        assert_eq!(body.bytes().unwrap(), std::fs::read(s).unwrap());
    }
    // Not a tar file at all.
    let (status, body) = server.put_bytes(
        &format!("/api/v1/debuginfo/{}/sources", fx.build_id),
        vec![1u8; 1024],
        None,
    );
    assert_eq!(status, 422, "{body}");
}

#[test]
fn compressed_uploads_are_accepted() {
    if !tools() || !have("zstd") || !have("gzip") {
        return;
    }
    let server = Server::start(&Backend::local(), &[]);
    let fx = Fixture::hello("src", "hello.c", &["-g"]);
    for (encoding, tool, file, kind) in [
        ("zstd", "zstd", &fx.debug, "debuginfo"),
        ("gzip", "gzip", &fx.stripped, "executable"),
    ] {
        let out = run(Command::new(tool).arg("-c").arg(file));
        let resp = client()
            .put(format!(
                "{}/api/v1/debuginfo/{}/{kind}",
                server.url, fx.build_id
            ))
            .header("content-encoding", encoding)
            .body(out.stdout)
            .send()
            .unwrap();
        let (status, body) = json_of(resp);
        assert_eq!(status, 201, "{encoding}: {body}");
        let served = server
            .get(&format!("/buildid/{}/{kind}", fx.build_id))
            .bytes()
            .unwrap();
        assert_eq!(served, std::fs::read(file).unwrap());
    }
}
