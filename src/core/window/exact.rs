//! The exact sliding log of `RL.WINDOW ... EXACT`: reading a stored log
//! ([`Log`]) under a call's window, and the log's compact encoding.

use std::fmt;

use serde::de::{self, SeqAccess, Visitor};
use serde::ser::SerializeSeq;
use serde::{Deserializer, Serializer};

use super::log::Log;
use super::{Entry, Shape, WindowSeen};
use crate::core::limits::MAX_EXACT_LIMIT;
use crate::core::time::{clamp_i64, Millis};

/// An exact log as read under a call's window: the entries of a stored log
/// that still count (their times shifted by `shift`), or one carried lump.
#[derive(Clone, Copy)]
pub(super) enum ExactView<'a> {
    /// Nothing counts.
    Empty,
    /// The entries of `log` from the `from`-th on; each counts for `w`
    /// after `at + shift`.
    Log {
        log: &'a Log,
        from: usize,
        shift: i128,
    },
    /// One entry: the points a foreign state counted, carried over.
    Lump(Entry),
}

impl<'a> ExactView<'a> {
    /// The entries of `log` that count at `now` when each counts for
    /// `w` after `at + shift`. Entries are sorted, so those are a suffix.
    pub(super) fn native(log: &'a Log, w: i128, shift: i128, now: Millis) -> ExactView<'a> {
        let from = log.first_live(w, shift, now);
        if from >= log.len() {
            return ExactView::Empty;
        }
        ExactView::Log { log, from, shift }
    }

    /// The entries as stored under the call's window (times shifted).
    pub(super) fn to_log(self) -> Log {
        match self {
            ExactView::Empty => Log::default(),
            ExactView::Lump(e) => Log::from(vec![e]),
            ExactView::Log { log, from, shift } => log
                .entries()
                .skip(from)
                .map(|e| Entry {
                    at: clamp_i64(i128::from(e.at) + shift),
                    cost: e.cost,
                })
                .collect(),
        }
    }

    /// The points counted and the expiry of the last entry (when none
    /// counts any more); `None` when nothing counts.
    pub(super) fn total(self, w: i128) -> Option<(u64, i128)> {
        let (count, last) = match self {
            ExactView::Empty => return None,
            ExactView::Lump(e) => (e.cost, i128::from(e.at) + w),
            ExactView::Log { log, from, shift } => {
                let last = log.last()?;
                (log.total_from(from), i128::from(last.at) + shift + w)
            }
        };
        (count > 0).then_some((count, last))
    }

    /// The expiry of the first entry by which at least `points` points
    /// have stopped counting (oldest first); `None` when they never do.
    pub(super) fn freed_by(self, w: i128, points: u64) -> Option<i128> {
        match self {
            ExactView::Empty => None,
            ExactView::Lump(e) => (e.cost >= points).then(|| i128::from(e.at) + w),
            ExactView::Log { log, from, shift } => {
                let j = log.first_reaching(from, points)?;
                log.at(j).map(|at| i128::from(at) + shift + w)
            }
        }
    }

    pub(super) fn seen(self, w: i128, now: Millis) -> WindowSeen {
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

/// The compact encoding of a log: a flat array of unsigned integers,
/// `[at_0 as u64, cost_0, at_1 - at_0, cost_1, ...]` (differences taken
/// with wrapping arithmetic, exact for a strictly increasing log).
pub(super) mod log_codec {
    use super::*;

    pub fn serialize<S: Serializer>(log: &Log, s: S) -> Result<S::Ok, S::Error> {
        let mut seq = s.serialize_seq(Some(log.len().saturating_mul(2)))?;
        let mut prev = 0i64;
        for (i, e) in log.entries().enumerate() {
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

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Log, D::Error> {
        d.deserialize_seq(LogVisitor)
    }

    struct LogVisitor;

    impl<'de> Visitor<'de> for LogVisitor {
        type Value = Log;

        fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
            f.write_str("a flat array of (time, cost) pairs")
        }

        fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Log, A::Error> {
            let cap = MAX_EXACT_LIMIT as usize;
            let mut log = Log::default();
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
                log.push_back(Entry { at, cost });
                prev = at;
            }
            Ok(log)
        }
    }
}
