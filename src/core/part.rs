//! What every part of a key's [`Record`](super::record::Record) declares:
//! its validity (checked on every load), its retention (what a write
//! keeps, and for how long) and its memory. The parts themselves, and the
//! order in which they are encoded, are listed once, in
//! [`super::record`].

use super::limits::MAX_DURATION_MS;
use super::time::{after, Millis};

/// How far ahead of the server's clock a stored deadline may lie: twice the
/// longest duration a call accepts (a bucket's debt can add a `DELAY` to a
/// refill, each up to 100 years); about 6.3 * 10^12 ms, far below 2^53.
pub const MAX_AHEAD_MS: u64 = 2 * MAX_DURATION_MS;

/// The largest counter a stored state may hold (2^53: exact as a double,
/// as every integer a client reads should be).
pub const MAX_COUNT: u64 = 1 << 53;

/// Whether `deadline` lies at most [`MAX_AHEAD_MS`] after `now`.
pub fn within_reach(deadline: Millis, now: Millis) -> bool {
    deadline <= after(now, MAX_AHEAD_MS)
}

/// One kind of state a key may hold (a bucket, a window, a penalty...).
/// Its encoding is its serde form.
pub trait Part {
    /// Whether the part satisfies its invariants: a decoded part that does
    /// not is refused with the whole payload.
    fn is_valid(&self) -> bool;

    /// Whether the part is one a legal call could have written by `now`:
    /// no deadline beyond [`MAX_AHEAD_MS`] from `now` (so every duration
    /// in a reply stays below 2^53 ms), no counter beyond what a call can
    /// write. A loaded state (RDB, `RESTORE`, replication) that is not is
    /// refused as bad data.
    fn is_plausible(&self, _now: Millis) -> bool {
        true
    }

    /// The first payload version that can hold this value of the part (a
    /// field added later): a payload of an older version holding it is
    /// refused.
    fn since_version(&self) -> u8 {
        1
    }

    /// Drop what no longer matters at `now`, and say until when the part
    /// must be kept: the last instant it still matters
    /// ([`MANUAL`](super::penalty::MANUAL): without end), or `None` when
    /// nothing is left and the part goes.
    fn retain(&mut self, now: Millis) -> Option<Millis>;

    /// Bytes the part holds on the heap beyond its own size; `allocated`
    /// gives the allocator's size of the allocation at an address.
    fn heap_bytes(&self, _allocated: &dyn Fn(*const u8) -> usize) -> usize {
        0
    }

    /// The part is now as committed and replicated: forget whatever it
    /// tracks of its changes since (an exact log's [`LogEdit`]).
    ///
    /// [`LogEdit`]: super::window::LogEdit
    fn mark_committed(&mut self) {}
}

/// A part kept behind a pointer (so a record that lacks it stays small).
impl<T: Part> Part for Box<T> {
    fn is_valid(&self) -> bool {
        (**self).is_valid()
    }

    fn since_version(&self) -> u8 {
        (**self).since_version()
    }

    fn is_plausible(&self, now: Millis) -> bool {
        (**self).is_plausible(now)
    }

    fn retain(&mut self, now: Millis) -> Option<Millis> {
        (**self).retain(now)
    }

    fn heap_bytes(&self, allocated: &dyn Fn(*const u8) -> usize) -> usize {
        let inner: &T = self;
        allocated(std::ptr::from_ref(inner).cast()) + inner.heap_bytes(allocated)
    }

    fn mark_committed(&mut self) {
        T::mark_committed(self);
    }
}

/// A set of parts of a [`Record`](super::record::Record), by their position in encoding order.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PartMask(u32);

impl PartMask {
    /// No part.
    pub const NONE: PartMask = PartMask(0);

    /// Whether the set is empty.
    pub fn is_empty(self) -> bool {
        self.0 == 0
    }

    /// Whether the part at `index` is in the set.
    pub(crate) fn contains(self, index: u32) -> bool {
        index < 32 && self.0 & (1 << index) != 0
    }

    pub(crate) fn insert(&mut self, index: u32) {
        if index < 32 {
            self.0 |= 1 << index;
        }
    }

    /// The mask of these bits (bit `i`: the `i`-th part in encoding order).
    pub fn from_bits(bits: u32) -> PartMask {
        PartMask(bits)
    }

    /// The mask's bits (bit `i`: the `i`-th part in encoding order).
    pub fn bits(self) -> u32 {
        self.0
    }
}
