//! Arbitrary bytes as an OTLP/JSON export: the structural element bound,
//! the parser (no value tree), normalization and the segment round trip.
#![no_main]

use libfuzzer_sys::fuzz_target;
use symtrace_profiles::normalize::{normalize, Limits};
use symtrace_profiles::segment;
use symtrace_proto::json::decode_export_request;
use symtrace_proto::limits::count_json_elements;

fuzz_target!(|data: &[u8]| {
    if count_json_elements(data) > 20_000 {
        return;
    }
    let Ok(request) = decode_export_request(data) else {
        return;
    };
    let limits = Limits {
        max_stack_depth: 64,
        ..Limits::default()
    };
    // By series (as ingest stores it), the parts are the split whole.
    symtrace_profiles::testing::assert_by_series_is_the_split_whole(request.clone(), 1, &limits);
    if let Ok(out) = normalize(request, 1, &limits) {
        let once = segment::decode(&segment::encode(&out.data, 1)).expect("decodes");
        let events = |d: &symtrace_profiles::model::SegmentData| -> (usize, i64) {
            d.samples.iter().fold((0, 0), |(n, v), s| {
                (n + s.points(), v.wrapping_add(s.total()))
            })
        };
        assert_eq!(events(&once), events(&out.data));
        let twice = segment::decode(&segment::encode(&once, 1)).expect("decodes again");
        assert_eq!(twice, once);
    }
});
