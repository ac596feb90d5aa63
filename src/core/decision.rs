//! The decision of a limiter call (`RL.TAKE`, `RL.WINDOW`, `RL.QUOTA`),
//! typed: the adapter turns it into the reply's 8 integers in one place
//! (`adapter::reply::to_wire`), so no sentinel value exists in here.

use super::penalty::ActiveBox;
use super::time::Millis;

/// What the call may do.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Status {
    /// The request is admitted.
    Allowed,
    /// Not enough room: nothing was taken.
    Throttled,
    /// The penalty box is active: nothing was read or taken.
    Boxed,
    /// Admitted later: the points are reserved, proceed after
    /// `retry_after` (`RL.TAKE ... DELAY`).
    Delayed,
}

/// A time from now until something happens.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Span {
    /// In this many milliseconds (0: now).
    Ms(u64),
    /// Never by itself: a manual box lasts until it is released.
    Never,
}

impl Span {
    /// A span of `ms` milliseconds (a negative value is read as 0).
    pub fn ms(ms: i64) -> Span {
        Span::Ms(u64::try_from(ms).unwrap_or(0))
    }

    /// The milliseconds, `None` for [`Span::Never`].
    pub fn as_ms(self) -> Option<u64> {
        match self {
            Span::Ms(ms) => Some(ms),
            Span::Never => None,
        }
    }
}

/// The answer to one limiter call, about its binding key.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Decision {
    /// Allowed, throttled, boxed or delayed.
    pub status: Status,
    /// The binding key's limit (a bucket's capacity, a window's limit).
    pub limit: u64,
    /// Whole points left in the binding key after the call, negative by
    /// the excess when it holds more than it may admit (a debt, a lowered
    /// limit); 0 when boxed.
    pub remaining: i64,
    /// Until the binding key holds nothing that limits (when boxed: until
    /// the box ends).
    pub reset: Span,
    /// Until the caller may try again: zero when allowed; when throttled,
    /// until `cost` fits in every key (jitter included); when boxed, until
    /// the box ends; when delayed, until the reserved points are due.
    pub retry_after: Span,
    /// Level of the active box, 0 when none.
    pub box_level: u8,
    /// Strikes left before the box trips (0 when boxed); `None` when the
    /// call counts no strikes (no `STRIKES`).
    pub strikes_remaining: Option<u64>,
    /// Which key binds: 0 the first, 1 the first `ALSO`, ...
    pub binding: usize,
    /// Points granted by a `PARTIAL` call that was allowed (`None`
    /// otherwise: the wire writes 0 for a refused or boxed `PARTIAL`).
    pub granted: Option<u64>,
}

/// The decision of a call that meets an active box: `limit` is the first
/// key's, nothing remains, and both spans are the box's time left.
pub fn boxed(first_limit: u64, active: &ActiveBox, now: Millis) -> Decision {
    let left = match active.until {
        Some(until) => Span::ms(until.saturating_sub(now)),
        None => Span::Never,
    };
    Decision {
        status: Status::Boxed,
        limit: first_limit,
        remaining: 0,
        reset: left,
        retry_after: left,
        box_level: active.level,
        strikes_remaining: Some(0),
        binding: 0,
        granted: None,
    }
}

/// `wait_ms` stretched by a factor in `[1, 1 + percent/100]` chosen by
/// `random` (uniform over `u64`), rounded up.
pub fn jittered(wait_ms: u64, percent: u8, random: u64) -> u64 {
    if percent == 0 || wait_ms == 0 {
        return wait_ms;
    }
    let scaled = u128::from(wait_ms) * u128::from(percent.min(100)) * u128::from(random >> 32);
    let denominator = 100u128 << 32;
    let extra = scaled.div_ceil(denominator);
    wait_ms.saturating_add(u64::try_from(extra).unwrap_or(u64::MAX))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn jitter_bounds() {
        assert_eq!(jittered(1000, 0, u64::MAX), 1000);
        assert_eq!(jittered(1000, 100, 0), 1000);
        assert_eq!(jittered(1000, 100, u64::MAX), 2000);
        assert_eq!(jittered(u64::MAX, 100, u64::MAX), u64::MAX);
    }

    #[test]
    fn a_manual_box_never_ends_by_itself() {
        let manual = ActiveBox {
            level: 3,
            until: None,
        };
        let d = boxed(10, &manual, 5);
        assert_eq!((d.reset, d.retry_after), (Span::Never, Span::Never));
        let timed = ActiveBox {
            level: 1,
            until: Some(1005),
        };
        assert_eq!(boxed(10, &timed, 5).retry_after, Span::Ms(1000));
    }
}
