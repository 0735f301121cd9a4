//! Per-token quotas of what writers add to the store beyond single
//! requests: claims (each a database row for a while) and agents' uploads
//! (bytes). A token — fleet-wide for agents — may do at most so much per
//! minute or hour; beyond it a request is refused with 429 and when to come
//! back. Kept per replica, in memory (a bound on what one replica takes).

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use axum::http::StatusCode;

use crate::error::ApiError;

/// Callers remembered at most (the oldest forgotten beyond: they start
/// with a full allowance again).
const MAX_CALLERS: usize = 10_000;

/// A token bucket per caller.
pub struct Limiter {
    what: &'static str,
    setting: &'static str,
    /// Units a second, and at once.
    rate: f64,
    burst: f64,
    by_caller: Mutex<HashMap<String, (f64, Instant)>>,
}

impl Limiter {
    /// `per` units every `period` (0: no bound), all of them at once.
    pub fn new(what: &'static str, setting: &'static str, per: u64, period: Duration) -> Self {
        Limiter {
            what,
            setting,
            rate: per as f64 / period.as_secs_f64(),
            burst: per as f64,
            by_caller: Mutex::new(HashMap::new()),
        }
    }

    /// Takes `amount` from `caller`'s allowance, or says when there will
    /// be enough (429).
    pub fn take(&self, caller: &str, amount: u64) -> Result<(), ApiError> {
        if self.burst == 0.0 {
            return Ok(());
        }
        let now = Instant::now();
        let mut by_caller = self.by_caller.lock().unwrap_or_else(|e| e.into_inner());
        if by_caller.len() >= MAX_CALLERS && !by_caller.contains_key(caller) {
            if let Some(oldest) = by_caller
                .iter()
                .min_by_key(|(_, (_, at))| *at)
                .map(|(k, _)| k.clone())
            {
                by_caller.remove(&oldest);
            }
        }
        let (tokens, at) = by_caller
            .entry(caller.to_owned())
            .or_insert((self.burst, now));
        *tokens = (*tokens + now.duration_since(*at).as_secs_f64() * self.rate).min(self.burst);
        *at = now;
        let amount = amount as f64;
        if *tokens >= amount || (*tokens >= self.burst && amount > self.burst) {
            *tokens -= amount;
            return Ok(());
        }
        let wait = ((amount.min(self.burst) - *tokens) / self.rate)
            .ceil()
            .max(1.0);
        Err(ApiError::new(
            StatusCode::TOO_MANY_REQUESTS,
            "quota",
            format!(
                "this token's quota of {} is spent ({}); retry in {wait:.0} s",
                self.what, self.setting
            ),
        )
        .with_retry_after(wait as u64))
    }
}

/// The quotas of the server.
pub struct Quotas {
    pub claims: Limiter,
    pub agent_bytes: Limiter,
}

impl Quotas {
    pub fn new(claims_per_minute: u64, agent_bytes_per_hour: u64) -> Self {
        Quotas {
            claims: Limiter::new(
                "claims",
                "SYMTRACE_CLAIMS_PER_MINUTE",
                claims_per_minute,
                Duration::from_secs(60),
            ),
            agent_bytes: Limiter::new(
                "agent upload bytes",
                "SYMTRACE_AGENT_UPLOAD_BYTES_PER_HOUR",
                agent_bytes_per_hour,
                Duration::from_secs(3600),
            ),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_caller_spends_its_own_allowance() {
        let l = Limiter::new("claims", "X", 10, Duration::from_secs(60));
        assert!(l.take("a", 6).is_ok());
        assert!(l.take("a", 4).is_ok());
        let e = l.take("a", 1).unwrap_err();
        assert_eq!(e.status, 429);
        assert!(e.message.contains("retry in 6 s"), "{}", e.message);
        assert!(l.take("b", 10).is_ok(), "another token has its own");
        // More than the whole allowance at once: allowed from a full one
        // (one large upload), then in debt.
        assert!(l.take("c", 25).is_ok());
        assert!(l.take("c", 1).is_err());
        let off = Limiter::new("claims", "X", 0, Duration::from_secs(60));
        assert!(off.take("a", u64::MAX).is_ok());
    }
}
