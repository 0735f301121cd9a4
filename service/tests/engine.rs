//! The engine in-process, on its embedded defaults (SQLite and a local
//! directory in a temporary directory): an OTLP export goes in through
//! ingest and comes out of the query engine — flamegraph, samples, series —
//! with no HTTP in between. The rendered flamegraph is a snapshot.

use std::sync::Arc;
use std::time::Duration;

use prost::Message;
use symtrace_profiles::selection::{now_ns, RawSelection, Selection, SelectionError};
use symtrace_profiles::testing;
use symtrace_profiles::{render, tree};
use symtrace_proto::profiles::{Link, Sample};
use symtrace_service::cpu::CpuPool;
use symtrace_service::federation::Forwarding;
use symtrace_service::ingest::{Body, Encoding, Ingest};
use symtrace_service::limits::Slots;
use symtrace_service::profiles::store::ProfileStore;
use symtrace_service::query::samples::SamplesQuery;
use symtrace_service::query::{self, Engine, QueryError, QueryLimits};
use symtrace_service::store::blobs::ObjectBlobStore;
use symtrace_service::store::meta::SqlMetadata;
use symtrace_service::store::SymbolStore;
use symtrace_service::symbolize::SymbolizeService;

const TENANT: &str = "default";
const TRACE: [u8; 16] = [0xab; 16];
const SPAN: [u8; 8] = [0xcd; 8];

struct Fixture {
    _dir: tempfile::TempDir,
    ingest: Ingest,
    engine: Engine,
    slots: Slots,
}

async fn fixture(max_bytes: u64) -> Fixture {
    let dir = tempfile::tempdir().unwrap();
    let meta = SqlMetadata::open_sqlite(&dir.path().join("symtrace.db"))
        .await
        .unwrap();
    let objects = dir.path().join("objects");
    std::fs::create_dir_all(&objects).unwrap();
    let blobs = ObjectBlobStore::from_url(objects.to_str().unwrap()).unwrap();
    let spool = dir.path().join("spool");
    std::fs::create_dir_all(&spool).unwrap();
    let store = Arc::new(SymbolStore::new(
        Arc::new(meta),
        Arc::new(blobs),
        spool,
        Duration::from_millis(0),
    ));
    let profiles = Arc::new(ProfileStore::new(store.clone(), 100));
    let symbolizer = SymbolizeService::new(store.clone(), None, 16 << 20, 1);
    let ingest = Ingest::new(profiles.clone(), Default::default(), 64 << 20).unwrap();
    let engine = Engine::new(
        &store,
        profiles,
        symbolizer,
        16 << 20,
        QueryLimits {
            max_bytes,
            timeout: Duration::from_secs(30),
        },
        CpuPool::new("query-test", 1).unwrap(),
    );
    Fixture {
        _dir: dir,
        ingest,
        engine,
        slots: Slots::new("exports", "SYMTRACE_MAX_CONCURRENT_EXPORTS", 4),
    }
}

/// `checkout`'s export: 5 samples of f2 → f1 → f0 one second ago, 2 of
/// them on a span (trace TRACE, span SPAN).
async fn export(f: &Fixture, at_ns: u64) {
    let mut dictionary = testing::named_frames(3);
    dictionary.link_table = vec![
        Link::default(),
        Link {
            trace_id: TRACE.to_vec(),
            span_id: SPAN.to_vec(),
        },
    ];
    let sample = |link_index, n: u64| Sample {
        stack_index: 1,
        link_index,
        values: vec![1; n as usize],
        timestamps_unix_nano: (0..n).map(|i| at_ns + i * 1_000_000).collect(),
        ..Default::default()
    };
    let request = testing::request(
        Some("checkout"),
        vec![testing::cpu_profile(
            at_ns,
            vec![sample(0, 3), sample(1, 2)],
        )],
        dictionary,
    );
    let body = Body {
        bytes: request.encode_to_vec().into(),
        encoding: Encoding::Protobuf,
        gzip: false,
    };
    let answer = f
        .ingest
        .export(TENANT, body, f.slots.take().unwrap())
        .await
        .unwrap();
    assert!(answer.partial_success.is_none(), "{answer:?}");
}

fn selection(service: &str, from: &str, trace: Option<&str>) -> Selection {
    RawSelection {
        service: Some(service),
        from: Some(from),
        to: Some("now"),
        trace_id: trace,
        ..Default::default()
    }
    .parse(TENANT)
    .unwrap()
}

async fn folded(f: &Fixture, sel: Selection) -> String {
    let answer = query::run(&f.engine, &[sel], &Forwarding::default())
        .await
        .unwrap();
    let (agg, resolved) = (&answer.agg, &answer.resolved);
    render::folded(&tree::Expanded::new(agg, resolved), agg, resolved, 0)
}

#[tokio::test]
async fn an_export_comes_out_of_the_engine_as_its_flamegraph() {
    let f = fixture(1 << 30).await;
    export(&f, now_ns() as u64 - 1_000_000_000).await;
    let all = folded(&f, selection("checkout", "now-1h", None)).await;
    insta::assert_snapshot!("checkout_folded", all);
    // The span's samples only, by trace ID.
    let trace = hex::encode(TRACE);
    let on_span = folded(&f, selection("checkout", "now-1h", Some(&trace))).await;
    insta::assert_snapshot!("checkout_folded_trace", on_span);
    // The series the engine lists for the service.
    let series = f
        .engine
        .series(&selection("checkout", "now-1h", None))
        .await
        .unwrap();
    assert_eq!(series.len(), 1, "{series:?}");
    assert_eq!(series[0].service, "checkout");
}

#[tokio::test]
async fn the_samples_listing_takes_every_time_form_of_a_selection() {
    let f = fixture(1 << 30).await;
    let at = now_ns() as u64 - 1_000_000_000;
    export(&f, at).await;
    let count = |v: &serde_json::Value| v["samples"].as_array().unwrap().len();
    let list = |from: Option<&str>, trace: Option<&str>| SamplesQuery {
        service: Some("checkout".into()),
        from: from.map(str::to_owned),
        trace_id: trace.map(str::to_owned),
        ..Default::default()
    };
    let engine = &f.engine;
    for from in ["now-1h", &(at - 1).to_string(), "now-2m"] {
        let v = query::samples::samples(engine, TENANT.into(), list(Some(from), None))
            .await
            .unwrap();
        assert_eq!(count(&v), 2, "from={from}: {v}");
    }
    // After the samples: none.
    let v = query::samples::samples(
        engine,
        TENANT.into(),
        list(Some(&(at + 10_000_000).to_string()), None),
    )
    .await
    .unwrap();
    assert_eq!(count(&v), 0, "{v}");
    let trace = hex::encode(TRACE);
    let v = query::samples::samples(engine, TENANT.into(), list(Some("now-1h"), Some(&trace)))
        .await
        .unwrap();
    assert_eq!(count(&v), 1, "{v}");
    assert_eq!(v["samples"][0]["span_id"], hex::encode(SPAN));
    // Bad forms are the request's fault, named.
    for (from, trace, field) in [
        ("yesterday", None, "from"),
        ("now-1h", Some("xyz"), "trace_id"),
    ] {
        match query::samples::samples(engine, TENANT.into(), list(Some(from), trace)).await {
            Err(QueryError::Selection(
                SelectionError::Time { name, .. } | SelectionError::NotHex { name, .. },
            )) => assert_eq!(name, field),
            other => panic!("from={from} trace={trace:?}: {other:?}"),
        }
    }
}

#[tokio::test]
async fn a_selection_over_the_byte_bound_is_refused_before_it_is_read() {
    let f = fixture(1).await;
    export(&f, now_ns() as u64 - 1_000_000_000).await;
    match query::run(
        &f.engine,
        &[selection("checkout", "now-1h", None)],
        &Forwarding::default(),
    )
    .await
    {
        Err(QueryError::TooLarge { bytes, limit: 1 }) => assert!(bytes > 1),
        Err(e) => panic!("{e}"),
        Ok(_) => panic!("answered over the bound"),
    }
    let samples = query::samples::samples(
        &f.engine,
        TENANT.into(),
        SamplesQuery {
            service: Some("checkout".into()),
            ..Default::default()
        },
    )
    .await;
    assert!(
        matches!(samples, Err(QueryError::TooLarge { .. })),
        "{samples:?}"
    );
}
