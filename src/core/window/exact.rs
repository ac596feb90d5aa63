//! The exact sliding log of `RL.WINDOW ... EXACT`: reading a stored log
//! under a call's window, adding an entry in place, and the log's compact
//! encoding.

use std::fmt;

use serde::de::{self, SeqAccess, Visitor};
use serde::ser::SerializeSeq;
use serde::{Deserializer, Serializer};

use super::{Entry, Shape, WindowSeen};
use crate::core::limits::MAX_EXACT_LIMIT;
use crate::core::time::{clamp_i64, Millis};

/// An exact log as read under a call's window: the entries that still count
/// (their times shifted by `shift`), or one carried lump.
pub(super) struct ExactView<'a> {
    pub(super) log: &'a [Entry],
    pub(super) shift: i128,
    pub(super) lump: Option<Entry>,
}

impl<'a> ExactView<'a> {
    pub(super) const EMPTY: ExactView<'static> = ExactView {
        log: &[],
        shift: 0,
        lump: None,
    };

    /// The entries of `log` that count at `now` when each counts for
    /// `w` after `at + shift`. Entries are sorted, so those are a suffix.
    pub(super) fn native(log: &'a [Entry], w: i128, shift: i128, now: Millis) -> ExactView<'a> {
        let now = i128::from(now);
        let dead = log.partition_point(|e| i128::from(e.at) + shift + w <= now);
        ExactView {
            log: log.get(dead..).unwrap_or(&[]),
            shift,
            lump: None,
        }
    }

    /// `(expiry, cost)` of every entry, in order: the entry counts while
    /// `now < expiry`.
    pub(super) fn entries(&self, w: i128) -> impl Iterator<Item = (i128, u64)> + '_ {
        let shift = self.shift;
        self.log
            .iter()
            .map(move |e| (i128::from(e.at) + shift + w, e.cost))
            .chain(self.lump.map(|e| (i128::from(e.at) + w, e.cost)))
    }

    /// The entries as stored under the call's window (times shifted).
    pub(super) fn to_log(&self) -> Vec<Entry> {
        let mut log = Vec::with_capacity(self.log.len() + usize::from(self.lump.is_some()));
        let shifted = self.log.iter().map(|e| Entry {
            at: clamp_i64(i128::from(e.at) + self.shift),
            cost: e.cost,
        });
        for entry in shifted.chain(self.lump) {
            push_merged(&mut log, entry);
        }
        log
    }

    /// The points counted and the expiry of the last entry (when none
    /// counts any more); `None` when nothing counts.
    pub(super) fn total(&self, w: i128) -> Option<(u64, i128)> {
        let mut count = 0u64;
        let mut last = None;
        for (expiry, cost) in self.entries(w) {
            count = count.saturating_add(cost);
            last = Some(expiry);
        }
        last.filter(|_| count > 0).map(|last| (count, last))
    }

    pub(super) fn seen(&self, w: i128, now: Millis) -> WindowSeen {
        match self.total(w) {
            Some((count, last)) => WindowSeen {
                count,
                empty_in: clamp_i64(last - i128::from(now)).max(0),
                shape: Shape::Exact,
            },
            None => WindowSeen::default(),
        }
    }
}

/// Append `entry` to a sorted log, merging it into the last entry when it is
/// not later (which counts its points at least as long).
fn push_merged(log: &mut Vec<Entry>, entry: Entry) {
    match log.last_mut() {
        Some(last) if last.at >= entry.at => last.cost = last.cost.saturating_add(entry.cost),
        _ => log.push(entry),
    }
}

/// Add `cost` points admitted at `now` to a sorted log (merged with an entry
/// of the same millisecond), then merge the oldest entries while the log is
/// longer than [`MAX_EXACT_LIMIT`].
pub(super) fn add_entry(log: &mut Vec<Entry>, now: Millis, cost: u64) {
    if cost == 0 {
        return;
    }
    match log.binary_search_by_key(&now, |e| e.at) {
        Ok(i) => {
            if let Some(e) = log.get_mut(i) {
                e.cost = e.cost.saturating_add(cost);
            }
        }
        Err(i) => log.insert(i, Entry { at: now, cost }),
    }
    let cap = MAX_EXACT_LIMIT as usize;
    if log.len() > cap {
        let extra = log.len() - cap;
        let merged = log
            .iter()
            .take(extra)
            .fold(0u64, |sum, e| sum.saturating_add(e.cost));
        if let Some(keep) = log.get_mut(extra) {
            keep.cost = keep.cost.saturating_add(merged);
        }
        log.drain(..extra);
    }
}

/// The compact encoding of a log: a flat array of unsigned integers,
/// `[at_0 as u64, cost_0, at_1 - at_0, cost_1, ...]` (differences taken
/// with wrapping arithmetic, exact for a strictly increasing log).
pub(super) mod log_codec {
    use super::*;

    pub fn serialize<S: Serializer>(log: &[Entry], s: S) -> Result<S::Ok, S::Error> {
        let mut seq = s.serialize_seq(Some(log.len().saturating_mul(2)))?;
        let mut prev = 0i64;
        for (i, e) in log.iter().enumerate() {
            let t = if i == 0 {
                e.at
            } else {
                e.at.wrapping_sub(prev)
            };
            seq.serialize_element(&t.cast_unsigned())?;
            seq.serialize_element(&e.cost)?;
            prev = e.at;
        }
        seq.end()
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<Entry>, D::Error> {
        d.deserialize_seq(LogVisitor)
    }

    struct LogVisitor;

    impl<'de> Visitor<'de> for LogVisitor {
        type Value = Vec<Entry>;

        fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
            f.write_str("a flat array of (time, cost) pairs")
        }

        fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Vec<Entry>, A::Error> {
            let cap = MAX_EXACT_LIMIT as usize;
            // A hostile length prefix must not reserve memory.
            let mut log = Vec::with_capacity(seq.size_hint().unwrap_or(0).min(2 * cap) / 2);
            let mut prev = 0i64;
            while let Some(t) = seq.next_element::<u64>()? {
                let cost = seq
                    .next_element::<u64>()?
                    .ok_or_else(|| de::Error::custom("a log time without its cost"))?;
                if log.len() >= cap {
                    return Err(de::Error::custom("a log longer than MAX_EXACT_LIMIT"));
                }
                let at = if log.is_empty() {
                    t.cast_signed()
                } else {
                    prev.wrapping_add(t.cast_signed())
                };
                log.push(Entry { at, cost });
                prev = at;
            }
            Ok(log)
        }
    }
}
