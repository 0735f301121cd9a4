//! Tenants: every profile belongs to one, named by the `X-Scope-OrgID`
//! header (as in Cortex, Loki, Mimir and Pyroscope). Without the header a
//! request belongs to the tenant `default`. Tenants never see each other's
//! data: every profile query is scoped to the caller's tenant.

use std::net::SocketAddr;

use axum::http::HeaderMap;

use crate::auth::{Auth, Scope};
use crate::error::ApiError;

pub const HEADER: &str = "x-scope-orgid";
pub const DEFAULT: &str = "default";

/// The request's tenant, or why the header is unusable.
pub fn from_headers(headers: &HeaderMap) -> Result<String, String> {
    match headers.get(HEADER) {
        None => Ok(DEFAULT.to_owned()),
        Some(value) => {
            let value = value
                .to_str()
                .map_err(|_| "X-Scope-OrgID is not ASCII".to_owned())?;
            validate(value).map(str::to_owned)
        }
    }
}

/// A read request's tenant, once it is allowed to read (as every read
/// endpoint of profiles checks them).
pub fn reader(auth: &Auth, headers: &HeaderMap, peer: SocketAddr) -> Result<String, ApiError> {
    auth.check(headers, peer, Scope::Read)?;
    from_headers(headers).map_err(ApiError::bad_request)
}

/// 1–64 characters of `[A-Za-z0-9_.-]`.
pub fn validate(tenant: &str) -> Result<&str, String> {
    let ok = !tenant.is_empty()
        && tenant.len() <= 64
        && tenant
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'.' | b'-'));
    if ok {
        Ok(tenant)
    } else {
        Err(format!(
            "X-Scope-OrgID {tenant:?} is not a tenant name (1-64 characters of A-Z a-z 0-9 _ . -)"
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names() {
        let mut h = HeaderMap::new();
        assert_eq!(from_headers(&h).unwrap(), "default");
        h.insert(HEADER, "team-a.prod_1".parse().unwrap());
        assert_eq!(from_headers(&h).unwrap(), "team-a.prod_1");
        for bad in ["", "a/b", "../x", "a b", &"x".repeat(65)] {
            assert!(validate(bad).is_err(), "{bad:?}");
        }
    }
}
