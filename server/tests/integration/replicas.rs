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
    // The bucket requests behind that upload are counted, and the process
    // reports its CPU and memory (what the loadtest reads off-host).
    let metrics = a.get("/metrics").text().unwrap();
    let value = |name: &str| -> f64 {
        metrics
            .lines()
            .filter(|l| l.starts_with(name))
            .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
            .sum()
    };
    assert!(
        value("symtrace_object_store_requests_total{op=\"put\"}")
            + value("symtrace_object_store_requests_total{op=\"multipart_complete\"}")
            >= 3.0,
        "{metrics}"
    );
    assert!(value("process_resident_memory_bytes") > 1e6, "{metrics}");
    assert!(value("process_cpu_seconds_total") > 0.0, "{metrics}");
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
