//! What a lease set remembers of its change since it was last committed,
//! so that a call that granted, refreshed, renewed or released one lease
//! replicates that lease ([`LeaseChange`]) rather than the whole set.
//!
//! Every changing call first sweeps the leases expired at its `now` (see
//! the module docs of [`super`]); a replica redoes that sweep when it
//! prunes the record at the master's `now`, so the one lease set or
//! removed is all the replica needs besides.

use serde::de::{self, SeqAccess, Visitor};
use serde::ser::SerializeTuple;
use serde::{Deserialize, Deserializer, Serialize, Serializer};

use super::codec::{IdBuf, IdRef};
use super::{valid_id, Leases, MAX_DEADLINE, MAX_LEASES_USIZE};
use crate::core::time::Millis;

/// One lease as a call left it: `id` holds a lease until `deadline`, or
/// (`None`) holds none. Encoded as the array `[id (bin), deadline | nil]`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LeaseChange {
    /// The lease id (1 to `MAX_LEASE_ID_LEN` bytes).
    pub id: Box<[u8]>,
    /// Its deadline (absolute ms), or `None`: released.
    pub deadline: Option<Millis>,
}

/// How a lease set changed since it was last committed (bookkeeping, not
/// state: sets that differ only in it are equal).
#[derive(Clone, Debug, Default)]
pub(super) enum LeaseEdit {
    /// New or loaded: a replica needs all of it.
    #[default]
    Whole,
    /// As committed (expired leases aside, which a sweep at the same
    /// `now` removes on the replica too).
    Unchanged,
    /// As committed, swept, then this one lease set or removed.
    One(LeaseChange),
    /// Changed in more ways than one lease.
    Many,
}

impl LeaseEdit {
    /// The edit after `id` was also set to `deadline` (or removed).
    pub(super) fn then(self, id: &[u8], deadline: Option<Millis>) -> LeaseEdit {
        match self {
            LeaseEdit::Unchanged => LeaseEdit::One(LeaseChange {
                id: id.into(),
                deadline,
            }),
            LeaseEdit::One(mut change) if *change.id == *id => {
                change.deadline = deadline;
                LeaseEdit::One(change)
            }
            LeaseEdit::Whole => LeaseEdit::Whole,
            _ => LeaseEdit::Many,
        }
    }
}

impl Leases {
    /// The one lease changed since the last commit, when that is all that
    /// changed.
    pub fn change(&self) -> Option<&LeaseChange> {
        match &self.edit {
            LeaseEdit::One(change) => Some(change),
            _ => None,
        }
    }

    /// The set is now as committed (and replicated).
    pub fn mark_committed(&mut self) {
        self.edit = LeaseEdit::Unchanged;
    }

    /// Redo a [`LeaseChange`] on the committed set (the replica's side;
    /// the sweep comes with the record's pruning). A new lease beyond
    /// [`MAX_LEASES_USIZE`] is not added: a master's own set never holds
    /// more, so only a stream no master wrote (a forged or corrupted one)
    /// asks it, and the set stays one that loads.
    pub fn replay(&mut self, change: &LeaseChange) {
        self.remove(&change.id);
        if let Some(deadline) = change.deadline {
            if self.len() < MAX_LEASES_USIZE {
                self.insert(&change.id, deadline);
            }
        }
    }
}

impl LeaseChange {
    /// Whether a legal call could have made it: a valid id and a deadline
    /// at most [`MAX_DEADLINE`].
    pub fn is_valid(&self) -> bool {
        valid_id(&self.id) && self.deadline.is_none_or(|d| d <= MAX_DEADLINE)
    }
}

impl Serialize for LeaseChange {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let mut pair = serializer.serialize_tuple(2)?;
        pair.serialize_element(&IdRef(&self.id))?;
        pair.serialize_element(&self.deadline)?;
        pair.end()
    }
}

impl<'de> Deserialize<'de> for LeaseChange {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct ChangeVisitor;
        impl<'de> Visitor<'de> for ChangeVisitor {
            type Value = LeaseChange;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("a lease id and its deadline or nil")
            }
            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<LeaseChange, A::Error> {
                let missing = || de::Error::custom("a lease change of two fields");
                let IdBuf(id) = seq.next_element()?.ok_or_else(missing)?;
                let deadline = seq.next_element()?.ok_or_else(missing)?;
                if seq.next_element::<de::IgnoredAny>()?.is_some() {
                    return Err(de::Error::custom("a lease change of two fields"));
                }
                Ok(LeaseChange { id, deadline })
            }
        }
        deserializer.deserialize_tuple(2, ChangeVisitor)
    }
}
