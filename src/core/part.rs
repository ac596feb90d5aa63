//! What every part of a key's [`Record`](super::record::Record) declares:
//! its validity (checked on every load), its retention (what a write
//! keeps, and for how long) and its memory. The parts themselves, and the
//! order in which they are encoded, are listed once, in
//! [`super::record`].

use super::time::Millis;

/// One kind of state a key may hold (a bucket, a window, a penalty...).
/// Its encoding is its serde form.
pub trait Part {
    /// Whether the part satisfies its invariants: a decoded part that does
    /// not is refused with the whole payload.
    fn is_valid(&self) -> bool;

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
}

/// A part kept behind a pointer (so a record that lacks it stays small).
impl<T: Part> Part for Box<T> {
    fn is_valid(&self) -> bool {
        (**self).is_valid()
    }

    fn retain(&mut self, now: Millis) -> Option<Millis> {
        (**self).retain(now)
    }

    fn heap_bytes(&self, allocated: &dyn Fn(*const u8) -> usize) -> usize {
        let inner: &T = self;
        allocated(std::ptr::from_ref(inner).cast()) + inner.heap_bytes(allocated)
    }
}
