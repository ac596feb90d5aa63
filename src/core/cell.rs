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
    /// Whole points left, never negative (redis-cell's reply has no
    /// debt: a bucket in debt answers 0, its wait in `retry_after_s`).
    pub remaining: i64,
    /// Whole seconds until a retry may succeed, rounded up; `None` when
    /// allowed, when the quantity can never fit, and for a manual box.
    pub retry_after_s: Option<u64>,
    /// Whole seconds until the bucket is full, rounded up.
    pub reset_after_s: u64,
}

/// How far (ms) a redis-cell value's TAT may lie from its key's expiry:
/// redis-cell sets the TTL to the TAT minus the time of its write.
pub const TAT_EXPIRY_TOLERANCE_MS: u64 = 1000;

/// The bucket a stored string stands for, when it is a redis-cell value:
/// an integer `tat` of nanoseconds (its theoretical arrival time) on a key
/// whose TTL is `pttl_ms`, with `tat / 10^6` within
/// [`TAT_EXPIRY_TOLERANCE_MS`] of `now + pttl_ms` (redis-cell's key expires
/// at its TAT) and within [`MAX_DURATION_MS`] of `now`, written as
/// redis-cell writes an integer (no sign but a leading `-`, no leading
/// zero). Anything else (a key without a TTL, a user's counter, `+17...`
/// or `017...`) is not redis-cell's, and `None`.
pub fn redis_cell_bucket(
    bytes: &[u8],
    pttl_ms: Option<u64>,
    now: Millis,
    rate: &Rate,
) -> Option<Bucket> {
    let pttl_ms = pttl_ms?;
    let text = std::str::from_utf8(bytes).ok()?;
    let tat_ns: i64 = text.parse().ok()?;
    if tat_ns.to_string() != text {
        return None;
    }
    let tat_ms = i128::from(tat_ns).div_euclid(1_000_000);
    let expiry_ms = i128::from(now) + i128::from(pttl_ms);
    let off_expiry = (tat_ms - expiry_ms).unsigned_abs();
    let off_now = (tat_ms - i128::from(now)).unsigned_abs();
    (off_expiry <= u128::from(TAT_EXPIRY_TOLERANCE_MS) && off_now <= u128::from(MAX_DURATION_MS))
        .then(|| from_tat_ns(tat_ns, rate))
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
        remaining: decision.remaining.max(0),
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
        // redis-cell's own write: a TAT 6 s ahead, the key expiring then.
        let tat = (NOW + 6_000) * 1_000_000;
        let plausible = tat.to_string();
        let late = (NOW + 6_000 + 1_000) * 1_000_000;
        let too_late = (NOW + 6_000 + 1_001) * 1_000_000;
        let early = (NOW + 6_000 - 1_000) * 1_000_000;
        let too_early = (NOW + 6_000 - 1_001) * 1_000_000;
        let (late, too_late) = (late.to_string(), too_late.to_string());
        let (early, too_early) = (early.to_string(), too_early.to_string());
        let rows: &[(&str, Option<u64>, bool)] = &[
            (&plausible, Some(6_000), true),
            (&plausible, None, false),
            (&late, Some(6_000), true),
            (&too_late, Some(6_000), false),
            (&early, Some(6_000), true),
            (&too_early, Some(6_000), false),
            // A user's counter (`SET counter 5 EX 3600`), a balance.
            ("5", Some(3_600_000), false),
            ("5", None, false),
            ("1000", Some(0), false),
            ("0", Some(0), false),
            ("9223372036854775807", Some(6_000), false),
            ("-1", Some(6_000), false),
            ("-9000000000000000000", Some(6_000), false),
            ("12abc", Some(6_000), false),
            ("", Some(6_000), false),
            (" 1700000006000000000", Some(6_000), false),
            // The TAT in another spelling than redis-cell's.
            (&format!("+{plausible}"), Some(6_000), false),
            (&format!("0{plausible}"), Some(6_000), false),
        ];
        for &(value, pttl_ms, is_cell) in rows {
            let got = redis_cell_bucket(value.as_bytes(), pttl_ms, NOW, &RATE);
            assert_eq!(got.is_some(), is_cell, "{value:?} pttl {pttl_ms:?}");
        }
    }

    #[test]
    fn a_tat_matching_a_huge_ttl_is_still_bounded_by_the_clock() {
        let pttl = MAX_DURATION_MS + 10_000;
        let tat = (NOW + pttl as Millis) * 1_000_000;
        let got = redis_cell_bucket(tat.to_string().as_bytes(), Some(pttl), NOW, &RATE);
        assert!(got.is_none(), "beyond 100 years");
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
