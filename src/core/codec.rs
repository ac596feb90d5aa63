//! The versioned byte encoding of a [`Record`]: used for RDB, AOF rewrite,
//! `DUMP`/`RESTORE` and the replicated effect, so all four agree.
//!
//! Layout: one version byte, then the record as a MessagePack array of its
//! fields in declaration order. Each version appends fields: version 1 had
//! `[bucket, penalty]`, version 2 added `leases`, version 3 `window`,
//! version 4 `quota`. Older payloads (an RDB or
//! AOF written by an older build) decode with the missing fields empty.
//! Decoding accepts only canonical bytes (those that encode back to
//! themselves in their version) holding a valid record, so corrupt input
//! is an error and equal states always have equal bytes.

use serde::{Serialize, Serializer};

use super::record::Record;

/// The current payload version (the first byte of every payload): the
/// number of parts a [`Record`] encodes, see the registry in
/// [`super::record`].
pub const PAYLOAD_VERSION: u8 = 4;

/// Why a payload was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CodecError {
    /// Empty, or a version this build does not know.
    UnknownVersion,
    /// Not a well-formed, canonical, valid record.
    Malformed,
}

/// A record as a payload of one version lays it out.
struct Versioned<'a>(&'a Record, u8);

impl Serialize for Versioned<'_> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        self.0.serialize_version(self.1, serializer)
    }
}

/// Encode `record` at the end of `out`.
pub fn encode_append(record: &Record, out: &mut Vec<u8>) {
    append_version(record, PAYLOAD_VERSION, out);
}

/// Append `record` to `out` as `version` lays it out (the parts that
/// version has).
fn append_version(record: &Record, version: u8, out: &mut Vec<u8>) {
    out.push(version);
    // Writing into a Vec cannot fail for these plain types.
    let _ = rmp_serde::encode::write(out, &Versioned(record, version));
}

/// Encode `record` into a new buffer.
pub fn encode(record: &Record) -> Vec<u8> {
    let mut out = Vec::with_capacity(48);
    encode_append(record, &mut out);
    out
}

/// Decode a payload made by [`encode`], by this build or an older one.
pub fn decode(bytes: &[u8]) -> Result<Record, CodecError> {
    let (&version, body) = bytes.split_first().ok_or(CodecError::UnknownVersion)?;
    if version == 0 || version > PAYLOAD_VERSION {
        return Err(CodecError::UnknownVersion);
    }
    let mut de = rmp_serde::Deserializer::from_read_ref(body);
    let record = Record::deserialize_parts(&mut de).map_err(|_| CodecError::Malformed)?;
    let mut canonical = Vec::with_capacity(bytes.len());
    append_version(&record, version, &mut canonical);
    if !record.is_valid() || canonical != bytes {
        return Err(CodecError::Malformed);
    }
    Ok(record)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::bucket::Bucket;
    use crate::core::lease::Leases;
    use crate::core::penalty::Penalty;
    use crate::core::quota::QuotaState;
    use crate::core::window::WindowState;

    fn sample() -> Record {
        let mut record = Record::with_bucket(Bucket {
            tat_ms: 1_700_000_000_123,
            tat_frac: 2,
            tokens: crate::core::bucket::tick_scale(3),
            period_ms: 1000,
        });
        record.penalty = Some(Box::new(Penalty {
            strikes: 4,
            strikes_until: 1_700_000_060_000,
            offenses: 1,
            offenses_until: 1_700_086_400_000,
            box_level: 0,
            box_until: 0,
        }));
        record.set_part(Some(Box::new(leases())));
        record.set_part(Some(WindowState::Fixed {
            end: 1_700_000_060_000,
            count: 3,
        }));
        record.set_part(Some(QuotaState {
            end: 1_700_006_400_000,
            count: 42,
        }));
        record
    }

    fn leases() -> Leases {
        let mut leases = Leases::new();
        leases.acquire(b"worker-1", 2, 30_000, 1_700_000_000_000);
        leases
    }

    #[test]
    fn round_trip() {
        for record in [Record::default(), sample()] {
            assert_eq!(decode(&encode(&record)), Ok(record));
        }
    }

    #[test]
    fn small_payloads() {
        let mut r = sample();
        r.penalty = None;
        r.set_part::<Box<Leases>>(None);
        r.set_part::<WindowState>(None);
        r.set_part::<QuotaState>(None);
        assert!(encode(&r).len() <= 24, "{} bytes", encode(&r).len());
    }

    #[test]
    fn every_truncation_and_bad_version_is_an_error() {
        let bytes = encode(&sample());
        for len in 0..bytes.len() {
            assert!(decode(&bytes[..len]).is_err(), "prefix of {len} bytes");
        }
        let mut bad = bytes.clone();
        bad[0] = 99;
        assert_eq!(decode(&bad), Err(CodecError::UnknownVersion));
        let mut trailing = bytes;
        trailing.push(0);
        assert_eq!(decode(&trailing), Err(CodecError::Malformed));
    }

    #[test]
    fn a_version_1_payload_still_decodes() {
        let mut old = sample();
        old.set_part::<Box<Leases>>(None);
        old.set_part::<WindowState>(None);
        old.set_part::<QuotaState>(None);
        let mut v1 = Vec::new();
        append_version(&old, 1, &mut v1);
        assert_eq!(v1[0], 1);
        assert_eq!(decode(&v1), Ok(old.clone()));
        assert_eq!(
            encode(&old)[0],
            PAYLOAD_VERSION,
            "saved again in the current version"
        );
        let mut with_leases = vec![1];
        with_leases.extend(&encode(&sample())[1..]);
        assert_eq!(
            decode(&with_leases),
            Err(CodecError::Malformed),
            "a v1 payload has no leases"
        );
        let mut v2_record = sample();
        v2_record.set_part::<WindowState>(None);
        v2_record.set_part::<QuotaState>(None);
        let mut v2 = Vec::new();
        append_version(&v2_record, 2, &mut v2);
        assert_eq!(decode(&v2), Ok(v2_record));
    }

    #[test]
    fn invalid_fields_are_refused() {
        let mut r = sample();
        if let Some(b) = r.bucket.as_mut() {
            b.tat_frac = 3; // not below tokens
        }
        assert_eq!(decode(&encode(&r)), Err(CodecError::Malformed));
    }
}
