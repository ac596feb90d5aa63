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
use super::payload::{PAYLOAD_VERSION, PLAIN_PAYLOAD_VERSION};
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
    let parts = Record::parts_in(PLAIN_PAYLOAD_VERSION);
    // Written on the stack, then appended at once: the version byte, a
    // fixed array of the parts (fewer than 16), a bucket (5 markers, 4
    // integers of at most 9 bytes), a window (6 markers, 4 integers).
    let mut buf = Bytes::default();
    buf.push(PLAIN_PAYLOAD_VERSION);
    buf.push(Marker::FixArray(parts as u8).to_u8());
    // In encoding order: nil for each part absent, the bucket before the
    // window.
    const { assert!(Record::BUCKET_INDEX < Record::WINDOW_INDEX) };
    buf.nils(Record::BUCKET_INDEX);
    match &record.bucket {
        Some(bucket) => write_bucket(&mut buf, bucket),
        None => buf.push(Marker::Null.to_u8()),
    }
    buf.nils(Record::WINDOW_INDEX - Record::BUCKET_INDEX - 1);
    match window {
        Some(w) => write_window(&mut buf, w),
        None => buf.push(Marker::Null.to_u8()),
    }
    buf.nils(parts.saturating_sub(Record::WINDOW_INDEX + 1));
    match buf.bytes() {
        Some(bytes) => {
            out.extend_from_slice(bytes);
            true
        }
        // past the room (no shape written here comes near): serde's path
        None => false,
    }
}

/// The bytes of one plain record, written in place: room for the version
/// byte, the parts array of at most 15 parts, a bucket (41 bytes at most)
/// and a window (42), with a margin. A write past the end is dropped and
/// remembered: [`Bytes::bytes`] then gives nothing, never a cut payload.
struct Bytes {
    buf: [u8; 128],
    len: usize,
    overflowed: bool,
}

impl Default for Bytes {
    #[inline(always)]
    fn default() -> Self {
        Bytes {
            buf: [0; 128],
            len: 0,
            overflowed: false,
        }
    }
}

impl Bytes {
    #[inline(always)]
    fn push(&mut self, b: u8) {
        match self.buf.get_mut(self.len) {
            Some(slot) => {
                *slot = b;
                self.len += 1;
            }
            None => self.overflowed = true,
        }
    }

    #[inline(always)]
    fn extend(&mut self, bytes: &[u8]) {
        match self.buf.get_mut(self.len..self.len + bytes.len()) {
            Some(slots) => {
                slots.copy_from_slice(bytes);
                self.len += bytes.len();
            }
            None => self.overflowed = true,
        }
    }

    #[inline(always)]
    fn nils(&mut self, n: usize) {
        for _ in 0..n {
            self.push(Marker::Null.to_u8());
        }
    }

    /// The bytes written; `None` when a write did not fit.
    fn bytes(&self) -> Option<&[u8]> {
        if self.overflowed {
            return None;
        }
        self.buf.get(..self.len)
    }

    /// An unsigned integer in its shortest form, as `rmp::encode::write_uint`.
    #[inline(always)]
    fn uint(&mut self, v: u64) {
        if v < 128 {
            self.push(v as u8);
        } else if v < 1 << 8 {
            self.extend(&[Marker::U8.to_u8(), v as u8]);
        } else if v < 1 << 16 {
            self.push(Marker::U16.to_u8());
            self.extend(&(v as u16).to_be_bytes());
        } else if v < 1 << 32 {
            self.push(Marker::U32.to_u8());
            self.extend(&(v as u32).to_be_bytes());
        } else {
            self.push(Marker::U64.to_u8());
            self.extend(&v.to_be_bytes());
        }
    }

    /// A signed integer in its shortest form, as `rmp::encode::write_sint`
    /// (a non-negative one as [`Bytes::uint`]).
    #[inline(always)]
    fn sint(&mut self, v: i64) {
        match u64::try_from(v) {
            Ok(v) => self.uint(v),
            Err(_) if v >= -32 => self.push(v as u8),
            Err(_) if v >= -128 => self.extend(&[Marker::I8.to_u8(), v as u8]),
            Err(_) if v >= -32_768 => {
                self.push(Marker::I16.to_u8());
                self.extend(&(v as i16).to_be_bytes());
            }
            Err(_) if v >= -2_147_483_648 => {
                self.push(Marker::I32.to_u8());
                self.extend(&(v as i32).to_be_bytes());
            }
            Err(_) => {
                self.push(Marker::I64.to_u8());
                self.extend(&v.to_be_bytes());
            }
        }
    }
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

fn nils(out: &mut Vec<u8>, n: usize) {
    out.resize(out.len() + n, Marker::Null.to_u8());
}

fn write_bucket(out: &mut Bytes, b: &Bucket) {
    out.push(Marker::FixArray(4).to_u8());
    out.sint(b.tat_ms);
    out.uint(b.tat_frac);
    out.uint(b.tokens.get());
    out.uint(b.period_ms);
}

/// A `Sliding` or `Fixed` state as serde writes an enum: a one-key map
/// from the variant's name to its fields as an array.
fn write_window(out: &mut Bytes, w: &WindowState) {
    out.push(Marker::FixMap(1).to_u8());
    match w {
        WindowState::Sliding {
            start,
            prev,
            curr,
            window_ms,
        } => {
            out.extend(&[Marker::FixStr(1).to_u8(), b's', Marker::FixArray(4).to_u8()]);
            out.sint(*start);
            out.uint(*prev);
            out.uint(*curr);
            out.uint(*window_ms);
        }
        WindowState::Fixed { end, count } => {
            out.extend(&[Marker::FixStr(1).to_u8(), b'f', Marker::FixArray(2).to_u8()]);
            out.sint(*end);
            out.uint(*count);
        }
        // Never reached: `try_append` leaves logs to serde.
        WindowState::Exact { .. } => out.push(Marker::Null.to_u8()),
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
    fn integers_take_rmps_shortest_forms() {
        let mut edges: Vec<i128> = vec![0, i128::from(i64::MIN), i128::from(u64::MAX)];
        for bits in [5u32, 7, 8, 15, 16, 31, 32, 63] {
            let p = 1i128 << bits;
            edges.extend([p - 1, p, p + 1, -p - 1, -p, -p + 1]);
        }
        for v in edges {
            if let Ok(u) = u64::try_from(v) {
                let mut ours = Bytes::default();
                ours.uint(u);
                let mut theirs = Vec::new();
                let _ = write_uint(&mut theirs, u);
                assert_eq!(ours.bytes(), Some(&theirs[..]), "{u}");
            }
            if let Ok(i) = i64::try_from(v) {
                let mut ours = Bytes::default();
                ours.sint(i);
                let mut theirs = Vec::new();
                let _ = write_sint(&mut theirs, i);
                assert_eq!(ours.bytes(), Some(&theirs[..]), "{i}");
            }
        }
    }

    #[test]
    fn bytes_past_the_room_give_nothing() {
        let mut full = Bytes::default();
        full.nils(128);
        assert_eq!(full.bytes().map(<[u8]>::len), Some(128));
        full.push(0);
        assert_eq!(full.bytes(), None, "one byte more");
        let mut near = Bytes::default();
        near.nils(125);
        near.uint(u64::MAX);
        assert_eq!(near.bytes(), None, "a 9-byte integer past the end");
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
