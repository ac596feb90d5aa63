//! What a member set remembers of its change since it was last committed,
//! so that a recording call replicates the member it saw and the members
//! it trimmed ([`DistinctChange`]) rather than the whole set, as an exact
//! log replicates its one entry and a lease set its one lease.
//!
//! A recording call first drops the members that left its window at its
//! `now`; a replica redoes that when it replays the change at the master's
//! `now` (the patch carries it), so the members sent are all it needs
//! besides. Replayed on the set the master held before the call, the
//! change gives the master's set, to the byte.

use serde::{Deserialize, Serialize};

use super::{cutoff, DistinctState};
use crate::core::limits::{MAX_DISTINCT_LIMIT, MAX_DURATION_MS};
use crate::core::part::within_reach;
use crate::core::time::Millis;

/// One recording call's effect on a member set: the window it counted with
/// (the members seen at or before `now - window_ms` dropped), the member
/// and the time it is now seen at, and the other members dropped to keep
/// `limit + 1`. Encoded as the array `[window_ms, member, seen,
/// [trimmed, ...]]`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct DistinctChange {
    /// The window of the call (ms).
    pub window_ms: u64,
    /// The member's hash.
    pub member: u64,
    /// When the member is now last seen.
    pub seen: Millis,
    /// The members dropped beyond `limit + 1`, oldest first.
    pub trimmed: Vec<u64>,
}

impl DistinctChange {
    /// Whether a received change is one a legal call could have made by
    /// `now`: a window in range, a sighting within reach, no more members
    /// trimmed than a set holds.
    pub fn is_plausible(&self, now: Millis) -> bool {
        (1..=MAX_DURATION_MS).contains(&self.window_ms)
            && self.seen >= 0
            && within_reach(self.seen, now)
            && self.trimmed.len() as u64 <= MAX_DISTINCT_LIMIT + 1
    }
}

/// How a member set changed since it was last committed (bookkeeping, not
/// state: sets that differ only in it are equal).
#[derive(Clone, Debug, Default)]
pub(super) enum DistinctEdit {
    /// New or loaded: a replica needs all of it.
    #[default]
    Whole,
    /// As committed.
    Unchanged,
    /// As committed, then this one call recorded.
    One(DistinctChange),
    /// Changed by more than one call.
    Many,
}

impl DistinctEdit {
    /// The edit after `change` too.
    pub(super) fn then(self, change: DistinctChange) -> DistinctEdit {
        match self {
            DistinctEdit::Unchanged => DistinctEdit::One(change),
            DistinctEdit::Whole => DistinctEdit::Whole,
            DistinctEdit::One(_) | DistinctEdit::Many => DistinctEdit::Many,
        }
    }
}

impl DistinctState {
    /// The one call recorded since the last commit, when that is all that
    /// changed.
    pub fn change(&self) -> Option<&DistinctChange> {
        match &self.edit {
            DistinctEdit::One(change) => Some(change),
            _ => None,
        }
    }

    /// The set is now as committed (and replicated).
    pub fn mark_committed(&mut self) {
        self.edit = DistinctEdit::Unchanged;
    }

    /// Redo a [`DistinctChange`] at the master's `now` on the committed set
    /// (the replica's side). The set keeps at most one member more than
    /// [`MAX_DISTINCT_LIMIT`], the oldest other than the one just seen
    /// going first: a master's own set never holds more (its trimmed
    /// members say which went), so only a stream no master wrote (a forged
    /// or corrupted one) makes this trim anything, and the set stays one
    /// that loads.
    pub fn replay(&mut self, change: &DistinctChange, now: Millis) {
        self.window_ms = change.window_ms;
        self.drop_through(cutoff(now, change.window_ms));
        self.insert(change.member, change.seen);
        for &hash in &change.trimmed {
            self.remove(hash);
        }
        while self.len() as u64 > MAX_DISTINCT_LIMIT + 1 {
            if self.remove_oldest_other_than(change.member).is_none() {
                break;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::part::Part;

    #[test]
    fn a_forged_stream_of_new_members_leaves_a_set_that_loads() {
        // Changes that each add a member and trim none, more than a set
        // may hold: no master sends them, and the replica's set stays one
        // that loads.
        let now: Millis = 1_700_000_000_000;
        let mut set = DistinctState::new(60_000);
        let extra = 20;
        for m in 0..MAX_DISTINCT_LIMIT + 1 + extra {
            let change = DistinctChange {
                window_ms: 60_000,
                member: m + 1,
                seen: now + m as Millis,
                trimmed: Vec::new(),
            };
            set.replay(&change, now + m as Millis);
        }
        assert_eq!(set.len() as u64, MAX_DISTINCT_LIMIT + 1);
        assert!(set.is_valid());
        let newest = MAX_DISTINCT_LIMIT + 1 + extra;
        assert!(set.seen(newest).is_some(), "the member just seen is kept");
        assert!(set.seen(1).is_none(), "the oldest went first");
    }
}
