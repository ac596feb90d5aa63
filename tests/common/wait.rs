//! The kit's one wait loop: every wait in the tests is bounded in time
//! (and so in iterations).

use std::thread::sleep;
use std::time::{Duration, Instant};

/// Pause between two probes of [`wait_until`] and of the kit's own waits.
pub const POLL: Duration = Duration::from_millis(50);

/// Calls `probe` every `pause` until it gives `Some`, for at most
/// `timeout`: that value, or `None` once the time is up (the probe has
/// then run at least once, the last time at or after the deadline).
pub fn poll_for<T>(
    timeout: Duration,
    pause: Duration,
    mut probe: impl FnMut() -> Option<T>,
) -> Option<T> {
    let deadline = Instant::now() + timeout;
    loop {
        let past_deadline = Instant::now() >= deadline;
        if let Some(v) = probe() {
            return Some(v);
        }
        if past_deadline {
            return None;
        }
        sleep(pause);
    }
}

/// Polls `cond` every 50 ms until it returns true; panics with `what` when
/// `timeout` has passed.
pub fn wait_until(timeout: Duration, what: &str, mut cond: impl FnMut() -> bool) {
    if poll_for(timeout, POLL, || cond().then_some(())).is_none() {
        panic!("timed out after {timeout:?} waiting for {what}");
    }
}
