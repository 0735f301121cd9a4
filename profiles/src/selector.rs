//! Label selectors: `{name="value", name!="value", name=~"regex", name!~"regex"}`,
//! Prometheus-style. A label that is absent has the value `""`, so
//! `{k=""}` matches samples without `k` and `{k!=""}` those with it.

use regex::Regex;

/// How a matcher compares a label's value.
#[derive(Debug, Clone)]
pub enum Op {
    /// `=`: equal.
    Eq(String),
    /// `!=`: not equal (an absent label is the empty value).
    Ne(String),
    /// `=~`: the whole value matches the regex.
    Re(Regex),
    /// `!~`: the whole value does not match.
    NotRe(Regex),
}

/// One `name op value` term.
#[derive(Debug, Clone)]
pub struct Matcher {
    /// The label's name.
    pub name: String,
    /// The comparison.
    pub op: Op,
}

impl Matcher {
    /// Whether a label value (None: absent) satisfies this matcher.
    pub fn matches(&self, value: Option<&str>) -> bool {
        let value = value.unwrap_or("");
        match &self.op {
            Op::Eq(v) => value == v,
            Op::Ne(v) => value != v,
            Op::Re(r) => r.is_match(value),
            Op::NotRe(r) => !r.is_match(value),
        }
    }
}

/// Matchers that must all hold.
#[derive(Debug, Clone, Default)]
pub struct Selector {
    /// Every term must match.
    pub matchers: Vec<Matcher>,
}

/// Longest selector text accepted.
const MAX_SELECTOR: usize = 4096;

/// Why a selector's text was refused.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum SelectorError {
    /// Longer than [`MAX_SELECTOR`] bytes.
    #[error("selector longer than {MAX_SELECTOR} bytes")]
    TooLong,
    /// Not `{…}`.
    #[error("selector {0:?} must be enclosed in {{ and }}")]
    NotEnclosed(String),
    /// Something else than a separator after a matcher.
    #[error("selector: expected ',' or '}}' at byte {at} of {inner:?}")]
    ExpectedSeparator {
        /// The byte offset in `inner`.
        at: usize,
        /// The text between the braces.
        inner: String,
    },
    /// No label name where a matcher starts (at this byte).
    #[error("selector: expected a label name at byte {0}")]
    ExpectedName(usize),
    /// No operator after this label.
    #[error("selector: expected =, !=, =~ or !~ after label {0:?}")]
    ExpectedOperator(String),
    /// This label's value is not a double-quoted string.
    #[error("selector: the value of {0:?} must be a double-quoted string")]
    NotQuoted(String),
    /// This label's string does not end.
    #[error("selector: unterminated string for {0:?}")]
    Unterminated(String),
    /// This label's value is not UTF-8.
    #[error("selector: value of {0:?} is not UTF-8")]
    NotUtf8(String),
    /// This label's regular expression does not compile.
    #[error("selector: bad regex for {name:?}: {source}")]
    Regex {
        /// The label.
        name: String,
        /// Why.
        source: regex::Error,
    },
}

impl Selector {
    /// Parses `{…}` (or the empty string, which matches everything).
    pub fn parse(text: &str) -> Result<Self, SelectorError> {
        if text.len() > MAX_SELECTOR {
            return Err(SelectorError::TooLong);
        }
        let text = text.trim();
        if text.is_empty() {
            return Ok(Self::default());
        }
        let inner = text
            .strip_prefix('{')
            .and_then(|t| t.strip_suffix('}'))
            .ok_or_else(|| SelectorError::NotEnclosed(text.to_owned()))?;
        let mut p = Parser {
            s: inner.as_bytes(),
            i: 0,
        };
        let mut matchers = Vec::new();
        loop {
            p.skip_space();
            if p.done() {
                break;
            }
            matchers.push(p.matcher()?);
            p.skip_space();
            if p.done() {
                break;
            }
            if !p.eat(b",") {
                return Err(SelectorError::ExpectedSeparator {
                    at: p.i,
                    inner: inner.to_owned(),
                });
            }
        }
        Ok(Self { matchers })
    }

    /// Whether it selects everything.
    pub fn is_empty(&self) -> bool {
        self.matchers.is_empty()
    }

    /// Whether a label set (looked up by `get`) satisfies every matcher.
    pub fn matches<'a>(&self, get: impl Fn(&str) -> Option<&'a str>) -> bool {
        self.matchers.iter().all(|m| m.matches(get(&m.name)))
    }
}

struct Parser<'a> {
    s: &'a [u8],
    i: usize,
}

impl Parser<'_> {
    fn done(&self) -> bool {
        self.i >= self.s.len()
    }

    fn skip_space(&mut self) {
        while self.s.get(self.i).is_some_and(u8::is_ascii_whitespace) {
            self.i += 1;
        }
    }

    fn eat(&mut self, token: &[u8]) -> bool {
        if self.s[self.i..].starts_with(token) {
            self.i += token.len();
            true
        } else {
            false
        }
    }

    fn matcher(&mut self) -> Result<Matcher, SelectorError> {
        let start = self.i;
        while self
            .s
            .get(self.i)
            .is_some_and(|&c| c.is_ascii_alphanumeric() || b"_.-/:".contains(&c))
        {
            self.i += 1;
        }
        if self.i == start {
            return Err(SelectorError::ExpectedName(start));
        }
        let name = String::from_utf8_lossy(&self.s[start..self.i]).into_owned();
        self.skip_space();
        let op = if self.eat(b"=~") {
            "=~"
        } else if self.eat(b"!~") {
            "!~"
        } else if self.eat(b"!=") {
            "!="
        } else if self.eat(b"=") {
            "="
        } else {
            return Err(SelectorError::ExpectedOperator(name));
        };
        self.skip_space();
        let value = self.string(&name)?;
        let regex = |v: &str| {
            // Anchored, as in PromQL.
            Regex::new(&format!("^(?:{v})$")).map_err(|source| SelectorError::Regex {
                name: name.clone(),
                source,
            })
        };
        let op = match op {
            "=" => Op::Eq(value),
            "!=" => Op::Ne(value),
            "=~" => Op::Re(regex(&value)?),
            _ => Op::NotRe(regex(&value)?),
        };
        Ok(Matcher { name, op })
    }

    fn string(&mut self, name: &str) -> Result<String, SelectorError> {
        if !self.eat(b"\"") {
            return Err(SelectorError::NotQuoted(name.to_owned()));
        }
        let mut out = Vec::new();
        loop {
            let Some(&c) = self.s.get(self.i) else {
                return Err(SelectorError::Unterminated(name.to_owned()));
            };
            self.i += 1;
            match c {
                b'"' => break,
                b'\\' => {
                    let Some(&e) = self.s.get(self.i) else {
                        return Err(SelectorError::Unterminated(name.to_owned()));
                    };
                    self.i += 1;
                    out.push(match e {
                        b'n' => b'\n',
                        b't' => b'\t',
                        other => other,
                    });
                }
                c => out.push(c),
            }
        }
        String::from_utf8(out).map_err(|_| SelectorError::NotUtf8(name.to_owned()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn matches(sel: &str, labels: &[(&str, &str)]) -> bool {
        let s = Selector::parse(sel).unwrap();
        s.matches(|k| labels.iter().find(|(n, _)| *n == k).map(|(_, v)| *v))
    }

    #[test]
    fn parses_and_matches() {
        let l = [("region", "eu-west"), ("host.name", "a\"b")];
        assert!(matches("", &l));
        assert!(matches("{}", &l));
        assert!(matches(r#"{region="eu-west"}"#, &l));
        assert!(!matches(r#"{region="eu"}"#, &l));
        assert!(matches(r#"{ region =~ "eu-.*" , host.name="a\"b" }"#, &l));
        assert!(!matches(r#"{region=~"eu"}"#, &l), "regexes are anchored");
        assert!(matches(r#"{region!~"us-.*"}"#, &l));
        assert!(matches(r#"{zone=""}"#, &l), "absent means empty");
        assert!(!matches(r#"{zone!=""}"#, &l));
        assert!(matches(r#"{region!="us"}"#, &l));
    }

    #[test]
    fn rejects_malformed() {
        for (bad, needle) in [
            ("region=\"x\"", "enclosed"),
            ("{region}", "expected =, !=, =~ or !~"),
            ("{region=x}", "double-quoted"),
            ("{region=\"x}", "unterminated"),
            ("{region=\"x\" zone=\"y\"}", "expected ','"),
            ("{=\"x\"}", "label name"),
            ("{a=~\"(\"}", "bad regex"),
        ] {
            let err = Selector::parse(bad).unwrap_err().to_string();
            assert!(err.contains(needle), "{bad}: {err}");
        }
    }
}
