//! The engine in-process, on its embedded defaults (SQLite and a local
//! directory in a temporary directory): an OTLP export goes in through
//! ingest and comes out of the query engine — flamegraph, samples, series —
//! with no HTTP in between. The rendered flamegraph is a snapshot.

use std::sync::Arc;
use std::time::Duration;

use prost::Message;
use symtrace_profiles::answer::Answer;
use symtrace_profiles::selection::{now_ns, RawSelection, Selection, SelectionError};
use symtrace_profiles::testing;
use symtrace_profiles::{render, tree};
use symtrace_proto::profiles::{Link, Sample};
use symtrace_service::cpu::CpuPool;
use symtrace_service::federation::Forwarding;
use symtrace_service::ingest::{Body, Encoding, Ingest};
use symtrace_service::limits::Slots;
use symtrace_service::profiles::compact;
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
    profiles: Arc<ProfileStore>,
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
    let symbolizer = SymbolizeService::new(store.clone(), None, 16 << 20, 1).unwrap();
    let ingest = Ingest::new(profiles.clone(), Default::default(), 64 << 20).unwrap();
    let engine = Engine::new(
        store.clone(),
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
        profiles,
        ingest,
        engine,
        slots: Slots::new("exports", "SYMTRACE_MAX_CONCURRENT_EXPORTS", 4),
    }
}

/// `checkout`'s export: 5 samples of f2 → f1 → f0 one second ago, 2 of
/// them on a span (trace TRACE, span SPAN).
async fn export(f: &Fixture, at_ns: u64) {
    export_as(f, "checkout", at_ns, (3, 2), Encoding::Protobuf).await;
}

/// `service`'s export at `at_ns`: `off` + `on` samples of f2 → f1 → f0
/// (the `on` ones on TRACE's span SPAN), 1 ms apart, in `encoding`.
async fn export_as(
    f: &Fixture,
    service: &str,
    at_ns: u64,
    (off, on): (u64, u64),
    encoding: Encoding,
) {
    let mut dictionary = testing::named_frames(3);
    dictionary.link_table = vec![
        Link::default(),
        Link {
            trace_id: TRACE.to_vec(),
            span_id: SPAN.to_vec(),
        },
    ];
    let sample = |link_index, first: u64, n: u64| Sample {
        stack_index: 1,
        link_index,
        values: vec![1; n as usize],
        timestamps_unix_nano: (first..first + n).map(|i| at_ns + i * 1_000_000).collect(),
        ..Default::default()
    };
    let request = testing::request(
        Some(service),
        vec![testing::cpu_profile(
            at_ns,
            vec![sample(0, 0, off), sample(1, off, on)],
        )],
        dictionary,
    );
    let bytes = match encoding {
        Encoding::Protobuf => request.encode_to_vec(),
        Encoding::Json => symtrace_proto::json::encode_export_request(&request),
    };
    let body = Body {
        bytes: bytes.into(),
        encoding,
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

/// `checkout`'s samples listing over all time.
async fn checkout_samples(f: &Fixture) -> Result<serde_json::Value, QueryError> {
    let all = SamplesQuery {
        service: Some("checkout".into()),
        ..Default::default()
    };
    query::samples::samples(&f.engine, TENANT.into(), all).await
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
    let samples = checkout_samples(&f).await;
    assert!(
        matches!(samples, Err(QueryError::TooLarge { .. })),
        "{samples:?}"
    );
}

/// The answer to `sides` (one selection, or a baseline and a comparison).
async fn answer(f: &Fixture, sides: &[Selection]) -> Answer {
    query::run(&f.engine, sides, &Forwarding::default())
        .await
        .unwrap()
}

/// The flamegraph tree's JSON, as the HTTP API nests it under `tree`.
fn json_tree(a: &Answer, max_nodes: usize, diff: bool) -> serde_json::Value {
    let t = tree::Tree::build(&tree::Expanded::new(&a.agg, &a.resolved), max_nodes);
    serde_json::from_str(&render::json_tree(&t, &a.agg, &a.resolved, diff)).unwrap()
}

fn pretty(v: &serde_json::Value) -> String {
    serde_json::to_string_pretty(v).unwrap()
}

#[tokio::test]
async fn an_otlp_json_export_answers_as_its_protobuf_twin() {
    let f = fixture(1 << 30).await;
    let at = now_ns() as u64 - 1_000_000_000;
    export_as(&f, "checkout", at, (3, 2), Encoding::Protobuf).await;
    export_as(&f, "checkout-json", at, (3, 2), Encoding::Json).await;
    let proto = folded(&f, selection("checkout", "now-1h", None)).await;
    let json = folded(&f, selection("checkout-json", "now-1h", None)).await;
    assert_eq!(json, proto);
    let trace = hex::encode(TRACE);
    assert_eq!(
        folded(&f, selection("checkout-json", "now-1h", Some(&trace))).await,
        folded(&f, selection("checkout", "now-1h", Some(&trace))).await,
    );
}

#[tokio::test]
async fn the_flamegraph_json_pprof_and_diff_as_rendered() {
    let f = fixture(1 << 30).await;
    let now = now_ns() as u64;
    // A baseline 30 minutes ago with 2 + 1 samples, the comparison now
    // with 3 + 2.
    export_as(
        &f,
        "checkout",
        now - 1_800_000_000_000,
        (2, 1),
        Encoding::Protobuf,
    )
    .await;
    export(&f, now - 1_000_000_000).await;
    let recent = selection("checkout", "now-10m", None);
    let a = answer(&f, std::slice::from_ref(&recent)).await;
    assert_eq!(a.points(), [5, 0]);
    insta::assert_snapshot!("checkout_tree", pretty(&json_tree(&a, 1024, false)));
    // max_nodes: the root and one node more; the rest merged.
    let cut = json_tree(&a, 2, false);
    assert_eq!(cut["total"], 5, "{cut}");
    assert_eq!(cut["children"].as_array().unwrap().len(), 1, "{cut}");
    assert!(
        cut["children"][0]["children"]
            .as_array()
            .unwrap()
            .is_empty(),
        "{cut}"
    );
    let pprof = symtrace_profiles::render::pprof::encode(
        &a.agg,
        &a.resolved,
        &a.type_info(),
        1_000_000_000,
        2_000_000_000,
    );
    insta::assert_snapshot!(
        "checkout_pprof",
        symtrace_profiles::render::pprof::describe(&pprof)
    );
    // The diff of the hour's first half (baseline) and the last 10 minutes.
    let earlier = RawSelection {
        service: Some("checkout"),
        from: Some("now-1h"),
        to: Some("now-20m"),
        ..Default::default()
    }
    .parse(TENANT)
    .unwrap();
    let d = answer(&f, &[earlier, recent]).await;
    assert_eq!(d.points(), [3, 5]);
    insta::assert_snapshot!("checkout_diff", pretty(&json_tree(&d, 1024, true)));
}

#[tokio::test]
async fn the_trace_view_credits_the_span_its_samples() {
    let f = fixture(1 << 30).await;
    export(&f, now_ns() as u64 - 1_000_000_000).await;
    let v = query::traces::trace(&f.engine, TENANT, TRACE)
        .await
        .unwrap();
    let spans = v["spans"].as_array().unwrap();
    assert_eq!(spans.len(), 1, "{v}");
    assert_eq!(spans[0]["span_id"], hex::encode(SPAN), "{v}");
    assert_eq!(spans[0]["service"], "checkout", "{v}");
    assert_eq!(spans[0]["samples"], 2, "{v}");
    // A trace with no samples is an empty answer, not an error.
    let none = query::traces::trace(&f.engine, TENANT, [0x11; 16])
        .await
        .unwrap();
    assert!(none["spans"].as_array().unwrap().is_empty(), "{none}");
}

#[tokio::test]
async fn compaction_changes_no_answer() {
    let f = fixture(1 << 30).await;
    // Three exports in a closed hour-long window.
    let hour = 3_600_000_000_000u64;
    let window = (now_ns() as u64 - 3 * hour) / hour * hour;
    for (i, service) in ["checkout", "checkout", "cart"].into_iter().enumerate() {
        export_as(
            &f,
            service,
            window + i as u64 * 1_000_000_000,
            (3, 2),
            Encoding::Protobuf,
        )
        .await;
    }
    let trace = hex::encode(TRACE);
    let views = || async {
        let mut out = Vec::new();
        for (service, trace) in [
            ("checkout", None),
            ("cart", None),
            ("checkout", Some(trace.as_str())),
        ] {
            out.push(folded(&f, selection(service, "now-4h", trace)).await);
        }
        let spans = query::traces::trace(&f.engine, TENANT, TRACE)
            .await
            .unwrap()["spans"]
            .clone();
        // The listing's rows may merge (one per stored sample); its events
        // may not: (time, value, span) of each, sorted.
        let listing = checkout_samples(&f).await.unwrap();
        let mut samples: Vec<(String, i64, String)> = Vec::new();
        for row in listing["samples"].as_array().unwrap() {
            let times = row["timestamps"].as_array().unwrap();
            let values = row["values"].as_array().unwrap();
            for (t, v) in times.iter().zip(values) {
                let span = row["span_id"].as_str().unwrap_or_default().to_owned();
                samples.push((t.as_str().unwrap().to_owned(), v.as_i64().unwrap(), span));
            }
        }
        samples.sort();
        (out, spans, samples)
    };
    let before = views().await;
    assert_eq!(before.0[0], "f2;f1;f0 10\n");
    assert_eq!(before.2.len(), 10, "two exports of 3 + 2 events");
    let settings = compact::Settings {
        window_ns: hour as i64,
        delay_ns: 0,
        retention_ns: None,
        export_key_ttl_ms: compact::EXPORT_KEY_TTL_MS,
        job_bytes: compact::DEFAULT_JOB_BYTES,
    };
    let report = compact::run_once(&f.profiles, "test", &settings)
        .await
        .unwrap();
    assert_eq!(
        (report.inputs, report.outputs, report.quarantined),
        (3, 1, 0),
        "{report:?}"
    );
    assert_eq!(views().await, before);
}
