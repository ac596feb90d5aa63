//! The versioned byte encoding of a [`Record`]: used for RDB, AOF rewrite,
//! `DUMP`/`RESTORE` and the replicated effect, so all four agree.
//!
//! Layout: one version byte, then the record as a MessagePack array of its
//! fields in declaration order. Each version appends fields: version 1 had
//! `[bucket, penalty]`, version 2 added `leases`, version 3 `window`,
//! version 4 `quota`; version 5 added a field to the penalty (the retry a
//! refusal announced, written only when set), version 6 `distinct`,
//! version 7 `regions`. Older payloads (an RDB or
//! AOF written by an older build) decode with the missing fields empty.
//! Decoding accepts only canonical bytes (those that encode back to
//! themselves in their version) holding a valid record, so corrupt input
//! is an error and equal states always have equal bytes.

use serde::{Serialize, Serializer};

use super::payload::{CodecError, PAYLOAD_VERSION};
use super::record::Record;
use super::time::Millis;

/// A record as a payload of one version lays it out.
struct Versioned<'a>(&'a Record, u8);

impl Serialize for Versioned<'_> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        self.0.serialize_version(self.1, serializer)
    }
}

/// Encode `record` at the end of `out`.
pub fn encode_append(record: &Record, out: &mut Vec<u8>) {
    if !super::codec_direct::try_append(record, out) {
        append_version(record, PAYLOAD_VERSION, out);
    }
}

/// [`encode`] through serde alone (what the direct encoding must equal).
#[cfg(test)]
pub(crate) fn encode_with_serde(record: &Record) -> Vec<u8> {
    let mut out = Vec::new();
    append_version(record, PAYLOAD_VERSION, &mut out);
    out
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
    if !record.is_valid() || !record.fits_version(version) || canonical != bytes {
        return Err(CodecError::Malformed);
    }
    Ok(record)
}

/// Decode a payload loaded from outside a call (RDB, `RESTORE`, a
/// replicated `RL.APPLY`): also refuse a state no legal call could have
/// written by the server's time `now` ([`Record::is_plausible`]).
pub fn decode_loaded(bytes: &[u8], now: Millis) -> Result<Record, CodecError> {
    let record = decode(bytes)?;
    if record.is_plausible(now) {
        Ok(record)
    } else {
        Err(CodecError::Malformed)
    }
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
            retry_at: 0,
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
    fn loaded_states_stay_within_what_calls_write() {
        use crate::core::part::MAX_AHEAD_MS;
        use crate::core::penalty::MANUAL;
        let now = 1_700_000_000_000;
        let reach = now + MAX_AHEAD_MS as i64;
        let penalty = |p: Penalty| {
            let mut r = Record::default();
            r.penalty = Some(Box::new(p));
            r
        };
        let boxed = |level, until| Penalty {
            box_level: level,
            box_until: until,
            offenses: 1,
            offenses_until: now + 1,
            ..Penalty::default()
        };
        let rows: Vec<(&str, Record, bool)> = vec![
            ("a box at the reach", penalty(boxed(1, reach)), true),
            ("a box past the reach", penalty(boxed(1, reach + 1)), false),
            ("a box at 2^63-2", penalty(boxed(2, MANUAL - 1)), false),
            ("a manual box", penalty(boxed(3, MANUAL)), true),
            ("an end without a box", penalty(boxed(0, now + 5)), false),
            (
                "strikes that never expire",
                penalty(Penalty {
                    strikes: 1,
                    strikes_until: MANUAL,
                    ..Penalty::default()
                }),
                false,
            ),
            (
                "more strikes than any threshold",
                penalty(Penalty {
                    strikes: crate::core::limits::MAX_THRESHOLD + 1,
                    strikes_until: now + 1,
                    ..Penalty::default()
                }),
                false,
            ),
            (
                "a bucket full in 300 years",
                Record::with_bucket(Bucket {
                    tat_ms: now + 300 * 365 * 86_400_000,
                    tat_frac: 0,
                    tokens: crate::core::bucket::tick_scale(1),
                    period_ms: 1,
                }),
                false,
            ),
            ("an ordinary record", sample(), true),
        ];
        for (what, record, loads) in rows {
            let bytes = encode(&record);
            assert!(decode(&bytes).is_ok(), "{what}: well-formed");
            assert_eq!(decode_loaded(&bytes, now).is_ok(), loads, "{what}");
        }
    }

    #[test]
    fn a_retry_at_needs_version_5() {
        let mut r = sample();
        if let Some(p) = r.penalty.as_deref_mut() {
            p.retry_at = 1_700_000_001_000;
        }
        let bytes = encode(&r);
        assert_eq!(decode(&bytes), Ok(r.clone()));
        let mut as_v4 = bytes.clone();
        as_v4[0] = 4;
        assert_eq!(
            decode(&as_v4),
            Err(CodecError::Malformed),
            "a v4 payload has no retry_at"
        );
        // Without one, a penalty has the bytes older builds wrote.
        let plain = sample();
        let (mut v4, mut v5) = (Vec::new(), Vec::new());
        append_version(&plain, 4, &mut v4);
        append_version(&plain, 5, &mut v5);
        assert_eq!(&v4[1..], &v5[1..]);
        assert_eq!(decode(&v4), Ok(plain));
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
