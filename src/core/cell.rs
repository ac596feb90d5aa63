//! redis-cell's `CL.THROTTLE` on rl's bucket: which stored strings are
//! redis-cell values (and the bucket each stands for), and redis-cell's
//! answer to a decision.

use super::bucket::{from_tat_ns, Bucket, Rate};
use super::decision::{Decision, Span, Status};
use super::limits::MAX_DURATION_MS;
use super::time::Millis;

/// redis-cell's answer: `[limited, limit, remaining, retry_after_s,
/// reset_after_s]`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CellAnswer {
    /// The request is refused.
    pub limited: bool,
    /// `max_burst + 1`.
    pub limit: u64,
    /// Whole points left.
    pub remaining: i64,
    /// Whole seconds until a retry may succeed, rounded up; `None` when
    /// allowed, when the quantity can never fit, and for a manual box.
    pub retry_after_s: Option<u64>,
    /// Whole seconds until the bucket is full, rounded up.
    pub reset_after_s: u64,
}

/// The bucket a stored string stands for, when it is a redis-cell value:
/// an integer of nanoseconds (its theoretical arrival time) within
/// [`MAX_DURATION_MS`] of `now`, on a key with a TTL (redis-cell always
/// sets one). Anything else is not redis-cell's, and `None`.
pub fn redis_cell_bucket(bytes: &[u8], has_ttl: bool, now: Millis, rate: &Rate) -> Option<Bucket> {
    if !has_ttl {
        return None;
    }
    let tat_ns: i64 = std::str::from_utf8(bytes).ok()?.parse().ok()?;
    let distance = (i128::from(tat_ns) / 1_000_000 - i128::from(now)).unsigned_abs();
    (distance <= u128::from(MAX_DURATION_MS)).then(|| from_tat_ns(tat_ns, rate))
}

/// Whether `quantity` can ever fit a bucket of `rate`: redis-cell answers
/// a larger one "limited, never" and takes nothing.
pub fn can_fit(rate: &Rate, quantity: u64) -> bool {
    quantity <= rate.capacity
}

/// Whole seconds, rounded up.
fn seconds(span: Span) -> u64 {
    span.as_ms().map_or(0, |ms| ms.div_ceil(1000))
}

/// redis-cell's answer to `decision`, a call of `quantity` on a bucket of
/// `rate`.
pub fn answer(decision: &Decision, rate: &Rate, quantity: u64) -> CellAnswer {
    let never = !can_fit(rate, quantity);
    let limited = never || decision.status != Status::Allowed;
    let retry_after_s = match decision.retry_after {
        _ if never || !limited => None,
        Span::Never => None,
        wait => Some(seconds(wait).max(1)),
    };
    CellAnswer {
        limited,
        limit: rate.capacity,
        remaining: decision.remaining,
        retry_after_s,
        reset_after_s: seconds(decision.reset),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const NOW: Millis = 1_700_000_000_000;
    const RATE: Rate = Rate {
        capacity: 10,
        tokens: 10,
        period_ms: 60_000,
    };

    #[test]
    fn which_strings_are_redis_cell_values() {
        let tat = (NOW + 6_000) * 1_000_000;
        let plausible = tat.to_string();
        let rows: &[(&str, bool, bool)] = &[
            (&plausible, true, true),
            (&plausible, false, false),
            // 1970 is within 100 years of 2023: taken as a redis-cell value.
            ("1000", true, true),
            ("5", false, false),
            ("9223372036854775807", true, false),
            ("-1", true, true),
            ("-9000000000000000000", true, false),
            ("12abc", true, false),
            ("", true, false),
            (" 1700000006000000000", true, false),
        ];
        for &(value, has_ttl, is_cell) in rows {
            let got = redis_cell_bucket(value.as_bytes(), has_ttl, NOW, &RATE);
            assert_eq!(got.is_some(), is_cell, "{value:?} ttl {has_ttl}");
        }
    }

    #[test]
    fn the_answer_follows_redis_cell() {
        let allowed = Decision {
            status: Status::Allowed,
            limit: 10,
            remaining: 9,
            reset: Span::Ms(6_000),
            retry_after: Span::Ms(0),
            box_level: 0,
            strikes_remaining: None,
            binding: 0,
            granted: None,
        };
        let a = answer(&allowed, &RATE, 1);
        assert_eq!(
            (a.limited, a.retry_after_s, a.reset_after_s),
            (false, None, 6)
        );
        let throttled = Decision {
            status: Status::Throttled,
            retry_after: Span::Ms(1),
            ..allowed
        };
        assert_eq!(answer(&throttled, &RATE, 1).retry_after_s, Some(1));
        let never = answer(&allowed, &RATE, 11);
        assert!(never.limited && never.retry_after_s.is_none());
        let manual = Decision {
            status: Status::Boxed,
            retry_after: Span::Never,
            reset: Span::Never,
            ..allowed
        };
        let m = answer(&manual, &RATE, 1);
        assert_eq!(
            (m.limited, m.retry_after_s, m.reset_after_s),
            (true, None, 0)
        );
    }
}
