//! Token entries: `TOKEN` (every tenant) or `TOKEN=TENANT[+TENANT…]` (only
//! those), from the `SYMTRACE_*_TOKENS` lists, and the tokens file
//! (`SYMTRACE_TOKENS_FILE`), which may hold SHA-256 hashes instead of
//! secrets:
//!
//! ```text
//! # SCOPE   SECRET                      TENANTS (optional, + separated)
//! read      sha256:5e88…42d8            team-a
//! upload    ci-token-123                team-a+team-b
//! admin     sha256:9f86…0f00
//! agent     sha256:2c26…7ae0
//! ```

use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;

use super::Scope;

/// Bytes of a tokens file read at most.
pub const MAX_FILE_BYTES: u64 = 1 << 20;

/// How a token is kept: the secret, or its SHA-256.
#[derive(Clone)]
pub enum Secret {
    Plain(Vec<u8>),
    Sha256([u8; 32]),
}

impl Secret {
    /// Whether `presented` is this secret, in time independent of where
    /// they differ.
    pub fn matches(&self, presented: &[u8]) -> bool {
        match self {
            Secret::Plain(s) => s.ct_eq(presented).into(),
            Secret::Sha256(h) => {
                let digest: [u8; 32] = Sha256::digest(presented).into();
                h.ct_eq(&digest).into()
            }
        }
    }
}

/// One configured token.
#[derive(Clone)]
pub struct Token {
    pub secret: Secret,
    pub scope: Scope,
    /// `None`: every tenant.
    pub tenants: Option<Vec<String>>,
}

/// Parses a `TOKEN` or `TOKEN=TENANT[+TENANT…]` list entry. The split is at
/// the last `=` and only when what follows is a tenant list, so base64
/// padding (`abc==`) stays part of a plain token.
pub fn parse_entry(entry: &str, scope: Scope) -> Result<Option<Token>, String> {
    let entry = entry.trim();
    if entry.is_empty() {
        return Ok(None);
    }
    let (secret, tenants) = match entry.rsplit_once('=') {
        Some((secret, list)) if !secret.is_empty() && !list.is_empty() => {
            (secret, Some(parse_tenants(list)?))
        }
        _ => (entry, None),
    };
    Ok(Some(Token {
        secret: Secret::Plain(secret.as_bytes().to_vec()),
        scope,
        tenants,
    }))
}

fn parse_tenants(list: &str) -> Result<Vec<String>, String> {
    list.split('+')
        .map(|t| crate::tenant::validate(t.trim()).map(str::to_owned))
        .collect()
}

/// Parses a tokens file (format in the module docs). Errors name the line.
pub fn parse_file(text: &str) -> Result<Vec<Token>, String> {
    let mut tokens = Vec::new();
    for (n, line) in text.lines().enumerate() {
        // A comment starts at `#` at the line's start or after a blank, so a
        // secret may contain `#`.
        let line = match line.trim_start().strip_prefix('#') {
            Some(_) => "",
            None => match line.find(" #").or_else(|| line.find("\t#")) {
                Some(at) => &line[..at],
                None => line,
            },
        }
        .trim();
        if line.is_empty() {
            continue;
        }
        let at = |e: String| format!("line {}: {e}", n + 1);
        let mut words = line.split_whitespace();
        let (scope, secret) = (words.next(), words.next());
        let tenants = words.next();
        if words.next().is_some() {
            return Err(at("more than SCOPE SECRET TENANTS".into()));
        }
        let scope = match scope {
            Some("read") => Scope::Read,
            Some("upload") => Scope::Upload,
            Some("admin") => Scope::Admin,
            Some("agent") => Scope::Agent,
            other => {
                return Err(at(format!(
                    "scope {other:?} is not read, upload, admin or agent"
                )))
            }
        };
        let secret = secret.ok_or_else(|| at("no secret".into()))?;
        let secret = match secret.strip_prefix("sha256:") {
            Some(h) => {
                let bytes = hex::decode(h)
                    .ok()
                    .and_then(|b| <[u8; 32]>::try_from(b).ok())
                    .ok_or_else(|| at("sha256: wants 64 hex digits".into()))?;
                Secret::Sha256(bytes)
            }
            None => Secret::Plain(secret.as_bytes().to_vec()),
        };
        let tenants = tenants.map(parse_tenants).transpose().map_err(at)?;
        tokens.push(Token {
            secret,
            scope,
            tenants,
        });
    }
    Ok(tokens)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn list_entries() {
        let t = parse_entry("ra=team-a", Scope::Read).unwrap().unwrap();
        assert!(t.secret.matches(b"ra") && !t.secret.matches(b"ra=team-a"));
        assert_eq!(t.tenants.as_deref(), Some(&["team-a".to_owned()][..]));
        let t = parse_entry("u=a+b", Scope::Upload).unwrap().unwrap();
        assert_eq!(t.tenants.unwrap(), vec!["a", "b"]);
        // Base64 padding is part of a plain token.
        let t = parse_entry("c2VjcmV0==", Scope::Read).unwrap().unwrap();
        assert!(t.secret.matches(b"c2VjcmV0==") && t.tenants.is_none());
        assert!(parse_entry("  ", Scope::Read).unwrap().is_none());
        assert!(parse_entry("x=bad/tenant", Scope::Read).is_err());
    }

    #[test]
    fn tokens_file() {
        let hash = hex::encode(Sha256::digest(b"hunter2"));
        let text = format!(
            "# comment\n\nread sha256:{hash} team-a # trailing\nupload ci team-a+team-b\nadmin root\n"
        );
        let tokens = parse_file(&text).unwrap();
        assert_eq!(tokens.len(), 3);
        let hashed = parse_file("upload ab#c9 team-a # a comment\n").unwrap();
        assert!(hashed[0].secret.matches(b"ab#c9"), "# inside a secret");
        assert!(tokens[0].secret.matches(b"hunter2"));
        assert!(!tokens[0].secret.matches(b"hunter3"));
        assert_eq!(tokens[0].scope, Scope::Read);
        assert_eq!(tokens[1].tenants.as_ref().unwrap().len(), 2);
        assert!(tokens[2].tenants.is_none() && tokens[2].scope == Scope::Admin);
        for (bad, why) in [
            ("write x", "line 1: scope"),
            ("read", "line 1: no secret"),
            ("read sha256:abcd", "line 1: sha256"),
            ("\nread x a b", "line 2: more than"),
            ("read x a/b", "line 1: X-Scope-OrgID"),
        ] {
            let e = parse_file(bad).err().unwrap();
            assert!(e.starts_with(why), "{bad:?}: {e}");
        }
    }
}
