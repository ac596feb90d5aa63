//! What every payload shares, whole record ([`super::codec`]) or patch
//! ([`super::patch`]): the current version and why one is refused.

/// The current payload version (the first byte of every payload): the
/// number of parts a [`Record`](super::record::Record) encodes, see the
/// registry in [`super::record`] (version 6 added `RL.DISTINCT`'s members,
/// version 7 the regional components of `RL.QUOTA ... REGION`).
pub const PAYLOAD_VERSION: u8 = 7;

/// Why a payload was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CodecError {
    /// Empty, or a version this build does not know.
    UnknownVersion,
    /// Not a well-formed, canonical, valid record.
    Malformed,
}
