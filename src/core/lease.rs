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
use std::fmt;

use serde::de::{self, MapAccess, Visitor};
use serde::ser::SerializeMap;
use serde::{Deserialize, Deserializer, Serialize, Serializer};

use super::limits::{MAX_LEASES, MAX_LEASE_ID_LEN};
use super::time::{after, Millis};

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
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Leases {
    /// Deadline of each lease, by id.
    by_id: BTreeMap<Box<[u8]>, Millis>,
    /// The same leases ordered by `(deadline, id)`.
    by_deadline: BTreeSet<(Millis, Box<[u8]>)>,
}

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

    /// The deadline of `id` if it holds a live lease at `now`.
    pub fn deadline_of(&self, id: &[u8], now: Millis) -> Option<Millis> {
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
        self.set_deadline(id, deadline_after(now, ttl_ms));
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
const MAX_LEASES_USIZE: usize = MAX_LEASES as usize;

/// An id serialized as MessagePack `bin`.
struct IdRef<'a>(&'a [u8]);

impl Serialize for IdRef<'_> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_bytes(self.0)
    }
}

/// An id read from `bin` (a string or an array of integers is refused, so
/// decoding accepts only what encoding makes).
struct IdBuf(Box<[u8]>);

impl<'de> Deserialize<'de> for IdBuf {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct IdVisitor;
        impl Visitor<'_> for IdVisitor {
            type Value = IdBuf;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a lease id as bytes")
            }
            fn visit_bytes<E: de::Error>(self, v: &[u8]) -> Result<IdBuf, E> {
                Ok(IdBuf(v.into()))
            }
            fn visit_byte_buf<E: de::Error>(self, v: Vec<u8>) -> Result<IdBuf, E> {
                Ok(IdBuf(v.into_boxed_slice()))
            }
        }
        deserializer.deserialize_byte_buf(IdVisitor)
    }
}

impl Serialize for Leases {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let mut map = serializer.serialize_map(Some(self.by_id.len()))?;
        for (id, deadline) in &self.by_id {
            map.serialize_entry(&IdRef(id), deadline)?;
        }
        map.end()
    }
}

impl<'de> Deserialize<'de> for Leases {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct LeasesVisitor;
        impl<'de> Visitor<'de> for LeasesVisitor {
            type Value = Leases;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a map of lease ids to deadlines, in increasing id order")
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Leases, A::Error> {
                let mut leases = Leases::default();
                while let Some((IdBuf(id), deadline)) = map.next_entry::<IdBuf, Millis>()? {
                    if leases.by_id.len() >= MAX_LEASES_USIZE {
                        return Err(de::Error::custom("too many leases"));
                    }
                    if !valid_id(&id) || deadline > MAX_DEADLINE {
                        return Err(de::Error::custom("invalid lease"));
                    }
                    if leases
                        .by_id
                        .last_key_value()
                        .is_some_and(|(last, _)| **last >= *id)
                    {
                        return Err(de::Error::custom("lease ids not in increasing order"));
                    }
                    leases.by_deadline.insert((deadline, id.clone()));
                    leases.by_id.insert(id, deadline);
                }
                Ok(leases)
            }
        }
        deserializer.deserialize_map(LeasesVisitor)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const NOW: Millis = 1_700_000_000_000;

    /// One call in a table.
    #[derive(Clone, Copy, Debug)]
    enum Op {
        Acquire(&'static str, u64, u64),
        Release(&'static str),
        Renew(&'static str, u64),
        Sweep,
        InUse,
    }

    /// What the call answered.
    #[derive(Clone, Copy, Debug, PartialEq, Eq)]
    enum Out {
        A(Acquire),
        B(bool),
        N(u64),
    }

    fn granted(in_use: u64) -> Out {
        Out::A(Acquire::Granted { in_use })
    }

    fn refreshed(in_use: u64) -> Out {
        Out::A(Acquire::Refreshed { in_use })
    }

    fn denied(in_use: u64, retry_after_ms: i64) -> Out {
        Out::A(Acquire::Denied {
            in_use,
            retry_after_ms,
        })
    }

    /// Run `rows` of (ms after `NOW`, call, answer), checking that a denial
    /// and a false release or renew change nothing.
    fn run(leases: &mut Leases, rows: &[(i64, Op, Out)]) {
        for (i, &(at, op, expected)) in rows.iter().enumerate() {
            let now = NOW + at;
            let before = leases.clone();
            let out = match op {
                Op::Acquire(id, max, ttl) => Out::A(leases.acquire(id.as_bytes(), max, ttl, now)),
                Op::Release(id) => Out::B(leases.release(id.as_bytes(), now)),
                Op::Renew(id, ttl) => Out::B(leases.renew(id.as_bytes(), ttl, now)),
                Op::Sweep => Out::N(leases.sweep(now)),
                Op::InUse => Out::N(leases.in_use(now)),
            };
            assert_eq!(out, expected, "row {i}: {op:?} at +{at} ms");
            if matches!(out, Out::A(Acquire::Denied { .. }) | Out::B(false)) {
                assert_eq!(*leases, before, "row {i}: nothing changes");
            }
            assert!(leases.is_valid(), "row {i}");
        }
    }

    #[test]
    fn table_of_calls_on_max_two() {
        let mut leases = Leases::new();
        run(
            &mut leases,
            &[
                (0, Op::Acquire("a", 2, 1000), granted(1)),
                (100, Op::Acquire("b", 2, 1000), granted(2)),
                // Full: retry when `a` expires.
                (200, Op::Acquire("c", 2, 1000), denied(2, 800)),
                // A retry of `a` refreshes it even though the key is full.
                (300, Op::Acquire("a", 2, 1000), refreshed(2)),
                // Now `b` (deadline 1100) is the earliest.
                (400, Op::Acquire("c", 2, 1000), denied(2, 700)),
                (1099, Op::Acquire("c", 2, 1000), denied(2, 1)),
                // `b` expires at its deadline (exclusive) and frees its slot.
                (1100, Op::InUse, Out::N(1)),
                (1100, Op::Acquire("c", 2, 1000), granted(2)),
                (1100, Op::Release("b"), Out::B(false)),
                (1200, Op::Renew("a", 1000), Out::B(true)),
                (1300, Op::Acquire("d", 2, 1000), denied(2, 800)),
                (1300, Op::Release("c"), Out::B(true)),
                (1300, Op::Release("c"), Out::B(false)),
                (1300, Op::Acquire("d", 2, 1000), granted(2)),
                // `a` expires at 2200: no renew, no release.
                (2200, Op::Renew("a", 1000), Out::B(false)),
                (2200, Op::Release("a"), Out::B(false)),
                (2200, Op::InUse, Out::N(1)),
                // `a` is still stored, expired: a sweep removes it.
                (2250, Op::Sweep, Out::N(1)),
                (2250, Op::Sweep, Out::N(0)),
                (2299, Op::Release("d"), Out::B(true)),
                (2299, Op::InUse, Out::N(0)),
            ],
        );
        assert!(leases.is_empty());
    }

    #[test]
    fn a_lock_with_max_one() {
        let mut leases = Leases::new();
        run(
            &mut leases,
            &[
                (0, Op::Acquire("w1", 1, 30_000), granted(1)),
                (10, Op::Acquire("w2", 1, 30_000), denied(1, 29_990)),
                (20_000, Op::Renew("w1", 30_000), Out::B(true)),
                (20_000, Op::Acquire("w2", 1, 30_000), denied(1, 30_000)),
                (20_001, Op::Renew("w2", 30_000), Out::B(false)),
                // w1 crashed: its slot comes back at 50 000.
                (49_999, Op::Acquire("w2", 1, 30_000), denied(1, 1)),
                (50_000, Op::Acquire("w2", 1, 30_000), granted(1)),
                // w1's late release does not free w2's slot.
                (50_001, Op::Release("w1"), Out::B(false)),
                (50_002, Op::Acquire("w1", 1, 30_000), denied(1, 29_998)),
                // Acquiring an expired id again is a new grant.
                (80_000, Op::Acquire("w2", 1, 30_000), granted(1)),
            ],
        );
    }

    #[test]
    fn a_grant_sweeps_a_denial_does_not() {
        let mut leases = Leases::new();
        leases.acquire(b"a", 2, 100, NOW);
        leases.acquire(b"b", 2, 1000, NOW);
        leases.acquire(b"c", 3, 1000, NOW);
        // At +500 `a` expired; `b` and `c` fill max 2.
        assert_eq!(leases.expired(NOW + 500), 1);
        assert_eq!(
            leases.acquire(b"d", 2, 1000, NOW + 500),
            Acquire::Denied {
                in_use: 2,
                retry_after_ms: 500
            }
        );
        assert_eq!(leases.len(), 3, "the denial kept the expired lease");
        assert_eq!(
            leases.acquire(b"d", 3, 1000, NOW + 500),
            Acquire::Granted { in_use: 3 }
        );
        assert_eq!(leases.len(), 3, "the grant swept `a`");
        assert_eq!(leases.expired(NOW + 500), 0);
        assert!(!leases.is_live(b"a", NOW));
    }

    #[test]
    fn release_and_renew_sweep_when_they_succeed() {
        let mut leases = Leases::new();
        leases.acquire(b"a", 5, 100, NOW);
        leases.acquire(b"b", 5, 1000, NOW);
        leases.acquire(b"c", 5, 1000, NOW);
        assert!(!leases.release(b"a", NOW + 100));
        assert_eq!(leases.len(), 3);
        assert!(leases.renew(b"b", 10, NOW + 100));
        assert_eq!(leases.len(), 2);
        assert_eq!(leases.deadline_of(b"b", NOW + 100), Some(NOW + 110));
        assert!(leases.release(b"c", NOW + 200));
        assert!(leases.is_empty(), "`b` expired at +110 and was swept");
    }

    #[test]
    fn a_backward_clock_step_never_frees_a_slot() {
        let mut leases = Leases::new();
        assert_eq!(
            leases.acquire(b"a", 1, 1000, NOW),
            Acquire::Granted { in_use: 1 }
        );
        assert_eq!(
            leases.acquire(b"b", 1, 1000, NOW + 1000),
            Acquire::Granted { in_use: 1 }
        );
        // Back 600 ms: `b` (deadline +2000) still counts; `a` was swept by
        // the grant and does not come back.
        assert_eq!(leases.in_use(NOW + 400), 1);
        assert_eq!(
            leases.acquire(b"c", 1, 1000, NOW + 400),
            Acquire::Denied {
                in_use: 1,
                retry_after_ms: 1600
            }
        );
        // An unswept lease counts again when the clock goes back before its
        // deadline: a denial at +2500 keeps `b`, and at +1500 it is live.
        assert_eq!(leases.in_use(NOW + 2500), 0);
        assert!(leases.is_live(b"b", NOW + 1500));
        assert_eq!(
            leases.acquire(b"c", 1, 1000, NOW + 1500),
            Acquire::Denied {
                in_use: 1,
                retry_after_ms: 500
            }
        );
        // A refresh after a backward step takes `now + ttl` literally.
        assert_eq!(
            leases.acquire(b"b", 1, 100, NOW + 1500),
            Acquire::Refreshed { in_use: 1 }
        );
        assert_eq!(leases.last_deadline(NOW + 1500), Some(NOW + 1600));
    }

    #[test]
    fn list_and_last_deadline() {
        let mut leases = Leases::new();
        assert_eq!(leases.last_deadline(NOW), None);
        leases.acquire(b"m", 9, 3000, NOW);
        leases.acquire(b"z", 9, 1000, NOW);
        leases.acquire(b"a", 9, 2000, NOW);
        let listed: Vec<(&[u8], i64)> = leases.list(NOW + 500).collect();
        assert_eq!(
            listed,
            vec![(&b"a"[..], 1500), (&b"m"[..], 2500), (&b"z"[..], 500)]
        );
        assert_eq!(leases.last_deadline(NOW + 500), Some(NOW + 3000));
        let listed: Vec<(&[u8], i64)> = leases.list(NOW + 1000).collect();
        assert_eq!(listed, vec![(&b"a"[..], 1000), (&b"m"[..], 2000)]);
        assert_eq!(leases.last_deadline(NOW + 2999), Some(NOW + 3000));
        assert_eq!(leases.last_deadline(NOW + 3000), None);
        assert_eq!(leases.list(NOW + 3000).count(), 0);
    }

    #[test]
    fn bounds_are_clamped_and_deadlines_saturate() {
        let mut leases = Leases::new();
        // max 0 acts as 1, ttl 0 as 1 ms.
        assert_eq!(
            leases.acquire(b"a", 0, 0, NOW),
            Acquire::Granted { in_use: 1 }
        );
        assert_eq!(leases.deadline_of(b"a", NOW), Some(NOW + 1));
        assert_eq!(
            leases.acquire(b"b", 0, 0, NOW),
            Acquire::Denied {
                in_use: 1,
                retry_after_ms: 1
            }
        );
        let late = MAX_DEADLINE - 10;
        assert_eq!(
            leases.acquire(b"b", 1, u64::MAX, late),
            Acquire::Granted { in_use: 1 }
        );
        assert_eq!(leases.last_deadline(late), Some(MAX_DEADLINE));
        assert!(leases.renew(b"b", u64::MAX, late + 1));
        assert_eq!(leases.list(late).next(), Some((&b"b"[..], 10)));
        assert!(leases.is_valid());
        assert_eq!(leases.in_use(i64::MAX), 0);
        assert_eq!(leases.sweep(i64::MAX), 1);
        // Far in the past nothing overflows either.
        leases.acquire(b"c", 1, 5, i64::MIN);
        assert_eq!(leases.list(i64::MIN).next(), Some((&b"c"[..], 5)));
        assert_eq!(leases.in_use(i64::MIN), 1);
    }

    #[test]
    fn max_leases_is_the_ceiling() {
        let mut leases = Leases::new();
        for i in 0..MAX_LEASES {
            let id = i.to_be_bytes();
            let out = leases.acquire(&id, u64::MAX, 1000, NOW);
            assert_eq!(out, Acquire::Granted { in_use: i + 1 });
        }
        assert_eq!(
            leases.acquire(b"one more", u64::MAX, 1000, NOW),
            Acquire::Denied {
                in_use: MAX_LEASES,
                retry_after_ms: 1000
            }
        );
        assert!(leases.is_valid());
        assert!(leases.heap_bytes() > MAX_LEASES as usize * 16);
    }

    #[test]
    fn valid_ids() {
        assert!(!valid_id(b""));
        assert!(valid_id(b"x"));
        assert!(valid_id(&[0xff; MAX_LEASE_ID_LEN]));
        assert!(!valid_id(&[b'x'; MAX_LEASE_ID_LEN + 1]));
    }

    #[test]
    fn generated_ids_are_time_then_random_hex() {
        let id = format_id([0x0123_4567_89ab_cdef, 0xffff_ffff_ffff_beef], NOW);
        assert_eq!(id, "018bcfe56800beef0123456789abcdef");
        assert_eq!(id.len(), GENERATED_ID_LEN);
        assert_eq!(&id[..12], format!("{NOW:012x}"));
        assert_eq!(format_id([0, 0], 0), "00000000000000000000000000000000");
        // The time wraps at 48 bits; a negative time wraps too.
        assert_eq!(&format_id([0, 0], 1 << 48)[..12], "000000000000");
        assert_eq!(&format_id([0, 0], -1)[..12], "ffffffffffff");
        assert_eq!(
            format_id([u64::MAX, u64::MAX], i64::MAX),
            "ffffffffffffffffffffffffffffffff"
        );
        // Later ids sort after earlier ones.
        assert!(format_id([u64::MAX, u64::MAX], NOW) < format_id([0, 0], NOW + 1));
        let id = format_id([7, 9], NOW);
        assert!(valid_id(id.as_bytes()));
        assert!(id
            .bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b)));
    }

    fn sample() -> Leases {
        let mut leases = Leases::new();
        leases.acquire(b"b", 3, 1000, NOW);
        leases.acquire(b"a", 3, 2000, NOW);
        leases
    }

    #[test]
    fn serde_round_trip_and_shape() {
        for leases in [Leases::new(), sample()] {
            let bytes = rmp_serde::to_vec(&leases).unwrap_or_default();
            let back: Leases = rmp_serde::from_slice(&bytes).unwrap_or_default();
            assert_eq!(back, leases);
            assert!(back.is_valid());
        }
        // A map of bin ids to integer deadlines, in id order.
        let mut one = Leases::new();
        one.acquire(b"a", 1, 5, 0);
        assert_eq!(
            rmp_serde::to_vec(&one).unwrap_or_default(),
            [0x81, 0xc4, 0x01, b'a', 0x05]
        );
        assert_eq!(
            rmp_serde::to_vec(&Leases::new()).unwrap_or_default(),
            [0x80]
        );
        // A generated id at a current time: 43 bytes a lease.
        let mut big = Leases::new();
        for i in 0..10 {
            big.acquire(format_id([i, i], NOW).as_bytes(), 10, 60_000, NOW);
        }
        assert_eq!(
            rmp_serde::to_vec(&big).unwrap_or_default().len(),
            1 + 10 * 43
        );
    }

    #[test]
    fn decoding_refuses_non_canonical_or_invalid_maps() {
        let decode = |bytes: &[u8]| rmp_serde::from_slice::<Leases>(bytes).ok();
        // {"a": 5, "b": 6} decodes.
        let good = [0x82, 0xc4, 1, b'a', 5, 0xc4, 1, b'b', 6];
        assert_eq!(decode(&good).map(|l| l.len()), Some(2));
        let cases: &[(&str, &[u8])] = &[
            ("unsorted", &[0x82, 0xc4, 1, b'b', 6, 0xc4, 1, b'a', 5]),
            ("duplicate", &[0x82, 0xc4, 1, b'a', 5, 0xc4, 1, b'a', 6]),
            ("empty id", &[0x81, 0xc4, 0, 5]),
            ("str id", &[0x81, 0xa1, b'a', 5]),
            ("array id", &[0x81, 0x91, 0x61, 5]),
            ("array", &[0x92, 0xc4, 1, b'a', 5]),
            (
                "deadline i64::MAX",
                &[
                    0x81, 0xc4, 1, b'a', 0xcf, 0x7f, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff,
                ],
            ),
            ("truncated", &good[..8]),
        ];
        for (what, bytes) in cases {
            assert_eq!(decode(bytes), None, "{what}");
        }
        let mut long = vec![0x81, 0xc4, 129];
        long.extend([b'x'; 129]);
        long.push(5);
        assert_eq!(decode(&long), None, "id too long");
        let header = |n: u64| u16::try_from(n).expect("a map16 length").to_be_bytes();
        let mut too_many = vec![0xde]; // map16 of MAX_LEASES + 1 entries
        too_many.extend(header(MAX_LEASES + 1));
        for i in 0..=MAX_LEASES {
            too_many.extend([0xc4, 8]);
            too_many.extend(i.to_be_bytes());
            too_many.push(5);
        }
        assert_eq!(decode(&too_many), None, "too many leases");
        too_many[1..3].copy_from_slice(&header(MAX_LEASES));
        too_many.truncate(too_many.len() - 11);
        assert_eq!(decode(&too_many).map(|l| l.len() as u64), Some(MAX_LEASES));
    }

    #[test]
    fn is_valid_checks_the_index() {
        let mut leases = sample();
        assert!(leases.is_valid());
        leases.by_deadline.pop_first();
        assert!(!leases.is_valid());
        let mut leases = sample();
        if let Some(d) = leases.by_id.get_mut(&b"a"[..]) {
            *d += 1;
        }
        assert!(!leases.is_valid());
        let mut leases = sample();
        leases.insert(b"", NOW);
        assert!(!leases.is_valid());
    }
}
