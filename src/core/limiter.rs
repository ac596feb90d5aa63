//! What every kind of limiter (a token bucket, a sliding window...)
//! provides to the shared decision, [`crate::core::take::decide`]: how one
//! key's stored state answers a request of `cost` points at `now`.

use super::quota::Period;
use super::record::Record;
use super::time::Millis;

/// Why a key's stored record cannot take a call of a limiter: it counts
/// the same quota another way.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Conflict {
    /// A plain call on a key holding regional components.
    Regional,
    /// A regional call (or merge) on a key holding a plain count.
    Plain,
    /// A regional call (or merge) naming another period kind than the
    /// key's live one (this one).
    Period(Period),
}

/// The parameters of one key in a call (a bucket's rate, a window's limit
/// and length), which know how to read and charge that key's state.
pub trait Limiter {
    /// What one key stores.
    type State: Clone;
    /// What the decision needs to know of one key at `now`, computed once
    /// per call by [`Limiter::see`].
    type Seen: Copy + Default;

    /// Whether a call must ask [`Limiter::conflict`] about each key's
    /// record before deciding (false: it never conflicts, and the call
    /// does not look).
    const CHECKS_RECORD: bool = false;

    /// The keyspace event a call announces on each key whose state it
    /// changed, if any.
    const CHANGE_EVENT: Option<&'static std::ffi::CStr> = None;

    /// Whether the expiry a call gives the key usually stays where the
    /// previous call set it (the end of a period or of a sub-window, not a
    /// time that moves with every call): the adapter then sets it only
    /// when it moved, knowing where it was from the record
    /// ([`Record::steady_until`](crate::core::record::Record::steady_until))
    /// or else by reading it (on Redis 7.4 a read costs about 60% of a
    /// write; on 7.0 about the same).
    fn steady_expiry(&self) -> bool {
        false
    }

    /// Whether `record` (a key of the call) holds a state this limiter
    /// must not count on: the call is then refused, nothing changed.
    fn conflict(&self, _record: &Record, _now: Millis) -> Option<Conflict> {
        None
    }

    /// The `limit` position of the reply when this key binds.
    fn limit(&self) -> u64;

    /// Read `state` (`None`: the key holds none yet) at `now`.
    fn see(&self, state: Option<&Self::State>, now: Millis) -> Self::Seen;

    /// Whether `cost` points fit now.
    fn fits(&self, seen: &Self::Seen, cost: u64) -> bool;

    /// Milliseconds until `cost` points fit in `state` (read as `seen`),
    /// exactly: at `now + wait` they fit, at `now + wait - 1` they do not
    /// (0 when they fit now).
    fn wait_ms(
        &self,
        state: Option<&Self::State>,
        seen: &Self::Seen,
        cost: u64,
        now: Millis,
    ) -> i64;

    /// Whole points still admissible now (never negative).
    fn remaining(&self, seen: &Self::Seen) -> i64 {
        self.balance(seen).max(0)
    }

    /// Whole points left now, negative by the excess when the state holds
    /// more than the limit admits (a `DEBT` or `DELAY` charge beyond it, a
    /// limit lowered below what was spent): the `remaining` of a reply.
    fn balance(&self, seen: &Self::Seen) -> i64;

    /// Milliseconds until `state` (as stored after the call, read as
    /// `seen`) holds nothing that limits: the bucket is full, the window is
    /// empty.
    fn reset_ms(&self, state: Option<&Self::State>, seen: &Self::Seen, now: Millis) -> i64;

    /// Take `cost` points at `now` from `state` (read as `seen`), in
    /// place (`None`: the key holds none yet), and say how it reads after.
    fn charge(
        &self,
        state: &mut Option<Self::State>,
        seen: &Self::Seen,
        cost: u64,
        now: Millis,
    ) -> Self::Seen;

    /// Give `points` back to `state` (read as `seen`) at `now`, never
    /// beyond empty (a full bucket, a window counting nothing), and say how
    /// it reads after.
    fn refund(
        &self,
        state: &mut Self::State,
        seen: &Self::Seen,
        points: u64,
        now: Millis,
    ) -> Self::Seen;

    /// Rewrite a throttled call's stored `state` when it no longer says
    /// what [`Limiter::see`] read from it (its parameters changed, or it
    /// was clamped); false when it needs no rewrite (and is unchanged).
    fn rewrite(&self, state: &mut Self::State, seen: &Self::Seen, now: Millis) -> bool;
}
