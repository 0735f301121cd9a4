//! Tenants: every profile belongs to one, named by the `X-Scope-OrgID`
//! header (as in Cortex, Loki, Mimir and Pyroscope). Without the header a
//! request belongs to the tenant `default` — or, with a token bound to one
//! tenant, to that one. A bound token may name only its own tenants;
//! another is refused (403). Every profile query and export is scoped to
//! the tenant resolved here.

use std::net::SocketAddr;

use axum::http::HeaderMap;

use crate::auth::AuthError;
use crate::auth::{Auth, Scope, Tenants};

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
pub fn reader(auth: &Auth, headers: &HeaderMap, peer: SocketAddr) -> Result<String, AuthError> {
    let tenants = auth.check(headers, peer, Scope::Read)?;
    resolve(&tenants, headers)
}

/// An export's tenant, once it is allowed to write (upload, admin and
/// agent tokens export profiles).
pub fn writer(auth: &Auth, headers: &HeaderMap, peer: SocketAddr) -> Result<String, AuthError> {
    let tenants = auth.check(headers, peer, Scope::Agent)?;
    resolve(&tenants, headers)
}

/// The tenant a request acts for, within what its token allows: the header's
/// when allowed (403 naming the header otherwise), else the token's only
/// tenant, else `default` for a token of every tenant.
pub fn resolve(tenants: &Tenants, headers: &HeaderMap) -> Result<String, AuthError> {
    let named = match headers.get(HEADER) {
        None => None,
        Some(_) => Some(from_headers(headers).map_err(AuthError::BadTenant)?),
    };
    match (tenants, named) {
        (Tenants::All, named) => Ok(named.unwrap_or_else(|| DEFAULT.to_owned())),
        (only, Some(t)) if only.allows(&t) => Ok(t),
        (Tenants::Only(_), Some(t)) => Err(AuthError::Forbidden(format!(
            "this token may not act for tenant {t:?} (X-Scope-OrgID); it is bound to other tenants"
        ))),
        (Tenants::Only(list), None) => match list.as_slice() {
            [one] => Ok(one.clone()),
            _ => Err(AuthError::BadTenant(format!(
                "this token is bound to {} tenants: name one with X-Scope-OrgID",
                list.len()
            ))),
        },
    }
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

    #[test]
    fn bound_tokens_name_only_their_tenants() {
        let only = |l: &[&str]| Tenants::Only(l.iter().map(|s| s.to_string()).collect());
        let mut h = HeaderMap::new();
        assert_eq!(resolve(&Tenants::All, &h).unwrap(), "default");
        assert_eq!(resolve(&only(&["team-a"]), &h).unwrap(), "team-a");
        let e = resolve(&only(&["a", "b"]), &h).unwrap_err();
        assert_eq!(e.status(), 400);
        assert!(e.message().contains("X-Scope-OrgID"));
        h.insert(HEADER, "team-b".parse().unwrap());
        assert_eq!(resolve(&Tenants::All, &h).unwrap(), "team-b");
        let e = resolve(&only(&["team-a"]), &h).unwrap_err();
        assert_eq!(e.status(), 403);
        assert!(e.message().contains("X-Scope-OrgID"), "{}", e.message());
        assert_eq!(resolve(&only(&["team-a", "team-b"]), &h).unwrap(), "team-b");
        h.insert(HEADER, "bad/name".parse().unwrap());
        assert_eq!(resolve(&only(&["team-a"]), &h).unwrap_err().status(), 400);
    }
}
