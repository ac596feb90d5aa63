//! What one RL key holds: the registry of its parts. Each part is present
//! only while it matters; the list below is the one place that names them,
//! in encoding order with the payload version that added each.
//!
//! Adding a part: a file with its state implementing [`Part`] (and serde),
//! then one line in `parts!` below (the next payload version, see
//! [`super::codec`]); a limiter's state is reached by type, with
//! [`Holds`].

use serde::de::{self, SeqAccess, Visitor};
use serde::ser::SerializeTuple;
use serde::{Deserializer, Serializer};

use super::bucket::Bucket;
use super::distinct::{DistinctChange, DistinctState};
use super::lease::{LeaseChange, Leases};
use super::part::{Part, PartMask};
use super::patch_plan::{LogCharge, PatchPlan};
use super::penalty::{Penalty, MANUAL};
use super::quota::QuotaState;
use super::region::RegionCounts;
use super::time::Millis;
use super::window::WindowState;

/// Access to one kind of part of a [`Record`], by its type.
pub trait Holds<T> {
    /// The part, if the record holds it.
    fn get(&self) -> Option<&T>;
    /// The part's slot where it lives, to change in place; `None` when
    /// there is no room for it without an allocation (then change a copy
    /// and [`Holds::set`] it).
    fn slot(&mut self) -> Option<&mut Option<T>>;
    /// Replace the part (`None` removes it).
    fn set(&mut self, part: Option<T>);
}

/// How long a key must be kept.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Retention {
    /// Nothing in it matters any more: delete the key.
    Delete,
    /// Keep it until this absolute time (ms), then let it expire.
    Until(Millis),
    /// Keep it without a TTL (a manual box).
    Forever,
}

/// Declares [`Record`] from its parts: `inline` parts are fields of the
/// record itself (the common ones: a bucket-only key is one allocation);
/// `other` parts share one allocation, absent while none of them is there.
/// Encoding order is the order of the lines, inline parts first; `= N` is
/// the payload version that added the part.
macro_rules! parts {
    (
        inline { $($iname:ident: $ity:ty = $iver:literal,)* }
        other { $($oname:ident: $oty:ty = $over:literal,)* }
    ) => {
        /// The value of one key of the module type.
        #[derive(Clone, Debug, Default, PartialEq, Eq)]
        pub struct Record {
            $(
                #[doc = concat!("The `", stringify!($iname), "` part.")]
                pub $iname: Option<$ity>,
            )*
            /// The other parts; `None` when all of them are (never an
            /// allocation holding nothing).
            others: Option<Box<Others>>,
        }

        /// The position of each part in encoding order (its bit in a
        /// [`PartMask`]).
        #[allow(non_camel_case_types)]
        #[derive(Clone, Copy)]
        enum PartIndex {
            $($iname,)*
            $($oname,)*
        }

        /// The parts of a [`Record`] that only some keys hold.
        #[derive(Clone, Debug, Default, PartialEq, Eq)]
        struct Others {
            $($oname: Option<$oty>,)*
            /// The other parts reached for writing since the last commit
            /// (kept here, not in the record, so a bucket-only record is
            /// as small as its parts).
            touched: Touched,
        }

        impl Others {
            fn is_empty(&self) -> bool {
                true $(&& self.$oname.is_none())*
            }
        }

        $(
            impl Holds<$ity> for Record {
                fn get(&self) -> Option<&$ity> {
                    self.$iname.as_ref()
                }
                fn slot(&mut self) -> Option<&mut Option<$ity>> {
                    Some(&mut self.$iname)
                }
                fn set(&mut self, part: Option<$ity>) {
                    self.$iname = part;
                }
            }
        )*

        $(
            impl Holds<$oty> for Record {
                fn get(&self) -> Option<&$oty> {
                    self.others.as_ref()?.$oname.as_ref()
                }
                fn slot(&mut self) -> Option<&mut Option<$oty>> {
                    self.others.as_deref_mut().map(|o| {
                        o.touched.0.insert(PartIndex::$oname as u32);
                        &mut o.$oname
                    })
                }
                fn set(&mut self, part: Option<$oty>) {
                    match (self.others.as_deref_mut(), part) {
                        (Some(others), part) => {
                            others.touched.0.insert(PartIndex::$oname as u32);
                            others.$oname = part;
                        }
                        (None, None) => {}
                        (None, part) => {
                            let mut others = Others {
                                $oname: part,
                                ..Others::default()
                            };
                            others.touched.0.insert(PartIndex::$oname as u32);
                            self.others = Some(Box::new(others));
                        }
                    }
                    self.drop_empty_others();
                }
            }
        )*

        impl Record {
            /// How many parts a payload of `version` holds.
            pub(crate) fn parts_in(version: u8) -> usize {
                0 $(+ usize::from($iver <= version))* $(+ usize::from($over <= version))*
            }

            /// Whether every part satisfies its invariants.
            pub fn is_valid(&self) -> bool {
                true
                    $(&& self.$iname.as_ref().is_none_or(Part::is_valid))*
                    && self.others.as_deref().is_none_or(|o| {
                        !o.is_empty() $(&& o.$oname.as_ref().is_none_or(Part::is_valid))*
                    })
            }

            /// Whether every part is one a legal call could have written by
            /// `now` ([`Part::is_plausible`]).
            pub fn is_plausible(&self, now: Millis) -> bool {
                true
                    $(&& self.$iname.as_ref().is_none_or(|p| p.is_plausible(now)))*
                    && self.others.as_deref().is_none_or(|o| {
                        true $(&& o.$oname.as_ref().is_none_or(|p| p.is_plausible(now)))*
                    })
            }

            /// Whether a payload of `version` can hold every part as it is.
            pub(crate) fn fits_version(&self, version: u8) -> bool {
                true
                    $(&& self.$iname.as_ref().is_none_or(|p| p.since_version() <= version))*
                    && self.others.as_deref().is_none_or(|o| {
                        true $(&& o.$oname.as_ref().is_none_or(|p| p.since_version() <= version))*
                    })
            }

            /// Drop the parts that no longer matter at `now`, and say how
            /// long the rest must be kept.
            pub fn prune(&mut self, now: Millis) -> Retention {
                let mut until: Option<Millis> = None;
                $(until = until.max(retain(&mut self.$iname, now));)*
                if let Some(o) = self.others.as_deref_mut() {
                    $(until = until.max(retain(&mut o.$oname, now));)*
                }
                self.drop_empty_others();
                match until {
                    None => Retention::Delete,
                    Some(MANUAL) => Retention::Forever,
                    Some(t) => Retention::Until(t),
                }
            }

            /// Bytes this record holds on the heap beyond the record itself.
            /// `allocated` gives the allocator's size of the allocation at an
            /// address (its size class, not the size asked for).
            pub fn heap_bytes(&self, allocated: impl Fn(*const u8) -> usize) -> usize {
                let mut bytes = 0;
                $(bytes += self.$iname.as_ref().map_or(0, |p| Part::heap_bytes(p, &allocated));)*
                if let Some(o) = self.others.as_deref() {
                    bytes += allocated(std::ptr::from_ref(o).cast());
                    $(bytes += o.$oname.as_ref().map_or(0, |p| Part::heap_bytes(p, &allocated));)*
                }
                bytes
            }

            /// Tell every part it is now as committed ([`Part::mark_committed`]).
            fn mark_parts_committed(&mut self) {
                $(if let Some(p) = self.$iname.as_mut() { p.mark_committed(); })*
                if let Some(o) = self.others.as_deref_mut() {
                    $(if let Some(p) = o.$oname.as_mut() { p.mark_committed(); })*
                }
            }

            /// Write the parts a payload of `version` holds, as one
            /// MessagePack array in encoding order.
            pub(crate) fn serialize_version<S: Serializer>(
                &self,
                version: u8,
                serializer: S,
            ) -> Result<S::Ok, S::Error> {
                let mut fields = serializer.serialize_tuple(Record::parts_in(version))?;
                $(if $iver <= version {
                    fields.serialize_element(&self.$iname)?;
                })*
                $(if $over <= version {
                    fields.serialize_element(&Holds::<$oty>::get(self))?;
                })*
                fields.end()
            }

            /// The parts present.
            pub(crate) fn present(&self) -> PartMask {
                let mut mask = PartMask::NONE;
                $(if self.$iname.is_some() {
                    mask.insert(PartIndex::$iname as u32);
                })*
                if let Some(o) = self.others.as_deref() {
                    $(if o.$oname.is_some() {
                        mask.insert(PartIndex::$oname as u32);
                    })*
                }
                mask
            }

            /// The other parts present and not reached for writing since
            /// [`Record::clear_touched`]: a patch may leave them unchanged.
            /// (The inline parts are plain fields, so never in it.)
            pub fn untouched_present(&self) -> PartMask {
                let mut mask = PartMask::NONE;
                if let Some(o) = self.others.as_deref() {
                    $(if o.$oname.is_some() && !o.touched.0.contains(PartIndex::$oname as u32) {
                        mask.insert(PartIndex::$oname as u32);
                    })*
                }
                mask
            }

            /// Write a patch body as a MessagePack array: `version`,
            /// `now`, the `unchanged` mask, then the parts `version` lays
            /// out, each unchanged one as nil, then the log charge if any.
            pub(crate) fn serialize_patch<S: Serializer>(
                &self,
                version: u8,
                now: Millis,
                plan: &PatchPlan,
                serializer: S,
            ) -> Result<S::Ok, S::Error> {
                let unchanged = plan.unchanged;
                // The edits in order (log, lease, member set), up to the
                // last one there, the others before it as nil.
                let edits = if plan.distinct.is_some() {
                    3
                } else if plan.lease.is_some() {
                    2
                } else {
                    usize::from(plan.log.is_some())
                };
                let len = 3 + Record::parts_in(version) + edits;
                let mut fields = serializer.serialize_tuple(len)?;
                fields.serialize_element(&version)?;
                fields.serialize_element(&now)?;
                fields.serialize_element(&unchanged.bits())?;
                $(if $iver <= version {
                    let sent = !unchanged.contains(PartIndex::$iname as u32);
                    fields.serialize_element(&self.$iname.as_ref().filter(|_| sent))?;
                })*
                $(if $over <= version {
                    let sent = !unchanged.contains(PartIndex::$oname as u32);
                    fields.serialize_element(&Holds::<$oty>::get(self).filter(|_| sent))?;
                })*
                if edits > 0 {
                    fields.serialize_element(&plan.log)?;
                }
                if edits > 1 {
                    fields.serialize_element(&plan.lease)?;
                }
                if let Some(distinct) = &plan.distinct {
                    fields.serialize_element(distinct)?;
                }
                fields.end()
            }

            /// Read a patch body written by [`Record::serialize_patch`]:
            /// `(version, now, unchanged, the parts sent, the log charge)`.
            pub(crate) fn deserialize_patch<'de, D: Deserializer<'de>>(
                deserializer: D,
            ) -> Result<PatchBody, D::Error> {
                struct PatchVisitor;
                impl<'de> Visitor<'de> for PatchVisitor {
                    type Value = PatchBody;
                    fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                        f.write_str("a patch of record parts")
                    }
                    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
                        let version: u8 = required(&mut seq)?;
                        let now: Millis = required(&mut seq)?;
                        let unchanged = PartMask::from_bits(required(&mut seq)?);
                        let mut record = Record::default();
                        $(if $iver <= version {
                            record.$iname = required::<Option<$ity>, _>(&mut seq)?;
                        })*
                        $(if $over <= version {
                            let part = required::<Option<$oty>, _>(&mut seq)?;
                            Holds::<$oty>::set(&mut record, part);
                        })*
                        let log = seq.next_element::<Option<LogCharge>>()?.flatten();
                        let lease = seq.next_element::<Option<LeaseChange>>()?.flatten();
                        let distinct = seq.next_element::<DistinctChange>()?;
                        if seq.next_element::<de::IgnoredAny>()?.is_some() {
                            return Err(de::Error::custom("more parts than the version has"));
                        }
                        record.clear_touched();
                        let plan = PatchPlan { unchanged, log, lease, distinct };
                        Ok((version, now, plan, record))
                    }
                }
                deserializer.deserialize_seq(PatchVisitor)
            }

            /// Take the `unchanged` parts from `base` (a part `base` lacks
            /// stays absent); the others stay as they are.
            pub(crate) fn keep_unchanged(&mut self, mut base: Record, unchanged: PartMask) {
                $(if unchanged.contains(PartIndex::$iname as u32) {
                    self.$iname = base.$iname.take();
                })*
                let mut others = base.others.take().map(|o| *o).unwrap_or_default();
                $(if unchanged.contains(PartIndex::$oname as u32) {
                    Holds::<$oty>::set(self, others.$oname.take());
                })*
            }

            /// Read the parts of a payload (a shorter array, from an older
            /// version, leaves the later parts empty).
            pub(crate) fn deserialize_parts<'de, D: Deserializer<'de>>(
                deserializer: D,
            ) -> Result<Record, D::Error> {
                struct PartsVisitor;
                impl<'de> Visitor<'de> for PartsVisitor {
                    type Value = Record;
                    fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                        f.write_str("an array of record parts")
                    }
                    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Record, A::Error> {
                        let mut record = Record::default();
                        $(record.$iname = seq.next_element::<Option<$ity>>()?.flatten();)*
                        $(Holds::<$oty>::set(
                            &mut record,
                            seq.next_element::<Option<$oty>>()?.flatten(),
                        );)*
                        if seq.next_element::<de::IgnoredAny>()?.is_some() {
                            return Err(de::Error::custom("more parts than this build knows"));
                        }
                        Ok(record)
                    }
                }
                deserializer.deserialize_seq(PartsVisitor)
            }
        }
    };
}

parts! {
    inline {
        bucket: Bucket = 1,
        penalty: Box<Penalty> = 1,
    }
    other {
        leases: Box<Leases> = 2,
        window: WindowState = 3,
        quota: QuotaState = 4,
        distinct: Box<DistinctState> = 6,
        regions: Box<RegionCounts> = 7,
    }
}

/// A patch body as read: `(version, now, what it leaves to the replica,
/// the parts sent)`.
pub(crate) type PatchBody = (u8, Millis, PatchPlan, Record);

/// Which other parts were reached for writing ([`Holds::slot`],
/// [`Holds::set`], [`Record::leases_or_insert`]) since the last commit:
/// bookkeeping, not state, so records that differ only in it are equal.
#[derive(Clone, Copy, Debug, Default)]
struct Touched(PartMask);

impl PartialEq for Touched {
    fn eq(&self, _: &Touched) -> bool {
        true
    }
}

impl Eq for Touched {}

/// The next element of a sequence, which must be there.
fn required<'de, T: serde::Deserialize<'de>, A: SeqAccess<'de>>(
    seq: &mut A,
) -> Result<T, A::Error> {
    seq.next_element()?
        .ok_or_else(|| de::Error::custom("a patch shorter than its version"))
}

/// [`Part::retain`] on an optional part, removing it when nothing is left.
fn retain<T: Part>(part: &mut Option<T>, now: Millis) -> Option<Millis> {
    let until = part.as_mut()?.retain(now);
    if until.is_none() {
        *part = None;
    }
    until
}

impl Record {
    /// A record holding only `bucket`.
    pub fn with_bucket(bucket: Bucket) -> Record {
        Record {
            bucket: Some(bucket),
            ..Record::default()
        }
    }

    /// The bucket, when the record holds it and nothing else (what a key
    /// may keep bare, see the adapter's module type).
    pub fn bare_bucket(&self) -> Option<Bucket> {
        match (&self.bucket, &self.penalty, &self.others) {
            (Some(bucket), None, None) => Some(*bucket),
            _ => None,
        }
    }

    /// The instant [`Record::prune`] keeps the record until, when that is a
    /// function of its state alone: it holds nothing but a window that is
    /// not a log, a quota count and regional counts (a bucket's, a
    /// penalty's, a log's or a lease's retention moves with the clock).
    /// Such a record read at any time before that instant gives the same
    /// answer, so when a call leaves it unchanged, the expiry set by the
    /// call that stored the record still stands.
    #[inline]
    pub fn steady_until(&self, now: Millis) -> Option<Millis> {
        let o = self.others.as_deref()?;
        let steady = self.bucket.is_none()
            && self.penalty.is_none()
            && o.leases.is_none()
            && o.distinct.is_none()
            && !matches!(o.window, Some(WindowState::Exact { .. }));
        if !steady {
            return None;
        }
        let window = o.window.as_ref().and_then(|w| w.counts_until(now));
        let quota = o.quota.as_ref().and_then(|q| q.counts_until(now));
        let regions = o
            .regions
            .as_ref()
            .and_then(|r| (now < r.end).then_some(r.end));
        let until = window.max(quota).max(regions)?;
        Some(until.min(MANUAL - 1))
    }

    /// The bucket and the penalty, when the record holds both and nothing
    /// else (see [`super::packed::BucketWithPenalty`]).
    pub fn bucket_and_penalty(&self) -> Option<(Bucket, &Penalty)> {
        match (&self.bucket, &self.penalty, &self.others) {
            (Some(bucket), Some(penalty), None) => Some((*bucket, penalty)),
            _ => None,
        }
    }

    /// The part of type `T`, if the record holds it.
    pub fn part<T>(&self) -> Option<&T>
    where
        Record: Holds<T>,
    {
        Holds::<T>::get(self)
    }

    /// Replace the part of type `T` (`None` removes it).
    pub fn set_part<T>(&mut self, part: Option<T>)
    where
        Record: Holds<T>,
    {
        Holds::<T>::set(self, part);
    }

    /// The `RL.LEASE` leases (never an empty set).
    pub fn leases(&self) -> Option<&Leases> {
        self.part::<Box<Leases>>().map(|l| &**l)
    }

    /// The leases to change in place, an empty set first when there are
    /// none: [`Record::prune`] removes the set if it stays empty.
    pub fn leases_or_insert(&mut self) -> &mut Leases {
        let others = self.others.get_or_insert_with(Box::default);
        others.touched.0.insert(PartIndex::leases as u32);
        others.leases.get_or_insert_with(Box::default)
    }

    /// The penalty state, or an empty one.
    pub fn penalty_or_default(&self) -> Penalty {
        self.penalty.as_deref().copied().unwrap_or_default()
    }

    /// Store `penalty`, dropping it when nothing in it is live at `now`.
    pub fn set_penalty(&mut self, mut penalty: Penalty, now: Millis) {
        match (self.penalty.as_deref_mut(), penalty.prune(now)) {
            (Some(slot), true) => *slot = penalty,
            (_, live) => self.penalty = live.then(|| Box::new(penalty)),
        }
    }

    /// Forget which parts were reached for writing and how they changed:
    /// the record as committed (and replicated) is the base of the next
    /// patch.
    pub fn clear_touched(&mut self) {
        if let Some(others) = self.others.as_deref_mut() {
            others.touched = Touched::default();
        }
        self.mark_parts_committed();
    }

    /// The window part's position in encoding order (its bit in a
    /// [`PartMask`]).
    pub(crate) const WINDOW_INDEX: usize = PartIndex::window as usize;

    /// The bucket part's position in encoding order.
    pub(crate) const BUCKET_INDEX: usize = PartIndex::bucket as usize;

    /// The regional counts' position in encoding order.
    pub(crate) const REGIONS_INDEX: usize = PartIndex::regions as usize;

    /// The leases part's position in encoding order.
    pub(crate) const LEASES_INDEX: usize = PartIndex::leases as usize;

    /// The member set's position in encoding order.
    pub(crate) const DISTINCT_INDEX: usize = PartIndex::distinct as usize;

    fn drop_empty_others(&mut self) {
        if self.others.as_deref().is_some_and(Others::is_empty) {
            self.others = None;
        }
    }
}

#[cfg(test)]
#[path = "record_tests.rs"]
mod tests;
