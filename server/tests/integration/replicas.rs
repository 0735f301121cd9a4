//! Several replicas share one PostgreSQL database and one bucket: what is
//! uploaded through one is served by the others, with no cache in between.

use crate::support::*;

#[test]
fn an_upload_through_one_replica_is_served_by_another() {
    if !["gcc", "objcopy", "strip", "readelf", "debuginfod-find"]
        .iter()
        .all(|t| have(t))
    {
        return;
    }
    let Some(backend) = Backend::postgres_s3() else {
        return;
    };
    let a = Server::start(&backend, &[]);
    let b = Server::start(&backend, &[]);
    let fx = Fixture::hello("src", "hello.c", &["-g"]);
    fx.publish(&a);
    let cache = tempfile::tempdir().unwrap();
    for (artifact, expected) in [("debuginfo", &fx.debug), ("executable", &fx.stripped)] {
        let path = b.debuginfod_fetch(cache.path(), &[artifact, &fx.build_id]);
        assert_eq!(path, std::fs::read(expected).unwrap());
    }
    let src = b.get(&format!(
        "/buildid/{}/source{}",
        fx.build_id,
        escape_path(&fx.sources[0].display().to_string())
    ));
    assert_eq!(src.bytes().unwrap(), std::fs::read(&fx.sources[0]).unwrap());
    // A delete through B is seen by A at once.
    let resp = client()
        .delete(format!("{}/api/v1/debuginfo/{}", b.url, fx.build_id))
        .send()
        .unwrap();
    assert_eq!(resp.status(), 200);
    assert_eq!(
        a.get(&format!("/buildid/{}/debuginfo", fx.build_id))
            .status(),
        404
    );
}
