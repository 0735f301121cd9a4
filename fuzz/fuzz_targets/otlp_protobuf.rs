//! Arbitrary bytes as an OTLP/HTTP or gRPC export, the way the server
//! takes them: the element bound on the wire, the decoder (ingest's, which
//! must decode exactly as prost's generated code does), normalization;
//! what normalization accepts must encode into a segment that decodes to
//! the same data, and by series the parts splitting it whole gives.
#![no_main]

use libfuzzer_sys::fuzz_target;
use prost::Message;
use symtrace_profiles::normalize::{normalize, Limits, DEFAULT_MAX_ELEMENTS};
use symtrace_profiles::segment;
use symtrace_proto::collector::ExportProfilesServiceRequest;
use symtrace_proto::limits::count_protobuf_elements;

fuzz_target!(|data: &[u8]| {
    // Small bounds, so the fuzzer reaches them.
    let max = 20_000.min(DEFAULT_MAX_ELEMENTS);
    if count_protobuf_elements(data, max) > max {
        return;
    }
    // Ingest's decoder gives prost's content, or prost's error.
    symtrace_profiles::testing::assert_decodes_as_prost(data);
    let Ok(request) = ExportProfilesServiceRequest::decode(data) else {
        return;
    };
    let limits = Limits {
        max_stack_depth: 64,
        ..Limits::default()
    };
    // By series (as ingest stores it), the parts are the split whole.
    symtrace_profiles::testing::assert_by_series_is_the_split_whole(request.clone(), 1, &limits);
    if let Ok(out) = normalize(request, 1, &limits) {
        round_trip(&out.data);
    }
});

/// A segment we encode decodes, to the same events (its tables may come
/// back in the format's canonical order), and a second pass changes nothing.
fn round_trip(data: &symtrace_profiles::model::SegmentData) {
    let once = segment::decode(&segment::encode(data, 1)).expect("a segment we encoded decodes");
    let events = |d: &symtrace_profiles::model::SegmentData| -> (usize, i64) {
        d.samples.iter().fold((0, 0), |(n, v), s| {
            (n + s.points(), v.wrapping_add(s.total()))
        })
    };
    assert_eq!(events(&once), events(data));
    let twice = segment::decode(&segment::encode(&once, 1)).expect("decodes again");
    assert_eq!(twice, once);
}
