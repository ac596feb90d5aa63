//! The module's integer replies by name: the limiter reply of `RL.TAKE`,
//! `RL.WINDOW` and `RL.QUOTA` (8 integers, commands.md "RL.TAKE / Reply"),
//! and the penalty state of `RL.BOX STATUS` / `TRIP` (4 integers).

use redis::Connection;

use super::ints;

/// One limiter decision, the 8 integers of the reply in their order.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Decision {
    /// `1` allowed, `0` throttled, `-1` penalty box active, `2` delayed.
    pub status: i64,
    /// Capacity (or window/quota limit) of the binding bucket.
    pub limit: i64,
    /// Whole points left in the binding bucket after the call.
    pub remaining: i64,
    /// Ms until the binding bucket is full again (the window counts
    /// nothing, the quota period ends); the box's time when boxed.
    pub reset_ms: i64,
    /// `0` if allowed; else ms until the call can be admitted (the wait
    /// when delayed, the box's time or `-1` for a manual box when boxed).
    pub retry_after_ms: i64,
    /// `0`, or the level (1..3) of the active box.
    pub box_level: i64,
    /// Strikes left before the box trips; `0` when boxed, `-1` without
    /// `STRIKES`.
    pub strikes_remaining: i64,
    /// Which bucket the reply describes: `0` the first key, `1` the first
    /// `ALSO`, and so on.
    pub binding: i64,
}

/// `status` of an allowed call.
pub const ALLOWED: i64 = 1;
/// `status` of a throttled call.
pub const THROTTLED: i64 = 0;
/// `status` of a call refused by an active penalty box.
pub const BOXED: i64 = -1;
/// `status` of a call admitted after a wait (`DELAY`).
pub const DELAYED: i64 = 2;

impl Decision {
    /// The reply as its 8 integers, in order.
    pub fn to_array(self) -> [i64; 8] {
        [
            self.status,
            self.limit,
            self.remaining,
            self.reset_ms,
            self.retry_after_ms,
            self.box_level,
            self.strikes_remaining,
            self.binding,
        ]
    }

    /// Every field but the two millisecond countdowns (`reset_ms`,
    /// `retry_after_ms`), in order: `[status, limit, remaining,
    /// box_level, strikes_remaining, binding]`, for exact comparisons of
    /// replies whose times move with the clock.
    pub fn untimed(self) -> [i64; 6] {
        [
            self.status,
            self.limit,
            self.remaining,
            self.box_level,
            self.strikes_remaining,
            self.binding,
        ]
    }

    /// Whether the call was allowed (`status` 1).
    pub fn allowed(self) -> bool {
        self.status == ALLOWED
    }
}

impl From<[i64; 8]> for Decision {
    fn from(r: [i64; 8]) -> Decision {
        let [status, limit, remaining, reset_ms, retry_after_ms, box_level, strikes_remaining, binding] =
            r;
        Decision {
            status,
            limit,
            remaining,
            reset_ms,
            retry_after_ms,
            box_level,
            strikes_remaining,
            binding,
        }
    }
}

impl From<Vec<i64>> for Decision {
    /// Panics (a test failure) unless the reply has exactly 8 integers.
    fn from(r: Vec<i64>) -> Decision {
        let fields: [i64; 8] = r
            .try_into()
            .unwrap_or_else(|r: Vec<i64>| panic!("a limiter reply has 8 integers, got {r:?}"));
        Decision::from(fields)
    }
}

/// Sends a limiter command (`RL.TAKE`, `RL.WINDOW`, `RL.QUOTA` as one
/// whitespace-separated line) and decodes its reply; panics on an error.
pub fn decide(con: &mut Connection, line: &str) -> Decision {
    Decision::from(ints(con, line))
}

/// A key's penalty state: the reply of `RL.BOX STATUS` and `RL.BOX TRIP`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BoxStatus {
    /// Level of the active box (1..3), or 0 when no box is active.
    pub level: i64,
    /// Ms until the box ends; `-1` for a manual box; `0` without a box.
    pub ttl_ms: i64,
    /// Offenses (trips) still remembered.
    pub offenses: i64,
    /// Strikes counted in the strike window still open.
    pub strikes: i64,
}

impl From<Vec<i64>> for BoxStatus {
    /// Panics (a test failure) unless the reply has exactly 4 integers.
    fn from(r: Vec<i64>) -> BoxStatus {
        let [level, ttl_ms, offenses, strikes]: [i64; 4] = r
            .try_into()
            .unwrap_or_else(|r: Vec<i64>| panic!("RL.BOX STATUS has 4 integers, got {r:?}"));
        BoxStatus {
            level,
            ttl_ms,
            offenses,
            strikes,
        }
    }
}

impl BoxStatus {
    /// The reply as its 4 integers, in order.
    pub fn to_array(self) -> [i64; 4] {
        [self.level, self.ttl_ms, self.offenses, self.strikes]
    }
}

/// `RL.BOX STATUS key`, decoded.
pub fn box_status(con: &mut Connection, key: &str) -> BoxStatus {
    BoxStatus::from(ints(con, &format!("RL.BOX STATUS {key}")))
}
