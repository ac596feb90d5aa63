//! The versioned byte encoding of a [`Record`]: used for RDB, AOF rewrite,
//! `DUMP`/`RESTORE` and the replicated effect, so all four agree.
//!
//! Layout: one version byte, then the record as MessagePack (serde field
//! order, arrays not maps). Decoding accepts only canonical bytes (those
//! that encode back to themselves) holding a valid record, so corrupt
//! input is an error and equal states always have equal bytes.

use super::record::Record;

/// The current encoding version (first byte of every payload).
pub const VERSION: u8 = 1;

/// Why a payload was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CodecError {
    /// Empty, or a version this build does not know.
    UnknownVersion,
    /// Not a well-formed, canonical, valid record.
    Malformed,
}

/// Encode `record` into `out` (cleared first).
pub fn encode_into(record: &Record, out: &mut Vec<u8>) {
    out.clear();
    out.push(VERSION);
    // Writing into a Vec cannot fail for these plain types.
    let _ = rmp_serde::encode::write(out, record);
}

/// Encode `record` into a new buffer.
pub fn encode(record: &Record) -> Vec<u8> {
    let mut out = Vec::with_capacity(48);
    encode_into(record, &mut out);
    out
}

/// Decode a payload made by [`encode`].
pub fn decode(bytes: &[u8]) -> Result<Record, CodecError> {
    let (&version, body) = bytes.split_first().ok_or(CodecError::UnknownVersion)?;
    if version != VERSION {
        return Err(CodecError::UnknownVersion);
    }
    let record: Record = rmp_serde::from_slice(body).map_err(|_| CodecError::Malformed)?;
    if !record.is_valid() || encode(&record) != bytes {
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

    fn sample() -> Record {
        Record {
            bucket: Some(Bucket {
                tat_ms: 1_700_000_000_123,
                tat_frac: 2,
                tokens: 3,
                period_ms: 1000,
            }),
            penalty: Some(Box::new(Penalty {
                strikes: 4,
                strikes_until: 1_700_000_060_000,
                offenses: 1,
                offenses_until: 1_700_086_400_000,
                box_level: 0,
                box_until: 0,
            })),
            leases: Some(Box::new(leases())),
        }
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
        r.leases = None;
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
    fn invalid_fields_are_refused() {
        let mut r = sample();
        if let Some(b) = r.bucket.as_mut() {
            b.tat_frac = 3; // not below tokens
        }
        assert_eq!(decode(&encode(&r)), Err(CodecError::Malformed));
    }
}
