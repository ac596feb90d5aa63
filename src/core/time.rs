//! Integer helpers for time arithmetic shared by the algorithms.

/// Milliseconds since the Unix epoch, as read from the server clock.
pub type Millis = i64;

/// `ceil(a / b)` for `b > 0` (any sign of `a`).
pub fn ceil_div(a: i128, b: i128) -> i128 {
    let b = b.max(1);
    let q = div_floor(a, b);
    if rem_floor(a, b) == 0 {
        q
    } else {
        q.saturating_add(1)
    }
}

/// `a.div_euclid(b)` for `b >= 1` (rounded toward minus infinity), in
/// 64-bit arithmetic when both fit: the common case, where a 128-bit
/// division would be a library call of a hundred instructions.
pub fn div_floor(a: i128, b: i128) -> i128 {
    match (i64::try_from(a), i64::try_from(b)) {
        (Ok(a), Ok(b)) if b >= 1 => i128::from(a.div_euclid(b)),
        _ => a.div_euclid(b.max(1)),
    }
}

/// `a.rem_euclid(b)` for `b >= 1` (in `0..b`), as [`div_floor`].
pub fn rem_floor(a: i128, b: i128) -> i128 {
    match (i64::try_from(a), i64::try_from(b)) {
        (Ok(a), Ok(b)) if b >= 1 => i128::from(a.rem_euclid(b)),
        _ => a.rem_euclid(b.max(1)),
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
    fn floor_division_agrees_with_128_bits() {
        let big = i128::from(i64::MAX) * 4;
        for a in [
            0,
            1,
            -1,
            7,
            -7,
            59_999,
            -60_001,
            big,
            -big,
            i128::from(i64::MIN),
        ] {
            for b in [1, 3, 60_000, big] {
                assert_eq!(div_floor(a, b), a.div_euclid(b), "{a} / {b}");
                assert_eq!(rem_floor(a, b), a.rem_euclid(b), "{a} % {b}");
            }
        }
    }

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
