//! Arbitrary bytes as a stored segment (a damaged object, or one written by
//! another version): decoding validates every index, never panics; what it
//! accepts re-encodes to the same data.
#![no_main]

use libfuzzer_sys::fuzz_target;
use symtrace_profiles::segment;

fuzz_target!(|data: &[u8]| {
    if let Ok(decoded) = segment::decode(data) {
        // Re-encoded, it decodes to the same events; once in the format's
        // canonical order, a second pass changes nothing.
        let once = segment::decode(&segment::encode(&decoded, 1)).expect("re-encoded decodes");
        let events = |d: &symtrace_profiles::model::SegmentData| -> (usize, i64) {
            d.samples.iter().fold((0, 0), |(n, v), s| {
                (
                    n + s.points(),
                    v.wrapping_add(s.values.iter().fold(0i64, |a, b| a.wrapping_add(*b))),
                )
            })
        };
        assert_eq!(events(&once), events(&decoded));
        let twice = segment::decode(&segment::encode(&once, 1)).expect("decodes again");
        assert_eq!(twice, once);
    }
});
