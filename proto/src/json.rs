//! OTLP/JSON for the profiles service.
//!
//! pbjson implements the canonical protobuf JSON mapping (camelCase or
//! original field names, int64 as numbers or strings, integer enums, unknown
//! fields ignored). OTLP/JSON departs from it for IDs: `traceId` and
//! `spanId` of a `Link`, and a profile's `profileId`, are hex; base64 is
//! still accepted. Requests are parsed straight into the messages (no
//! intermediate `serde_json::Value` tree, which costs ~10× the text); a hex
//! ID is every hex digit a base64 digit too, so pbjson reads it as base64 of
//! the wrong length (24 bytes for a 32-digit trace ID, 12 for a 16-digit
//! span ID, where base64 of a real ID gives 16 and 8), and it is turned back
//! into its hex text and decoded as hex.

use base64::Engine as _;
use serde_json::Value;

use crate::collector::{ExportProfilesServiceRequest, ExportProfilesServiceResponse};

/// Parses an OTLP/JSON `ExportProfilesServiceRequest`.
pub fn decode_export_request(
    body: &[u8],
) -> Result<ExportProfilesServiceRequest, serde_json::Error> {
    let mut request: ExportProfilesServiceRequest = serde_json::from_slice(body)?;
    if let Some(dictionary) = request.dictionary.as_mut() {
        for link in &mut dictionary.link_table {
            unhex(&mut link.trace_id, 16);
            unhex(&mut link.span_id, 8);
        }
    }
    for profile in request
        .resource_profiles
        .iter_mut()
        .flat_map(|r| &mut r.scope_profiles)
        .flat_map(|s| &mut s.profiles)
    {
        unhex(&mut profile.profile_id, 16);
    }
    Ok(request)
}

/// An ID of `len` bytes that was sent as hex and read as base64.
fn unhex(id: &mut Vec<u8>, len: usize) {
    if id.len() != len * 3 / 2 {
        return;
    }
    let text = base64::engine::general_purpose::STANDARD.encode(&id[..]);
    if text.len() == len * 2 {
        if let Ok(bytes) = hex::decode(&text) {
            *id = bytes;
        }
    }
}

/// Serializes an `ExportProfilesServiceResponse` as OTLP/JSON.
pub fn encode_export_response(response: &ExportProfilesServiceResponse) -> Vec<u8> {
    serde_json::to_vec(response).expect("a response always serializes")
}

/// Serializes a request as OTLP/JSON (hex IDs), for clients and tests.
pub fn encode_export_request(request: &ExportProfilesServiceRequest) -> Vec<u8> {
    let mut value = serde_json::to_value(request).expect("a request always serializes");
    base64_ids_to_hex(&mut value);
    serde_json::to_vec(&value).expect("a value always serializes")
}

fn id_fields(value: &mut Value, mut fix: impl FnMut(&mut Value)) {
    let Some(object) = value.as_object_mut() else {
        return;
    };
    let links = object
        .get_mut("dictionary")
        .and_then(|d| d.get_mut("linkTable"))
        .and_then(|l| l.as_array_mut());
    for link in links
        .into_iter()
        .flatten()
        .filter_map(|l| l.as_object_mut())
    {
        for key in ["traceId", "trace_id", "spanId", "span_id"] {
            if let Some(id) = link.get_mut(key) {
                fix(id);
            }
        }
    }
    let resources = object
        .get_mut("resourceProfiles")
        .and_then(|r| r.as_array_mut());
    for resource in resources.into_iter().flatten() {
        let scopes = resource
            .get_mut("scopeProfiles")
            .and_then(|s| s.as_array_mut());
        for scope in scopes.into_iter().flatten() {
            let profiles = scope.get_mut("profiles").and_then(|p| p.as_array_mut());
            for profile in profiles.into_iter().flatten() {
                if let Some(id) = profile.get_mut("profileId") {
                    fix(id);
                }
            }
        }
    }
}

fn base64_ids_to_hex(value: &mut Value) {
    id_fields(value, |id| {
        if let Value::String(s) = id {
            if let Ok(bytes) = base64::engine::general_purpose::STANDARD.decode(s.as_str()) {
                *s = hex::encode(bytes);
            }
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::profiles::{Link, ProfilesDictionary};

    #[test]
    fn link_ids_are_hex_both_ways() {
        let request = ExportProfilesServiceRequest {
            resource_profiles: vec![],
            dictionary: Some(ProfilesDictionary {
                link_table: vec![
                    Link::default(),
                    Link {
                        trace_id: (1..=16).collect(),
                        span_id: (1..=8).collect(),
                    },
                ],
                ..Default::default()
            }),
        };
        let json = encode_export_request(&request);
        let text = String::from_utf8(json.clone()).unwrap();
        assert!(
            text.contains("\"traceId\":\"0102030405060708090a0b0c0d0e0f10\""),
            "{text}"
        );
        assert!(text.contains("\"spanId\":\"0102030405060708\""), "{text}");
        assert_eq!(decode_export_request(&json).unwrap(), request);
    }

    #[test]
    fn accepts_int64_strings_and_unknown_fields() {
        let body = br#"{"resourceProfiles":[{"scopeProfiles":[{"profiles":[
            {"timeUnixNano":"1700000000000000000","period":"50000000","futureField":1,
             "samples":[{"stackIndex":1,"values":["7"],"timestampsUnixNano":["1700000000000000001"]}]}]}]}],
            "dictionary":{"linkTable":[{}, {"traceId":"5B8EFFF798038103D269B633813FC60C","spanId":"EEE19B7EC3C1B174"}]}}"#;
        let request = decode_export_request(body).unwrap();
        let profile = &request.resource_profiles[0].scope_profiles[0].profiles[0];
        assert_eq!(profile.time_unix_nano, 1_700_000_000_000_000_000);
        assert_eq!(profile.period, 50_000_000);
        assert_eq!(profile.samples[0].values, vec![7]);
        let link = &request.dictionary.unwrap().link_table[1];
        assert_eq!(
            hex::encode(&link.trace_id),
            "5b8efff798038103d269b633813fc60c"
        );
        assert_eq!(hex::encode(&link.span_id), "eee19b7ec3c1b174");
    }
}
