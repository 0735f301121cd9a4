//! Waiting for a condition, never for a time: `wait_until` polls until the
//! condition answers or its deadline passes, then fails the test saying
//! what it waited for. A test that waits this way is as fast as the
//! machine allows and does not fail because the machine is busy (the
//! deadline is generous; only a condition that never comes reaches it).

use std::time::{Duration, Instant};

/// How often a condition is asked again.
const POLL: Duration = Duration::from_millis(50);

/// Polls `condition` until it answers `Some`, and returns that; panics
/// with `what` (and the condition's last `Err` explanation, if it gave
/// one through [`wait_until_ok`]) once `within` has passed.
pub fn wait_until<T>(what: &str, within: Duration, mut condition: impl FnMut() -> Option<T>) -> T {
    match wait_until_ok(within, || condition().ok_or_else(String::new)) {
        Ok(value) => value,
        Err(_) => panic!("waited {within:?} for {what}, in vain"),
    }
}

/// Polls `condition` until it answers `Ok`; after `within`, its last
/// `Err` (what it saw instead), for the caller's assertion.
pub fn wait_until_ok<T, E>(
    within: Duration,
    mut condition: impl FnMut() -> Result<T, E>,
) -> Result<T, E> {
    let deadline = Instant::now() + within;
    loop {
        let answer = condition();
        if answer.is_ok() || Instant::now() >= deadline {
            return answer;
        }
        std::thread::sleep(POLL);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn answers_as_soon_as_the_condition_holds_and_fails_past_the_deadline() {
        let mut asked = 0;
        let value = wait_until("the third ask", Duration::from_secs(10), || {
            asked += 1;
            (asked == 3).then_some(asked)
        });
        assert_eq!(value, 3);
        let last: Result<(), u32> = wait_until_ok(Duration::from_millis(120), || Err(7));
        assert_eq!(last, Err(7));
        let panicked = std::panic::catch_unwind(|| {
            wait_until("nothing", Duration::from_millis(60), || None::<()>)
        });
        let message = panicked.unwrap_err();
        let message = message.downcast_ref::<String>().unwrap();
        assert!(message.contains("for nothing"), "{message}");
    }
}
