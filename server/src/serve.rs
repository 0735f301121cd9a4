//! Sending stored files the way debuginfod clients expect: the
//! `X-DEBUGINFOD-*` headers, `Last-Modified`, `Cache-Control`, an `ETag`,
//! single-range requests (206/416), `If-None-Match` (304) and HEAD without
//! touching the object store.

use axum::body::Body;
use axum::http::{header, HeaderMap, HeaderValue, Method, StatusCode};
use axum::response::{IntoResponse, Response};

use crate::error::{ApiError, ApiResult};
use crate::store::blobs::BlobBody;
use crate::store::SymbolStore;

/// A file (or a section of one) to send.
pub struct StoredFile<'a> {
    pub sha256: &'a str,
    /// Where the file's bytes start inside the blob (non-zero for sections).
    pub offset: u64,
    /// The file's length.
    pub size: u64,
    /// For `X-DEBUGINFOD-FILE`.
    pub name: &'a str,
    /// Unix milliseconds, for `Last-Modified`.
    pub modified_ms: i64,
    /// Distinguishes sections of the same blob in the ETag.
    pub etag_suffix: &'a str,
    /// Reads are public (`Cache-Control: public`), not behind tokens.
    pub public: bool,
}

pub async fn send(
    store: &SymbolStore,
    method: &Method,
    request: &HeaderMap,
    file: StoredFile<'_>,
) -> ApiResult<Response> {
    let etag = format!("\"{}{}\"", file.sha256, file.etag_suffix);
    let modified =
        std::time::UNIX_EPOCH + std::time::Duration::from_millis(file.modified_ms.max(0) as u64);
    let mut headers = HeaderMap::new();
    headers.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/octet-stream"),
    );
    headers.insert("x-debuginfod-size", HeaderValue::from(file.size));
    if let Ok(name) = HeaderValue::from_str(file.name) {
        headers.insert("x-debuginfod-file", name);
    }
    headers.insert(
        header::LAST_MODIFIED,
        HeaderValue::from_str(&httpdate::fmt_http_date(modified)).expect("http date is ASCII"),
    );
    if file.public {
        headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("public"));
    } else {
        // Reads need a token: no shared cache may keep this for others.
        headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("private"));
        headers.insert(header::VARY, HeaderValue::from_static("authorization"));
    }
    headers.insert(
        header::ETAG,
        HeaderValue::from_str(&etag).expect("hex etag is ASCII"),
    );
    headers.insert(header::ACCEPT_RANGES, HeaderValue::from_static("bytes"));

    if let Some(max) = request
        .get("x-debuginfod-maxsize")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim().parse::<u64>().ok())
    {
        if file.size > max {
            return Err(ApiError::new(
                StatusCode::NOT_ACCEPTABLE,
                "too_large",
                format!(
                    "file is {} bytes, more than X-DEBUGINFOD-MAXSIZE {max}",
                    file.size
                ),
            ));
        }
    }
    if request
        .get(header::IF_NONE_MATCH)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.split(',').any(|t| t.trim() == etag || t.trim() == "*"))
    {
        return Ok((StatusCode::NOT_MODIFIED, headers).into_response());
    }

    let (status, start, len) = match request.get(header::RANGE).and_then(|v| v.to_str().ok()) {
        None => (StatusCode::OK, 0, file.size),
        Some(spec) => match parse_range(spec, file.size) {
            RangeSpec::Ignore => (StatusCode::OK, 0, file.size),
            RangeSpec::Unsatisfiable => {
                headers.insert(
                    header::CONTENT_RANGE,
                    HeaderValue::from_str(&format!("bytes */{}", file.size)).expect("ASCII"),
                );
                return Ok((StatusCode::RANGE_NOT_SATISFIABLE, headers).into_response());
            }
            RangeSpec::Range(start, end) => {
                headers.insert(
                    header::CONTENT_RANGE,
                    HeaderValue::from_str(&format!("bytes {start}-{}/{}", end - 1, file.size))
                        .expect("ASCII"),
                );
                (StatusCode::PARTIAL_CONTENT, start, end - start)
            }
        },
    };
    headers.insert(header::CONTENT_LENGTH, HeaderValue::from(len));
    if method == Method::HEAD || len == 0 {
        return Ok((status, headers, Body::empty()).into_response());
    }
    let from = file.offset + start;
    let body = match store.blob(file.sha256, Some(from..from + len)).await? {
        BlobBody::Bytes(bytes) => Body::from(bytes),
        BlobBody::Stream(stream) => Body::from_stream(stream),
    };
    Ok((status, headers, body).into_response())
}

#[derive(Debug, PartialEq, Eq)]
enum RangeSpec {
    /// Not a single byte range we serve: answer with the whole file.
    Ignore,
    Unsatisfiable,
    /// Half-open `[start, end)`.
    Range(u64, u64),
}

fn parse_range(spec: &str, size: u64) -> RangeSpec {
    let Some(spec) = spec.trim().strip_prefix("bytes=") else {
        return RangeSpec::Ignore;
    };
    if spec.contains(',') {
        return RangeSpec::Ignore;
    }
    let Some((first, last)) = spec.trim().split_once('-') else {
        return RangeSpec::Ignore;
    };
    let (first, last) = (first.trim(), last.trim());
    let range = if first.is_empty() {
        match last.parse::<u64>() {
            Ok(0) => return RangeSpec::Unsatisfiable,
            Ok(n) => (size.saturating_sub(n), size),
            Err(_) => return RangeSpec::Ignore,
        }
    } else {
        let Ok(start) = first.parse::<u64>() else {
            return RangeSpec::Ignore;
        };
        let end = if last.is_empty() {
            size
        } else {
            match last.parse::<u64>() {
                Ok(l) if l >= start => l.saturating_add(1).min(size),
                _ => return RangeSpec::Ignore,
            }
        };
        (start, end)
    };
    if range.0 >= size {
        RangeSpec::Unsatisfiable
    } else {
        RangeSpec::Range(range.0, range.1)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranges() {
        assert_eq!(parse_range("bytes=0-9", 100), RangeSpec::Range(0, 10));
        assert_eq!(parse_range("bytes=90-", 100), RangeSpec::Range(90, 100));
        assert_eq!(parse_range("bytes=-10", 100), RangeSpec::Range(90, 100));
        assert_eq!(parse_range("bytes=-500", 100), RangeSpec::Range(0, 100));
        assert_eq!(parse_range("bytes=50-500", 100), RangeSpec::Range(50, 100));
        assert_eq!(parse_range("bytes=100-", 100), RangeSpec::Unsatisfiable);
        assert_eq!(parse_range("bytes=0-1,5-6", 100), RangeSpec::Ignore);
        assert_eq!(parse_range("items=0-1", 100), RangeSpec::Ignore);
        assert_eq!(parse_range("bytes=9-3", 100), RangeSpec::Ignore);
        assert_eq!(
            parse_range("bytes=0-18446744073709551615", 100),
            RangeSpec::Range(0, 100)
        );
        assert_eq!(
            parse_range("bytes=5-18446744073709551615", 100),
            RangeSpec::Range(5, 100)
        );
    }
}
