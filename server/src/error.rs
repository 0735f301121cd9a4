//! The one error type HTTP handlers return: a status, a stable code and a
//! message that says what was wrong, rendered as
//! `{"error": {"code": …, "message": …}}`.

use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use serde_json::json;

use crate::store;
use crate::store::spool::SpoolError;

#[derive(Debug)]
pub struct ApiError {
    pub status: StatusCode,
    pub code: &'static str,
    pub message: String,
    /// Seconds for `Retry-After` (a 429; a 503 says 2 unless set).
    pub retry_after: Option<u64>,
}

impl ApiError {
    pub fn new(status: StatusCode, code: &'static str, message: impl Into<String>) -> Self {
        Self {
            status,
            code,
            message: message.into(),
            retry_after: None,
        }
    }

    /// With a `Retry-After` of `seconds`.
    pub fn with_retry_after(mut self, seconds: u64) -> Self {
        self.retry_after = Some(seconds);
        self
    }

    pub fn bad_request(message: impl Into<String>) -> Self {
        Self::new(StatusCode::BAD_REQUEST, "bad_request", message)
    }

    pub fn not_found(message: impl Into<String>) -> Self {
        Self::new(StatusCode::NOT_FOUND, "not_found", message)
    }

    pub fn internal(message: impl Into<String>) -> Self {
        Self::new(StatusCode::INTERNAL_SERVER_ERROR, "internal", message)
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        if self.status.is_server_error() {
            tracing::error!(status = %self.status, code = self.code, message = %self.message, "request failed");
        }
        let body = json!({ "error": { "code": self.code, "message": self.message } });
        let mut response = (self.status, axum::Json(body)).into_response();
        if let Some(seconds) = self.retry_after {
            response
                .headers_mut()
                .insert(header::RETRY_AFTER, HeaderValue::from(seconds));
        } else if self.status == StatusCode::SERVICE_UNAVAILABLE {
            response
                .headers_mut()
                .insert(header::RETRY_AFTER, HeaderValue::from_static("2"));
        }
        if self.status == StatusCode::UNAUTHORIZED {
            response
                .headers_mut()
                .insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
        }
        response
    }
}

impl From<store::Error> for ApiError {
    /// Refusals keep their statuses; anything else the store could not do
    /// (a row or object that should be there and is not, an outage) is the
    /// server's fault: 500, logged.
    fn from(e: store::Error) -> Self {
        match e {
            store::Error::Rejected(m) => {
                Self::new(StatusCode::UNPROCESSABLE_ENTITY, "invalid_content", m)
            }
            store::Error::Conflict(m) => {
                Self::new(StatusCode::CONFLICT, "owned_by_another_tenant", m)
            }
            e @ store::Error::NotFound(_) => Self::internal(format!("stored data is missing: {e}")),
            e => Self::internal(e.to_string()),
        }
    }
}

impl From<SpoolError> for ApiError {
    fn from(e: SpoolError) -> Self {
        match e {
            SpoolError::TooLarge { .. } => {
                Self::new(StatusCode::PAYLOAD_TOO_LARGE, "too_large", e.to_string())
            }
            SpoolError::Body(ref m) if crate::listen::is_body_idle(m) => {
                Self::new(StatusCode::REQUEST_TIMEOUT, "body_timeout", e.to_string())
            }
            SpoolError::Body(_) => Self::bad_request(e.to_string()),
            SpoolError::Io(e) => Self::internal(format!("spool I/O error: {e}")),
        }
    }
}

impl From<symtrace_elf::BuildIdError> for ApiError {
    fn from(e: symtrace_elf::BuildIdError) -> Self {
        Self::new(StatusCode::BAD_REQUEST, "invalid_build_id", e.to_string())
    }
}

pub type ApiResult<T> = Result<T, ApiError>;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn store_errors_map_to_the_statuses_they_always_had() {
        let status = |e: store::Error| ApiError::from(e).status;
        assert_eq!(
            status(store::Error::Rejected("x".into())),
            StatusCode::UNPROCESSABLE_ENTITY
        );
        assert_eq!(
            status(store::Error::Conflict("x".into())),
            StatusCode::CONFLICT
        );
        // A blob or row the store should have: the server's fault, not the
        // client's (debuginfod clients cache a 404 for minutes).
        assert_eq!(
            status(store::Error::NotFound("blob".into())),
            StatusCode::INTERNAL_SERVER_ERROR
        );
        assert_eq!(
            status(sqlx::Error::PoolTimedOut.into()),
            StatusCode::INTERNAL_SERVER_ERROR
        );
        assert_eq!(
            status(std::io::Error::other("disk").into()),
            StatusCode::INTERNAL_SERVER_ERROR
        );
    }
}

// The engine's errors, each mapped to HTTP here (and to gRPC where the
// gRPC edge meets them).

impl From<symtrace_profiles::selection::SelectionError> for ApiError {
    /// A selection's parameters: always the client's mistake.
    fn from(e: symtrace_profiles::selection::SelectionError) -> Self {
        ApiError::bad_request(e.to_string())
    }
}

impl From<crate::query::QueryError> for ApiError {
    fn from(e: crate::query::QueryError) -> Self {
        use crate::query::QueryError;
        match e {
            QueryError::BadRequest(_) | QueryError::Selection(_) | QueryError::TooLarge { .. } => {
                Self::bad_request(e.to_string())
            }
            QueryError::Timeout(_) => {
                Self::new(StatusCode::SERVICE_UNAVAILABLE, "timeout", e.to_string())
            }
            QueryError::Store(e) => e.into(),
            QueryError::Segment(crate::profiles::store::ProfileStoreError::Store(e)) => e.into(),
            QueryError::Segment(_)
            | QueryError::Decode(_)
            | QueryError::Cpu(_)
            | QueryError::Retry => Self::internal(e.to_string()),
        }
    }
}

impl From<crate::federation::FindError> for ApiError {
    fn from(e: crate::federation::FindError) -> Self {
        match e {
            crate::federation::FindError::Store(e) => e.into(),
            crate::federation::FindError::Busy(e) => e.into(),
        }
    }
}

impl From<crate::limits::Busy> for ApiError {
    fn from(e: crate::limits::Busy) -> Self {
        ApiError::new(StatusCode::SERVICE_UNAVAILABLE, "busy", e.to_string())
    }
}

impl From<crate::auth::AuthError> for ApiError {
    fn from(e: crate::auth::AuthError) -> Self {
        use crate::auth::AuthError;
        let status = StatusCode::from_u16(e.status()).expect("a valid status");
        let code = match e {
            AuthError::Unauthenticated(_) => "unauthorized",
            AuthError::Forbidden(_) => "forbidden",
            AuthError::BadTenant(_) => "bad_request",
        };
        Self::new(status, code, e.message())
    }
}

impl From<crate::claims::ClaimError> for ApiError {
    fn from(e: crate::claims::ClaimError) -> Self {
        match e {
            crate::claims::ClaimError::InvalidBuildId => Self::bad_request(e.to_string()),
            crate::claims::ClaimError::Store(e) => e.into(),
        }
    }
}

#[cfg(test)]
mod engine_tests {
    use super::*;

    #[test]
    fn busy_is_503() {
        let slots = crate::limits::Slots::new("queries", "SYMTRACE_MAX_CONCURRENT_QUERIES", 1);
        let _held = slots.take().unwrap();
        let e: ApiError = slots.take().unwrap_err().into();
        assert_eq!(e.status, StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(e.code, "busy");
    }
}
