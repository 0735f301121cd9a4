//! Bearer tokens with scopes, each bound to tenants or to all of them.
//! Tokens are compared in constant time and never logged; only their counts
//! are. They come from the `SYMTRACE_*_TOKENS` lists and from
//! `SYMTRACE_TOKENS_FILE` (reloaded by [`Auth::reload`], on SIGHUP).

mod tokens;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::{Arc, RwLock};

use axum::http::{header, HeaderMap};

use tokens::{parse_entry, parse_file, Token};

/// What a request wants to do, and what a token may do.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Scope {
    /// Fetch files and list them.
    Read,
    /// Publish files (CI), export profiles.
    Upload,
    /// Delete files.
    Admin,
    /// What an agent does: export profiles, and publish the files it finds
    /// on its host — which the server then ranks below CI's and binds to
    /// their content. As a request's scope: accepted from agent, upload and
    /// admin tokens (the caller's [`Caller::scope`] says which).
    Agent,
}

/// Who made a request, as far as its token says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Caller {
    pub tenants: Tenants,
    /// The scope of the token it presented (`None`: no token was needed —
    /// public reads, or a trusted loopback client, which may do anything).
    pub scope: Option<Scope>,
    /// Who it is for quotas: a hash of its token, or `loopback`/`public`.
    pub id: String,
}

impl Caller {
    /// Whether what it publishes is an agent's: its token is an agent
    /// token (whatever the request says), or it says so itself (a CI token
    /// or a trusted client may publish as an agent; never the other way).
    pub fn publishes_as_agent(&self, says_agent: bool) -> bool {
        self.scope == Some(Scope::Agent) || says_agent
    }
}

/// The tenants a request may act for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Tenants {
    /// Every tenant: a plain token, public reads, or a trusted loopback
    /// write.
    All,
    /// Only these (a bound token).
    Only(Vec<String>),
}

impl Tenants {
    pub fn allows(&self, tenant: &str) -> bool {
        match self {
            Tenants::All => true,
            Tenants::Only(list) => list.iter().any(|t| t == tenant),
        }
    }

    /// Whether a reader of these tenants sees a stored file published by
    /// `owner` (empty: shared by every tenant).
    pub fn sees(&self, owner: &str) -> bool {
        owner.is_empty() || self.allows(owner)
    }
}

/// How the server was told to treat clients without tokens.
#[derive(Debug, Clone, Copy)]
pub struct Trust {
    /// Writes from direct loopback clients are accepted when no write
    /// token is configured (`SYMTRACE_LOOPBACK_TRUST`).
    pub loopback_writes: bool,
}

/// Configured tokens. Admin tokens may also upload and read; upload tokens
/// may also read.
pub struct Auth {
    from_lists: Vec<Token>,
    file: Option<PathBuf>,
    tokens: RwLock<Arc<Vec<Token>>>,
    trust: Trust,
}

impl Auth {
    /// Tokens from the four lists (entries `TOKEN` or
    /// `TOKEN=TENANT[+TENANT…]`) and the tokens file.
    pub fn new(
        read: Vec<String>,
        upload: Vec<String>,
        admin: Vec<String>,
        agent: Vec<String>,
        file: Option<PathBuf>,
        trust: Trust,
    ) -> Result<Self, String> {
        let mut from_lists = Vec::new();
        for (entries, scope) in [
            (read, Scope::Read),
            (upload, Scope::Upload),
            (admin, Scope::Admin),
            (agent, Scope::Agent),
        ] {
            for entry in entries {
                from_lists.extend(parse_entry(&entry, scope)?);
            }
        }
        let auth = Self {
            tokens: RwLock::new(Arc::new(from_lists.clone())),
            from_lists,
            file,
            trust,
        };
        auth.reload()?;
        Ok(auth)
    }

    /// Reads the tokens file again (SIGHUP). On an error the tokens in
    /// force stay.
    pub fn reload(&self) -> Result<usize, String> {
        let Some(path) = &self.file else {
            return Ok(0);
        };
        let text = read_bounded(path)
            .map_err(|e| format!("SYMTRACE_TOKENS_FILE {}: {e}", path.display()))?;
        let from_file = parse_file(&text)
            .map_err(|e| format!("SYMTRACE_TOKENS_FILE {}: {e}", path.display()))?;
        let n = from_file.len();
        let all: Vec<Token> = self.from_lists.iter().cloned().chain(from_file).collect();
        // A reload never opens the server: removing the last token of a
        // scope would make reads public or bring loopback trust back.
        let mut tokens = self.tokens.write().unwrap_or_else(|e| e.into_inner());
        let had = |list: &[Token], s: Scope| list.iter().any(|t| t.scope == s);
        for (scope, name) in [
            (Scope::Read, "read"),
            (Scope::Upload, "upload"),
            (Scope::Admin, "admin"),
            (Scope::Agent, "agent"),
        ] {
            if had(&tokens, scope) && !had(&all, scope) {
                return Err(format!(
                    "SYMTRACE_TOKENS_FILE {}: it would leave no {name} token, opening the server; kept the tokens in force (restart to remove the last one)",
                    path.display()
                ));
            }
        }
        *tokens = Arc::new(all);
        Ok(n)
    }

    fn tokens(&self) -> Arc<Vec<Token>> {
        self.tokens
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    fn count(&self, scope: Scope) -> usize {
        self.tokens().iter().filter(|t| t.scope == scope).count()
    }

    /// A line for the start-up log.
    pub fn describe(&self) -> String {
        let (read, upload, admin, agent) = (
            self.count(Scope::Read),
            self.count(Scope::Upload),
            self.count(Scope::Admin),
            self.count(Scope::Agent),
        );
        let bound = self.tokens().iter().filter(|t| t.tenants.is_some()).count();
        let loopback = if self.trust.loopback_writes {
            "accepted from direct loopback clients only"
        } else {
            "refused (loopback trust off)"
        };
        format!(
            "{read} read, {upload} upload, {admin} admin, {agent} agent token(s), {bound} bound to tenants; reads {}; uploads {}; deletes {}",
            if read == 0 { "public" } else { "need a token" },
            if upload + admin + agent == 0 {
                format!("{loopback} (no SYMTRACE_UPLOAD_TOKENS)")
            } else {
                "need a token".to_owned()
            },
            match (admin, upload) {
                (1.., _) => "need an admin token".to_owned(),
                (0, 0) => format!("{loopback} (no SYMTRACE_ADMIN_TOKENS)"),
                (0, _) => "refused (no SYMTRACE_ADMIN_TOKENS)".to_owned(),
            },
        )
    }

    pub fn reads_need_token(&self) -> bool {
        self.count(Scope::Read) > 0
    }

    pub fn uploads_need_token(&self) -> bool {
        self.count(Scope::Upload) + self.count(Scope::Admin) + self.count(Scope::Agent) > 0
    }

    /// Checks that a request may act with `scope`, and for which tenants.
    pub fn check(
        &self,
        headers: &HeaderMap,
        peer: SocketAddr,
        scope: Scope,
    ) -> Result<Tenants, AuthError> {
        self.caller(headers, peer, scope).map(|c| c.tenants)
    }

    /// Checks that a request may act with `scope`: for which tenants, with
    /// a token of which scope, and who it is.
    pub fn caller(
        &self,
        headers: &HeaderMap,
        peer: SocketAddr,
        scope: Scope,
    ) -> Result<Caller, AuthError> {
        let tokens = self.tokens();
        let counts = |s: Scope| tokens.iter().filter(|t| t.scope == s).count();
        let (read, upload, admin, agent) = (
            counts(Scope::Read),
            counts(Scope::Upload),
            counts(Scope::Admin),
            counts(Scope::Agent),
        );
        // Agent tokens read nothing and publish only as agents.
        let accepts = |t: &Token| match scope {
            Scope::Read => t.scope != Scope::Agent,
            Scope::Upload => matches!(t.scope, Scope::Upload | Scope::Admin),
            Scope::Admin => t.scope == Scope::Admin,
            Scope::Agent => t.scope != Scope::Read,
        };
        let untokened = |id: &str| Caller {
            tenants: Tenants::All,
            scope: None,
            id: id.to_owned(),
        };
        let accepted = match scope {
            Scope::Read if read == 0 => return Ok(untokened("public")),
            Scope::Read => read + upload + admin,
            Scope::Upload => upload + admin,
            Scope::Admin => admin,
            Scope::Agent => upload + admin + agent,
        };
        if accepted == 0 {
            // A write with no token of that scope configured. Only a server
            // with no write tokens at all trusts loopback clients: a direct
            // one (no proxy header), asking for a loopback host (a browser
            // lured by DNS rebinding asks for another name).
            let open = upload + admin + agent == 0;
            if open && self.trust.loopback_writes && direct_loopback(headers, peer) {
                return Ok(untokened("loopback"));
            }
            let (what, var) = match scope {
                Scope::Admin => ("deletes", "SYMTRACE_ADMIN_TOKENS"),
                _ => ("uploads", "SYMTRACE_UPLOAD_TOKENS"),
            };
            return Err(AuthError::Forbidden(
                match (open, self.trust.loopback_writes) {
                    (true, true) => format!("with no token configured this server accepts {what} only from direct loopback clients (no proxy headers, a loopback Host); set {var}"),
                    (true, false) => format!("{what} need a token from {var} (loopback trust is off)"),
                    _ => format!("{what} need a token from {var}, and none is configured"),
                },
            ));
        }
        let Some(presented) = bearer(headers) else {
            return Err(AuthError::Unauthenticated(
                "this request needs an `Authorization: Bearer <token>` header".into(),
            ));
        };
        // Every token is compared, so the time taken does not say which
        // (or whether one) matched.
        let mut found: Option<&Token> = None;
        for token in tokens.iter().filter(|t| accepts(t)) {
            if token.secret.matches(presented.as_bytes()) && found.is_none() {
                found = Some(token);
            }
        }
        match found {
            Some(token) => Ok(Caller {
                tenants: match &token.tenants {
                    None => Tenants::All,
                    Some(list) => Tenants::Only(list.clone()),
                },
                scope: Some(token.scope),
                id: token_id(presented),
            }),
            None => Err(AuthError::Forbidden(
                format!("the bearer token is not valid for {scope:?} requests").to_lowercase(),
            )),
        }
    }
}

/// Why a request may not act: mapped to HTTP (`crate::error`) and to
/// gRPC (`crate::ingest::grpc`) in one place each.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AuthError {
    /// No credentials where they are needed (401, UNAUTHENTICATED).
    #[error("{0}")]
    Unauthenticated(String),
    /// Credentials that do not allow this (403, PERMISSION_DENIED).
    #[error("{0}")]
    Forbidden(String),
    /// A tenant named wrongly, or not named where it must be (400,
    /// INVALID_ARGUMENT).
    #[error("{0}")]
    BadTenant(String),
}

impl AuthError {
    /// Its HTTP status.
    pub fn status(&self) -> u16 {
        match self {
            Self::Unauthenticated(_) => 401,
            Self::Forbidden(_) => 403,
            Self::BadTenant(_) => 400,
        }
    }

    /// What it says.
    pub fn message(&self) -> &str {
        match self {
            Self::Unauthenticated(m) | Self::Forbidden(m) | Self::BadTenant(m) => m,
        }
    }
}

/// A token's identity for quotas: the first 8 bytes of its SHA-256, hex
/// (never the token).
fn token_id(presented: &str) -> String {
    use sha2::{Digest, Sha256};
    let digest = Sha256::digest(presented.as_bytes());
    format!("token:{}", hex::encode(&digest[..8]))
}

fn read_bounded(path: &std::path::Path) -> std::io::Result<String> {
    use std::io::Read;
    let mut text = String::new();
    std::fs::File::open(path)?
        .take(tokens::MAX_FILE_BYTES + 1)
        .read_to_string(&mut text)?;
    if text.len() as u64 > tokens::MAX_FILE_BYTES {
        return Err(std::io::Error::other(format!(
            "larger than {} bytes",
            tokens::MAX_FILE_BYTES
        )));
    }
    Ok(text)
}

/// A client on this host talking to us directly: a loopback peer, no proxy
/// header, and a loopback `Host` when there is one (HTTP/1.1 always sends
/// it; an OTLP gRPC client sends `:authority` instead).
fn direct_loopback(headers: &HeaderMap, peer: SocketAddr) -> bool {
    let proxied = [
        "x-forwarded-for",
        "x-forwarded-host",
        "x-real-ip",
        "forwarded",
        "via",
    ]
    .iter()
    .any(|h| headers.contains_key(*h));
    let host_ok = match headers.get(header::HOST) {
        None => true,
        Some(v) => v.to_str().is_ok_and(is_loopback_host),
    };
    peer.ip().is_loopback() && !proxied && host_ok
}

/// `localhost` (and `*.localhost`, RFC 6761), `127.0.0.0/8` or `[::1]`,
/// with or without a port.
pub fn is_loopback_host(host: &str) -> bool {
    let name = if let Some(rest) = host.strip_prefix('[') {
        match rest.split_once(']') {
            Some((ip, port))
                if port.is_empty()
                    || port.strip_prefix(':').is_some_and(|p| {
                        !p.is_empty() && p.bytes().all(|b| b.is_ascii_digit())
                    }) =>
            {
                ip
            }
            _ => return false,
        }
    } else {
        host.rsplit_once(':').map_or(host, |(h, port)| {
            if port.bytes().all(|b| b.is_ascii_digit()) {
                h
            } else {
                host
            }
        })
    };
    let name = name.trim_end_matches('.').to_ascii_lowercase();
    if name == "localhost" || name.ends_with(".localhost") {
        return true;
    }
    name.parse::<std::net::IpAddr>()
        .is_ok_and(|ip| ip.is_loopback())
}

fn bearer(headers: &HeaderMap) -> Option<&str> {
    let value = headers.get(header::AUTHORIZATION)?.to_str().ok()?;
    let (scheme, token) = value.split_once(' ')?;
    scheme.eq_ignore_ascii_case("bearer").then(|| token.trim())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn auth(read: &[&str], upload: &[&str], admin: &[&str]) -> Auth {
        let v = |l: &[&str]| l.iter().map(|s| s.to_string()).collect();
        let trust = Trust {
            loopback_writes: true,
        };
        Auth::new(v(read), v(upload), v(admin), Vec::new(), None, trust).unwrap()
    }

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
        let open = auth(&[], &[], &[]);
        assert!(open.check(&headers(None), remote, Scope::Read).is_ok());
        assert!(open.check(&headers(None), local, Scope::Upload).is_ok());
        assert_eq!(
            open.check(&headers(None), remote, Scope::Upload)
                .unwrap_err()
                .status(),
            403
        );

        let mut proxied = headers(None);
        proxied.insert("x-forwarded-for", "192.0.2.9".parse().unwrap());
        assert_eq!(
            open.check(&proxied, local, Scope::Upload)
                .unwrap_err()
                .status(),
            403
        );
        // Upload tokens but no admin token: deletes are refused, even locally.
        let no_admin = auth(&[], &["up"], &[]);
        assert_eq!(
            no_admin
                .check(&headers(None), local, Scope::Admin)
                .unwrap_err()
                .status(),
            403
        );
        assert_eq!(
            no_admin
                .check(&headers(Some("up")), local, Scope::Admin)
                .unwrap_err()
                .status(),
            403
        );

        let auth = auth(&[], &["up"], &["adm"]);
        assert_eq!(
            auth.check(&headers(None), local, Scope::Upload)
                .unwrap_err()
                .status(),
            401
        );
        assert_eq!(
            auth.check(&headers(Some("nope")), local, Scope::Upload)
                .unwrap_err()
                .status(),
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
                .status(),
            403
        );
        assert!(auth
            .check(&headers(Some("adm")), remote, Scope::Admin)
            .is_ok());
    }

    #[test]
    fn tokens_bound_to_tenants() {
        let remote: SocketAddr = "192.0.2.7:1".parse().unwrap();
        let a = auth(&["ra=team-a", "plain"], &["ua=team-a+team-c"], &[]);
        let only = |l: &[&str]| Tenants::Only(l.iter().map(|s| s.to_string()).collect());
        assert_eq!(
            a.check(&headers(Some("ra")), remote, Scope::Read).unwrap(),
            only(&["team-a"])
        );
        assert_eq!(
            a.check(&headers(Some("plain")), remote, Scope::Read)
                .unwrap(),
            Tenants::All
        );
        assert_eq!(
            a.check(&headers(Some("ua")), remote, Scope::Upload)
                .unwrap(),
            only(&["team-a", "team-c"])
        );
        assert!(
            a.check(&headers(Some("ra")), remote, Scope::Upload)
                .is_err(),
            "read only"
        );
        assert!(only(&["team-a"]).allows("team-a") && !only(&["team-a"]).allows("team-b"));
    }

    #[test]
    fn loopback_trust_needs_a_loopback_host_and_can_be_off() {
        let local: SocketAddr = "127.0.0.1:1".parse().unwrap();
        let open = auth(&[], &[], &[]);
        let mut h = headers(None);
        h.insert(header::HOST, "localhost:8002".parse().unwrap());
        assert!(open.check(&h, local, Scope::Upload).is_ok());
        // DNS rebinding: a browser on this host asked for another name.
        h.insert(header::HOST, "attacker.example".parse().unwrap());
        let e = open.check(&h, local, Scope::Upload).unwrap_err();
        assert_eq!(e.status(), 403);
        assert!(e.message().contains("loopback Host"), "{}", e.message());
        let off = Auth::new(
            vec![],
            vec![],
            vec![],
            vec![],
            None,
            Trust {
                loopback_writes: false,
            },
        )
        .unwrap();
        let e = off.check(&headers(None), local, Scope::Upload).unwrap_err();
        assert!(
            e.message().contains("loopback trust is off"),
            "{}",
            e.message()
        );
        for host in [
            "localhost",
            "127.0.0.1:80",
            "[::1]:8002",
            "app.localhost",
            "LOCALHOST.",
        ] {
            assert!(is_loopback_host(host), "{host}");
        }
        for host in [
            "example.com",
            "127.0.0.1.nip.io",
            "[::2]",
            "localhost.example",
            "10.0.0.1",
        ] {
            assert!(!is_loopback_host(host), "{host}");
        }
    }

    #[test]
    fn tokens_file_adds_and_reloads() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("tokens");
        std::fs::write(&path, "read fileread team-b\n").unwrap();
        let trust = Trust {
            loopback_writes: true,
        };
        let a = Auth::new(
            vec!["ra=team-a".into()],
            vec![],
            vec![],
            vec![],
            Some(path.clone()),
            trust,
        )
        .unwrap();
        let remote: SocketAddr = "192.0.2.7:1".parse().unwrap();
        assert!(a
            .check(&headers(Some("fileread")), remote, Scope::Read)
            .is_ok());
        assert!(a.check(&headers(Some("ra")), remote, Scope::Read).is_ok());
        std::fs::write(&path, "read other\n").unwrap();
        assert_eq!(a.reload().unwrap(), 1);
        assert!(a
            .check(&headers(Some("fileread")), remote, Scope::Read)
            .is_err());
        assert!(a
            .check(&headers(Some("other")), remote, Scope::Read)
            .is_ok());
        assert!(
            a.check(&headers(Some("ra")), remote, Scope::Read).is_ok(),
            "lists stay"
        );
        // A broken file keeps the tokens in force.
        std::fs::write(&path, "nonsense here\n").unwrap();
        assert!(a.reload().unwrap_err().contains("line 1"));
        assert!(a
            .check(&headers(Some("other")), remote, Scope::Read)
            .is_ok());
        // Too large: refused, named.
        std::fs::write(&path, vec![b'#'; (tokens::MAX_FILE_BYTES + 1) as usize]).unwrap();
        assert!(a.reload().unwrap_err().contains("larger than"));
    }
}
