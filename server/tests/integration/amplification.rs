//! Exports that would be stored as far more than they are: a long label
//! (cut), labels shared by many series (each series keeps its own copy,
//! so their text is bounded per request), and more series than one
//! request should add to the index.

use prost::Message;
use serde_json::Value;
use symtrace_profiles::normalize::TRUNCATED_LABEL_SUFFIX;
use symtrace_profiles::testing::many_types_request;
use symtrace_proto::collector::profiles_service_client::ProfilesServiceClient;

use super::hostile::{get, now_ns};
use super::profiles_bad_input::{export_http as export, post};
use crate::support::*;

fn refused(server: &Server, body: Vec<u8>, says: &str) {
    let (status, answer) = post(server, "amp", "application/x-protobuf", None, body);
    let text = String::from_utf8_lossy(&answer);
    assert_eq!(status, 413, "{text}");
    assert!(text.contains(says), "{text}");
}

#[test]
fn long_labels_are_cut_and_what_series_copy_of_them_is_bounded() {
    let server = Server::start(
        &Backend::local(),
        &[
            "--max-export-series",
            "300",
            "--max-export-text-bytes",
            &(32 << 20).to_string(),
        ],
    );
    let time = now_ns() - 60_000_000_000;
    // One 1 MiB label under 200 series: cut to 16 KiB, so the series hold
    // 3 MiB of it, not 200 MiB.
    export(
        &server,
        "amp",
        &many_types_request("cut", 1, 1 << 20, 200, time),
    );
    let (status, body) = get(&server, "amp", "/api/v1/labels/note0/values?service=cut");
    assert_eq!(status, 200, "{body:.200}");
    let values: Value = serde_json::from_str(&body).unwrap();
    let value = values["values"][0].as_str().unwrap().to_owned();
    assert_eq!(value.len(), 16 << 10);
    assert!(value.ends_with(TRUNCATED_LABEL_SUFFIX), "{value:.40}");
    assert!(server.metric("symtrace_ingest_truncated_labels_total", &[]) >= 1.0);
    let (status, types) = get(&server, "amp", "/api/v1/profile-types?service=cut");
    assert_eq!(status, 200, "{types}");
    assert_eq!(
        types.matches(":count:cpu:nanoseconds").count(),
        200,
        "{types:.300}"
    );

    // 100 labels of 15 KiB (under the value limit) under 300 series: 440
    // MiB of copies from a 1.5 MB request, refused.
    let amplified = many_types_request("copies", 100, 15 << 10, 300, time);
    assert!(amplified.encoded_len() < 2 << 20);
    refused(
        &server,
        amplified.encode_to_vec(),
        "SYMTRACE_MAX_EXPORT_TEXT_BYTES",
    );
    // More series than allowed.
    let wide = many_types_request("wide", 1, 1, 301, time);
    refused(&server, wide.encode_to_vec(), "more than 300 series");
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        let mut client = ProfilesServiceClient::connect(format!("http://{}", server.grpc_addr))
            .await
            .unwrap();
        for (request, says) in [
            (amplified, "SYMTRACE_MAX_EXPORT_TEXT_BYTES"),
            (wide, "SYMTRACE_MAX_EXPORT_SERIES"),
        ] {
            let mut request = tonic::Request::new(request);
            request
                .metadata_mut()
                .insert("x-scope-orgid", "amp".parse().unwrap());
            let err = client.export(request).await.unwrap_err();
            assert_eq!(err.code(), tonic::Code::ResourceExhausted, "{err}");
            assert!(err.message().contains(says), "{err}");
        }
    });
    // Neither refused request left anything behind.
    let (status, services) = get(&server, "amp", "/api/v1/services");
    assert_eq!(status, 200, "{services}");
    assert!(!services.contains("copies"), "{services}");
    assert!(!services.contains("wide"), "{services}");
    assert!(services.contains("cut"), "{services}");
}
