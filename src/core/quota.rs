//! `RL.QUOTA`: at most `limit` points per calendar day, ISO week or month,
//! in UTC. The count resets when the period ends; the key expires then.
//!
//! Calendar arithmetic is exact in integers (Howard Hinnant's
//! `days_from_civil` / `civil_from_days`), so month ends, leap years and
//! the turn of the year need no tables.

use serde::{Deserialize, Serialize};

use super::limiter::{Conflict, Limiter};
use super::part::{within_reach, Part, MAX_COUNT};
use super::penalty::MANUAL;
use super::record::Record;
use super::region::RegionCounts;
use super::time::{clamp_i64, Millis};

const DAY_MS: i64 = 86_400_000;

/// A calendar period, in UTC.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub enum Period {
    /// 00:00 to 24:00.
    Day,
    /// Monday 00:00 to the next Monday 00:00 (ISO 8601 weeks).
    Week,
    /// The first of the month 00:00 to the first of the next month.
    Month,
}

impl Period {
    /// The period's name in replies and arguments.
    pub fn name(self) -> &'static str {
        match self {
            Period::Day => "DAY",
            Period::Week => "WEEK",
            Period::Month => "MONTH",
        }
    }

    /// The period's code in a payload.
    pub(crate) fn code(self) -> u8 {
        self as u8
    }
}

/// Encoded as its code: 0 day, 1 week, 2 month.
impl Serialize for Period {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_u8(self.code())
    }
}

impl<'de> Deserialize<'de> for Period {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Period, D::Error> {
        match u8::deserialize(d)? {
            0 => Ok(Period::Day),
            1 => Ok(Period::Week),
            2 => Ok(Period::Month),
            _ => Err(serde::de::Error::custom("not a period")),
        }
    }
}

/// The parameters of one key in an `RL.QUOTA` call.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Quota {
    /// Points per period (>= 1).
    pub limit: u64,
    /// The calendar period.
    pub period: Period,
}

/// What a quota key stores: the points counted in the period that ends at
/// `end` (exclusive). The count holds while `now < end`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct QuotaState {
    /// End of the counted period (ms since the epoch, exclusive).
    pub end: Millis,
    /// Points counted.
    pub count: u64,
}

/// How a quota reads at `now`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct QuotaSeen {
    /// Points counted now.
    pub count: u64,
    /// When the count resets.
    pub end: Millis,
}

impl QuotaState {
    /// Whether decoded data is consistent.
    pub fn is_valid(&self) -> bool {
        self.count > 0
    }

    /// The end of the period while anything is counted at `now`.
    pub fn counts_until(&self, now: Millis) -> Option<Millis> {
        (now < self.end && self.count > 0).then_some(self.end)
    }
}

/// A quota count matters until its period ends.
impl Part for QuotaState {
    fn is_valid(&self) -> bool {
        QuotaState::is_valid(self)
    }

    fn retain(&mut self, now: Millis) -> Option<Millis> {
        self.counts_until(now).map(|end| end.min(MANUAL - 1))
    }

    fn is_plausible(&self, now: Millis) -> bool {
        within_reach(self.end, now) && self.count <= MAX_COUNT
    }
}

/// Days since 1970-01-01 of the civil date `year-month-day`.
pub fn days_from_civil(year: i64, month: u32, day: u32) -> i64 {
    let y = if month <= 2 { year - 1 } else { year };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let m = i64::from(month);
    let doy = (153 * (if m > 2 { m - 3 } else { m + 9 }) + 2) / 5 + i64::from(day) - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

/// The civil date `(year, month, day)` of `days` since 1970-01-01.
pub fn civil_from_days(days: i64) -> (i64, u32, u32) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let month = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    let year = yoe + era * 400 + i64::from(month <= 2);
    (year, month, day)
}

/// `[start, end)` of the period holding `now`, in ms.
pub fn period_bounds(period: Period, now: Millis) -> (Millis, Millis) {
    // Keep the arithmetic far from i64 overflow: clamp to +-100000 years.
    let days = now.div_euclid(DAY_MS).clamp(-36_500_000, 36_500_000);
    let (first, next) = match period {
        Period::Day => (days, days + 1),
        Period::Week => {
            // 1970-01-01 was a Thursday: Monday-based weekday index.
            let start = days - (days + 3).rem_euclid(7);
            (start, start + 7)
        }
        Period::Month => {
            let (y, m, _) = civil_from_days(days);
            let (ny, nm) = if m == 12 { (y + 1, 1) } else { (y, m + 1) };
            (days_from_civil(y, m, 1), days_from_civil(ny, nm, 1))
        }
    };
    (first * DAY_MS, next * DAY_MS)
}

impl Quota {
    /// End of the period holding `now`.
    fn period_end(&self, now: Millis) -> Millis {
        period_bounds(self.period, now).1
    }
}

/// A quota is a [`Limiter`] whose reading is the count of the current
/// period. A count stored for a period ending later than this call's (the
/// clock stepped back, or the period kind changed) keeps counting until
/// its own end: never fewer points counted than either reading.
impl Limiter for Quota {
    type State = QuotaState;
    type Seen = QuotaSeen;
    const CHECKS_RECORD: bool = true;

    fn limit(&self) -> u64 {
        self.limit
    }

    /// A count lasts until the end of its period.
    fn steady_expiry(&self) -> bool {
        true
    }

    /// A key holding live regional components is counted with `REGION`
    /// only.
    fn conflict(&self, record: &Record, now: Millis) -> Option<Conflict> {
        record
            .part::<Box<RegionCounts>>()
            .is_some_and(|r| now < r.end)
            .then_some(Conflict::Regional)
    }

    fn see(&self, state: Option<&QuotaState>, now: Millis) -> QuotaSeen {
        let end = self.period_end(now);
        match state {
            Some(s) if now < s.end => QuotaSeen {
                count: s.count,
                end: s.end.max(end),
            },
            _ => QuotaSeen { count: 0, end },
        }
    }

    fn fits(&self, seen: &QuotaSeen, cost: u64) -> bool {
        u128::from(seen.count) + u128::from(cost) <= u128::from(self.limit)
    }

    /// The count resets when the period ends (and `cost <= limit`).
    fn wait_ms(
        &self,
        _state: Option<&QuotaState>,
        seen: &QuotaSeen,
        cost: u64,
        now: Millis,
    ) -> i64 {
        if self.fits(seen, cost) {
            0
        } else {
            seen.end.saturating_sub(now).max(1)
        }
    }

    fn balance(&self, seen: &QuotaSeen) -> i64 {
        clamp_i64(i128::from(self.limit) - i128::from(seen.count))
    }

    fn refund(
        &self,
        state: &mut QuotaState,
        seen: &QuotaSeen,
        points: u64,
        _now: Millis,
    ) -> QuotaSeen {
        let after = QuotaSeen {
            count: seen.count.saturating_sub(points),
            end: seen.end,
        };
        *state = QuotaState {
            end: after.end,
            count: after.count,
        };
        after
    }

    /// Milliseconds until the period ends (when the count resets).
    fn reset_ms(&self, _state: Option<&QuotaState>, seen: &QuotaSeen, now: Millis) -> i64 {
        seen.end.saturating_sub(now).max(0)
    }

    fn charge(
        &self,
        state: &mut Option<QuotaState>,
        seen: &QuotaSeen,
        cost: u64,
        _now: Millis,
    ) -> QuotaSeen {
        let after = QuotaSeen {
            count: seen.count.saturating_add(cost),
            end: seen.end,
        };
        *state = Some(QuotaState {
            end: after.end,
            count: after.count,
        });
        after
    }

    fn rewrite(&self, _state: &mut QuotaState, _seen: &QuotaSeen, _now: Millis) -> bool {
        false
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// ms of `y-m-d hh:mm:ss` UTC.
    fn at(y: i64, m: u32, d: u32, hh: i64, mm: i64, ss: i64) -> Millis {
        days_from_civil(y, m, d) * DAY_MS + ((hh * 60 + mm) * 60 + ss) * 1000
    }

    #[test]
    fn civil_dates_round_trip() {
        assert_eq!(days_from_civil(1970, 1, 1), 0);
        assert_eq!(days_from_civil(2000, 3, 1), 11_017);
        for days in [-800_000, -1, 0, 59, 11_016, 19_723, 2_932_896] {
            let (y, m, d) = civil_from_days(days);
            assert_eq!(days_from_civil(y, m, d), days);
        }
        assert_eq!(civil_from_days(days_from_civil(2024, 2, 29)), (2024, 2, 29));
    }

    #[test]
    fn periods_at_the_edges() {
        let rows = [
            // (period, now, start, end)
            (
                Period::Day,
                at(2026, 11, 29, 23, 59, 59),
                at(2026, 11, 29, 0, 0, 0),
                at(2026, 11, 30, 0, 0, 0),
            ),
            (
                Period::Day,
                at(2026, 12, 31, 12, 0, 0),
                at(2026, 12, 31, 0, 0, 0),
                at(2027, 1, 1, 0, 0, 0),
            ),
            // 2026-11-29 is a Sunday: its ISO week began Monday 23rd.
            (
                Period::Week,
                at(2026, 11, 29, 10, 0, 0),
                at(2026, 11, 23, 0, 0, 0),
                at(2026, 11, 30, 0, 0, 0),
            ),
            (
                Period::Week,
                at(2026, 11, 30, 0, 0, 0),
                at(2026, 11, 30, 0, 0, 0),
                at(2026, 12, 7, 0, 0, 0),
            ),
            // A week across the turn of the year.
            (
                Period::Week,
                at(2027, 1, 1, 8, 0, 0),
                at(2026, 12, 28, 0, 0, 0),
                at(2027, 1, 4, 0, 0, 0),
            ),
            (
                Period::Month,
                at(2024, 2, 29, 23, 59, 59),
                at(2024, 2, 1, 0, 0, 0),
                at(2024, 3, 1, 0, 0, 0),
            ),
            (
                Period::Month,
                at(2023, 2, 28, 12, 0, 0),
                at(2023, 2, 1, 0, 0, 0),
                at(2023, 3, 1, 0, 0, 0),
            ),
            (
                Period::Month,
                at(2100, 2, 28, 12, 0, 0),
                at(2100, 2, 1, 0, 0, 0),
                at(2100, 3, 1, 0, 0, 0),
            ),
            (
                Period::Month,
                at(2026, 12, 31, 23, 59, 59),
                at(2026, 12, 1, 0, 0, 0),
                at(2027, 1, 1, 0, 0, 0),
            ),
            (
                Period::Month,
                at(2026, 4, 30, 0, 0, 0),
                at(2026, 4, 1, 0, 0, 0),
                at(2026, 5, 1, 0, 0, 0),
            ),
            (
                Period::Day,
                at(1969, 12, 31, 23, 0, 0),
                at(1969, 12, 31, 0, 0, 0),
                at(1970, 1, 1, 0, 0, 0),
            ),
        ];
        for (period, now, start, end) in rows {
            assert_eq!(
                period_bounds(period, now),
                (start, end),
                "{period:?} at {now}"
            );
        }
    }

    #[test]
    fn a_monthly_quota_resets_at_the_first() {
        let q = Quota {
            limit: 3,
            period: Period::Month,
        };
        let now = at(2026, 1, 31, 23, 59, 0);
        let mut state = None;
        for left in [2, 1, 0] {
            let seen = q.see(state.as_ref(), now);
            assert!(q.fits(&seen, 1));
            let after = q.charge(&mut state, &seen, 1, now);
            assert_eq!(q.remaining(&after), left);
        }
        let seen = q.see(state.as_ref(), now);
        assert!(!q.fits(&seen, 1));
        assert_eq!(q.wait_ms(state.as_ref(), &seen, 1, now), 60_000);
        assert_eq!(q.reset_ms(state.as_ref(), &seen, now), 60_000);
        let next = at(2026, 2, 1, 0, 0, 0);
        assert!(!q.fits(&q.see(state.as_ref(), next - 1), 1));
        assert!(q.fits(&q.see(state.as_ref(), next), 3));
        assert_eq!(state.and_then(|s| s.counts_until(now)), Some(next));
    }

    #[test]
    fn a_backward_step_keeps_the_later_period() {
        let q = Quota {
            limit: 1,
            period: Period::Day,
        };
        let day2 = at(2026, 6, 2, 1, 0, 0);
        let mut charged = None;
        q.charge(&mut charged, &q.see(None, day2), 1, day2);
        let s = charged.expect("charged");
        let back = day2 - 2 * 3_600_000;
        let seen = q.see(Some(&s), back);
        assert_eq!(seen.count, 1, "the step into yesterday releases nothing");
        assert!(!q.fits(&seen, 1));
        assert_eq!(
            q.wait_ms(Some(&s), &seen, 1, back),
            at(2026, 6, 3, 0, 0, 0) - back
        );
    }
}
