//! What one RL key holds: each part is present only while it matters.

use serde::{Deserialize, Serialize};

use super::bucket::{Bucket, Rate};
use super::lease::Leases;
use super::limiter::Limiter;
use super::penalty::{Penalty, MANUAL};
use super::quota::{Quota, QuotaState};
use super::time::Millis;
use super::window::{Window, WindowState};

/// The value of one key of the module type.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Record {
    /// The `RL.TAKE` bucket.
    pub bucket: Option<Bucket>,
    /// Strikes, offenses and box (boxed to keep bucket-only keys small).
    pub penalty: Option<Box<Penalty>>,
    /// The `RL.LEASE` leases (never an empty set: `None` then). Since
    /// encoding version 2.
    #[serde(default)]
    pub leases: Option<Box<Leases>>,
    /// The `RL.WINDOW` window. Since encoding version 3.
    #[serde(default)]
    pub window: Option<Box<WindowState>>,
    /// The `RL.QUOTA` count. Since encoding version 4.
    #[serde(default)]
    pub quota: Option<QuotaState>,
}

/// A limiter kind whose state lives in a [`Record`] (each kind in its own
/// part, so one key may serve several commands).
pub trait InRecord: Limiter {
    /// This kind's part of `record`.
    fn read(record: &Record) -> Option<&Self::State>;
    /// Take this kind's part out of `record`, to [`InRecord::write`] it
    /// back (changed or not) before the record is used again: it may leave
    /// a placeholder (an allocation kept for the state to come back to).
    fn take(record: &mut Record) -> Option<Self::State>;
    /// Replace this kind's part of `record`.
    fn write(record: &mut Record, state: Option<Self::State>);
}

impl InRecord for Window {
    fn read(record: &Record) -> Option<&WindowState> {
        record.window.as_deref()
    }

    fn take(record: &mut Record) -> Option<WindowState> {
        record.window.as_deref_mut().map(std::mem::take)
    }

    fn write(record: &mut Record, state: Option<WindowState>) {
        match (record.window.as_deref_mut(), state) {
            (Some(slot), Some(state)) => *slot = state,
            (_, state) => record.window = state.map(Box::new),
        }
    }
}

impl InRecord for Quota {
    fn read(record: &Record) -> Option<&QuotaState> {
        record.quota.as_ref()
    }

    fn take(record: &mut Record) -> Option<QuotaState> {
        record.quota.take()
    }

    fn write(record: &mut Record, state: Option<QuotaState>) {
        record.quota = state;
    }
}

impl InRecord for Rate {
    fn read(record: &Record) -> Option<&Bucket> {
        record.bucket.as_ref()
    }

    fn take(record: &mut Record) -> Option<Bucket> {
        record.bucket.take()
    }

    fn write(record: &mut Record, state: Option<Bucket>) {
        record.bucket = state;
    }
}

/// How long a key must be kept.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Retention {
    /// Nothing in it matters any more: delete the key.
    Delete,
    /// Keep it until this absolute time (ms), then let it expire.
    Until(Millis),
    /// Keep it without a TTL (a manual box).
    Forever,
}

impl Record {
    /// Whether every part satisfies its invariants.
    pub fn is_valid(&self) -> bool {
        self.bucket.as_ref().is_none_or(Bucket::is_valid)
            && self.penalty.as_deref().is_none_or(Penalty::is_valid)
            && self
                .leases
                .as_deref()
                .is_none_or(|l| l.is_valid() && !l.is_empty())
            && self.window.as_deref().is_none_or(WindowState::is_valid)
            && self.quota.as_ref().is_none_or(QuotaState::is_valid)
    }

    /// The penalty state, or an empty one.
    pub fn penalty_or_default(&self) -> Penalty {
        self.penalty.as_deref().copied().unwrap_or_default()
    }

    /// Store `penalty`, dropping it when nothing in it is live at `now`.
    pub fn set_penalty(&mut self, mut penalty: Penalty, now: Millis) {
        match (self.penalty.as_deref_mut(), penalty.prune(now)) {
            (Some(slot), true) => *slot = penalty,
            (_, live) => self.penalty = live.then(|| Box::new(penalty)),
        }
    }

    /// Drop the parts that no longer matter at `now`, and say how long the
    /// rest must be kept.
    pub fn prune(&mut self, now: Millis) -> Retention {
        let mut until: Option<Millis> = None;
        if let Some(b) = &self.bucket {
            if b.full_at_ms() > now {
                until = Some(b.full_at_ms());
            } else {
                self.bucket = None;
            }
        }
        if let Some(p) = self.penalty.as_deref_mut() {
            let keep = p.retain_until(now);
            if p.prune(now) {
                until = until.max(keep);
            } else {
                self.penalty = None;
            }
        }
        if let Some(window) = self.window.as_deref() {
            match window.counts_until(now) {
                Some(last) => until = until.max(Some(last.min(MANUAL - 1))),
                None => self.window = None,
            }
        }
        if let Some(quota) = &self.quota {
            match quota.counts_until(now) {
                Some(end) => until = until.max(Some(end.min(MANUAL - 1))),
                None => self.quota = None,
            }
        }
        if let Some(leases) = self.leases.as_deref_mut() {
            leases.sweep(now);
            match leases.last_deadline(now) {
                Some(deadline) => until = until.max(Some(deadline)),
                None => self.leases = None,
            }
        }
        match until {
            None => Retention::Delete,
            Some(MANUAL) => Retention::Forever,
            Some(t) => Retention::Until(t),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::bucket::{charge, Rate};

    const NOW: Millis = 1_700_000_000_000;

    #[test]
    fn retention_follows_the_longest_part() {
        let rate = Rate {
            capacity: 10,
            tokens: 10,
            period_ms: 1000,
        };
        let mut r = Record {
            bucket: Some(charge(0, 5, &rate, NOW).0),
            ..Record::default()
        };
        assert_eq!(r.prune(NOW), Retention::Until(NOW + 500));
        let mut p = Penalty::default();
        p.trip(1, 60_000, NOW);
        r.set_penalty(p, NOW);
        assert_eq!(r.prune(NOW), Retention::Until(NOW + 86_400_000));
        p.trip(3, 0, NOW);
        r.set_penalty(p, NOW);
        assert_eq!(r.prune(NOW), Retention::Forever);
        assert_ne!(r.prune(NOW + 1000), Retention::Delete);
        let mut empty = Record {
            bucket: Some(charge(0, 5, &rate, NOW).0),
            ..Record::default()
        };
        assert_eq!(empty.prune(NOW + 500), Retention::Delete);
        let mut leased = Record::default();
        let mut leases = Leases::new();
        leases.acquire(b"job", 1, 30_000, NOW);
        leased.leases = Some(Box::new(leases));
        assert_eq!(leased.prune(NOW), Retention::Until(NOW + 30_000));
        assert_eq!(leased.prune(NOW + 30_000), Retention::Delete);
        assert_eq!(leased, Record::default());
        assert_eq!(empty, Record::default());
    }
}
