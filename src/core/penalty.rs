//! The penalty ladder: strikes, offenses and an escalating box.
//!
//! Every deadline is an absolute server time in milliseconds, so a value
//! means the same thing on a master, a replica and after an AOF replay. A
//! piece of state is *live* while `now` is before its deadline; an expired
//! piece counts as zero without being rewritten.

use serde::de::{self, SeqAccess, Visitor};
use serde::ser::SerializeTuple;
use serde::{Deserialize, Deserializer, Serialize, Serializer};

use super::limits::{DEFAULT_OFFENSES_TTL_MS, MAX_BOX_LEVEL, MAX_THRESHOLD};
use super::part::{within_reach, Part, MAX_COUNT};
use super::time::{after, Millis};

/// `box_until` of a manual box: it lasts until `RL.BOX RELEASE`.
pub const MANUAL: Millis = i64::MAX;

/// The penalty state of a key.
///
/// Encoded as an array of its fields in order; `retry_at` only when set
/// (a payload of version 5 or later), so a state without it has the bytes
/// older builds wrote.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Penalty {
    /// Strikes counted in the open strike window.
    pub strikes: u64,
    /// End of the strike window (exclusive).
    pub strikes_until: Millis,
    /// Trips remembered.
    pub offenses: u64,
    /// When the offenses are forgotten (exclusive).
    pub offenses_until: Millis,
    /// Level of the box, 0 when there is none.
    pub box_level: u8,
    /// End of the box (exclusive), or [`MANUAL`].
    pub box_until: Millis,
    /// The instant the latest refusal announced (`now + retry_after_ms`):
    /// a refusal before it is an early retry, a strike. 0 when none is
    /// pending.
    pub retry_at: Millis,
}

/// The payload version that added [`Penalty::retry_at`].
pub const RETRY_AT_SINCE: u8 = 5;

impl Serialize for Penalty {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let n = if self.retry_at == 0 { 6 } else { 7 };
        let mut t = serializer.serialize_tuple(n)?;
        t.serialize_element(&self.strikes)?;
        t.serialize_element(&self.strikes_until)?;
        t.serialize_element(&self.offenses)?;
        t.serialize_element(&self.offenses_until)?;
        t.serialize_element(&self.box_level)?;
        t.serialize_element(&self.box_until)?;
        if self.retry_at != 0 {
            t.serialize_element(&self.retry_at)?;
        }
        t.end()
    }
}

impl<'de> Deserialize<'de> for Penalty {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Penalty, D::Error> {
        struct PenaltyVisitor;
        impl<'de> Visitor<'de> for PenaltyVisitor {
            type Value = Penalty;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("a penalty: 6 or 7 fields")
            }
            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Penalty, A::Error> {
                let missing = || de::Error::custom("a penalty has at least 6 fields");
                Ok(Penalty {
                    strikes: seq.next_element()?.ok_or_else(missing)?,
                    strikes_until: seq.next_element()?.ok_or_else(missing)?,
                    offenses: seq.next_element()?.ok_or_else(missing)?,
                    offenses_until: seq.next_element()?.ok_or_else(missing)?,
                    box_level: seq.next_element()?.ok_or_else(missing)?,
                    box_until: seq.next_element()?.ok_or_else(missing)?,
                    retry_at: seq.next_element()?.unwrap_or(0),
                })
            }
        }
        deserializer.deserialize_seq(PenaltyVisitor)
    }
}

/// What a call with `STRIKES` configures.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PenaltyPolicy {
    /// Strikes that trip the box (>= 1).
    pub threshold: u64,
    /// Length of a strike window in ms (>= 1).
    pub window_ms: u64,
    /// Box durations in ms for levels 1, 2, 3; 0 means manual.
    pub box_ms: [u64; 3],
    /// How long offenses are remembered after the latest trip, in ms.
    pub offenses_ttl_ms: u64,
    /// `EVERY`: every refusal is a strike, early or not (lockouts where
    /// exceeding is the offence). Read from each call, never stored.
    pub every: bool,
}

/// An active box.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ActiveBox {
    /// 1..=3.
    pub level: u8,
    /// End of the box, or `None` for a manual box.
    pub until: Option<Millis>,
}

impl ActiveBox {
    /// Milliseconds until the box ends, -1 for a manual box.
    pub fn ttl_ms(&self, now: Millis) -> i64 {
        match self.until {
            Some(until) => until.saturating_sub(now).max(0),
            None => -1,
        }
    }
}

/// What one strike did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Strike {
    /// Counted; this many strikes are left before the box trips.
    Counted { remaining: u64 },
    /// The box tripped.
    Tripped(ActiveBox),
}

impl Penalty {
    /// Whether the stored fields are within their ranges.
    pub fn is_valid(&self) -> bool {
        self.box_level <= MAX_BOX_LEVEL
    }

    /// The box in force at `now`, if any.
    pub fn active_box(&self, now: Millis) -> Option<ActiveBox> {
        if self.box_level == 0 || now >= self.box_until {
            return None;
        }
        let until = (self.box_until != MANUAL).then_some(self.box_until);
        Some(ActiveBox {
            level: self.box_level,
            until,
        })
    }

    /// Strikes counted in a window still open at `now`.
    pub fn live_strikes(&self, now: Millis) -> u64 {
        if now < self.strikes_until {
            self.strikes
        } else {
            0
        }
    }

    /// Offenses still remembered at `now`.
    pub fn live_offenses(&self, now: Millis) -> u64 {
        if now < self.offenses_until {
            self.offenses
        } else {
            0
        }
    }

    /// Strikes left before the box trips under `policy`.
    pub fn strikes_remaining(&self, policy: &PenaltyPolicy, now: Millis) -> u64 {
        policy.threshold.saturating_sub(self.live_strikes(now))
    }

    /// A refusal at `now` that announces `retry_after_ms`: a strike when it
    /// comes before the instant the previous refusal announced (an early
    /// retry) or when the policy strikes `every` refusal, otherwise none;
    /// either way the new instant is recorded. `None` when no strike was
    /// counted.
    pub fn refuse(
        &mut self,
        policy: &PenaltyPolicy,
        retry_after_ms: u64,
        now: Millis,
    ) -> Option<Strike> {
        let struck = policy.every || now < self.retry_at;
        self.retry_at = after(now, retry_after_ms).min(MANUAL - 1);
        struck.then(|| self.strike(policy, now))
    }

    /// An admitted call at `now`: a retry announced earlier no longer
    /// holds (the next refusal is not early). Whether anything changed.
    pub fn admit(&mut self, now: Millis) -> bool {
        let pending = now < self.retry_at;
        if self.retry_at != 0 {
            self.retry_at = 0;
        }
        pending
    }

    /// Count one strike at `now`; trip the box when the count reaches the
    /// threshold.
    pub fn strike(&mut self, policy: &PenaltyPolicy, now: Millis) -> Strike {
        if now >= self.strikes_until {
            self.strikes = 0;
            self.strikes_until = after(now, policy.window_ms);
        }
        self.strikes = self.strikes.saturating_add(1);
        if self.strikes < policy.threshold {
            return Strike::Counted {
                remaining: policy.threshold - self.strikes,
            };
        }
        let offenses = self.record_offense(now, policy.offenses_ttl_ms);
        let level = level_for(offenses);
        let duration = policy.box_ms[usize::from(level - 1)];
        Strike::Tripped(self.put_in_box(level, duration, now))
    }

    /// A manual trip (`RL.BOX TRIP`): box at `level` for `duration_ms`
    /// (0 = manual), one more offense, remembered for at least the default
    /// offense memory.
    pub fn trip(&mut self, level: u8, duration_ms: u64, now: Millis) -> ActiveBox {
        self.record_offense(now, DEFAULT_OFFENSES_TTL_MS);
        self.put_in_box(level.clamp(1, MAX_BOX_LEVEL), duration_ms, now)
    }

    /// Lift the box; with `forget` also clear offenses and strikes. Returns
    /// whether a box was active.
    pub fn release(&mut self, forget: bool, now: Millis) -> bool {
        let was_active = self.active_box(now).is_some();
        self.box_level = 0;
        self.box_until = 0;
        if forget {
            *self = Penalty::default();
        }
        was_active
    }

    /// The last instant at which anything here still matters: `None` when
    /// nothing does, `Some(MANUAL)` for a manual box.
    pub fn retain_until(&self, now: Millis) -> Option<Millis> {
        let mut until = None;
        if self.active_box(now).is_some() {
            until = Some(self.box_until);
        }
        if self.live_strikes(now) > 0 {
            until = until.max(Some(self.strikes_until));
        }
        if self.live_offenses(now) > 0 {
            until = until.max(Some(self.offenses_until));
        }
        if now < self.retry_at {
            until = until.max(Some(self.retry_at));
        }
        until
    }

    /// Clear every piece that has expired at `now`, so the stored value is
    /// as small as it can be. Returns whether anything is left.
    pub fn prune(&mut self, now: Millis) -> bool {
        if self.active_box(now).is_none() {
            self.box_level = 0;
            self.box_until = 0;
        }
        if self.live_strikes(now) == 0 {
            self.strikes = 0;
            self.strikes_until = 0;
        }
        if self.live_offenses(now) == 0 {
            self.offenses = 0;
            self.offenses_until = 0;
        }
        if now >= self.retry_at {
            self.retry_at = 0;
        }
        *self != Penalty::default()
    }

    fn record_offense(&mut self, now: Millis, ttl_ms: u64) -> u64 {
        let offenses = self.live_offenses(now).saturating_add(1);
        self.offenses = offenses;
        self.offenses_until = after(now, ttl_ms).max(self.offenses_until);
        offenses
    }

    fn put_in_box(&mut self, level: u8, duration_ms: u64, now: Millis) -> ActiveBox {
        self.strikes = 0;
        self.strikes_until = 0;
        self.retry_at = 0;
        self.box_level = level;
        self.box_until = if duration_ms == 0 {
            MANUAL
        } else {
            after(now, duration_ms).min(MANUAL - 1)
        };
        ActiveBox {
            level,
            until: (duration_ms != 0).then_some(self.box_until),
        }
    }
}

/// A penalty matters while its box, strikes, offenses or announced retry
/// are live.
impl Part for Penalty {
    fn is_valid(&self) -> bool {
        Penalty::is_valid(self)
    }

    /// A manual box is the only deadline without end; counters stay below
    /// what calls can reach (strikes below the largest threshold).
    fn is_plausible(&self, now: Millis) -> bool {
        let timed = |t: Millis| t != MANUAL && within_reach(t, now);
        let box_ok = self.box_level == 0 && self.box_until == 0
            || self.box_level > 0 && (self.box_until == MANUAL || timed(self.box_until));
        box_ok
            && timed(self.strikes_until)
            && timed(self.offenses_until)
            && timed(self.retry_at)
            && self.strikes <= MAX_THRESHOLD
            && self.offenses <= MAX_COUNT
    }

    fn since_version(&self) -> u8 {
        if self.retry_at == 0 {
            1
        } else {
            RETRY_AT_SINCE
        }
    }

    fn retain(&mut self, now: Millis) -> Option<Millis> {
        let until = self.retain_until(now);
        self.prune(now).then_some(until).flatten()
    }
}

/// The box level for a number of offenses: `min(offenses, 3)`.
fn level_for(offenses: u64) -> u8 {
    u8::try_from(offenses.clamp(1, u64::from(MAX_BOX_LEVEL))).unwrap_or(MAX_BOX_LEVEL)
}

#[cfg(test)]
mod tests {
    use super::*;

    const NOW: Millis = 1_700_000_000_000;

    fn policy(threshold: u64) -> PenaltyPolicy {
        PenaltyPolicy {
            threshold,
            window_ms: 60_000,
            box_ms: [300_000, 3_600_000, 0],
            offenses_ttl_ms: 86_400_000,
            every: false,
        }
    }

    #[test]
    fn strikes_trip_the_box_at_the_threshold() {
        let mut p = Penalty::default();
        let pol = policy(3);
        assert_eq!(p.strike(&pol, NOW), Strike::Counted { remaining: 2 });
        assert_eq!(p.strike(&pol, NOW + 1), Strike::Counted { remaining: 1 });
        let tripped = p.strike(&pol, NOW + 2);
        assert_eq!(
            tripped,
            Strike::Tripped(ActiveBox {
                level: 1,
                until: Some(NOW + 2 + 300_000)
            })
        );
        assert_eq!(p.live_strikes(NOW + 2), 0);
        assert_eq!(p.live_offenses(NOW + 2), 1);
        assert_eq!(p.active_box(NOW + 2 + 299_999).map(|b| b.level), Some(1));
        assert_eq!(p.active_box(NOW + 2 + 300_000), None);
    }

    #[test]
    fn the_strike_window_opens_at_the_first_strike() {
        let mut p = Penalty::default();
        let pol = policy(2);
        p.strike(&pol, NOW);
        // The window closed: this strike opens a new one.
        assert_eq!(
            p.strike(&pol, NOW + 60_000),
            Strike::Counted { remaining: 1 }
        );
        assert_eq!(p.strikes_until, NOW + 120_000);
    }

    #[test]
    fn offenses_escalate_and_level_three_can_be_manual() {
        let mut p = Penalty::default();
        let pol = policy(1);
        let mut now = NOW;
        let mut levels = vec![];
        for _ in 0..4 {
            if let Strike::Tripped(b) = p.strike(&pol, now) {
                levels.push((b.level, b.until.is_some()));
                now = b.until.unwrap_or(now) + 1;
                p.release(false, now);
            }
        }
        assert_eq!(levels, vec![(1, true), (2, true), (3, false), (3, false)]);
    }

    #[test]
    fn offenses_are_forgotten_after_their_ttl() {
        let mut p = Penalty::default();
        let pol = policy(1);
        p.strike(&pol, NOW);
        let later = NOW + 86_400_000;
        assert_eq!(p.live_offenses(later), 0);
        assert_eq!(
            p.strike(&pol, later),
            Strike::Tripped(ActiveBox {
                level: 1,
                until: Some(later + 300_000)
            })
        );
    }

    #[test]
    fn release_and_forget() {
        let mut p = Penalty::default();
        assert!(!p.release(false, NOW));
        p.trip(2, 0, NOW);
        assert_eq!(
            p.active_box(NOW + 10_000_000_000),
            Some(ActiveBox {
                level: 2,
                until: None
            })
        );
        assert_eq!(p.retain_until(NOW), Some(MANUAL));
        assert!(p.release(false, NOW));
        assert_eq!(p.live_offenses(NOW), 1);
        assert!(p.prune(NOW));
        assert!(!p.release(true, NOW));
        assert!(!p.prune(NOW));
    }
}
