//! What a patch ([`super::patch`]) leaves to the replica: the parts it
//! keeps as they are, and the one edit it redoes on a large part (a log
//! charge, a lease change, a member set's change) instead of receiving
//! the part.

use super::distinct::DistinctChange;
use super::lease::LeaseChange;
use super::part::PartMask;

/// What a patch leaves to the replica
/// ([`Record::patch_plan`](super::record::Record::patch_plan)).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PatchPlan {
    /// The parts the replica keeps as it holds them.
    pub unchanged: PartMask,
    /// The charge to redo on the replica's exact log (its part unchanged).
    pub log: Option<LogCharge>,
    /// The one lease to set or remove in the replica's set (its part
    /// unchanged).
    pub lease: Option<LeaseChange>,
    /// The one `RL.DISTINCT` call to redo on the replica's member set (its
    /// part unchanged).
    pub distinct: Option<DistinctChange>,
}

/// The one entry an exact log gained in a call that only charged it (its
/// dead entries dropped, points added at the call's millisecond): the
/// points its entry at the call's time holds after the call. The replica
/// redoes that on its copy of the log (`Record::replay_edits`).
/// Encoded as that integer.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct LogCharge(pub u64);
