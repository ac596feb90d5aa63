//! The compact forms of the commonest small records, for the module type to
//! keep instead of a whole [`Record`] (48 bytes and a 64-byte penalty):
//! a bucket alone (32 bytes), or a bucket and a penalty in one 64-byte
//! value ([`BucketWithPenalty`]). Packing is lossless: a penalty whose
//! numbers do not fit the compact form is not packed, and its key keeps a
//! whole record.

use super::bucket::Bucket;
use super::penalty::{Penalty, MANUAL};
use super::record::Record;
use super::time::Millis;

/// The offset that stands for a deadline of 0 (none).
const NO_DEADLINE: i32 = i32::MIN;

/// A [`Penalty`] in 32 bytes: its deadlines as offsets (at most about 24
/// days) before the latest of them, its counts narrowed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(C)]
pub struct PackedPenalty {
    /// The latest deadline (0 when there is none).
    base: Millis,
    /// `strikes_until`, `offenses_until`, `box_until`, `retry_at`, each
    /// `deadline - base` (<= 0), or [`NO_DEADLINE`] for 0.
    until: [i32; 4],
    strikes: u32,
    offenses: u16,
    box_level: u8,
    /// `box_until` is [`MANUAL`] (its offset is then [`NO_DEADLINE`]).
    manual: bool,
}

impl PackedPenalty {
    /// `p` packed, or `None` when a count or the spread of its deadlines
    /// does not fit.
    pub fn pack(p: &Penalty) -> Option<PackedPenalty> {
        let manual = p.box_until == MANUAL;
        let box_until = if manual { 0 } else { p.box_until };
        let deadlines = [p.strikes_until, p.offenses_until, box_until, p.retry_at];
        let base = deadlines.iter().copied().max().unwrap_or(0).max(0);
        let mut until = [NO_DEADLINE; 4];
        for (slot, &deadline) in until.iter_mut().zip(&deadlines) {
            if deadline != 0 {
                let offset = i32::try_from(deadline.checked_sub(base)?).ok()?;
                if offset == NO_DEADLINE {
                    return None;
                }
                *slot = offset;
            }
        }
        Some(PackedPenalty {
            base,
            until,
            strikes: u32::try_from(p.strikes).ok()?,
            offenses: u16::try_from(p.offenses).ok()?,
            box_level: p.box_level,
            manual,
        })
    }

    /// The penalty packed.
    pub fn unpack(&self) -> Penalty {
        let deadline = |i: usize| match self.until[i] {
            NO_DEADLINE => 0,
            offset => self.base + Millis::from(offset),
        };
        Penalty {
            strikes: u64::from(self.strikes),
            strikes_until: deadline(0),
            offenses: u64::from(self.offenses),
            offenses_until: deadline(1),
            box_level: self.box_level,
            box_until: if self.manual { MANUAL } else { deadline(2) },
            retry_at: deadline(3),
        }
    }
}

/// A record that holds a bucket and a penalty and nothing else, in 64
/// bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(C)]
pub struct BucketWithPenalty {
    /// The bucket.
    pub bucket: Bucket,
    /// The penalty, packed.
    pub penalty: PackedPenalty,
}

impl BucketWithPenalty {
    /// `record` in this form, when it holds a bucket and a penalty that
    /// packs, and nothing else.
    pub fn of(record: &Record) -> Option<BucketWithPenalty> {
        let (bucket, penalty) = record.bucket_and_penalty()?;
        Some(BucketWithPenalty {
            bucket,
            penalty: PackedPenalty::pack(penalty)?,
        })
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    const NOW: Millis = 1_700_000_000_000;
    const DAY: Millis = 86_400_000;

    #[test]
    fn sizes() {
        assert_eq!(std::mem::size_of::<PackedPenalty>(), 32);
        assert_eq!(std::mem::size_of::<BucketWithPenalty>(), 64);
    }

    #[test]
    fn what_packs_and_what_does_not() {
        let tripped = Penalty {
            strikes: 0,
            strikes_until: NOW + 60_000,
            offenses: 1,
            offenses_until: NOW + DAY,
            box_level: 1,
            box_until: NOW + 300_000,
            retry_at: 0,
        };
        let cases = [
            ("a box of the defaults", tripped, true),
            ("nothing set", Penalty::default(), true),
            (
                "a manual box",
                Penalty {
                    box_until: MANUAL,
                    ..tripped
                },
                true,
            ),
            (
                "deadlines 24 days apart",
                Penalty {
                    strikes_until: NOW + DAY - 24 * DAY,
                    ..tripped
                },
                true,
            ),
            (
                "deadlines 25 days apart",
                Penalty {
                    strikes_until: NOW + DAY - 25 * DAY,
                    ..tripped
                },
                false,
            ),
            (
                "65,536 offenses",
                Penalty {
                    offenses: 65_536,
                    ..tripped
                },
                false,
            ),
            (
                "2^32 strikes",
                Penalty {
                    strikes: 1 << 32,
                    ..tripped
                },
                false,
            ),
        ];
        for (what, penalty, packs) in cases {
            let packed = PackedPenalty::pack(&penalty);
            assert_eq!(packed.is_some(), packs, "{what}");
            if let Some(packed) = packed {
                assert_eq!(packed.unpack(), penalty, "{what}");
            }
        }
    }

    fn deadline() -> impl Strategy<Value = Millis> {
        prop_oneof![
            Just(0),
            Just(MANUAL),
            any::<Millis>(),
            (NOW - 30 * DAY)..(NOW + 30 * DAY),
        ]
    }

    proptest! {
        #![proptest_config(crate::core::testkit::config(2000))]

        /// Whatever packs unpacks to itself, and a penalty whose deadlines
        /// are within 24 days of each other (and whose counts fit) packs.
        #[test]
        fn packing_is_lossless(
            strikes in prop_oneof![0u64..70_000, any::<u64>()],
            offenses in prop_oneof![0u64..70_000, any::<u64>()],
            box_level in 0u8..=3,
            deadlines in [deadline(), deadline(), deadline(), deadline()],
        ) {
            let p = Penalty {
                strikes,
                strikes_until: deadlines[0],
                offenses,
                offenses_until: deadlines[1],
                box_level,
                box_until: deadlines[2],
                retry_at: deadlines[3],
            };
            if let Some(packed) = PackedPenalty::pack(&p) {
                prop_assert_eq!(packed.unpack(), p);
            }
            let box_until = if p.box_until == MANUAL { 0 } else { p.box_until };
            let set: Vec<Millis> = [p.strikes_until, p.offenses_until, box_until, p.retry_at]
                .into_iter()
                .filter(|&d| d != 0)
                .collect();
            let spread = set.iter().max().zip(set.iter().min()).map_or(0, |(a, b)| a.abs_diff(*b));
            let near = set.iter().all(|&d| d > 0) && spread < 24 * DAY as u64;
            if near && strikes <= u64::from(u32::MAX) && offenses <= u64::from(u16::MAX) {
                prop_assert!(PackedPenalty::pack(&p).is_some(), "{:?}", p);
            }
        }
    }
}
