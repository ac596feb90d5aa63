//! Integer helpers for time arithmetic shared by the algorithms.

/// Milliseconds since the Unix epoch, as read from the server clock.
pub type Millis = i64;

/// `ceil(a / b)` for `b > 0` (any sign of `a`).
pub fn ceil_div(a: i128, b: i128) -> i128 {
    let b = b.max(1);
    let q = a.div_euclid(b);
    if a.rem_euclid(b) == 0 {
        q
    } else {
        q.saturating_add(1)
    }
}

/// `a` clamped into `i64`.
pub fn clamp_i64(a: i128) -> i64 {
    i64::try_from(a).unwrap_or(if a < 0 { i64::MIN } else { i64::MAX })
}

/// `now + duration_ms`, saturating.
pub fn after(now: Millis, duration_ms: u64) -> Millis {
    now.saturating_add(i64::try_from(duration_ms).unwrap_or(i64::MAX))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ceil_div_rounds_up() {
        assert_eq!(ceil_div(0, 3), 0);
        assert_eq!(ceil_div(1, 3), 1);
        assert_eq!(ceil_div(3, 3), 1);
        assert_eq!(ceil_div(-1, 3), 0);
        assert_eq!(ceil_div(-4, 3), -1);
    }

    #[test]
    fn clamping_and_saturation() {
        assert_eq!(clamp_i64(i128::MAX), i64::MAX);
        assert_eq!(clamp_i64(i128::MIN), i64::MIN);
        assert_eq!(after(i64::MAX - 1, u64::MAX), i64::MAX);
    }
}
