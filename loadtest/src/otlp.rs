//! The `otlp` scenario: realistic exports (see generate.rs), generated once
//! and made unique per send, over OTLP/HTTP (pre-compressed) or gRPC.
//!
//! Every export ends with one more resource, of service
//! [`EXPORTS_SERVICE`], holding one sample whose only frame is the named
//! function `export-<seq>`: a flamegraph of that service, folded, lists
//! exactly the exports the store holds, which is how `mixed --verify`
//! checks that nothing acknowledged was lost. That sample is linked to a
//! trace of its own ([`export_trace_id`]): the trace lookups of `mixed`
//! ask for recent exports' traces, each held by one export, as a span's
//! samples are held by the few exports of its hosts. (The payloads' own
//! links repeat in every export made from the same payload, an eighth of
//! all: no trace of a real fleet is in so many.)

use std::collections::HashMap;
use std::io::Write;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use prost::Message;
use symtrace_proto::collector::profiles_service_client::ProfilesServiceClient;
use symtrace_proto::collector::{ExportProfilesServiceRequest, ExportProfilesServiceResponse};
use symtrace_proto::common::{any_value, AnyValue, KeyValue};
use symtrace_proto::profiles::{
    Function, Line, Link, Location, Profile, ProfilesDictionary, ResourceProfiles, Sample,
    ScopeProfiles, Stack, ValueType,
};
use tonic::codec::CompressionEncoding;

use crate::generate::{self, Shape};
use crate::report::Op;
use crate::target::{classify, send_checked, Failure, Targets};

/// The service of the one-sample resource that names each export.
pub const EXPORTS_SERVICE: &str = "loadtest-exports";

#[derive(Clone, Copy, clap::ValueEnum)]
pub enum Protocol {
    /// OTLP/HTTP, protobuf, gzip (compressed once, up front).
    Http,
    /// OTLP gRPC with gzip (the client compresses every export).
    Grpc,
}

pub struct Payload {
    pub raw: Vec<u8>,
    pub gzipped: Vec<u8>,
    pub events: usize,
    /// Decoded, for gRPC (tonic encodes messages itself).
    request: Option<ExportProfilesServiceRequest>,
    /// Lengths of the dictionary tables the suffix appends to.
    strings: i32,
    functions: i32,
    locations: i32,
    stacks: i32,
    links: i32,
    window_end_ns: u64,
}

/// The trace of export `seq` of run `run` (see the module's comment):
/// random-looking, as W3C trace IDs are (the trace index keys on their
/// first bytes).
pub fn export_trace_id(run: u64, seq: u64) -> [u8; 16] {
    // splitmix64
    let mix = |mut z: u64| {
        z = z.wrapping_add(0x9e37_79b9_7f4a_7c15);
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    };
    let high = mix(run ^ mix(seq));
    let mut id = [0u8; 16];
    id[..8].copy_from_slice(&high.to_be_bytes());
    id[8..].copy_from_slice(&mix(high).to_be_bytes());
    id
}

pub fn payloads(shape: Shape, count: usize, ago_s: u64, keep_request: bool) -> Vec<Payload> {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos() as u64
        - ago_s * 1_000_000_000;
    (0..count)
        .map(|i| {
            let request = generate::export(shape, i as u64 + 1, now);
            let raw = request.encode_to_vec();
            let d = request.dictionary.as_ref().expect("a dictionary");
            let len = |n: usize| n as i32;
            Payload {
                gzipped: gzip(&raw),
                events: generate::events(&request),
                strings: len(d.string_table.len()),
                functions: len(d.function_table.len()),
                locations: len(d.location_table.len()),
                stacks: len(d.stack_table.len()),
                links: len(d.link_table.len()),
                window_end_ns: now,
                raw,
                request: keep_request.then_some(request),
            }
        })
        .collect()
}

pub fn gzip(data: &[u8]) -> Vec<u8> {
    let mut e = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
    e.write_all(data).unwrap();
    e.finish().unwrap()
}

/// Protobuf that, appended to `p`'s encoding, adds one resource of
/// [`EXPORTS_SERVICE`] with one sample of frame `export-<seq>`: repeated
/// fields concatenate, so its dictionary entries follow `p`'s and are
/// indexed from `p`'s table lengths.
pub fn unique_suffix(p: &Payload, run: u64, seq: u64) -> Vec<u8> {
    let s = p.strings;
    let extra = ExportProfilesServiceRequest {
        resource_profiles: vec![ResourceProfiles {
            resource: Some(symtrace_proto::resource::Resource {
                attributes: vec![KeyValue {
                    key: "service.name".into(),
                    value: Some(AnyValue {
                        value: Some(any_value::Value::StringValue(EXPORTS_SERVICE.into())),
                    }),
                    ..Default::default()
                }],
                ..Default::default()
            }),
            scope_profiles: vec![ScopeProfiles {
                profiles: vec![Profile {
                    sample_type: Some(ValueType {
                        type_strindex: s + 1,
                        unit_strindex: s + 2,
                    }),
                    period_type: Some(ValueType {
                        type_strindex: s + 3,
                        unit_strindex: s + 4,
                    }),
                    period: 52_631_578,
                    time_unix_nano: p.window_end_ns - 10_000_000_000,
                    duration_nano: 10_000_000_000,
                    samples: vec![Sample {
                        stack_index: p.stacks,
                        timestamps_unix_nano: vec![p.window_end_ns - 1],
                        link_index: p.links,
                        ..Default::default()
                    }],
                    ..Default::default()
                }],
                ..Default::default()
            }],
            ..Default::default()
        }],
        dictionary: Some(ProfilesDictionary {
            string_table: [
                export_name(run, seq).as_str(),
                "samples",
                "count",
                "cpu",
                "nanoseconds",
            ]
            .map(str::to_owned)
            .to_vec(),
            function_table: vec![Function {
                name_strindex: s,
                ..Default::default()
            }],
            location_table: vec![Location {
                lines: vec![Line {
                    function_index: p.functions,
                    ..Default::default()
                }],
                ..Default::default()
            }],
            stack_table: vec![Stack {
                location_indices: vec![p.locations],
            }],
            link_table: vec![Link {
                trace_id: export_trace_id(run, seq).to_vec(),
                span_id: seq.wrapping_add(1).to_be_bytes().to_vec(),
            }],
            ..Default::default()
        }),
    };
    extra.encode_to_vec()
}

/// Sends exports of the payloads, each unique, to the targets.
pub struct Exporter {
    payloads: Arc<Vec<Payload>>,
    http: reqwest::Client,
    grpc: HashMap<String, ProfilesServiceClient<tonic::transport::Channel>>,
    protocol: Protocol,
    tenant: String,
    /// Sequence numbers of the exports the server acknowledged.
    pub acknowledged: Mutex<Vec<u64>>,
    /// Protobuf bytes of the acknowledged exports.
    pub protobuf_bytes: AtomicU64,
    /// This run's number, in the exports' names.
    pub run: u64,
}

/// The frame that names export `seq` of run `run`.
pub fn export_name(run: u64, seq: u64) -> String {
    format!("export-{run:x}-{seq}")
}

impl Exporter {
    pub fn new(
        payloads: Vec<Payload>,
        protocol: Protocol,
        urls: &[String],
        tenant: &str,
        run: u64,
    ) -> anyhow::Result<Self> {
        let mut grpc = HashMap::new();
        if let Protocol::Grpc = protocol {
            for url in urls {
                let channel = tonic::transport::Endpoint::from_shared(url.clone())?
                    .connect_timeout(Duration::from_secs(5))
                    .timeout(Duration::from_secs(60))
                    .connect_lazy();
                let client = ProfilesServiceClient::new(channel)
                    .send_compressed(CompressionEncoding::Gzip)
                    .max_encoding_message_size(64 << 20);
                grpc.insert(url.trim_end_matches('/').to_owned(), client);
            }
        }
        Ok(Self {
            payloads: Arc::new(payloads),
            http: reqwest::Client::builder()
                .timeout(Duration::from_secs(60))
                .build()?,
            grpc,
            protocol,
            tenant: tenant.to_owned(),
            acknowledged: Mutex::new(Vec::new()),
            protobuf_bytes: AtomicU64::new(0),
            run,
        })
    }

    pub fn average_events(&self) -> f64 {
        self.payloads.iter().map(|p| p.events + 1).sum::<usize>() as f64
            / self.payloads.len() as f64
    }

    pub fn average_bytes(&self) -> usize {
        self.payloads.iter().map(|p| p.raw.len()).sum::<usize>() / self.payloads.len()
    }

    /// The trace of one of the last 100 acknowledged exports (hex), if any.
    pub fn recent_trace_id(&self) -> Option<String> {
        let acknowledged = self.acknowledged.lock().unwrap();
        let recent = &acknowledged[acknowledged.len().saturating_sub(100)..];
        let seq = *recent.get(rand::random_range(0..recent.len().max(1)))?;
        Some(
            export_trace_id(self.run, seq)
                .iter()
                .map(|b| format!("{b:02x}"))
                .collect(),
        )
    }

    /// Export number `seq`; its events count in `op`.
    pub async fn export(&self, targets: &Targets, op: &Op, seq: u64) {
        let p = &self.payloads[seq as usize % self.payloads.len()];
        let suffix = unique_suffix(p, self.run, seq);
        let sent = targets
            .send(op, |url| {
                let suffix = &suffix;
                async move {
                    match self.protocol {
                        Protocol::Http => self.export_http(&url, p, suffix).await,
                        Protocol::Grpc => self.export_grpc(&url, p, suffix).await,
                    }
                }
            })
            .await;
        if sent.is_some() {
            self.acknowledged.lock().unwrap().push(seq);
            self.protobuf_bytes
                .fetch_add(p.raw.len() as u64, Ordering::Relaxed);
        }
    }

    async fn export_http(&self, url: &str, p: &Payload, suffix: &[u8]) -> Result<u64, Failure> {
        let mut body = p.gzipped.clone();
        body.extend_from_slice(&gzip(suffix));
        let r = send_checked(
            self.http
                .post(format!("{url}/v1development/profiles"))
                .header("Content-Type", "application/x-protobuf")
                .header("Content-Encoding", "gzip")
                .header("X-Scope-OrgID", &self.tenant)
                .body(body),
        )
        .await?;
        let answer = r.bytes().await.map_err(|e| classify(&e))?;
        let answer = ExportProfilesServiceResponse::decode(&answer[..])
            .map_err(|_| Failure::Answer("undecodable answer".into()))?;
        accepted(answer, p)
    }

    async fn export_grpc(&self, url: &str, p: &Payload, suffix: &[u8]) -> Result<u64, Failure> {
        let mut request = p.request.clone().expect("payloads kept for gRPC");
        request.merge(suffix).expect("the suffix is valid protobuf");
        let mut client = self.grpc[url].clone();
        let mut request = tonic::Request::new(request);
        request.metadata_mut().insert(
            "x-scope-orgid",
            self.tenant
                .parse()
                .map_err(|_| Failure::Answer("tenant is not ASCII".into()))?,
        );
        match client.export(request).await {
            Ok(answer) => accepted(answer.into_inner(), p),
            Err(status) => Err(match status.code() {
                tonic::Code::Unavailable | tonic::Code::Unknown | tonic::Code::Cancelled => {
                    Failure::Connection(format!("gRPC {:?}", status.code()))
                }
                code => Failure::Answer(format!("gRPC {code:?}")),
            }),
        }
    }
}

fn accepted(answer: ExportProfilesServiceResponse, p: &Payload) -> Result<u64, Failure> {
    match answer.partial_success {
        Some(partial) if partial.rejected_profiles > 0 => Err(Failure::Answer(format!(
            "{} profiles rejected",
            partial.rejected_profiles
        ))),
        _ => Ok(p.events as u64 + 1),
    }
}
