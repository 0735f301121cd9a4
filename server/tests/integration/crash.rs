//! Crash safety: a server killed during an upload restarts consistent, with
//! the earlier version still served and nothing partial visible; a blob
//! orphaned by a crash before its commit is collected.

use std::time::{Duration, Instant};

use crate::support::*;

fn tools() -> bool {
    ["gcc", "objcopy", "strip", "readelf"]
        .iter()
        .all(|t| have(t))
}

#[test]
fn kill_9_mid_upload_leaves_the_earlier_version() {
    if !tools() {
        return;
    }
    for backend in Backend::all() {
        let mut server = Server::start(&backend, &[]);
        let fx = Fixture::hello("src", "hello.c", &["-g"]);
        fx.publish(&server);
        // Start replacing the debuginfo with a better-ranked... any other
        // candidate, and die half-way through the body.
        let body = std::fs::read(&fx.unstripped).unwrap();
        let url = format!("/api/v1/debuginfo/{}/debuginfo", fx.build_id);
        let stream = partial_upload(&server, &url, &body, 0.5);
        wait_until_spooled(&server);
        server.kill9();
        drop(stream);

        server.spawn();
        let served = server.get(&format!("/buildid/{}/debuginfo", fx.build_id));
        assert_eq!(served.status(), 200, "[{}]", backend.name);
        assert_eq!(
            served.bytes().unwrap(),
            std::fs::read(&fx.debug).unwrap(),
            "[{}]",
            backend.name
        );
        let (_, details) = json_of(server.get(&format!("/api/v1/debuginfo/{}", fx.build_id)));
        assert_eq!(
            details["artifacts"].as_array().unwrap().len(),
            2,
            "[{}] {details}",
            backend.name
        );
        assert!(
            std::fs::read_dir(server.data_dir.join("spool"))
                .unwrap()
                .next()
                .is_none(),
            "[{}] the spool kept a partial upload",
            backend.name
        );
    }
}

#[test]
fn a_crash_between_blob_and_commit_leaves_an_orphan_that_is_collected() {
    if !tools() {
        return;
    }
    let mut server = Server::start(
        &Backend::local(),
        &["--gc-interval", "1", "--gc-grace", "0"],
    );
    let fx = Fixture::hello("src", "hello.c", &["-g"]);
    fx.publish(&server);
    let objects = server.data_dir.join("objects");
    let before = count_files(&objects);
    assert_eq!(before, 4, "debuginfo, executable and two sources");
    server.kill9();

    // Restart with the crash point armed: the upload dies after the object
    // write, before the metadata commit.
    let crashing = Server::start_on(&server, &[("SYMTRACE_CRASH_AT", "after_blob_put")]);
    let (status, _) = {
        let r = client()
            .put(format!(
                "{}/api/v1/debuginfo/{}/debuginfo",
                crashing.url, fx.build_id
            ))
            .body(std::fs::read(&fx.unstripped).unwrap())
            .send();
        (r.map(|r| r.status().as_u16()).unwrap_or(0), ())
    };
    assert_eq!(status, 0, "the server should have died mid-request");
    drop(crashing);
    assert_eq!(
        count_files(&objects),
        before + 1,
        "the orphan blob should exist after the crash"
    );

    // And an object with no row at all (as a crash in the middle of a
    // collection, or a stray copy, leaves behind).
    let stray = objects.join("blobs/ab").join("ab".repeat(32));
    std::fs::create_dir_all(stray.parent().unwrap()).unwrap();
    std::fs::write(&stray, b"stray").unwrap();

    server.spawn();
    let served = server.get(&format!("/buildid/{}/debuginfo", fx.build_id));
    assert_eq!(served.bytes().unwrap(), std::fs::read(&fx.debug).unwrap());
    let deadline = Instant::now() + Duration::from_secs(20);
    while count_files(&objects) > before {
        assert!(
            Instant::now() < deadline,
            "the orphan was not collected:\n{}",
            server.log_text()
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    assert!(!stray.exists(), "an object without a row was not collected");
    // Referenced blobs survive collection.
    assert_eq!(
        server
            .get(&format!("/buildid/{}/executable", fx.build_id))
            .status(),
        200
    );
    assert_eq!(count_files(&objects), before);
}
