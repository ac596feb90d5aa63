//! A patch: the replicated payload of a call that left some parts of a
//! key's record as they were. It carries the parts the call may have
//! changed and marks the others "unchanged": the replica keeps its own
//! copy of those, so a call's replicated bytes and encode work do not grow
//! with a large part it did not touch (an `EXACT` window log, a lease set).
//!
//! Layout: the marker byte [`PATCH_MARKER`] (distinct from every payload
//! version, which counts parts), then a MessagePack array `[version, now,
//! unchanged, part...]`: the payload version whose parts follow, the
//! master's time of the call (ms), the mask of unchanged parts (bit `i`:
//! the `i`-th part in encoding order), then every part of that version in
//! encoding order, an unchanged one as nil. Only canonical bytes decode.
//!
//! Applying it ([`Patch::apply_onto`]): the sent parts replace the base's,
//! the unchanged parts come from the base, then the record is pruned at
//! the master's `now` (the master pruned the unchanged parts at that time
//! before it encoded, and pruning is deterministic), so a replica holding
//! the master's previous state ends with exactly the master's bytes. A
//! base that lacks an unchanged part (the key missing on the replica, or
//! holding another type, which cannot happen while the replica follows
//! the master) leaves that part absent: the key gets the sent parts.
//! Patches only travel in `RL.APPLY`; RDB, AOF rewrite and `DUMP` always
//! hold whole records ([`super::codec`]).

use serde::{Serialize, Serializer};

use super::codec::{CodecError, PAYLOAD_VERSION};
use super::part::MAX_AHEAD_MS;
use super::record::{PartMask, Record};
use super::time::Millis;

/// The first byte of a patch.
pub const PATCH_MARKER: u8 = 0xD0;

/// A decoded patch.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Patch {
    /// The master's time of the call (ms).
    pub now: Millis,
    /// The parts the replica keeps as it holds them.
    pub unchanged: PartMask,
    /// The parts sent (the unchanged ones absent).
    pub sent: Record,
}

/// A record laid out as a patch.
struct AsPatch<'a>(&'a Record, Millis, PartMask, u8);

impl Serialize for AsPatch<'_> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        self.0.serialize_patch(self.3, self.1, self.2, serializer)
    }
}

/// Append to `out` the patch of `record` (already pruned at `now`) that
/// leaves the `unchanged` parts to the replica.
pub fn encode_patch_append(record: &Record, unchanged: PartMask, now: Millis, out: &mut Vec<u8>) {
    append_patch(record, unchanged, now, PAYLOAD_VERSION, out);
}

fn append_patch(record: &Record, unchanged: PartMask, now: Millis, version: u8, out: &mut Vec<u8>) {
    out.push(PATCH_MARKER);
    // Writing into a Vec cannot fail for these plain types.
    let _ = rmp_serde::encode::write(out, &AsPatch(record, now, unchanged, version));
}

/// Whether `bytes` is a patch (rather than a whole-record payload).
pub fn is_patch(bytes: &[u8]) -> bool {
    bytes.first() == Some(&PATCH_MARKER)
}

/// Decode a patch received at the server time `server_now`: canonical
/// bytes, a known version, an unchanged mask within its parts, sent parts
/// that are valid and plausible, and a `now` no legal master could be at
/// (far ahead of this server's clock) is refused.
pub fn decode_patch(bytes: &[u8], server_now: Millis) -> Result<Patch, CodecError> {
    let (&marker, body) = bytes.split_first().ok_or(CodecError::UnknownVersion)?;
    if marker != PATCH_MARKER {
        return Err(CodecError::UnknownVersion);
    }
    let mut de = rmp_serde::Deserializer::from_read_ref(body);
    let (version, now, unchanged, sent) =
        Record::deserialize_patch(&mut de).map_err(|_| CodecError::Malformed)?;
    if version == 0 || version > PAYLOAD_VERSION {
        return Err(CodecError::UnknownVersion);
    }
    let parts = Record::parts_in(version) as u32;
    let within = parts >= 32 || unchanged.bits() >> parts == 0;
    let mut canonical = Vec::with_capacity(bytes.len());
    append_patch(&sent, unchanged, now, version, &mut canonical);
    let plausible_now = now >= 0 && now <= server_now.saturating_add(MAX_AHEAD_MS as Millis);
    if !within
        || !plausible_now
        || canonical != bytes
        || !sent.is_valid()
        || !sent.fits_version(version)
        || !sent.is_plausible(server_now)
    {
        return Err(CodecError::Malformed);
    }
    Ok(Patch {
        now,
        unchanged,
        sent,
    })
}

impl Patch {
    /// The record the patch makes of `base` (the replica's record of the
    /// key, or an empty one when it holds none): see the module doc.
    pub fn apply_onto(self, base: Record) -> Record {
        let mut record = self.sent;
        record.keep_unchanged(base, self.unchanged);
        record.prune(self.now);
        record.clear_touched();
        record
    }
}

#[cfg(test)]
#[path = "patch_tests.rs"]
mod tests;
