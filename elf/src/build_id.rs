use std::fmt;
use std::str::FromStr;

/// Longest build-ID accepted, in bytes (elfutils' `MAX_BUILD_ID_BYTES` is 64).
pub const MAX_BUILD_ID_BYTES: usize = 64;

/// A GNU build-ID, held as the lowercase hex string debuginfod uses as a key.
///
/// Valid build-IDs have an even number of lowercase hex digits, between 2 and
/// 128 of them — the rule elfutils' server applies.
#[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct BuildId(String);

/// Why a string is not a build-ID.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BuildIdError {
    /// Empty, odd length or longer than 128 hex digits.
    #[error("invalid build-ID {0:?}: must be an even number (2 to 128) of hex digits")]
    Length(String),
    /// Contains something other than `0-9a-f` (uppercase included).
    #[error("invalid build-ID {0:?}: only lowercase hex digits [0-9a-f] are allowed")]
    Digits(String),
}

impl BuildId {
    /// Builds the key from the raw bytes of an ELF note.
    pub fn from_bytes(bytes: &[u8]) -> Result<Self, BuildIdError> {
        let hex: String = bytes.iter().map(|b| format!("{b:02x}")).collect();
        if bytes.is_empty() || bytes.len() > MAX_BUILD_ID_BYTES {
            return Err(BuildIdError::Length(hex));
        }
        Ok(Self(hex))
    }

    /// The lowercase hex form.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl FromStr for BuildId {
    type Err = BuildIdError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        if s.len() < 2 || s.len() % 2 != 0 || s.len() > 2 * MAX_BUILD_ID_BYTES {
            return Err(BuildIdError::Length(truncate(s)));
        }
        if !s
            .bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
        {
            return Err(BuildIdError::Digits(truncate(s)));
        }
        Ok(Self(s.to_owned()))
    }
}

fn truncate(s: &str) -> String {
    s.chars().take(140).collect()
}

impl fmt::Display for BuildId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl fmt::Debug for BuildId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "BuildId({})", self.0)
    }
}

impl AsRef<str> for BuildId {
    fn as_ref(&self) -> &str {
        &self.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn accepts_lowercase_even_hex() {
        let id: BuildId = "0a1b2c".parse().unwrap();
        assert_eq!(id.as_str(), "0a1b2c");
        assert_eq!(BuildId::from_bytes(&[0x0a, 0x1b, 0x2c]).unwrap(), id);
    }

    #[test]
    fn rejects_what_elfutils_rejects() {
        assert!(matches!(
            "ABCD".parse::<BuildId>(),
            Err(BuildIdError::Digits(_))
        ));
        assert!(matches!(
            "abc".parse::<BuildId>(),
            Err(BuildIdError::Length(_))
        ));
        assert!(matches!(
            "".parse::<BuildId>(),
            Err(BuildIdError::Length(_))
        ));
        assert!(matches!(
            "a".repeat(130).parse::<BuildId>(),
            Err(BuildIdError::Length(_))
        ));
        assert!(matches!(
            "zz".parse::<BuildId>(),
            Err(BuildIdError::Digits(_))
        ));
        assert!("ab".repeat(64).parse::<BuildId>().is_ok());
    }
}
