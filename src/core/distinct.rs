//! `RL.DISTINCT`: how many distinct members (subjects, IPs, client ids)
//! a key has seen in the last `window`, exact up to `limit`.
//!
//! A member is kept as its 64-bit [`member_hash`] and the time it was last
//! seen; a member seen at `t` counts while `now < t + W`. A key keeps at
//! most `limit + 1` members, the most recently seen: the members that
//! count at `now` are always the most recent ones, so among them the count
//! is exact up to `limit + 1` and saturates there (which is all a decision
//! needs: allowed at most `limit`, refused above).
//!
//! A call with member `m` reads the *counted set*: `m` at
//! `max(its last sighting, now)` plus the `min(others, limit)` most recent
//! other members that still count. Then
//! - `count` = its size; status allowed while `count <= limit`;
//! - `remaining` = `limit - count`, floored at 0;
//! - `reset` = until its oldest member leaves the window;
//! - `retry_after` = 0 when allowed; above the limit the count is
//!   `limit + 1` and comes back to `limit` when that oldest member leaves,
//!   so it equals `reset`.
//!
//! A recording call (not `PEEK`) stores exactly the counted set, **refused
//! or not**: a member seen while the key is above its limit is still a
//! member seen (the count stays honest, and a client that keeps trying new
//! members stays refused until it stops for a window). A `PEEK` reads the
//! same numbers and changes nothing.
//!
//! Work per recording call: `O(log n)` for the member, plus `O(log n)` per
//! member that left the window since the last write (each leaves once). A
//! `PEEK` writes nothing, so it walks those members each time (at most
//! `limit + 1`).

use std::collections::{BTreeMap, BTreeSet};

use serde::de::{self, Deserializer};
use serde::ser::{SerializeSeq, SerializeTuple, Serializer};
use serde::{Deserialize, Serialize};

use super::decision::{boxed, Decision, Span, Status};
use super::limits::{MAX_DISTINCT_LIMIT, MAX_DURATION_MS};
use super::part::{within_reach, Part};
use super::penalty::{ActiveBox, Penalty, MANUAL};
use super::time::{after, Millis};
use super::window::fnv1a_64;

mod change;

pub use change::DistinctChange;
use change::DistinctEdit;

/// The 64-bit hash a member is kept as: FNV-1a 64 of the member's bytes
/// (offset basis `0xcbf29ce484222325`, prime `0x100000001b3`, the hash
/// of window offsets). A fixed function, never a randomized hasher, so a master, its
/// replicas and every restart agree. Two members with the same hash count
/// as one (for random members about one pair in 2^64).
pub fn member_hash(member: &[u8]) -> u64 {
    fnv1a_64(member)
}

/// The parameters of an `RL.DISTINCT` call.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Distinct {
    /// Distinct members allowed in a window, 1 to [`MAX_DISTINCT_LIMIT`].
    pub limit: u64,
    /// The window in ms, 1 to [`MAX_DURATION_MS`].
    pub window_ms: u64,
}

/// A box to trip when the count goes above the limit (`TRIP level
/// duration`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TripOnOver {
    /// 1 to 3.
    pub level: u8,
    /// How long, in ms; 0 for a manual box.
    pub duration_ms: u64,
}

/// One `RL.DISTINCT` call.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DistinctCall {
    /// Limit and window.
    pub distinct: Distinct,
    /// The member's [`member_hash`].
    pub member: u64,
    /// Count without recording (and never trip).
    pub peek: bool,
    /// Trip the key's box when the count goes above the limit.
    pub trip: Option<TripOnOver>,
}

/// What a call changed.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct DistinctEffects {
    /// The members were written.
    pub state: bool,
    /// The box tripped (the penalty changed).
    pub tripped: Option<ActiveBox>,
}

/// The members a key has seen, each once: by hash and by time of its last
/// sighting (two indexes of the same pairs, so a lookup, an update and
/// the oldest are each `O(log n)`).
///
/// Encoded as `[window_ms, [[hash, seen], ...]]`, the pairs in increasing
/// hash order (the only order a payload may have).
#[derive(Clone, Debug)]
pub struct DistinctState {
    /// The window of the latest write: what retention counts with.
    window_ms: u64,
    /// Last sighting of each member.
    by_member: BTreeMap<u64, Millis>,
    /// `(seen, hash)` of each member: the oldest first.
    by_time: BTreeSet<(Millis, u64)>,
    /// How the set changed since it was last committed.
    edit: DistinctEdit,
}

/// Equal when they hold the same window and members (the index follows;
/// the edit is bookkeeping).
impl PartialEq for DistinctState {
    fn eq(&self, other: &DistinctState) -> bool {
        self.window_ms == other.window_ms && self.by_member == other.by_member
    }
}

impl Eq for DistinctState {}

impl DistinctState {
    /// An empty set for windows of `window_ms` (never stored empty).
    pub fn new(window_ms: u64) -> DistinctState {
        DistinctState {
            window_ms,
            by_member: BTreeMap::new(),
            by_time: BTreeSet::new(),
            edit: DistinctEdit::Whole,
        }
    }

    /// Members kept (counted or not).
    pub fn len(&self) -> usize {
        self.by_member.len()
    }

    /// Whether no member is kept.
    pub fn is_empty(&self) -> bool {
        self.by_member.is_empty()
    }

    /// The window retention counts with.
    pub fn window_ms(&self) -> u64 {
        self.window_ms
    }

    /// When `hash` was last seen, if it is kept.
    pub fn seen(&self, hash: u64) -> Option<Millis> {
        self.by_member.get(&hash).copied()
    }

    fn insert(&mut self, hash: u64, seen: Millis) {
        if let Some(old) = self.by_member.insert(hash, seen) {
            self.by_time.remove(&(old, hash));
        }
        self.by_time.insert((seen, hash));
    }

    fn remove(&mut self, hash: u64) {
        if let Some(seen) = self.by_member.remove(&hash) {
            self.by_time.remove(&(seen, hash));
        }
    }

    /// Remove the oldest member other than `keep`; its hash.
    fn remove_oldest_other_than(&mut self, keep: u64) -> Option<u64> {
        let &(seen, hash) = self.by_time.iter().find(|&&(_, h)| h != keep)?;
        self.by_time.remove(&(seen, hash));
        self.by_member.remove(&hash);
        Some(hash)
    }

    /// Drop the members seen at or before `cutoff` (they no longer count).
    fn drop_through(&mut self, cutoff: Millis) {
        while let Some(&(seen, hash)) = self.by_time.first() {
            if seen > cutoff {
                break;
            }
            self.by_time.pop_first();
            self.by_member.remove(&hash);
        }
    }
}

/// The last instant that does not count any more for a window of
/// `window_ms` at `now`: a member seen at `t` counts while `t > cutoff`.
fn cutoff(now: Millis, window_ms: u64) -> Millis {
    now.saturating_sub(i64::try_from(window_ms).unwrap_or(i64::MAX))
}

/// The decision for a counted set of `count` members whose oldest was
/// seen at `oldest`.
fn reading(d: &Distinct, count: u64, oldest: Millis, now: Millis) -> Decision {
    let leaves = after(oldest, d.window_ms);
    let reset = Span::ms(leaves.saturating_sub(now));
    let allowed = count <= d.limit;
    Decision {
        status: if allowed {
            Status::Allowed
        } else {
            Status::Throttled
        },
        limit: d.limit,
        remaining: i64::try_from(d.limit.saturating_sub(count)).unwrap_or(i64::MAX),
        reset,
        retry_after: if allowed { Span::Ms(0) } else { reset },
        box_level: 0,
        strikes_remaining: None,
        binding: 0,
        granted: None,
    }
}

/// What a call with `member` would read at `now`, changing nothing.
pub fn peek(state: Option<&DistinctState>, d: &Distinct, member: u64, now: Millis) -> Decision {
    let cut = cutoff(now, d.window_ms);
    let Some(state) = state else {
        return reading(d, 1, now, now);
    };
    let member_seen = state.seen(member).filter(|&s| s > cut);
    let member_at = member_seen.map_or(now, |s| s.max(now));
    let expired = state.by_time.iter().take_while(|&&(s, _)| s <= cut).count();
    let live = state.len() - expired;
    let others = live - usize::from(member_seen.is_some());
    let limit = usize::try_from(d.limit).unwrap_or(usize::MAX);
    let excess = others.saturating_sub(limit);
    let oldest_other = state
        .by_time
        .iter()
        .skip(expired)
        .filter(|&&(_, h)| h != member)
        .nth(excess)
        .map(|&(s, _)| s);
    let counted = others - excess + 1;
    let oldest = oldest_other.map_or(member_at, |s| s.min(member_at));
    reading(d, counted as u64, oldest, now)
}

/// Record `member` at `now` in `state` (refused or not: see the module
/// docs) and read the result: the members that no longer count are
/// dropped, and the oldest others beyond `limit`.
pub fn record(state: &mut DistinctState, d: &Distinct, member: u64, now: Millis) -> Decision {
    state.window_ms = d.window_ms;
    state.drop_through(cutoff(now, d.window_ms));
    let at = state.seen(member).map_or(now, |s| s.max(now));
    state.insert(member, at);
    let keep = usize::try_from(d.limit)
        .unwrap_or(usize::MAX)
        .saturating_add(1);
    let mut trimmed = Vec::new();
    while state.len() > keep {
        match state.remove_oldest_other_than(member) {
            Some(hash) => trimmed.push(hash),
            None => break,
        }
    }
    let change = DistinctChange {
        window_ms: d.window_ms,
        member,
        seen: at,
        trimmed,
    };
    state.edit = std::mem::take(&mut state.edit).then(change);
    let oldest = state.by_time.first().map_or(at, |&(s, _)| s);
    reading(d, state.len() as u64, oldest, now)
}

/// Decide one call on the key's members (`slot`, created when the call
/// records) and penalty: an active box answers at once and reads nothing;
/// a `PEEK` reads only; otherwise the member is recorded, and with `TRIP`
/// a count above the limit trips the box (as `RL.BOX TRIP` would) and the
/// answer is the box.
pub fn decide(
    slot: &mut Option<Box<DistinctState>>,
    penalty: &mut Penalty,
    call: &DistinctCall,
    now: Millis,
) -> (Decision, DistinctEffects) {
    let d = &call.distinct;
    if let Some(active) = penalty.active_box(now) {
        return (boxed(d.limit, &active, now), DistinctEffects::default());
    }
    if call.peek {
        return (
            peek(slot.as_deref(), d, call.member, now),
            DistinctEffects::default(),
        );
    }
    let state = slot.get_or_insert_with(|| Box::new(DistinctState::new(d.window_ms)));
    let decision = record(state, d, call.member, now);
    let mut effects = DistinctEffects {
        state: true,
        tripped: None,
    };
    if let (Status::Throttled, Some(trip)) = (decision.status, call.trip) {
        let active = penalty.trip(trip.level, trip.duration_ms, now);
        effects.tripped = Some(active);
        return (boxed(d.limit, &active, now), effects);
    }
    (decision, effects)
}

/// Heap bytes per kept member, an estimate: one `(u64, i64)` in each of
/// two B-trees (16 bytes each in nodes of 11, about two thirds full, plus
/// node headers and the inner nodes).
pub const HEAP_BYTES_PER_MEMBER: usize = 56;

impl Part for DistinctState {
    /// A window within the accepted range, at least one member and at
    /// most [`MAX_DISTINCT_LIMIT`] + 1, both indexes of the same pairs.
    fn is_valid(&self) -> bool {
        (1..=MAX_DURATION_MS).contains(&self.window_ms)
            && !self.by_member.is_empty()
            && self.by_member.len() as u64 <= MAX_DISTINCT_LIMIT + 1
            && self.by_time.len() == self.by_member.len()
    }

    fn since_version(&self) -> u8 {
        6
    }

    /// No sighting later than a deadline could lie.
    fn is_plausible(&self, now: Millis) -> bool {
        self.by_time
            .last()
            .is_none_or(|&(seen, _)| within_reach(after(seen, self.window_ms), now))
    }

    /// The members matter until the newest leaves the window.
    fn retain(&mut self, now: Millis) -> Option<Millis> {
        self.drop_through(cutoff(now, self.window_ms));
        let &(newest, _) = self.by_time.last()?;
        Some(after(newest, self.window_ms).min(MANUAL - 1))
    }

    fn heap_bytes(&self, _allocated: &dyn Fn(*const u8) -> usize) -> usize {
        self.len() * HEAP_BYTES_PER_MEMBER
    }

    fn mark_committed(&mut self) {
        DistinctState::mark_committed(self);
    }
}

/// The member pairs in hash order, as a sequence.
struct Pairs<'a>(&'a BTreeMap<u64, Millis>);

impl Serialize for Pairs<'_> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let mut seq = serializer.serialize_seq(Some(self.0.len()))?;
        for pair in self.0 {
            seq.serialize_element(&pair)?;
        }
        seq.end()
    }
}

impl Serialize for DistinctState {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let mut t = serializer.serialize_tuple(2)?;
        t.serialize_element(&self.window_ms)?;
        t.serialize_element(&Pairs(&self.by_member))?;
        t.end()
    }
}

impl<'de> Deserialize<'de> for DistinctState {
    /// Refuses pairs that are not in strictly increasing hash order.
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<DistinctState, D::Error> {
        let (window_ms, pairs): (u64, Vec<(u64, Millis)>) = Deserialize::deserialize(deserializer)?;
        if pairs.windows(2).any(|w| w[0].0 >= w[1].0) {
            return Err(de::Error::custom("members out of hash order"));
        }
        let mut state = DistinctState::new(window_ms);
        for (hash, seen) in pairs {
            state.insert(hash, seen);
        }
        Ok(state)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const NOW: Millis = 1_700_000_000_000;
    const D: Distinct = Distinct {
        limit: 2,
        window_ms: 10_000,
    };

    fn call(member: &[u8], peek: bool, trip: Option<TripOnOver>) -> DistinctCall {
        DistinctCall {
            distinct: D,
            member: member_hash(member),
            peek,
            trip,
        }
    }

    /// `[status, remaining, reset_ms, retry_after_ms]` of one call.
    fn run(
        slot: &mut Option<Box<DistinctState>>,
        member: &[u8],
        at: Millis,
    ) -> (Status, i64, Span, Span) {
        let (d, _) = decide(
            slot,
            &mut Penalty::default(),
            &call(member, false, None),
            at,
        );
        (d.status, d.remaining, d.reset, d.retry_after)
    }

    #[test]
    fn the_hash_is_fnv1a_64() {
        assert_eq!(member_hash(b""), 0xcbf2_9ce4_8422_2325);
        assert_eq!(member_hash(b"a"), 0xaf63_dc4c_8601_ec8c);
    }

    #[test]
    fn counts_distinct_members_up_to_the_limit() {
        let mut slot = None;
        let ms = Span::Ms;
        assert_eq!(
            run(&mut slot, b"alice", NOW),
            (Status::Allowed, 1, ms(10_000), ms(0))
        );
        assert_eq!(
            run(&mut slot, b"alice", NOW + 1000),
            (Status::Allowed, 1, ms(10_000), ms(0))
        );
        assert_eq!(
            run(&mut slot, b"bob", NOW + 2000),
            (Status::Allowed, 0, ms(9_000), ms(0))
        );
        // A third member is refused; alice (seen at +1000) leaves at +11000.
        assert_eq!(
            run(&mut slot, b"carol", NOW + 3000),
            (Status::Throttled, 0, ms(8_000), ms(8_000))
        );
        assert_eq!(slot.as_ref().map(|s| s.len()), Some(3), "limit + 1 kept");
        // A fourth: the oldest (alice) is dropped, bob is now the oldest.
        assert_eq!(
            run(&mut slot, b"dave", NOW + 4000),
            (Status::Throttled, 0, ms(8_000), ms(8_000))
        );
        assert_eq!(slot.as_ref().map(|s| s.len()), Some(3));
        // Once bob and carol have left, dave and erin fit.
        assert_eq!(
            run(&mut slot, b"erin", NOW + 13_000),
            (Status::Allowed, 0, ms(1_000), ms(0))
        );
    }

    #[test]
    fn peek_reads_what_a_call_would_and_writes_nothing() {
        let mut slot = None;
        run(&mut slot, b"a", NOW);
        run(&mut slot, b"b", NOW + 1);
        let before = slot.clone();
        let mut penalty = Penalty::default();
        let trip = Some(TripOnOver {
            level: 3,
            duration_ms: 0,
        });
        let (peeked, fx) = decide(&mut slot, &mut penalty, &call(b"c", true, trip), NOW + 2);
        assert_eq!(
            (peeked.status, fx),
            (Status::Throttled, DistinctEffects::default())
        );
        assert_eq!(
            (slot.clone(), penalty),
            (before, Penalty::default()),
            "never trips"
        );
        let (recorded, _) = decide(&mut slot, &mut penalty, &call(b"c", false, None), NOW + 2);
        assert_eq!(peeked, recorded);
        assert_eq!(peek(None, &D, 7, NOW).remaining, 1);
    }

    #[test]
    fn trip_boxes_the_key_above_the_limit() {
        let mut slot = None;
        let mut penalty = Penalty::default();
        let trip = Some(TripOnOver {
            level: 3,
            duration_ms: 60_000,
        });
        for (i, m) in [b"a", b"b"].iter().enumerate() {
            let (d, fx) = decide(
                &mut slot,
                &mut penalty,
                &call(*m, false, trip),
                NOW + i as i64,
            );
            assert_eq!((d.status, fx.tripped), (Status::Allowed, None));
        }
        let (d, fx) = decide(&mut slot, &mut penalty, &call(b"c", false, trip), NOW + 2);
        assert_eq!((d.status, d.box_level), (Status::Boxed, 3));
        assert_eq!(d.retry_after, Span::Ms(60_000));
        assert!(fx.state && fx.tripped.is_some());
        assert_eq!(penalty.live_offenses(NOW + 2), 1);
        // Boxed: nothing is read or recorded.
        let before = slot.clone();
        let (d, fx) = decide(&mut slot, &mut penalty, &call(b"z", false, trip), NOW + 3);
        assert_eq!((d.status, fx), (Status::Boxed, DistinctEffects::default()));
        assert_eq!(slot, before);
    }

    #[test]
    fn retention_follows_the_newest_member() {
        let mut slot = None;
        run(&mut slot, b"a", NOW);
        run(&mut slot, b"b", NOW + 5000);
        let mut state = *slot.expect("recorded");
        assert_eq!(state.retain(NOW + 9_999), Some(NOW + 15_000));
        assert_eq!(state.len(), 2);
        assert_eq!(state.retain(NOW + 10_000), Some(NOW + 15_000));
        assert_eq!(state.len(), 1, "a left the window");
        assert_eq!(state.retain(NOW + 15_000), None);
    }

    #[test]
    fn a_clock_stepping_back_never_forgets_a_member() {
        let mut slot = None;
        run(&mut slot, b"a", NOW + 5000);
        let (status, remaining, reset, _) = run(&mut slot, b"a", NOW);
        assert_eq!(
            (status, remaining, reset),
            (Status::Allowed, 1, Span::Ms(15_000))
        );
        assert_eq!(
            slot.as_ref().and_then(|s| s.seen(member_hash(b"a"))),
            Some(NOW + 5000)
        );
    }

    #[test]
    fn encoding_is_canonical() {
        let mut slot = None;
        run(&mut slot, b"a", NOW);
        run(&mut slot, b"b", NOW + 1);
        let state = *slot.expect("recorded");
        let bytes = rmp_serde::to_vec(&state).expect("encodes");
        let back: DistinctState = rmp_serde::from_slice(&bytes).expect("decodes");
        assert_eq!(back, state);
        assert!(back.is_valid() && back.is_plausible(NOW));
        let (h1, h2) = (member_hash(b"a"), member_hash(b"b"));
        let (lo, hi) = (h1.min(h2), h1.max(h2));
        let unsorted =
            rmp_serde::to_vec(&(10_000u64, vec![(hi, NOW), (lo, NOW)])).expect("encodes");
        assert!(rmp_serde::from_slice::<DistinctState>(&unsorted).is_err());
        let twice = rmp_serde::to_vec(&(10_000u64, vec![(lo, NOW), (lo, NOW)])).expect("encodes");
        assert!(rmp_serde::from_slice::<DistinctState>(&twice).is_err());
        assert!(!DistinctState::new(1000).is_valid(), "never stored empty");
        let far = rmp_serde::to_vec(&(10_000u64, vec![(lo, i64::MAX / 2)])).expect("encodes");
        let far: DistinctState = rmp_serde::from_slice(&far).expect("decodes");
        assert!(!far.is_plausible(NOW));
    }
}
