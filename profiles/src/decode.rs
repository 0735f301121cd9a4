//! OTLP profiles requests from bytes: protobuf and OTLP/JSON, each
//! refused before it is decoded when it holds more elements than allowed
//! (counted on the wire by `symtrace_proto::limits`).

use symtrace_proto::collector::ExportProfilesServiceRequest;

use crate::request::Request;

/// Why a request's bytes are not a request.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum DecodeError {
    /// Not a well-formed request of this version (the message says where).
    #[error("{0}")]
    Malformed(String),
    /// More elements than the limit: refused before decoding.
    #[error(
        "the request holds more than {max} elements (table entries, samples, stack \
         frames, values and timestamps; SYMTRACE_MAX_EXPORT_ELEMENTS): send smaller exports"
    )]
    TooManyElements {
        /// The limit.
        max: usize,
    },
}

/// Decodes a protobuf request into [`Request`] (the way ingest does: no
/// message per sample or stack), naming the v1.9 layout when that is what
/// broke the decoding.
pub fn decode_protobuf(body: &[u8], max_elements: usize) -> Result<Request, DecodeError> {
    let elements = symtrace_proto::limits::count_protobuf_elements(body, max_elements);
    check_elements(elements, max_elements)?;
    Request::decode(body).map_err(malformed)
}

/// Decodes a protobuf request into the generated message, with the same
/// checks and errors as [`decode_protobuf`].
pub fn decode_protobuf_message(
    body: &[u8],
    max_elements: usize,
) -> Result<ExportProfilesServiceRequest, DecodeError> {
    let elements = symtrace_proto::limits::count_protobuf_elements(body, max_elements);
    check_elements(elements, max_elements)?;
    <ExportProfilesServiceRequest as prost::Message>::decode(body).map_err(malformed)
}

fn malformed(e: prost::DecodeError) -> DecodeError {
    let text = e.to_string();
    let hint = if text.contains("Sample.") {
        " (this is what an OTLP profiles v1.9 or older sender produces: v1.10 renumbered \
         Sample's fields; upgrade the sender to proto >= 1.10)"
    } else {
        ""
    };
    DecodeError::Malformed(format!(
        "malformed ExportProfilesServiceRequest: {text}{hint}"
    ))
}

/// Decodes an OTLP/JSON request into [`Request`].
pub fn decode_json(body: &[u8], max_elements: usize) -> Result<Request, DecodeError> {
    let message = decode_json_message(body, max_elements)?;
    // A request parsed from JSON may nest values past what protobuf's
    // decoder takes.
    Request::from_message(&message)
        .map_err(|e| DecodeError::Malformed(format!("malformed OTLP/JSON request: {e}")))
}

/// Decodes an OTLP/JSON request into the generated message.
pub fn decode_json_message(
    body: &[u8],
    max_elements: usize,
) -> Result<ExportProfilesServiceRequest, DecodeError> {
    check_elements(
        symtrace_proto::limits::count_json_elements(body),
        max_elements,
    )?;
    symtrace_proto::json::decode_export_request(body)
        .map_err(|e| DecodeError::Malformed(format!("malformed OTLP/JSON request: {e}")))
}

fn check_elements(elements: usize, max: usize) -> Result<(), DecodeError> {
    if elements > max {
        return Err(DecodeError::TooManyElements { max });
    }
    Ok(())
}
