//! Bearer tokens with scopes. Tokens are compared in constant time and never
//! logged; only their counts are.

use std::net::SocketAddr;

use axum::http::{header, HeaderMap, StatusCode};
use subtle::ConstantTimeEq;

use crate::error::ApiError;

/// What a request wants to do.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Scope {
    /// Fetch files and list them.
    Read,
    /// Publish files.
    Upload,
    /// Delete files.
    Admin,
}

/// Configured tokens. Admin tokens may also upload and read; upload tokens
/// may also read.
pub struct Auth {
    read: Vec<String>,
    upload: Vec<String>,
    admin: Vec<String>,
}

impl Auth {
    pub fn new(read: Vec<String>, upload: Vec<String>, admin: Vec<String>) -> Self {
        let clean = |v: Vec<String>| -> Vec<String> {
            v.into_iter()
                .map(|t| t.trim().to_owned())
                .filter(|t| !t.is_empty())
                .collect()
        };
        Self {
            read: clean(read),
            upload: clean(upload),
            admin: clean(admin),
        }
    }

    /// A line for the start-up log.
    pub fn describe(&self) -> String {
        format!(
            "{} read, {} upload, {} admin token(s); reads {}; uploads {}; deletes {}",
            self.read.len(),
            self.upload.len(),
            self.admin.len(),
            if self.read.is_empty() {
                "public"
            } else {
                "need a token"
            },
            if self.upload.is_empty() && self.admin.is_empty() {
                "accepted from loopback clients only (no SYMTRACE_UPLOAD_TOKENS)"
            } else {
                "need a token"
            },
            match (self.admin.is_empty(), self.upload.is_empty()) {
                (false, _) => "need an admin token",
                (true, true) => "accepted from loopback clients only (no SYMTRACE_ADMIN_TOKENS)",
                (true, false) => "refused (no SYMTRACE_ADMIN_TOKENS)",
            },
        )
    }

    pub fn reads_need_token(&self) -> bool {
        !self.read.is_empty()
    }

    pub fn uploads_need_token(&self) -> bool {
        !(self.upload.is_empty() && self.admin.is_empty())
    }

    /// Checks that a request may act with `scope`.
    pub fn check(
        &self,
        headers: &HeaderMap,
        peer: SocketAddr,
        scope: Scope,
    ) -> Result<(), ApiError> {
        let accepted: Vec<&String> = match scope {
            Scope::Read => {
                if self.read.is_empty() {
                    return Ok(());
                }
                self.read
                    .iter()
                    .chain(&self.upload)
                    .chain(&self.admin)
                    .collect()
            }
            Scope::Upload => self.upload.iter().chain(&self.admin).collect(),
            Scope::Admin => self.admin.iter().collect(),
        };
        if accepted.is_empty() {
            // Upload or admin with no token of that scope configured. Only a
            // server with no write tokens at all trusts loopback clients, and
            // never a request relayed by a proxy on the same host.
            let proxied =
                headers.contains_key("x-forwarded-for") || headers.contains_key("forwarded");
            let open = self.upload.is_empty() && self.admin.is_empty();
            if open && peer.ip().is_loopback() && !proxied {
                return Ok(());
            }
            let (what, var) = match scope {
                Scope::Admin => ("deletes", "SYMTRACE_ADMIN_TOKENS"),
                _ => ("uploads", "SYMTRACE_UPLOAD_TOKENS"),
            };
            return Err(ApiError::new(
                StatusCode::FORBIDDEN,
                "forbidden",
                if open {
                    format!("with no token configured this server accepts {what} only from direct loopback clients; set {var}")
                } else {
                    format!("{what} need a token from {var}, and none is configured")
                },
            ));
        }
        let Some(presented) = bearer(headers) else {
            return Err(ApiError::new(
                StatusCode::UNAUTHORIZED,
                "unauthorized",
                "this request needs an `Authorization: Bearer <token>` header",
            ));
        };
        let mut ok = 0u8;
        for token in accepted {
            ok |= token.as_bytes().ct_eq(presented.as_bytes()).unwrap_u8();
        }
        if ok == 1 {
            Ok(())
        } else {
            Err(ApiError::new(
                StatusCode::FORBIDDEN,
                "forbidden",
                format!("the bearer token is not valid for {scope:?} requests").to_lowercase(),
            ))
        }
    }
}

fn bearer(headers: &HeaderMap) -> Option<&str> {
    let value = headers.get(header::AUTHORIZATION)?.to_str().ok()?;
    let (scheme, token) = value.split_once(' ')?;
    scheme.eq_ignore_ascii_case("bearer").then(|| token.trim())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(token: Option<&str>) -> HeaderMap {
        let mut h = HeaderMap::new();
        if let Some(t) = token {
            h.insert(
                header::AUTHORIZATION,
                format!("Bearer {t}").parse().unwrap(),
            );
        }
        h
    }

    #[test]
    fn scopes_and_loopback_rule() {
        let local: SocketAddr = "127.0.0.1:1".parse().unwrap();
        let remote: SocketAddr = "192.0.2.7:1".parse().unwrap();
        let open = Auth::new(vec![], vec![], vec![]);
        assert!(open.check(&headers(None), remote, Scope::Read).is_ok());
        assert!(open.check(&headers(None), local, Scope::Upload).is_ok());
        assert_eq!(
            open.check(&headers(None), remote, Scope::Upload)
                .unwrap_err()
                .status,
            403
        );

        let mut proxied = headers(None);
        proxied.insert("x-forwarded-for", "192.0.2.9".parse().unwrap());
        assert_eq!(
            open.check(&proxied, local, Scope::Upload)
                .unwrap_err()
                .status,
            403
        );
        // Upload tokens but no admin token: deletes are refused, even locally.
        let no_admin = Auth::new(vec![], vec!["up".into()], vec![]);
        assert_eq!(
            no_admin
                .check(&headers(None), local, Scope::Admin)
                .unwrap_err()
                .status,
            403
        );
        assert_eq!(
            no_admin
                .check(&headers(Some("up")), local, Scope::Admin)
                .unwrap_err()
                .status,
            403
        );

        let auth = Auth::new(vec![], vec!["up".into()], vec!["adm".into()]);
        assert_eq!(
            auth.check(&headers(None), local, Scope::Upload)
                .unwrap_err()
                .status,
            401
        );
        assert_eq!(
            auth.check(&headers(Some("nope")), local, Scope::Upload)
                .unwrap_err()
                .status,
            403
        );
        assert!(auth
            .check(&headers(Some("up")), remote, Scope::Upload)
            .is_ok());
        assert!(auth
            .check(&headers(Some("adm")), remote, Scope::Upload)
            .is_ok());
        assert_eq!(
            auth.check(&headers(Some("up")), remote, Scope::Admin)
                .unwrap_err()
                .status,
            403
        );
        assert!(auth
            .check(&headers(Some("adm")), remote, Scope::Admin)
            .is_ok());
    }
}
