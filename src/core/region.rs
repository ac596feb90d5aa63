//! Regional quotas: one quota shared by several regions, each counting on
//! its own component. A component is a PN-counter pair `(added,
//! refunded)`, both grow-only; a key's [`RegionCounts`] keeps one per
//! region for one calendar period, and a call decides on the total of
//! their counts. Components of the other regions arrive by [`merge`],
//! which takes the maximum of each field: idempotent, commutative and
//! associative, so a component may be sent any number of times, in any
//! order, and no point is ever counted twice.

use arrayvec::ArrayVec;
use serde::{Deserialize, Serialize};

use super::limiter::{Conflict, Limiter};
use super::part::{within_reach, Part, MAX_COUNT};
use super::penalty::MANUAL;
use super::quota::{period_bounds, Period, Quota, QuotaSeen, QuotaState};
use super::record::Record;
use super::time::Millis;

/// Most regions (components per key, names in `rl.regions`).
pub const MAX_REGIONS: usize = 16;

/// Longest region name, in bytes.
pub const MAX_REGION_NAME: usize = 32;

/// The legal bound on `added` and `refunded` of a component (2^53): a local
/// component stops growing there, and a larger value is refused.
pub const MAX_COMPONENT: u64 = MAX_COUNT;

/// A region name: 1 to [`MAX_REGION_NAME`] bytes of `A-Z a-z 0-9 _ -`,
/// kept inline (no allocation), the rest of its array zero. Ordered as its
/// bytes: as no name holds a zero byte, comparing the zero-padded arrays
/// orders names as their bytes do (a prefix first).
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct RegionName {
    len: u8,
    bytes: [u8; MAX_REGION_NAME],
}

impl RegionName {
    /// The name, if `bytes` is a valid one.
    pub fn new(bytes: &[u8]) -> Option<RegionName> {
        let valid = (1..=MAX_REGION_NAME).contains(&bytes.len())
            && bytes
                .iter()
                .all(|&b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-');
        if !valid {
            return None;
        }
        let mut name = RegionName {
            len: bytes.len() as u8,
            bytes: [0; MAX_REGION_NAME],
        };
        name.bytes[..bytes.len()].copy_from_slice(bytes);
        Some(name)
    }

    /// The name's bytes.
    pub fn as_bytes(&self) -> &[u8] {
        &self.bytes[..usize::from(self.len).min(MAX_REGION_NAME)]
    }

    /// The name as text.
    pub fn as_str(&self) -> &str {
        let bytes = self.as_bytes();
        debug_assert!(bytes.is_ascii());
        // SAFETY: `new` admits only ASCII bytes (alphanumerics, `_`, `-`),
        // and a name is never changed after: always valid UTF-8.
        unsafe { std::str::from_utf8_unchecked(bytes) }
    }
}

impl Ord for RegionName {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        self.bytes.cmp(&other.bytes)
    }
}

impl PartialOrd for RegionName {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}

impl std::fmt::Debug for RegionName {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{:?}", self.as_str())
    }
}

impl Serialize for RegionName {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(self.as_str())
    }
}

impl<'de> Deserialize<'de> for RegionName {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<RegionName, D::Error> {
        struct NameVisitor;
        impl serde::de::Visitor<'_> for NameVisitor {
            type Value = RegionName;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("a region name")
            }
            fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<RegionName, E> {
                RegionName::new(v.as_bytes()).ok_or_else(|| E::custom("not a region name"))
            }
        }
        d.deserialize_str(NameVisitor)
    }
}

/// Why a list of regions (`rl.regions`) is refused.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RegionListError {
    /// A name that is empty, too long or outside the alphabet.
    BadName,
    /// More than [`MAX_REGIONS`] names.
    TooMany,
    /// A name given twice.
    Repeated,
}

/// Parse a comma-separated list of region names (empty: no region).
pub fn parse_region_list(
    text: &[u8],
) -> Result<ArrayVec<RegionName, MAX_REGIONS>, RegionListError> {
    let mut names = ArrayVec::new();
    if text.is_empty() {
        return Ok(names);
    }
    for part in text.split(|&b| b == b',') {
        let name = RegionName::new(part).ok_or(RegionListError::BadName)?;
        if names.contains(&name) {
            return Err(RegionListError::Repeated);
        }
        names.try_push(name).map_err(|_| RegionListError::TooMany)?;
    }
    Ok(names)
}

/// One region's component: its points `added` and `refunded` in the
/// period, both only growing; its count is `added - refunded`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Component {
    /// The region.
    pub region: RegionName,
    /// Points counted (`COST`, `DEBT`).
    pub added: u64,
    /// Points given back (`REFUND`), at most `added`.
    pub refunded: u64,
}

impl Component {
    /// `added - refunded`.
    pub fn count(&self) -> u64 {
        self.added.saturating_sub(self.refunded)
    }

    /// Whether the values are legal: `refunded <= added <= MAX_COMPONENT`.
    pub fn is_legal(&self) -> bool {
        self.refunded <= self.added && self.added <= MAX_COMPONENT
    }
}

/// What a regional quota key stores: the components of one period, sorted
/// by region name, none repeated, none `(0, 0)`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct RegionCounts {
    /// End of the period (ms since the epoch, exclusive).
    pub end: Millis,
    /// The period's kind (fixed while the period lasts).
    pub period: Period,
    /// The components, sorted by region name.
    components: Vec<Component>,
}

impl RegionCounts {
    /// Empty counts for the period of kind `period` ending at `end`.
    pub fn new(period: Period, end: Millis) -> RegionCounts {
        RegionCounts {
            end,
            period,
            components: Vec::new(),
        }
    }

    /// The components, sorted by region name.
    pub fn components(&self) -> &[Component] {
        &self.components
    }

    /// The sum of every component's count.
    pub fn total(&self) -> u64 {
        self.components
            .iter()
            .fold(0u64, |sum, c| sum.saturating_add(c.count()))
    }

    /// The component of `region`, if any.
    pub fn component(&self, region: &RegionName) -> Option<&Component> {
        self.find(region).ok().map(|i| &self.components[i])
    }

    fn find(&self, region: &RegionName) -> Result<usize, usize> {
        self.components.binary_search_by(|c| c.region.cmp(region))
    }

    /// The component of `region`, inserted as `(0, 0)` when absent (the
    /// caller makes it grow), or `None` when the set is full.
    fn component_mut(&mut self, region: &RegionName) -> Option<&mut Component> {
        let i = match self.find(region) {
            Ok(i) => i,
            Err(i) if self.components.len() < MAX_REGIONS => {
                let fresh = Component {
                    region: *region,
                    added: 0,
                    refunded: 0,
                };
                self.components.insert(i, fresh);
                i
            }
            Err(_) => return None,
        };
        self.components.get_mut(i)
    }

    /// Count `cost` more points on `local`'s component, up to the legal
    /// bound; whether it changed.
    pub fn charge(&mut self, local: &RegionName, cost: u64) -> bool {
        if cost == 0 {
            return false;
        }
        let Some(c) = self.component_mut(local) else {
            return false;
        };
        // `cost > 0`: the component is not left `(0, 0)`, unless it
        // already was at the bound.
        let before = c.added;
        c.added = c.added.saturating_add(cost).min(MAX_COMPONENT);
        c.added != before
    }

    /// Give back up to `points` of `local`'s own count; the points given.
    pub fn refund(&mut self, local: &RegionName, points: u64) -> u64 {
        let Ok(i) = self.find(local) else {
            return 0;
        };
        let c = &mut self.components[i];
        let given = points.min(c.count());
        c.refunded += given;
        given
    }

    /// Merge `incoming` components (legal, of this period) by maximum;
    /// how many of them made a component grow.
    pub fn merge(&mut self, incoming: &[Component]) -> usize {
        let mut grown = 0;
        for inc in incoming {
            if inc.added == 0 {
                continue;
            }
            let Some(c) = self.component_mut(&inc.region) else {
                continue;
            };
            let next = (c.added.max(inc.added), c.refunded.max(inc.refunded));
            if next != (c.added, c.refunded) {
                (c.added, c.refunded) = next;
                grown += 1;
            }
        }
        grown
    }
}

/// Whether `end` is the end of a period of kind `period`.
pub fn is_period_end(period: Period, end: Millis) -> bool {
    period_bounds(period, end.saturating_sub(1)).1 == end
}

/// Whether a merge may name `end` at `now`: the end of a `period`, at most
/// the end of the period after the current one (a region whose clock is a
/// little ahead at the turn of a period).
pub fn is_acceptable_end(period: Period, end: Millis, now: Millis) -> bool {
    let current = period_bounds(period, now).1;
    let next = period_bounds(period, current).1;
    is_period_end(period, end) && end <= next
}

/// The components of one `RL.REGION MERGE`, checked: legal values, no
/// region twice.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Merge {
    /// The period kind named.
    pub period: Period,
    /// The period end named (accepted by [`is_acceptable_end`]).
    pub end: Millis,
    /// The components.
    pub components: ArrayVec<Component, MAX_REGIONS>,
}

/// Apply `merge` at `now` to a key's counts (`None`: none yet, or none
/// live); how many components grew. The same period merges; any other
/// changes nothing while the key's period runs (an earlier or past one,
/// and a later one: a region whose clock is ahead at the turn sends the
/// next period's count before this server reaches it, and the running
/// period's counts, the local one above all, still decide until then);
/// once the key's period is over, a later one creates the counts anew.
pub fn merge(state: &mut Option<Box<RegionCounts>>, m: &Merge, now: Millis) -> usize {
    if m.end <= now {
        return 0;
    }
    match state {
        Some(s) if now < s.end && m.end != s.end => 0,
        Some(s) if now < s.end => s.merge(&m.components),
        _ => {
            let mut fresh = RegionCounts::new(m.period, m.end);
            let grown = fresh.merge(&m.components);
            if grown > 0 {
                *state = Some(Box::new(fresh));
            }
            grown
        }
    }
}

/// Whether `record` may take a merge of `period` at `now` (see
/// [`RegionalQuota::conflict`]).
pub fn merge_conflict(record: &Record, period: Period, now: Millis) -> Option<Conflict> {
    regional_conflict(record, period, now)
}

/// A key holding a live plain count, or live counts of another period
/// kind.
fn regional_conflict(record: &Record, period: Period, now: Millis) -> Option<Conflict> {
    if record
        .part::<QuotaState>()
        .is_some_and(|q| q.counts_until(now).is_some())
    {
        return Some(Conflict::Plain);
    }
    match record.part::<Box<RegionCounts>>() {
        Some(r) if now < r.end && r.period != period => Some(Conflict::Period(r.period)),
        _ => None,
    }
}

/// Regional counts matter until their period ends.
impl Part for RegionCounts {
    fn is_valid(&self) -> bool {
        !self.components.is_empty()
            && self.components.len() <= MAX_REGIONS
            && self.components.iter().all(|c| c.added > 0 && c.is_legal())
            && self
                .components
                .windows(2)
                .all(|w| w[0].region < w[1].region)
            && is_period_end(self.period, self.end)
    }

    fn since_version(&self) -> u8 {
        7
    }

    fn retain(&mut self, now: Millis) -> Option<Millis> {
        (now < self.end).then_some(self.end.min(MANUAL - 1))
    }

    fn is_plausible(&self, now: Millis) -> bool {
        within_reach(self.end, now)
    }

    fn heap_bytes(&self, allocated: &dyn Fn(*const u8) -> usize) -> usize {
        if self.components.capacity() == 0 {
            0
        } else {
            allocated(self.components.as_ptr().cast())
        }
    }
}

/// The parameters of one key in an `RL.QUOTA ... REGION` call: the quota
/// and this server's region.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RegionalQuota {
    /// The limit and period.
    pub quota: Quota,
    /// The region whose component this call changes.
    pub local: RegionName,
}

/// A regional quota reads the total of its live counts, charges and
/// refunds the local component only, and keeps its period end and kind
/// while they last.
impl Limiter for RegionalQuota {
    type State = Box<RegionCounts>;
    type Seen = QuotaSeen;
    const CHECKS_RECORD: bool = true;
    const CHANGE_EVENT: Option<&'static std::ffi::CStr> = Some(c"rl.quota.region");

    fn limit(&self) -> u64 {
        self.quota.limit
    }

    /// The counts last until the end of their period.
    fn steady_expiry(&self) -> bool {
        true
    }

    fn see(&self, state: Option<&Box<RegionCounts>>, now: Millis) -> QuotaSeen {
        match state {
            Some(s) if now < s.end => QuotaSeen {
                count: s.total(),
                end: s.end,
            },
            _ => QuotaSeen {
                count: 0,
                end: period_bounds(self.quota.period, now).1,
            },
        }
    }

    fn fits(&self, seen: &QuotaSeen, cost: u64) -> bool {
        self.quota.fits(seen, cost)
    }

    fn wait_ms(
        &self,
        _: Option<&Box<RegionCounts>>,
        seen: &QuotaSeen,
        cost: u64,
        now: Millis,
    ) -> i64 {
        self.quota.wait_ms(None, seen, cost, now)
    }

    fn balance(&self, seen: &QuotaSeen) -> i64 {
        self.quota.balance(seen)
    }

    fn reset_ms(&self, _: Option<&Box<RegionCounts>>, seen: &QuotaSeen, now: Millis) -> i64 {
        self.quota.reset_ms(None, seen, now)
    }

    fn charge(
        &self,
        state: &mut Option<Box<RegionCounts>>,
        seen: &QuotaSeen,
        cost: u64,
        now: Millis,
    ) -> QuotaSeen {
        let counts = match state {
            Some(s) if now < s.end => s,
            _ => state.insert(Box::new(RegionCounts::new(self.quota.period, seen.end))),
        };
        counts.charge(&self.local, cost);
        QuotaSeen {
            count: counts.total(),
            end: counts.end,
        }
    }

    fn refund(
        &self,
        state: &mut Box<RegionCounts>,
        seen: &QuotaSeen,
        points: u64,
        now: Millis,
    ) -> QuotaSeen {
        if now < state.end {
            state.refund(&self.local, points);
            return QuotaSeen {
                count: state.total(),
                end: state.end,
            };
        }
        *seen
    }

    fn rewrite(&self, _: &mut Box<RegionCounts>, _: &QuotaSeen, _: Millis) -> bool {
        false
    }

    fn conflict(&self, record: &Record, now: Millis) -> Option<Conflict> {
        regional_conflict(record, self.quota.period, now)
    }
}

#[cfg(test)]
#[path = "region_tests.rs"]
mod tests;
