//! The sliding log of an `EXACT` window, held so that a call's work does
//! not grow with the log: entries sorted by time, each with the running
//! total of points through it, in a ring buffer. The count of the entries
//! that still count is one subtraction, a wait is a binary search, and an
//! entry that stops counting leaves from the front in O(1).
//!
//! A log also remembers how it changed since it was last committed
//! ([`LogEdit`]): when the only change was points added at the call's own
//! millisecond, a replica that holds the committed log can redo exactly
//! that ([`Log::replay_charge`]), so the call replicates one entry, not the
//! whole log.

use std::collections::VecDeque;

use super::Entry;
use crate::core::limits::MAX_EXACT_LIMIT;
use crate::core::time::Millis;

/// One entry as held: its time and the running total of points through it
/// (wrapping arithmetic: the differences are exact while the log's total
/// fits a `u64`, which [`Log::is_valid`] checks and charging keeps).
#[derive(Clone, Copy, Debug)]
struct Stamp {
    at: Millis,
    through: u64,
}

/// How a log changed since it was last committed (bookkeeping, not state:
/// logs that differ only in it are equal).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum LogEdit {
    /// New, converted, refunded or loaded: a replica needs all of it.
    #[default]
    Whole,
    /// As committed.
    Unchanged,
    /// As committed, then its dead entries dropped and points added at
    /// this millisecond only ([`Log::charge_in_place`]).
    ChargedAt(Millis),
}

/// An exact log: entries strictly increasing in time, each of at least one
/// point (see the module docs).
#[derive(Clone, Debug, Default)]
pub struct Log {
    stamps: VecDeque<Stamp>,
    /// The running total before the first entry.
    base: u64,
    edit: LogEdit,
}

impl PartialEq for Log {
    fn eq(&self, other: &Log) -> bool {
        self.len() == other.len() && self.entries().eq(other.entries())
    }
}

impl Eq for Log {}

impl FromIterator<Entry> for Log {
    /// The entries as given, in order (valid or not: see [`Log::is_valid`]).
    fn from_iter<I: IntoIterator<Item = Entry>>(entries: I) -> Log {
        let mut log = Log::default();
        for e in entries {
            log.push_back(e);
        }
        log
    }
}

impl From<Vec<Entry>> for Log {
    /// The entries as given, in order (valid or not: see [`Log::is_valid`]).
    fn from(entries: Vec<Entry>) -> Log {
        entries.into_iter().collect()
    }
}

impl Log {
    /// How many entries.
    pub fn len(&self) -> usize {
        self.stamps.len()
    }

    /// Whether it holds no entry.
    pub fn is_empty(&self) -> bool {
        self.stamps.is_empty()
    }

    /// The entries in order.
    pub fn entries(&self) -> impl Iterator<Item = Entry> + '_ {
        let mut before = self.base;
        self.stamps.iter().map(move |s| {
            let cost = s.through.wrapping_sub(before);
            before = s.through;
            Entry { at: s.at, cost }
        })
    }

    /// The newest entry.
    pub fn last(&self) -> Option<Entry> {
        let last = self.stamps.back()?;
        Some(Entry {
            at: last.at,
            cost: last.through.wrapping_sub(self.before(self.len() - 1)),
        })
    }

    /// Time of the `i`-th entry.
    pub(super) fn at(&self, i: usize) -> Option<Millis> {
        self.stamps.get(i).map(|s| s.at)
    }

    /// Entries strictly increasing in time, each of at least one point, at
    /// most [`MAX_EXACT_LIMIT`] of them, their total within a `u64`.
    pub fn is_valid(&self) -> bool {
        let mut total = 0u64;
        let mut prev: Option<Millis> = None;
        self.len() <= MAX_EXACT_LIMIT as usize
            && self.entries().all(|e| {
                let ok = e.cost >= 1 && prev.is_none_or(|p| p < e.at);
                prev = Some(e.at);
                match total.checked_add(e.cost) {
                    Some(t) if ok => {
                        total = t;
                        true
                    }
                    _ => false,
                }
            })
    }

    /// How it changed since it was last committed.
    pub fn edit(&self) -> LogEdit {
        self.edit
    }

    /// It is now as committed (and replicated).
    pub fn mark_committed(&mut self) {
        self.edit = LogEdit::Unchanged;
    }

    /// Heap bytes behind it (its buffer's capacity).
    pub fn heap_bytes(&self) -> usize {
        self.stamps.capacity() * std::mem::size_of::<Stamp>()
    }

    /// The running total before the `i`-th entry.
    fn before(&self, i: usize) -> u64 {
        match i.checked_sub(1).and_then(|j| self.stamps.get(j)) {
            Some(s) => s.through,
            None => self.base,
        }
    }

    /// The index of the first entry that still counts at `now` when each
    /// counts while `now < at + shift + w` (a suffix, as times increase).
    pub(super) fn first_live(&self, w: i128, shift: i128, now: Millis) -> usize {
        let now = i128::from(now);
        self.stamps
            .partition_point(|s| i128::from(s.at) + shift + w <= now)
    }

    /// Points of the entries from the `from`-th on.
    pub(super) fn total_from(&self, from: usize) -> u64 {
        match self.stamps.back() {
            Some(last) if from < self.len() => last.through.wrapping_sub(self.before(from)),
            _ => 0,
        }
    }

    /// The first index `j >= from` such that the entries `from..=j` hold at
    /// least `points`; `None` when all of them hold fewer.
    pub(super) fn first_reaching(&self, from: usize, points: u64) -> Option<usize> {
        let start = self.before(from);
        let (mut lo, mut hi) = (from, self.len());
        while lo < hi {
            let mid = lo + (hi - lo) / 2;
            let held = self.stamps.get(mid)?.through.wrapping_sub(start);
            if held >= points {
                hi = mid;
            } else {
                lo = mid + 1;
            }
        }
        (lo < self.len()).then_some(lo)
    }

    /// Append an entry after the last one (no check of its order).
    pub(super) fn push_back(&mut self, e: Entry) {
        let through = self.before(self.len()).wrapping_add(e.cost);
        self.stamps.push_back(Stamp { at: e.at, through });
    }

    /// Add `cost` points admitted at `now` (merged with an entry of the
    /// same millisecond), then merge the oldest entries into the next one
    /// while it is longer than [`MAX_EXACT_LIMIT`] (the merged points count
    /// longer, never shorter). The log's total stays within a `u64`. A
    /// replica then needs the whole log ([`Log::charge_in_place`] says
    /// otherwise when it can).
    pub(super) fn add(&mut self, now: Millis, cost: u64) {
        self.edit = LogEdit::Whole;
        let room = u64::MAX - self.total_from(0);
        let cost = cost.min(room);
        if cost == 0 {
            return;
        }
        let i = self.stamps.partition_point(|s| s.at < now);
        let exists = self.stamps.get(i).is_some_and(|s| s.at == now);
        if !exists {
            let through = self.before(i);
            self.stamps.insert(i, Stamp { at: now, through });
        }
        // Only the entries from `now` on change (one unless the clock went
        // back).
        for s in self.stamps.range_mut(i..) {
            s.through = s.through.wrapping_add(cost);
        }
        while self.len() > MAX_EXACT_LIMIT as usize {
            // The next entry's running total already holds these points.
            self.stamps.pop_front();
        }
    }

    /// Drop the entries that count no more at `now` for a window of `w`.
    fn drop_dead(&mut self, w: i128, now: Millis) {
        while let Some(&front) = self.stamps.front() {
            if i128::from(front.at) + w > i128::from(now) {
                break;
            }
            self.base = front.through;
            self.stamps.pop_front();
        }
    }

    /// A charge of a log of the call's own window length: drop its dead
    /// entries and add `cost` points at `now`, in place.
    pub fn charge_in_place(&mut self, w: i128, now: Millis, cost: u64) {
        let before = self.edit;
        self.drop_dead(w, now);
        self.add(now, cost);
        self.edit = match before {
            LogEdit::Unchanged => LogEdit::ChargedAt(now),
            LogEdit::ChargedAt(t) if t == now => LogEdit::ChargedAt(now),
            _ => LogEdit::Whole,
        };
    }

    /// The points of the entry at `now` (0 when there is none).
    pub fn cost_at(&self, now: Millis) -> u64 {
        let i = self.stamps.partition_point(|s| s.at < now);
        match self.stamps.get(i) {
            Some(s) if s.at == now => s.through.wrapping_sub(self.before(i)),
            _ => 0,
        }
    }

    /// Redo, on the committed log, what [`Log::charge_in_place`] at `now`
    /// did on the master's copy, given the entry at `now` it ended with:
    /// drop the dead entries, then make the entry at `now` hold `cost`.
    pub fn replay_charge(&mut self, w: i128, now: Millis, cost: u64) {
        self.drop_dead(w, now);
        let held = self.cost_at(now);
        self.add(now, cost.saturating_sub(held));
    }

    /// Take up to `points` off the newest entries (an entry left with none
    /// goes); returns the points taken.
    pub(super) fn take_newest(&mut self, points: u64) -> u64 {
        let mut left = points;
        while left > 0 {
            let Some(last) = self.last() else { break };
            let taken = left.min(last.cost);
            left -= taken;
            if taken == last.cost {
                self.stamps.pop_back();
            } else if let Some(s) = self.stamps.back_mut() {
                s.through = s.through.wrapping_sub(taken);
            }
        }
        self.edit = LogEdit::Whole;
        points - left
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const T0: Millis = 1_700_000_000_000;

    fn entries(log: &Log) -> Vec<(Millis, u64)> {
        log.entries().map(|e| (e.at, e.cost)).collect()
    }

    #[test]
    fn totals_and_searches_follow_the_running_sums() {
        let mut log = Log::default();
        for (dt, cost) in [(0, 2), (5, 1), (5, 3), (9, 4)] {
            log.add(T0 + dt, cost);
        }
        assert_eq!(entries(&log), [(T0, 2), (T0 + 5, 4), (T0 + 9, 4)]);
        assert_eq!(log.total_from(0), 10);
        assert_eq!(log.total_from(1), 8);
        assert_eq!(log.total_from(3), 0);
        assert_eq!(log.first_reaching(0, 2), Some(0));
        assert_eq!(log.first_reaching(0, 3), Some(1));
        assert_eq!(log.first_reaching(1, 8), Some(2));
        assert_eq!(log.first_reaching(1, 9), None);
        assert_eq!(log.first_live(10, 0, T0 + 10), 1);
        assert_eq!(log.cost_at(T0 + 5), 4);
        assert_eq!(log.cost_at(T0 + 6), 0);
    }

    #[test]
    fn a_step_back_of_the_clock_inserts_in_order() {
        let mut log = Log::from(vec![
            Entry { at: T0, cost: 1 },
            Entry {
                at: T0 + 9,
                cost: 1,
            },
        ]);
        log.add(T0 + 4, 2);
        log.add(T0 + 9, 1);
        assert_eq!(entries(&log), [(T0, 1), (T0 + 4, 2), (T0 + 9, 2)]);
        assert!(log.is_valid());
    }

    #[test]
    fn the_oldest_entries_merge_into_the_next_past_the_cap() {
        let cap = MAX_EXACT_LIMIT as i64;
        let mut log = Log::default();
        for i in 0..cap + 2 {
            log.add(T0 + i, 1);
        }
        assert_eq!(log.len(), cap as usize);
        assert_eq!(
            log.entries().next(),
            Some(Entry {
                at: T0 + 2,
                cost: 3
            })
        );
        assert_eq!(log.total_from(0), cap as u64 + 2);
    }

    #[test]
    fn a_replayed_charge_gives_the_masters_log() {
        let start = Log::from(vec![
            Entry { at: T0, cost: 1 },
            Entry {
                at: T0 + 50,
                cost: 2,
            },
            Entry {
                at: T0 + 120,
                cost: 1,
            },
        ]);
        for now in [T0 + 120, T0 + 130, T0 + 100, T0 + 160] {
            let mut master = start.clone();
            master.mark_committed();
            master.charge_in_place(100, now, 3);
            master.charge_in_place(100, now, 1);
            assert_eq!(master.edit(), LogEdit::ChargedAt(now));
            let mut replica = start.clone();
            replica.replay_charge(100, now, master.cost_at(now));
            assert_eq!(replica, master, "at {now}");
        }
    }

    #[test]
    fn refunds_come_off_the_newest_entries() {
        let mut log = Log::from(vec![
            Entry { at: T0, cost: 2 },
            Entry {
                at: T0 + 1,
                cost: 2,
            },
        ]);
        log.mark_committed();
        assert_eq!(log.take_newest(3), 3);
        assert_eq!(entries(&log), [(T0, 1)]);
        assert_eq!(log.edit(), LogEdit::Whole);
        assert_eq!(log.take_newest(5), 1);
        assert!(log.is_empty());
    }

    #[test]
    fn invalid_logs_are_named() {
        let bad = |v: Vec<(Millis, u64)>| {
            !Log::from(
                v.into_iter()
                    .map(|(at, cost)| Entry { at, cost })
                    .collect::<Vec<_>>(),
            )
            .is_valid()
        };
        assert!(bad(vec![(T0, 1), (T0, 1)]));
        assert!(bad(vec![(T0, 0)]));
        assert!(bad(vec![(T0, u64::MAX), (T0 + 1, 1)]));
        assert!(!bad(vec![(T0, u64::MAX)]));
    }
}
