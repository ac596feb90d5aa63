//! Concurrency leases (`RL.LEASE`): at most `max` holders of a key at once,
//! each holding a slot until it releases it or its ttl passes, so a crashed
//! worker cannot leak a slot.
//!
//! A lease is an id and an absolute deadline in server milliseconds
//! (exclusive): it is *live* while `now < deadline`. Deadlines are absolute,
//! so a value means the same thing on a master, a replica and after an AOF
//! replay, and a backward clock step can only make more leases count, never
//! fewer: it cannot free a slot.
//!
//! [`Leases`] keeps the leases of one key twice: by id (the stored form, and
//! the order of `LIST`) and by `(deadline, id)` (an index rebuilt when
//! decoding), so every operation is `O(log n)` plus the expired leases it
//! removes, each of which is removed once.
//!
//! Every call that changes something (a grant or refresh, a release or
//! renew of a live lease) first removes the leases expired at `now`, so the
//! value to store after it holds live leases only. A call that changes
//! nothing (a denial, a release or renew of a lease that is not live) leaves
//! the value untouched, expired leases included, so the caller can skip the
//! write. Sweeping before every grant is also what keeps the number of
//! stored leases at most `max`: an expired lease left behind would count
//! again after a backward clock step.

use std::collections::{BTreeMap, BTreeSet};

mod change;
mod codec;

pub use change::LeaseChange;
use change::LeaseEdit;

use crate::core::limits::{MAX_LEASES, MAX_LEASE_ID_LEN};
use crate::core::part::{within_reach, Part};
use crate::core::time::{after, Millis};

/// The latest deadline a lease can have: deadlines stay below `i64::MAX`.
pub const MAX_DEADLINE: Millis = i64::MAX - 1;

/// Length in bytes of an id made by [`format_id`].
pub const GENERATED_ID_LEN: usize = 32;

/// Bytes of memory one lease takes besides its id (twice): two B-tree
/// entries of a boxed id and a deadline, with node slack. An estimate for
/// `MEMORY USAGE`.
const ENTRY_OVERHEAD: usize = 96;

/// The live leases of one key: id -> deadline (absolute ms, exclusive).
///
/// Stored (serde) as a map from id (MessagePack `bin`) to deadline, in
/// increasing id order; decoding refuses any other order, duplicate ids,
/// empty or too long ids, more than [`MAX_LEASES`] entries and deadlines
/// above [`MAX_DEADLINE`], and rebuilds the deadline index.
#[derive(Clone, Debug, Default)]
pub struct Leases {
    /// Deadline of each lease, by id.
    by_id: BTreeMap<Box<[u8]>, Millis>,
    /// The same leases ordered by `(deadline, id)`.
    by_deadline: BTreeSet<(Millis, Box<[u8]>)>,
    /// How the set changed since it was last committed.
    edit: LeaseEdit,
}

/// Equal when they hold the same leases (the index follows; the edit is
/// bookkeeping).
impl PartialEq for Leases {
    fn eq(&self, other: &Leases) -> bool {
        self.by_id == other.by_id
    }
}

impl Eq for Leases {}

/// What [`Leases::acquire`] did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Acquire {
    /// A new lease (slot taken). `in_use` counts live leases after the call.
    Granted {
        /// Live leases after the call, this one included.
        in_use: u64,
    },
    /// `id` already held a live lease: its ttl was refreshed, no second slot
    /// (idempotent retry), even when the key is full.
    Refreshed {
        /// Live leases after the call.
        in_use: u64,
    },
    /// Full: nothing changed.
    Denied {
        /// Live leases (at least `max`).
        in_use: u64,
        /// Time until the earliest live lease expires (>= 1).
        retry_after_ms: i64,
    },
}

/// Whether `id` may name a lease: 1 to [`MAX_LEASE_ID_LEN`] bytes.
pub fn valid_id(id: &[u8]) -> bool {
    !id.is_empty() && id.len() <= MAX_LEASE_ID_LEN
}

/// The deadline of a lease taken or renewed at `now` for `ttl_ms` (at least
/// 1 ms): `now + ttl_ms`, saturating at [`MAX_DEADLINE`].
pub fn deadline_after(now: Millis, ttl_ms: u64) -> Millis {
    after(now, ttl_ms.max(1)).min(MAX_DEADLINE)
}

/// A new opaque lease id: [`GENERATED_ID_LEN`] lowercase hex digits, the
/// low 48 bits of `now` (ms, so it wraps after about 8,900 years) then 80
/// random bits (all of `random[0]`, the low 16 bits of `random[1]`).
///
/// No counter is involved: the caller draws `random` from a source seeded
/// by the OS in each process (std's `RandomState`), so a restarted or
/// promoted server draws fresh words, and replicas never generate ids (they
/// receive them in the replicated state). Two ids can only be equal when
/// made in the same millisecond with the same 80 random bits: for `k` ids
/// made in one millisecond the odds are about `k² / 2^81` (`4·10^-19` for
/// `k = 1000`). A collision only matters between live leases of one key,
/// which the caller can rule out with [`Leases::is_live`] and a redraw.
///
/// Ids made this way sort by creation time (to the millisecond), so `LIST`
/// shows generated leases oldest first.
pub fn format_id(random: [u64; 2], now: Millis) -> GeneratedId {
    let mut id = [0u8; GENERATED_ID_LEN];
    let (time, rest) = id.split_at_mut(12);
    let (high, low) = rest.split_at_mut(4);
    write_hex(time, now.cast_unsigned());
    write_hex(high, random[1]);
    write_hex(low, random[0]);
    GeneratedId(id)
}

/// Write the low `4 * out.len()` bits of `value` as lowercase hex digits.
fn write_hex(out: &mut [u8], mut value: u64) {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    for slot in out.iter_mut().rev() {
        *slot = DIGITS[(value & 0xf) as usize];
        value >>= 4;
    }
}

/// A lease id made by [`format_id`], held on the stack; reads as a `str`.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct GeneratedId([u8; GENERATED_ID_LEN]);

impl GeneratedId {
    /// The id's bytes (hex digits), without the UTF-8 check of reading it
    /// as a `str`.
    pub fn as_bytes(&self) -> &[u8] {
        &self.0
    }
}

impl std::ops::Deref for GeneratedId {
    type Target = str;

    fn deref(&self) -> &str {
        // Hex digits only, so always UTF-8.
        std::str::from_utf8(&self.0).unwrap_or_default()
    }
}

impl std::fmt::Debug for GeneratedId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        std::fmt::Debug::fmt(&**self, f)
    }
}

impl PartialEq<&str> for GeneratedId {
    fn eq(&self, other: &&str) -> bool {
        &**self == *other
    }
}

impl Leases {
    /// No leases.
    pub fn new() -> Self {
        Self::default()
    }

    /// Leases stored, live or expired but not yet swept.
    pub fn len(&self) -> usize {
        self.by_id.len()
    }

    /// Whether no lease is stored (the key can be deleted).
    pub fn is_empty(&self) -> bool {
        self.by_id.is_empty()
    }

    /// Live leases at `now` (a lease is live while `now < deadline`).
    ///
    /// `O(log n + min(live, expired))`: after any write there are no expired
    /// leases left, so this is `O(log n)` until the clock passes a deadline.
    pub fn in_use(&self, now: Millis) -> u64 {
        let (live, _) = self.split_counts(now);
        u64::try_from(live).unwrap_or(u64::MAX)
    }

    /// Stored leases that have expired at `now`: what the next successful
    /// [`acquire`](Self::acquire), [`release`](Self::release),
    /// [`renew`](Self::renew) or [`sweep`](Self::sweep) will remove (count
    /// them as expired when that call succeeds).
    pub fn expired(&self, now: Millis) -> u64 {
        let (_, expired) = self.split_counts(now);
        u64::try_from(expired).unwrap_or(u64::MAX)
    }

    /// Whether `id` holds a live lease at `now`.
    pub fn is_live(&self, id: &[u8], now: Millis) -> bool {
        self.by_id.get(id).is_some_and(|&deadline| now < deadline)
    }

    /// The deadline of `id` if it holds a live lease at `now` (what the
    /// tests read).
    #[cfg(test)]
    pub(crate) fn deadline_of(&self, id: &[u8], now: Millis) -> Option<Millis> {
        self.by_id
            .get(id)
            .copied()
            .filter(|&deadline| now < deadline)
    }

    /// Remove the leases expired at `now`; returns how many (for an INFO
    /// counter of expired leases). `O(k log n)` for `k` removed.
    pub fn sweep(&mut self, now: Millis) -> u64 {
        let mut removed = 0u64;
        while self
            .by_deadline
            .first()
            .is_some_and(|(deadline, _)| *deadline <= now)
        {
            if let Some((_, id)) = self.by_deadline.pop_first() {
                self.by_id.remove(&id);
                removed = removed.saturating_add(1);
            }
        }
        removed
    }

    /// Acquire `id` for `ttl_ms` (at least 1) when fewer than `max` leases
    /// are live; `max` is clamped into `1..=MAX_LEASES` (the caller rejects
    /// values outside it). Expired leases never count.
    ///
    /// When `id` holds a live lease its deadline becomes `now + ttl_ms` and
    /// no second slot is taken, even when the key is full. A denial leaves
    /// `self` unchanged (no sweep either), so the caller can skip the write;
    /// a grant or refresh first sweeps the leases expired at `now` (count
    /// them with [`expired`](Self::expired) before the call).
    ///
    /// `id` must satisfy [`valid_id`]; the caller rejects other ids.
    pub fn acquire(&mut self, id: &[u8], max: u64, ttl_ms: u64, now: Millis) -> Acquire {
        let max = max.clamp(1, MAX_LEASES);
        let deadline = deadline_after(now, ttl_ms);
        if self.is_live(id, now) {
            self.sweep(now);
            self.set_deadline(id, deadline);
            self.note(id, Some(deadline));
            return Acquire::Refreshed {
                in_use: self.in_use(now),
            };
        }
        let live = self.in_use(now);
        if live >= max {
            return Acquire::Denied {
                in_use: live,
                retry_after_ms: self.retry_after_ms(now),
            };
        }
        // Removes `id` too if it holds an expired lease.
        self.sweep(now);
        self.insert(id, deadline);
        self.note(id, Some(deadline));
        Acquire::Granted {
            in_use: self.in_use(now),
        }
    }

    /// Remove `id` if it is live at `now`, sweeping the expired leases;
    /// true when it was. False changes nothing.
    pub fn release(&mut self, id: &[u8], now: Millis) -> bool {
        if !self.is_live(id, now) {
            return false;
        }
        self.remove(id);
        self.sweep(now);
        self.note(id, None);
        true
    }

    /// Give a live `id` the new deadline `now + ttl_ms` (at least 1 ms),
    /// sweeping the expired leases; false (and no change) when it is not
    /// live. The new deadline may be earlier than the old one.
    pub fn renew(&mut self, id: &[u8], ttl_ms: u64, now: Millis) -> bool {
        if !self.is_live(id, now) {
            return false;
        }
        self.sweep(now);
        let deadline = deadline_after(now, ttl_ms);
        self.set_deadline(id, deadline);
        self.note(id, Some(deadline));
        true
    }

    /// Live leases with the ms left on each (>= 1), ordered by id (for
    /// `LIST`). `O(n)`.
    pub fn list(&self, now: Millis) -> impl Iterator<Item = (&[u8], i64)> + '_ {
        self.by_id
            .iter()
            .filter(move |(_, &deadline)| now < deadline)
            .map(move |(id, &deadline)| (&**id, deadline.saturating_sub(now)))
    }

    /// The latest deadline of a live lease (the key's expiry time), `None`
    /// when none is live. `O(log n)`.
    pub fn last_deadline(&self, now: Millis) -> Option<Millis> {
        self.by_deadline
            .last()
            .map(|(deadline, _)| *deadline)
            .filter(|&deadline| now < deadline)
    }

    /// Whether the data is consistent: at most [`MAX_LEASES`] leases, ids
    /// valid ([`valid_id`]), deadlines at most [`MAX_DEADLINE`], and the
    /// deadline index matching. `O(n log n)`.
    pub fn is_valid(&self) -> bool {
        self.by_id.len() <= MAX_LEASES_USIZE
            && self.by_deadline.len() == self.by_id.len()
            && self
                .by_id
                .iter()
                .all(|(id, &deadline)| valid_id(id) && deadline <= MAX_DEADLINE)
            && self
                .by_deadline
                .iter()
                .all(|(deadline, id)| self.by_id.get(id) == Some(deadline))
    }

    /// Estimated heap bytes held (for `MEMORY USAGE`). `O(n)`.
    pub fn heap_bytes(&self) -> usize {
        self.by_id
            .keys()
            .map(|id| id.len().saturating_mul(2).saturating_add(ENTRY_OVERHEAD))
            .fold(0usize, usize::saturating_add)
    }

    /// `(live, expired)` at `now`, walking the deadline index from both ends
    /// at once so the cost is the smaller of the two.
    fn split_counts(&self, now: Millis) -> (usize, usize) {
        let total = self.by_deadline.len();
        let mut oldest = self.by_deadline.iter();
        let mut newest = self.by_deadline.iter().rev();
        let mut steps = 0usize;
        loop {
            // So far the `steps` oldest are expired and the `steps` newest
            // are live.
            match oldest.next() {
                Some((deadline, _)) if *deadline <= now => {}
                _ => return (total - steps, steps),
            }
            match newest.next() {
                Some((deadline, _)) if now < *deadline => {}
                _ => return (steps, total - steps),
            }
            steps += 1;
        }
    }

    /// Ms until the earliest live lease expires (>= 1), or 1 when none is.
    fn retry_after_ms(&self, now: Millis) -> i64 {
        let first_live = (now.saturating_add(1), Box::<[u8]>::default());
        self.by_deadline
            .range(first_live..)
            .next()
            .map_or(1, |(deadline, _)| deadline.saturating_sub(now).max(1))
    }

    /// Remember that `id` was set to `deadline` (or removed).
    fn note(&mut self, id: &[u8], deadline: Option<Millis>) {
        self.edit = std::mem::take(&mut self.edit).then(id, deadline);
    }

    /// Add a lease `id` that is not stored.
    fn insert(&mut self, id: &[u8], deadline: Millis) {
        let key: Box<[u8]> = id.into();
        self.by_deadline.insert((deadline, key.clone()));
        self.by_id.insert(key, deadline);
    }

    /// Drop the lease `id` if stored.
    fn remove(&mut self, id: &[u8]) {
        if let Some((key, deadline)) = self.by_id.remove_entry(id) {
            self.by_deadline.remove(&(deadline, key));
        }
    }

    /// Move the stored lease `id` to `deadline`, reusing both boxed ids.
    fn set_deadline(&mut self, id: &[u8], deadline: Millis) {
        let Some((key, old)) = self.by_id.remove_entry(id) else {
            return;
        };
        let probe = (old, key);
        let indexed = self.by_deadline.take(&probe);
        let (_, key) = probe;
        let indexed_key = indexed.map_or_else(|| key.clone(), |(_, k)| k);
        self.by_deadline.insert((deadline, indexed_key));
        self.by_id.insert(key, deadline);
    }
}

/// [`MAX_LEASES`] as a `usize`.
pub(crate) const MAX_LEASES_USIZE: usize = MAX_LEASES as usize;

/// Leases matter until the last live one's deadline; expired ones are
/// swept when the record is written. Never stored empty.
impl Part for Leases {
    fn is_valid(&self) -> bool {
        Leases::is_valid(self) && !self.is_empty()
    }

    fn retain(&mut self, now: Millis) -> Option<Millis> {
        self.sweep(now);
        self.last_deadline(now)
    }

    fn is_plausible(&self, now: Millis) -> bool {
        self.by_deadline
            .last()
            .is_none_or(|(deadline, _)| within_reach(*deadline, now))
    }

    fn heap_bytes(&self, _allocated: &dyn Fn(*const u8) -> usize) -> usize {
        Leases::heap_bytes(self)
    }

    fn mark_committed(&mut self) {
        Leases::mark_committed(self);
    }
}

#[cfg(test)]
mod proptests;
#[cfg(test)]
mod tests;
