//! What one RL key holds: each part is present only while it matters.

use serde::ser::SerializeStruct;
use serde::{Deserialize, Deserializer, Serialize, Serializer};

use super::bucket::{Bucket, Rate};
use super::lease::Leases;
use super::limiter::Limiter;
use super::penalty::{Penalty, MANUAL};
use super::quota::{Quota, QuotaState};
use super::time::Millis;
use super::window::{Window, WindowState};

/// The value of one key of the module type. Small for the common keys:
/// the bucket lives inline, the penalty state and the parts of the other
/// commands each behind one pointer that is null while they hold nothing
/// (a bucket-only key is one 48-byte allocation).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Record {
    /// The `RL.TAKE` bucket.
    pub bucket: Option<Bucket>,
    /// Strikes, offenses and box.
    pub penalty: Option<Box<Penalty>>,
    /// The window, quota and leases; `None` when all three are (never an
    /// allocation holding nothing).
    others: Option<Box<Others>>,
}

/// The parts of a [`Record`] that only some keys hold.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
struct Others {
    /// The `RL.WINDOW` window. Since encoding version 3.
    window: Option<WindowState>,
    /// The `RL.QUOTA` count. Since encoding version 4.
    quota: Option<QuotaState>,
    /// The `RL.LEASE` leases (never an empty set: `None` then). Since
    /// encoding version 2.
    leases: Option<Box<Leases>>,
}

impl Others {
    fn is_empty(&self) -> bool {
        self.window.is_none() && self.quota.is_none() && self.leases.is_none()
    }
}

/// The fields of a [`Record`] as they are encoded, in order: each version
/// of the codec appends fields, and a payload of an older version decodes
/// with the missing ones empty.
#[derive(Deserialize)]
struct EncodedRecord {
    bucket: Option<Bucket>,
    penalty: Option<Box<Penalty>>,
    #[serde(default)]
    leases: Option<Box<Leases>>,
    #[serde(default)]
    window: Option<WindowState>,
    #[serde(default)]
    quota: Option<QuotaState>,
}

impl Serialize for Record {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let mut fields = serializer.serialize_struct("Record", 5)?;
        fields.serialize_field("bucket", &self.bucket)?;
        fields.serialize_field("penalty", &self.penalty)?;
        fields.serialize_field("leases", &self.leases())?;
        fields.serialize_field("window", &self.window())?;
        fields.serialize_field("quota", &self.quota())?;
        fields.end()
    }
}

impl<'de> Deserialize<'de> for Record {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let e = EncodedRecord::deserialize(deserializer)?;
        let mut record = Record {
            bucket: e.bucket,
            penalty: e.penalty,
            others: None,
        };
        record.set_window(e.window);
        record.set_quota(e.quota);
        record.set_leases(e.leases);
        Ok(record)
    }
}

impl Record {
    /// A record holding only `bucket`.
    pub fn with_bucket(bucket: Bucket) -> Record {
        Record {
            bucket: Some(bucket),
            ..Record::default()
        }
    }

    /// The `RL.WINDOW` window.
    pub fn window(&self) -> Option<&WindowState> {
        self.others.as_ref()?.window.as_ref()
    }

    /// The `RL.QUOTA` count.
    pub fn quota(&self) -> Option<&QuotaState> {
        self.others.as_ref()?.quota.as_ref()
    }

    /// The `RL.LEASE` leases (never an empty set).
    pub fn leases(&self) -> Option<&Leases> {
        self.others.as_ref()?.leases.as_deref()
    }

    /// Replace the window.
    pub fn set_window(&mut self, window: Option<WindowState>) {
        match (self.others.as_deref_mut(), window) {
            (
                Some(Others {
                    window: Some(slot), ..
                }),
                Some(w),
            ) => *slot = w,
            (_, w) => self.edit_others(|o| o.window = w),
        }
    }

    /// Replace the quota count.
    pub fn set_quota(&mut self, quota: Option<QuotaState>) {
        self.edit_others(|o| o.quota = quota);
    }

    /// Replace the leases (an empty set is stored as none).
    pub fn set_leases(&mut self, leases: Option<Box<Leases>>) {
        let leases = leases.filter(|l| !l.is_empty());
        self.edit_others(|o| o.leases = leases);
    }

    /// The leases to change in place, an empty set first when there are
    /// none: put it back with [`Record::set_leases`] or [`Record::prune`]
    /// if it may have stayed empty.
    pub fn leases_or_insert(&mut self) -> &mut Leases {
        let others = self.others.get_or_insert_with(Box::default);
        others.leases.get_or_insert_with(Box::default)
    }

    /// Take the window out, leaving a placeholder in its place (the
    /// allocation kept for it to come back to with [`Record::set_window`]).
    fn take_window(&mut self) -> Option<WindowState> {
        self.others
            .as_deref_mut()?
            .window
            .as_mut()
            .map(std::mem::take)
    }

    /// Change the other parts, then drop their allocation if it holds
    /// nothing.
    fn edit_others(&mut self, change: impl FnOnce(&mut Others)) {
        match self.others.as_deref_mut() {
            Some(others) => change(others),
            None => {
                let mut others = Others::default();
                change(&mut others);
                if others.is_empty() {
                    return;
                }
                self.others = Some(Box::new(others));
            }
        }
        if self.others.as_deref().is_some_and(Others::is_empty) {
            self.others = None;
        }
    }

    /// Bytes this record holds on the heap beyond the record itself.
    /// `allocated` gives the allocator's size of the allocation at an
    /// address (its size class, not the size asked for); the nested
    /// collections (a lease set's tree nodes, a window log) are counted by
    /// what they hold.
    pub fn heap_bytes(&self, allocated: impl Fn(*const u8) -> usize) -> usize {
        fn address<T>(value: &T) -> *const u8 {
            std::ptr::from_ref(value).cast()
        }
        let penalty = self.penalty.as_deref().map_or(0, |p| allocated(address(p)));
        let others = self.others.as_deref().map_or(0, |o| {
            allocated(address(o))
                + o.window.as_ref().map_or(0, WindowState::heap_bytes)
                + o.leases
                    .as_deref()
                    .map_or(0, |l| allocated(address(l)) + l.heap_bytes())
        });
        penalty + others
    }
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
        record.window()
    }

    fn take(record: &mut Record) -> Option<WindowState> {
        record.take_window()
    }

    fn write(record: &mut Record, state: Option<WindowState>) {
        record.set_window(state);
    }
}

impl InRecord for Quota {
    fn read(record: &Record) -> Option<&QuotaState> {
        record.quota()
    }

    fn take(record: &mut Record) -> Option<QuotaState> {
        // Copied, not taken: taking could empty the other parts.
        record.quota().copied()
    }

    fn write(record: &mut Record, state: Option<QuotaState>) {
        record.set_quota(state);
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
            && self.others.as_deref().is_none_or(|o| !o.is_empty())
            && self.leases().is_none_or(|l| l.is_valid() && !l.is_empty())
            && self.window().is_none_or(WindowState::is_valid)
            && self.quota().is_none_or(QuotaState::is_valid)
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
        if let Some(others) = self.others.as_deref_mut() {
            if let Some(window) = &others.window {
                match window.counts_until(now) {
                    Some(last) => until = until.max(Some(last.min(MANUAL - 1))),
                    None => others.window = None,
                }
            }
            if let Some(quota) = &others.quota {
                match quota.counts_until(now) {
                    Some(end) => until = until.max(Some(end.min(MANUAL - 1))),
                    None => others.quota = None,
                }
            }
            if let Some(leases) = others.leases.as_deref_mut() {
                leases.sweep(now);
                match leases.last_deadline(now) {
                    Some(deadline) => until = until.max(Some(deadline)),
                    None => others.leases = None,
                }
            }
            if others.is_empty() {
                self.others = None;
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
        leased.set_leases(Some(Box::new(leases)));
        assert_eq!(leased.prune(NOW), Retention::Until(NOW + 30_000));
        assert_eq!(leased.prune(NOW + 30_000), Retention::Delete);
        assert_eq!(leased, Record::default());
        assert_eq!(empty, Record::default());
    }

    #[test]
    fn heap_bytes_counts_each_allocation_once() {
        let class = |_: *const u8| 64;
        let rate = Rate {
            capacity: 10,
            tokens: 10,
            period_ms: 1000,
        };
        let mut r = Record::with_bucket(charge(0, 5, &rate, NOW).0);
        assert_eq!(r.heap_bytes(class), 0, "the bucket is inline");
        r.set_penalty(
            Penalty {
                strikes: 1,
                strikes_until: NOW + 1,
                ..Penalty::default()
            },
            NOW,
        );
        assert_eq!(r.heap_bytes(class), 64);
        r.set_quota(Some(QuotaState {
            end: NOW + 1,
            count: 1,
        }));
        assert_eq!(r.heap_bytes(class), 128, "penalty + the other parts");
        let mut leases = Leases::new();
        leases.acquire(b"job", 1, 30_000, NOW);
        let lease_heap = leases.heap_bytes();
        r.set_leases(Some(Box::new(leases)));
        assert_eq!(r.heap_bytes(class), 192 + lease_heap);
        r.set_quota(None);
        r.set_leases(None);
        assert_eq!(r.heap_bytes(class), 64, "no empty allocation is kept");
    }
}
