//! The encoding of the records most calls write (a bucket, a sliding or
//! fixed window, or both, and nothing else; regional quota counts alone),
//! written with `rmp`'s
//! MessagePack writers directly: the very bytes serde writes through
//! `rmp_serde` (a test compares them), without serde's per-field
//! machinery, which costs more than the record's own arithmetic. Every
//! other record goes through serde ([`super::codec`]).

use rmp::encode::{write_array_len, write_sint, write_str, write_uint};
use rmp::Marker;

use super::bucket::Bucket;
use super::payload::PAYLOAD_VERSION;
use super::record::Record;
use super::region::RegionCounts;
use super::window::WindowState;

/// Append `record`'s payload (the version byte, then its parts) to `out`
/// when it is one of the shapes written here; false (and `out` untouched)
/// otherwise.
pub(super) fn try_append(record: &Record, out: &mut Vec<u8>) -> bool {
    let present = record.present().bits();
    let written_here = (1u32 << Record::BUCKET_INDEX) | (1 << Record::WINDOW_INDEX);
    if present & !written_here != 0 {
        return match record.part::<Box<RegionCounts>>() {
            Some(counts) if present == 1 << Record::REGIONS_INDEX => {
                append_regions(counts, out);
                true
            }
            _ => false,
        };
    }
    let window = record.part::<WindowState>();
    if matches!(window, Some(WindowState::Exact { .. })) {
        return false;
    }
    let parts = Record::parts_in(PAYLOAD_VERSION);
    // The version byte, a fixed array of the parts (fewer than 16), at most
    // 9 bytes per integer.
    out.reserve(2 + parts + 48);
    out.push(PAYLOAD_VERSION);
    out.push(Marker::FixArray(parts as u8).to_u8());
    // In encoding order: nil for each part absent, the bucket before the
    // window.
    const { assert!(Record::BUCKET_INDEX < Record::WINDOW_INDEX) };
    nils(out, Record::BUCKET_INDEX);
    match &record.bucket {
        Some(bucket) => write_bucket(out, bucket),
        None => nil(out),
    }
    nils(out, Record::WINDOW_INDEX - Record::BUCKET_INDEX - 1);
    match window {
        Some(w) => write_window(out, w),
        None => nil(out),
    }
    nils(out, parts.saturating_sub(Record::WINDOW_INDEX + 1));
    true
}

/// A record holding regional counts alone.
fn append_regions(counts: &RegionCounts, out: &mut Vec<u8>) {
    let parts = Record::parts_in(PAYLOAD_VERSION);
    let components = counts.components();
    // The parts header, the counts' three fields, at most 45 bytes per
    // component (a 32-byte name and two integers).
    out.reserve(2 + parts + 16 + 45 * components.len());
    out.push(PAYLOAD_VERSION);
    out.push(Marker::FixArray(parts as u8).to_u8());
    nils(out, Record::REGIONS_INDEX);
    out.push(Marker::FixArray(3).to_u8());
    let _ = write_sint(out, counts.end);
    let _ = write_uint(out, u64::from(counts.period.code()));
    let _ = write_array_len(out, components.len() as u32);
    for c in components {
        out.push(Marker::FixArray(3).to_u8());
        let _ = write_str(out, c.region.as_str());
        let _ = write_uint(out, c.added);
        let _ = write_uint(out, c.refunded);
    }
    nils(out, parts.saturating_sub(Record::REGIONS_INDEX + 1));
}

fn nil(out: &mut Vec<u8>) {
    out.push(Marker::Null.to_u8());
}

fn nils(out: &mut Vec<u8>, n: usize) {
    out.resize(out.len() + n, Marker::Null.to_u8());
}

/// Writing into a Vec cannot fail, so the writers' results are dropped.
fn write_bucket(out: &mut Vec<u8>, b: &Bucket) {
    out.push(Marker::FixArray(4).to_u8());
    let _ = write_sint(out, b.tat_ms);
    let _ = write_uint(out, b.tat_frac);
    let _ = write_uint(out, b.tokens.get());
    let _ = write_uint(out, b.period_ms);
}

/// A `Sliding` or `Fixed` state as serde writes an enum: a one-key map
/// from the variant's name to its fields as an array.
fn write_window(out: &mut Vec<u8>, w: &WindowState) {
    out.push(Marker::FixMap(1).to_u8());
    match w {
        WindowState::Sliding {
            start,
            prev,
            curr,
            window_ms,
        } => {
            out.extend_from_slice(&[Marker::FixStr(1).to_u8(), b's']);
            out.push(Marker::FixArray(4).to_u8());
            let _ = write_sint(out, *start);
            let _ = write_uint(out, *prev);
            let _ = write_uint(out, *curr);
            let _ = write_uint(out, *window_ms);
        }
        WindowState::Fixed { end, count } => {
            out.extend_from_slice(&[Marker::FixStr(1).to_u8(), b'f']);
            out.push(Marker::FixArray(2).to_u8());
            let _ = write_sint(out, *end);
            let _ = write_uint(out, *count);
        }
        // Never reached: `try_append` leaves logs to serde.
        WindowState::Exact { .. } => nil(out),
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;
    use crate::core::codec::encode_with_serde;
    use crate::core::testkit::{any_valid_bucket, any_window_state};

    /// A window state of a mode written here (not a log).
    fn window() -> impl Strategy<Value = WindowState> {
        any_window_state().prop_filter("a sliding or fixed window", |w| {
            !matches!(w, WindowState::Exact { .. })
        })
    }

    proptest! {
        #[test]
        fn the_direct_bytes_are_serdes(b in prop::option::of(any_valid_bucket()), w in prop::option::of(window())) {
            let mut record = Record::default();
            record.bucket = b;
            record.set_part(w);
            let mut direct = Vec::new();
            prop_assert!(try_append(&record, &mut direct));
            prop_assert_eq!(direct, encode_with_serde(&record));
        }
    }

    proptest! {
        #[test]
        fn the_direct_bytes_of_regional_counts_are_serdes(
            parts in prop::collection::vec((0usize..20, 1u64..=crate::core::region::MAX_COMPONENT, any::<u64>()), 1..17),
            month in 0i64..1200,
        ) {
            use crate::core::quota::{days_from_civil, Period};
            use crate::core::region::{Component, RegionName};
            let end = days_from_civil(2000 + month / 12, (month % 12) as u32 + 1, 1) * 86_400_000;
            let incoming: Vec<Component> = parts
                .iter()
                .filter_map(|&(i, added, r)| {
                    Some(Component {
                        region: RegionName::new(format!("r-{i}").as_bytes())?,
                        added,
                        refunded: r % (added + 1),
                    })
                })
                .collect();
            let mut counts = RegionCounts::new(Period::Month, end);
            counts.merge(&incoming);
            let mut record = Record::default();
            record.set_part(Some(Box::new(counts)));
            let mut direct = Vec::new();
            prop_assert!(try_append(&record, &mut direct));
            prop_assert_eq!(&direct, &encode_with_serde(&record));
            prop_assert_eq!(crate::core::codec::decode(&direct), Ok(record));
        }
    }

    #[test]
    fn other_records_go_through_serde() {
        let mut record = Record::default();
        record.set_part(Some(WindowState::Exact {
            window_ms: 1000,
            log: vec![crate::core::window::Entry { at: 5, cost: 1 }].into(),
        }));
        let mut out = Vec::new();
        assert!(!try_append(&record, &mut out));
        assert!(out.is_empty());
        let mut boxed = Record::default();
        let mut penalty = crate::core::penalty::Penalty::default();
        penalty.trip(1, 60_000, 1_700_000_000_000);
        boxed.set_penalty(penalty, 1_700_000_000_000);
        assert!(!try_append(&boxed, &mut out));
    }
}
