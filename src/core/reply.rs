//! The 8-integer reply shared by `RL.TAKE` and `RL.WINDOW`.

use super::penalty::ActiveBox;
use super::time::Millis;

/// Reply position 1.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Status {
    /// `1`: the request is admitted.
    Allowed,
    /// `0`: not enough room.
    Throttled,
    /// `-1`: the penalty box is active.
    Boxed,
    /// `2`: admitted later: the points are reserved, proceed after
    /// `retry_after_ms` (`RL.TAKE ... DELAY`).
    Delayed,
}

impl Status {
    /// The integer on the wire.
    pub fn code(self) -> i64 {
        match self {
            Status::Allowed => 1,
            Status::Throttled => 0,
            Status::Boxed => -1,
            Status::Delayed => 2,
        }
    }
}

/// The 8 integers of the reply, in contract order.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Reply {
    /// Allowed, throttled or boxed.
    pub status: Status,
    /// Capacity of the binding bucket.
    pub limit: i64,
    /// Whole points left in the binding bucket.
    pub remaining: i64,
    /// Milliseconds until the binding bucket is full.
    pub reset_ms: i64,
    /// Milliseconds to wait; -1 for a manual box.
    pub retry_after_ms: i64,
    /// Level of the active box, or 0.
    pub box_level: i64,
    /// Strikes left before the box trips; -1 without `STRIKES`.
    pub strikes_remaining: i64,
    /// Index of the binding key (0 = first key, 1 = first `ALSO`, ...).
    pub binding: i64,
}

impl Reply {
    /// The reply as the wire array.
    pub fn to_array(&self) -> [i64; 8] {
        [
            self.status.code(),
            self.limit,
            self.remaining,
            self.reset_ms,
            self.retry_after_ms,
            self.box_level,
            self.strikes_remaining,
            self.binding,
        ]
    }
}

/// The reply of a call that meets an active box: `limit` is the first
/// bucket's, `remaining` 0, `reset_ms` = `retry_after_ms` = the box's ttl.
pub fn boxed_reply(first_limit: u64, active: &ActiveBox, now: Millis) -> Reply {
    let ttl = active.ttl_ms(now);
    Reply {
        status: Status::Boxed,
        limit: i64::try_from(first_limit).unwrap_or(i64::MAX),
        remaining: 0,
        reset_ms: ttl,
        retry_after_ms: ttl,
        box_level: i64::from(active.level),
        strikes_remaining: 0,
        binding: 0,
    }
}

/// `wait_ms` stretched by a factor in `[1, 1 + percent/100]` chosen by
/// `random` (uniform over `u64`), rounded up.
pub fn jittered(wait_ms: i64, percent: u8, random: u64) -> i64 {
    if percent == 0 || wait_ms <= 0 {
        return wait_ms;
    }
    let scaled = i128::from(wait_ms) * i128::from(percent.min(100)) * i128::from(random >> 32);
    let denominator = 100i128 << 32;
    let extra = (scaled + denominator - 1) / denominator;
    wait_ms.saturating_add(i64::try_from(extra).unwrap_or(i64::MAX))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn jitter_bounds() {
        assert_eq!(jittered(1000, 0, u64::MAX), 1000);
        assert_eq!(jittered(1000, 100, 0), 1000);
        assert_eq!(jittered(1000, 100, u64::MAX), 2000);
        assert_eq!(jittered(i64::MAX, 100, u64::MAX), i64::MAX);
    }
}
