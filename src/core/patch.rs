//! A patch: the replicated payload of a call that left some parts of a
//! key's record as they were. It carries the parts the call may have
//! changed and marks the others "unchanged": the replica keeps its own
//! copy of those, so a call's replicated bytes and encode work do not grow
//! with a large part it did not touch (an `EXACT` window log, a lease set).
//!
//! Layout: the marker byte [`PATCH_MARKER`] (distinct from every payload
//! version, which counts parts), then a MessagePack array `[version, now,
//! unchanged, part..., (charge)]`: the payload version whose parts follow,
//! the master's time of the call (ms), the mask of unchanged parts (bit
//! `i`: the `i`-th part in encoding order), then every part of that version
//! in encoding order, an unchanged one as nil, and last the edits the
//! replica redoes on a part marked unchanged, in this order, each only
//! when it or a later one is there (nil when absent): the [`LogCharge`]
//! of an exact log the call did nothing to but charge at `now` (the points
//! of its entry at `now`), the [`LeaseChange`](super::lease::LeaseChange)
//! of a lease set in which one lease changed, the
//! [`DistinctChange`](super::distinct::DistinctChange) of a member set one
//! `RL.DISTINCT` call recorded in. So an `RL.WINDOW ... EXACT`, `RL.LEASE` or
//! `RL.DISTINCT` call replicates a few bytes per key however large its
//! part. Only canonical bytes decode.
//!
//! Applying it ([`Patch::apply_onto`]): the sent parts replace the base's,
//! the unchanged parts come from the base, a log charge is redone on the
//! base's log (its dead entries dropped at `now`, its entry at `now` made
//! to hold the points sent: what the master did), a lease or member-set
//! change is redone on the base's set, then the record is pruned at the
//! master's `now` (the master pruned the unchanged parts at that time
//! before it encoded, and pruning is deterministic), so a replica holding
//! the master's previous state ends with exactly the master's bytes. A
//! base that lacks an unchanged part (the key missing on the replica, or
//! holding another type, which cannot happen while the replica follows
//! the master) leaves that part absent: the key gets the sent parts.
//! Patches only travel in `RL.APPLY`; RDB, AOF rewrite and `DUMP` always
//! hold whole records ([`super::codec`]).

use serde::{Serialize, Serializer};

use super::distinct::DistinctState;
use super::lease::Leases;
use super::part::{within_reach, MAX_AHEAD_MS, MAX_COUNT};
use super::patch_plan::{LogCharge, PatchPlan};
use super::payload::{CodecError, PAYLOAD_VERSION};
use super::record::{Holds, Record};
use super::time::Millis;
use super::window::{LogEdit, WindowState};

/// The first byte of a patch.
pub const PATCH_MARKER: u8 = 0xD0;

/// A decoded patch.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Patch {
    /// The master's time of the call (ms).
    pub now: Millis,
    /// What the replica keeps or redoes.
    pub plan: PatchPlan,
    /// The parts sent (the unchanged ones absent).
    pub sent: Record,
}

/// A record laid out as a patch.
struct AsPatch<'a>(&'a Record, Millis, &'a PatchPlan, u8);

impl Serialize for AsPatch<'_> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        self.0.serialize_patch(self.3, self.1, self.2, serializer)
    }
}

/// Append to `out` the patch of `record` (already pruned at `now`) that
/// leaves to the replica what `plan` says.
pub fn encode_patch_append(record: &Record, plan: &PatchPlan, now: Millis, out: &mut Vec<u8>) {
    append_patch(record, plan, now, PAYLOAD_VERSION, out);
}

fn append_patch(record: &Record, plan: &PatchPlan, now: Millis, version: u8, out: &mut Vec<u8>) {
    out.push(PATCH_MARKER);
    // Writing into a Vec cannot fail for these plain types.
    let _ = rmp_serde::encode::write(out, &AsPatch(record, now, plan, version));
}

/// Whether `bytes` is a patch (rather than a whole-record payload).
pub fn is_patch(bytes: &[u8]) -> bool {
    bytes.first() == Some(&PATCH_MARKER)
}

/// Decode a patch received at the server time `server_now`: canonical
/// bytes, a known version, an unchanged mask within its parts, sent parts
/// that are valid and plausible, a log charge only with the window part
/// unchanged and within what a call can write; and a `now` no legal master
/// could be at (far ahead of this server's clock) is refused.
pub fn decode_patch(bytes: &[u8], server_now: Millis) -> Result<Patch, CodecError> {
    let (&marker, body) = bytes.split_first().ok_or(CodecError::UnknownVersion)?;
    if marker != PATCH_MARKER {
        return Err(CodecError::UnknownVersion);
    }
    let mut de = rmp_serde::Deserializer::from_read_ref(body);
    let (version, now, plan, sent) =
        Record::deserialize_patch(&mut de).map_err(|_| CodecError::Malformed)?;
    let unchanged = plan.unchanged;
    if version == 0 || version > PAYLOAD_VERSION {
        return Err(CodecError::UnknownVersion);
    }
    let parts = Record::parts_in(version) as u32;
    let within = parts >= 32 || unchanged.bits() >> parts == 0;
    let mut canonical = Vec::with_capacity(bytes.len());
    append_patch(&sent, &plan, now, version, &mut canonical);
    let kept =
        |index: usize| Record::parts_in(version) > index && unchanged.bits() & (1 << index) != 0;
    let log_ok = plan
        .log
        .is_none_or(|LogCharge(cost)| cost <= MAX_COUNT && kept(Record::WINDOW_INDEX));
    let lease_ok = plan.lease.as_ref().is_none_or(|change| {
        change.is_valid()
            && change.deadline.is_none_or(|d| within_reach(d, server_now))
            && kept(Record::LEASES_INDEX)
    });
    let distinct_ok = plan
        .distinct
        .as_ref()
        .is_none_or(|change| change.is_plausible(server_now) && kept(Record::DISTINCT_INDEX));
    let plausible_now = now >= 0 && now <= server_now.saturating_add(MAX_AHEAD_MS as Millis);
    if !within
        || !log_ok
        || !lease_ok
        || !distinct_ok
        || !plausible_now
        || canonical != bytes
        || !sent.is_valid()
        || !sent.fits_version(version)
        || !sent.is_plausible(server_now)
    {
        return Err(CodecError::Malformed);
    }
    Ok(Patch { now, plan, sent })
}

impl Patch {
    /// The record the patch makes of `base` (the replica's record of the
    /// key, or an empty one when it holds none): see the module doc.
    pub fn apply_onto(self, base: Record) -> Record {
        let mut record = self.sent;
        record.keep_unchanged(base, self.plan.unchanged);
        record.replay_edits(&self.plan, self.now);
        record.prune(self.now);
        record.clear_touched();
        record
    }
}

impl Record {
    /// What a patch of this record (pruned at the call's `now`, not new to
    /// the replica) may leave to the replica: the parts not reached, an
    /// exact log that was only charged at `now` (its new entry is all the
    /// patch carries, [`LogCharge`]), a lease set in which one lease
    /// changed ([`LeaseChange`](super::lease::LeaseChange)), and a member
    /// set one call recorded in
    /// ([`DistinctChange`](super::distinct::DistinctChange)).
    pub fn patch_plan(&self, now: Millis) -> PatchPlan {
        let mut unchanged = self.untouched_present();
        let log = match self.part::<WindowState>() {
            Some(WindowState::Exact { log, .. }) if log.edit() == LogEdit::ChargedAt(now) => {
                unchanged.insert(Record::WINDOW_INDEX as u32);
                Some(LogCharge(log.cost_at(now)))
            }
            _ => None,
        };
        let lease = self.leases().and_then(Leases::change).cloned();
        if lease.is_some() {
            unchanged.insert(Record::LEASES_INDEX as u32);
        }
        let distinct = self
            .part::<Box<DistinctState>>()
            .and_then(|set| set.change())
            .cloned();
        if distinct.is_some() {
            unchanged.insert(Record::DISTINCT_INDEX as u32);
        }
        PatchPlan {
            unchanged,
            log,
            lease,
            distinct,
        }
    }

    /// Redo a patch's edits at `now` on the record (the replica's, with
    /// the patch's unchanged parts in place); a part that is not there
    /// (which a replica following its master never lacks) stays absent,
    /// as a patch's unchanged parts do.
    pub(crate) fn replay_edits(&mut self, plan: &PatchPlan, now: Millis) {
        if let Some(charge) = plan.log {
            self.replay_log_charge(charge, now);
        }
        if let Some(change) = &plan.lease {
            if let Some(Some(leases)) = Holds::<Box<Leases>>::slot(self) {
                leases.replay(change);
            }
        }
        if let Some(change) = &plan.distinct {
            if let Some(Some(set)) = Holds::<Box<DistinctState>>::slot(self) {
                set.replay(change, now);
            }
        }
    }

    /// Redo a [`LogCharge`] at `now` on the record's exact log.
    fn replay_log_charge(&mut self, charge: LogCharge, now: Millis) {
        if let Some(Some(WindowState::Exact { window_ms, log })) = Holds::<WindowState>::slot(self)
        {
            log.replay_charge(i128::from((*window_ms).max(1)), now, charge.0);
        }
    }
}

#[cfg(test)]
#[path = "patch_tests.rs"]
mod tests;
