//! UTC calendar arithmetic written independently of the module's (by
//! counting days), for the tests of calendar quotas.

fn leap(y: i64) -> bool {
    (y % 4 == 0 && y % 100 != 0) || y % 400 == 0
}

fn month_days(y: i64, m: i64) -> i64 {
    match m {
        2 if leap(y) => 29,
        2 => 28,
        4 | 6 | 9 | 11 => 30,
        _ => 31,
    }
}

/// Milliseconds since the epoch of `y-m-d hh:mm:ss` UTC, for years from
/// 1970.
pub fn utc_ms(y: i64, m: i64, d: i64, hh: i64, mm: i64, ss: i64) -> i64 {
    let days: i64 = (1970..y)
        .map(|y| if leap(y) { 366 } else { 365 })
        .sum::<i64>()
        + (1..m).map(|m| month_days(y, m)).sum::<i64>()
        + d
        - 1;
    days * 86_400_000 + ((hh * 60 + mm) * 60 + ss) * 1000
}

/// The start (ms) of the UTC month `k` months after the one holding
/// `ms` (0: its own start; 1: its end), for times from 1970 to 3970.
pub fn month_start(ms: i64, k: i64) -> i64 {
    let days = ms.div_euclid(86_400_000);
    let (mut y, mut m, mut first) = (1970, 1, 0);
    // Walk whole months to the one holding `days` (bounded).
    for _ in 0..24_000 {
        if first + month_days(y, m) > days {
            break;
        }
        first += month_days(y, m);
        (y, m) = if m == 12 { (y + 1, 1) } else { (y, m + 1) };
    }
    let months = y * 12 + (m - 1) + k;
    utc_ms(months.div_euclid(12), months.rem_euclid(12) + 1, 1, 0, 0, 0)
}
