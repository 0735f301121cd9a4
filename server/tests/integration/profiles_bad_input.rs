//! Bad OTLP exports over HTTP and gRPC: one case per status code (and per
//! rule of the HTTP layer: encodings, content types, tenants), each with a
//! message naming what was wrong; good profiles of the same request are
//! stored, nothing of the bad ones is, and nothing stored before is
//! touched. Every decoding and normalization rule is tested over bytes in
//! `profiles/src/rules_tests.rs`.

use std::io::Write;

use prost::Message;
use serde_json::Value;
use symtrace_proto::collector::{
    profiles_service_client::ProfilesServiceClient, ExportProfilesServiceRequest,
    ExportProfilesServiceResponse,
};
use symtrace_proto::profiles::{
    Profile, ProfilesDictionary, ResourceProfiles, Sample, ScopeProfiles, ValueType,
};

use super::profiles::dump;
use crate::support::*;
use symtrace_profiles::testing::v19::Request as V19Request;

/// One native frame in one mapping (stack 1), one attribute and one link
/// (index 1).
fn dictionary() -> ProfilesDictionary {
    symtrace_profiles::testing::native_dictionary()
}

fn profile(samples: Vec<Sample>) -> Profile {
    Profile {
        sample_type: Some(ValueType {
            type_strindex: 1,
            unit_strindex: 2,
        }),
        period_type: Some(ValueType {
            type_strindex: 3,
            unit_strindex: 4,
        }),
        period: 50_000_000,
        time_unix_nano: 1_700_000_000_000_000_000,
        duration_nano: 10_000_000_000,
        samples,
        ..Default::default()
    }
}

fn good_sample(ts: u64) -> Sample {
    Sample {
        stack_index: 1,
        attribute_indices: vec![1],
        link_index: 1,
        timestamps_unix_nano: vec![ts, ts + 1],
        ..Default::default()
    }
}

fn request(profiles: Vec<Profile>) -> ExportProfilesServiceRequest {
    ExportProfilesServiceRequest {
        resource_profiles: vec![ResourceProfiles {
            scope_profiles: vec![ScopeProfiles {
                profiles,
                ..Default::default()
            }],
            ..Default::default()
        }],
        dictionary: Some(dictionary()),
    }
}

pub fn post(
    server: &Server,
    tenant: &str,
    content_type: &str,
    encoding: Option<&str>,
    body: Vec<u8>,
) -> (u16, Vec<u8>) {
    let mut req = client()
        .post(format!("{}/v1development/profiles", server.url))
        .header("Content-Type", content_type)
        .header("X-Scope-OrgID", tenant)
        .body(body);
    if let Some(e) = encoding {
        req = req.header("Content-Encoding", e);
    }
    let resp = req.send().unwrap();
    (resp.status().as_u16(), resp.bytes().unwrap().to_vec())
}

/// The message of an OTLP/HTTP error (a protobuf google.rpc.Status).
fn status_message(body: &[u8]) -> String {
    #[derive(Clone, PartialEq, prost::Message)]
    struct Status {
        #[prost(int32, tag = "1")]
        code: i32,
        #[prost(string, tag = "2")]
        message: String,
    }
    Status::decode(body)
        .expect("a google.rpc.Status body")
        .message
}

pub fn export_http(
    server: &Server,
    tenant: &str,
    req: &ExportProfilesServiceRequest,
) -> ExportProfilesServiceResponse {
    let (status, body) = post(
        server,
        tenant,
        "application/x-protobuf",
        None,
        req.encode_to_vec(),
    );
    assert_eq!(status, 200, "{}", String::from_utf8_lossy(&body));
    ExportProfilesServiceResponse::decode(&body[..]).unwrap()
}

#[test]
fn bad_profiles_are_rejected_and_good_ones_kept() {
    let server = Server::start(&Backend::local(), &[]);
    let tenant = "partial";
    // One rule (every rule is tested over bytes in symtrace-profiles'
    // rules_tests.rs): the rejection reaches the client as partial success.
    let cases: Vec<(Profile, &str)> = vec![(
        profile(vec![Sample {
            stack_index: 99,
            timestamps_unix_nano: vec![1],
            ..Default::default()
        }]),
        "stack_index 99 is out of range",
    )];
    // Each request's good profile differs: an identical export is a retry,
    // stored once.
    let good = |i: u64| profile(vec![good_sample(1_700_000_000_000_000_100 + 10 * i)]);
    for (i, (bad, needle)) in cases.iter().enumerate() {
        let req = request(vec![good(i as u64), bad.clone()]);
        let response = export_http(&server, tenant, &req);
        let partial = response.partial_success.expect("partial success");
        assert_eq!(partial.rejected_profiles, 1, "{needle}");
        assert!(
            partial.error_message.contains(needle),
            "{needle}: {}",
            partial.error_message
        );
    }
    let req = request(vec![good(99)]);
    assert!(export_http(&server, tenant, &req).partial_success.is_none());

    // Every request stored its good profile (2 events each), nothing else.
    let body = dump(&server, tenant);
    let samples = body["samples"].as_array().unwrap();
    let stored: usize = samples
        .iter()
        .map(|s| s["timestamps"].as_array().unwrap().len())
        .sum();
    assert_eq!(stored, 2 * (cases.len() + 1), "{body}");
    for s in samples {
        assert_eq!(s["labels"]["thread.name"], "w", "{s}");
        assert_eq!(s["trace_id"], "07".repeat(16));
        assert_eq!(s["stack"][0]["address"], "0x1234");
    }

    // The good part of the last request again (as a client's retry would
    // send it): the same segment, stored once.
    let again = request(vec![good(99)]);
    assert!(export_http(&server, tenant, &again)
        .partial_success
        .is_none());
    let body = dump(&server, tenant);
    let stored_again: usize = body["samples"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["timestamps"].as_array().unwrap().len())
        .sum();
    assert_eq!(stored_again, stored, "a retry is not stored twice");

    // An empty request succeeds without partial success.
    let response = export_http(&server, tenant, &ExportProfilesServiceRequest::default());
    assert!(response.partial_success.is_none());
}

fn v19_request() -> V19Request {
    symtrace_profiles::testing::v19::request(dictionary())
}

#[test]
fn bad_requests_get_clear_errors_and_store_nothing() {
    let server = Server::start(&Backend::local(), &["--max-export-bytes", "100000"]);
    let tenant = "bad";
    let good = request(vec![profile(vec![good_sample(1_700_000_000_000_000_100)])]);
    export_http(&server, tenant, &good);
    let before = dump(&server, tenant);

    let check = |status: u16, body: &[u8], want: u16, needle: &str| {
        assert_eq!(status, want, "{needle}: {}", String::from_utf8_lossy(body));
        let message = status_message(body);
        assert!(message.contains(needle), "want {needle:?} in {message:?}");
    };
    let proto = "application/x-protobuf";
    let (s, b) = post(&server, tenant, proto, None, v19_request().encode_to_vec());
    check(s, &b, 400, "v1.9");
    let bytes = good.encode_to_vec();
    let (s, b) = post(&server, tenant, proto, None, vec![0u8; 200_000]);
    check(s, &b, 413, "larger than the limit of 100000 bytes");
    let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
    gz.write_all(&vec![0u8; 1_000_000]).unwrap();
    let (s, b) = post(&server, tenant, proto, Some("gzip"), gz.finish().unwrap());
    check(s, &b, 413, "decompressed request is larger");
    let (s, b) = post(&server, tenant, proto, Some("gzip"), b"not gzip".to_vec());
    check(s, &b, 400, "gzip body is damaged");
    let (s, b) = post(&server, tenant, proto, Some("br"), bytes.clone());
    check(s, &b, 415, "Content-Encoding \"br\"");
    let (s, b) = post(&server, tenant, "text/plain", None, bytes.clone());
    assert_eq!(s, 415);
    let err: Value = serde_json::from_slice(&b).unwrap();
    assert!(
        err["message"]
            .as_str()
            .unwrap()
            .contains("application/x-protobuf"),
        "{err}"
    );
    // OTLP/JSON errors answer in JSON.
    let (s, b) = post(
        &server,
        tenant,
        "application/json",
        None,
        b"{\"resourceProfiles\": 7}".to_vec(),
    );
    assert_eq!(s, 400);
    let err: Value = serde_json::from_slice(&b).unwrap();
    assert!(
        err["message"]
            .as_str()
            .unwrap()
            .contains("malformed OTLP/JSON"),
        "{err}"
    );
    let (s, b) = post(&server, "a/../b", proto, None, bytes.clone());
    check(s, &b, 400, "not a tenant name");

    // gRPC: the same rules, as status codes.
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        let endpoint = format!("http://{}", server.grpc_addr);
        let channel = tonic::transport::Endpoint::from_shared(endpoint)
            .unwrap()
            .connect()
            .await
            .unwrap();
        let mut grpc = tonic::client::Grpc::new(channel.clone());
        grpc.ready().await.unwrap();
        let path = http::uri::PathAndQuery::from_static(
            "/opentelemetry.proto.collector.profiles.v1development.ProfilesService/Export",
        );
        let codec = tonic_prost::ProstCodec::<V19Request, ExportProfilesServiceResponse>::default();
        let mut req = tonic::Request::new(v19_request());
        req.metadata_mut()
            .insert("x-scope-orgid", tenant.parse().unwrap());
        let err = grpc.unary(req, path, codec).await.unwrap_err();
        assert_eq!(err.code(), tonic::Code::InvalidArgument, "{err}");
        assert!(err.message().contains("v1.9"), "{err}");

        let mut client = ProfilesServiceClient::new(channel);
        let mut big = good.clone();
        big.dictionary
            .as_mut()
            .unwrap()
            .string_table
            .push("x".repeat(200_000));
        let err = client.export(big).await.unwrap_err();
        assert_eq!(err.code(), tonic::Code::ResourceExhausted, "{err}");
        let mut bad = request(vec![profile(vec![Sample {
            stack_index: 7,
            timestamps_unix_nano: vec![1],
            ..Default::default()
        }])]);
        bad.resource_profiles[0].scope_profiles[0]
            .profiles
            .push(profile(vec![good_sample(9)]));
        let mut req = tonic::Request::new(bad);
        req.metadata_mut()
            .insert("x-scope-orgid", "grpc-partial".parse().unwrap());
        let response = client.export(req).await.unwrap().into_inner();
        let partial = response.partial_success.unwrap();
        assert_eq!(partial.rejected_profiles, 1);
        assert!(
            partial.error_message.contains("stack_index 7"),
            "{}",
            partial.error_message
        );
    });
    assert_eq!(
        dump(&server, "grpc-partial")["samples"]
            .as_array()
            .unwrap()
            .len(),
        1
    );

    // Nothing of the bad requests was stored; nothing stored was touched.
    assert_eq!(dump(&server, tenant)["samples"], before["samples"]);
}
