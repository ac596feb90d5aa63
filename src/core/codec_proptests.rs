//! Property tests of the payload codec: round trips, and every malformed,
//! truncated or invalid payload refused without a panic.
//!
//! Driven through the shared kit (`testkit`) with random rates, costs,
//! clocks and stored states, and checked against invariants derived from
//! the module docs rather than against the implementation.

use proptest::prelude::*;

use super::testkit::*;
use std::num::NonZeroU64;

use super::bucket::Bucket;
use super::codec::{decode, encode};
use super::limits::MAX_BOX_LEVEL;
use super::payload::{CodecError, PAYLOAD_VERSION};
use super::quota::QuotaState;
use super::window::WindowState;

// ---------------------------------------------------------------------------
// 7. Codec.
// ---------------------------------------------------------------------------

proptest! {
    #![proptest_config(config(512))]

    /// Every valid record survives `decode(encode(r))`, and its encoding
    /// starts with the oldest version that holds its parts.
    #[test]
    fn codec_round_trips(record in any_valid_record()) {
        let bytes = encode(&record);
        prop_assert_eq!(bytes[0], super::codec::version_for(&record));
        prop_assert_eq!(decode(&bytes), Ok(record));
    }

    /// Any bytes decode without panicking; what decodes is valid and
    /// canonical (encodes back to the same bytes).
    #[test]
    fn codec_never_panics_on_arbitrary_bytes(
        bytes in prop_oneof![
            prop::collection::vec(any::<u8>(), 0..64),
            prop::collection::vec(any::<u8>(), 0..64).prop_map(|mut v| { v.insert(0, PAYLOAD_VERSION); v }),
        ],
    ) {
        if let Ok(record) = decode(&bytes) {
            prop_assert!(record.is_valid());
            prop_assert_eq!(encode(&record), bytes);
        }
    }

    /// Every strict prefix of a valid encoding is refused.
    #[test]
    fn codec_refuses_truncations(record in any_valid_record()) {
        let bytes = encode(&record);
        for len in 0..bytes.len() {
            prop_assert!(decode(&bytes[..len]).is_err(), "prefix of {} of {} bytes decoded", len, bytes.len());
        }
    }

    /// Flipping bits of any one byte of a valid encoding either is refused
    /// or decodes to a different valid record whose encoding is exactly the
    /// mutated bytes (decoding accepts canonical bytes only).
    #[test]
    fn codec_single_byte_flips_are_refused_or_canonical(
        record in any_valid_record(),
        at in any::<prop::sample::Index>(),
        mask in 1u8..=255,
    ) {
        let mut bytes = encode(&record);
        let k = at.index(bytes.len());
        bytes[k] ^= mask;
        match decode(&bytes) {
            Err(e) => {
                // A flipped version byte naming an older version reads the
                // body in that version's layout, and is refused as malformed.
                if k == 0 && !(1..=PAYLOAD_VERSION).contains(&bytes[0]) {
                    prop_assert_eq!(e, CodecError::UnknownVersion);
                }
            }
            Ok(other) => {
                prop_assert!(other.is_valid());
                prop_assert_ne!(&other, &record);
                prop_assert_eq!(encode(&other), bytes);
            }
        }
    }

    /// A record that breaks an invariant (`tat_frac >= tokens`, a zero
    /// scale, `box_level > 3`) is refused even when well-formed.
    #[test]
    fn codec_refuses_invalid_records(
        record in any_valid_record(),
        breakage in 0u8..4,
        junk in any::<u64>(),
        level in (MAX_BOX_LEVEL + 1)..=u8::MAX,
    ) {
        let mut record = record;
        match breakage {
            0 => {
                let mut b = record.bucket.unwrap_or(Bucket { tat_ms: T0, tat_frac: 0, tokens: NonZeroU64::MIN, period_ms: 1 });
                b.tat_frac = b.tokens.get().saturating_add(junk % 3).max(b.tokens.get());
                record.bucket = Some(b);
            }
            1 => {
                // A zero scale cannot be held in a `Bucket`: write its bytes.
                let b = record.bucket.unwrap_or(Bucket { tat_ms: T0, tat_frac: 0, tokens: NonZeroU64::MIN, period_ms: 1 });
                let fields = (
                    Some((b.tat_ms, 0u64, 0u64, b.period_ms)),
                    &record.penalty,
                    record.leases(),
                    record.part::<WindowState>(),
                    record.part::<QuotaState>(),
                );
                let mut bytes = vec![PAYLOAD_VERSION];
                prop_assert!(rmp_serde::encode::write(&mut bytes, &fields).is_ok());
                prop_assert_eq!(decode(&bytes), Err(CodecError::Malformed));
                return Ok(());
            }
            2 => {
                let mut b = record.bucket.unwrap_or(Bucket { tat_ms: T0, tat_frac: 0, tokens: NonZeroU64::MIN, period_ms: 1 });
                b.period_ms = 0;
                record.bucket = Some(b);
            }
            _ => {
                let mut p = record.penalty_or_default();
                p.box_level = level;
                record.penalty = Some(Box::new(p));
            }
        }
        prop_assert!(!record.is_valid());
        prop_assert_eq!(decode(&encode(&record)), Err(CodecError::Malformed));
    }
}
