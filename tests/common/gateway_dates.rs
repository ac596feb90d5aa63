//! Date parsing for the gateway tests: HTTP-dates (`Retry-After`) and
//! RFC 3339 timestamps (`lockout_ends_at`), as seconds since the epoch.
//!
//! Included next to `common/gateway.rs`:
//! `#[path = "common/gateway_dates.rs"] mod gateway_dates;`.

#![allow(dead_code)]

/// Days from 1970-01-01 of a proleptic Gregorian date (H. Hinnant's
/// algorithm).
fn days_from_civil(y: i64, m: i64, d: i64) -> i64 {
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let doy = (153 * ((m + 9) % 12) + 2) / 5 + d - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

fn unix_time(y: i64, mo: i64, d: i64, h: i64, mi: i64, s: i64) -> Option<u64> {
    let valid = (1..=12).contains(&mo)
        && (1..=31).contains(&d)
        && (0..24).contains(&h)
        && (0..60).contains(&mi)
        && (0..61).contains(&s);
    let t = days_from_civil(y, mo, d) * 86_400 + h * 3600 + mi * 60 + s;
    valid.then(|| u64::try_from(t).ok()).flatten()
}

/// The Unix time of an IMF-fixdate (`Sun, 06 Nov 1994 08:49:37 GMT`), the
/// HTTP-date form of `Retry-After`, or None.
pub fn http_date(s: &str) -> Option<u64> {
    const MONTHS: [&str; 12] = [
        "Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec",
    ];
    let parts: Vec<&str> = s.split(' ').collect();
    let [_wday, d, mon, y, hms, "GMT"] = parts[..] else {
        return None;
    };
    let mo = MONTHS.iter().position(|m| *m == mon)? as i64 + 1;
    let t: Vec<i64> = hms.split(':').filter_map(|x| x.parse().ok()).collect();
    let [h, mi, sec] = t[..] else { return None };
    unix_time(y.parse().ok()?, mo, d.parse().ok()?, h, mi, sec)
}

/// The Unix time of an RFC 3339 UTC timestamp (`2026-01-02T03:04:05Z`), or
/// None.
pub fn rfc3339(s: &str) -> Option<u64> {
    let b = s.as_bytes();
    if b.len() != 20 || b[4] != b'-' || b[7] != b'-' || b[10] != b'T' || b[19] != b'Z' {
        return None;
    }
    let n = |r: std::ops::Range<usize>| s.get(r)?.parse::<i64>().ok();
    unix_time(
        n(0..4)?,
        n(5..7)?,
        n(8..10)?,
        n(11..13)?,
        n(14..16)?,
        n(17..19)?,
    )
}
