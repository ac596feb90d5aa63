//! The patch codec: round trips, merging onto the replica's record to the
//! master's exact bytes, and refusal of every malformed patch.

use super::*;
use crate::core::bucket::{tick_scale, Bucket};
use crate::core::codec::{decode, encode};
use crate::core::lease::Leases;
use crate::core::window::{Entry, WindowState};

const NOW: Millis = 1_700_000_000_000;

fn log(entries: usize) -> WindowState {
    WindowState::Exact {
        window_ms: 3_600_000,
        log: (0..entries)
            .map(|i| Entry {
                at: NOW - 1_000_000 + i as Millis * 10,
                cost: 1,
            })
            .collect(),
    }
}

/// A record as the master committed it: a bucket beside a large log.
fn committed() -> Record {
    let mut r = Record::with_bucket(Bucket {
        tat_ms: NOW + 100,
        tat_frac: 0,
        tokens: tick_scale(1),
        period_ms: 1000,
    });
    r.set_part(Some(log(1000)));
    r.prune(NOW);
    r.clear_touched();
    r
}

/// The master's call: the bucket changes, the log is not reached.
fn after_take(mut r: Record) -> Record {
    if let Some(b) = r.bucket.as_mut() {
        b.tat_ms += 100;
    }
    r
}

fn patch_of(r: &Record, now: Millis) -> Vec<u8> {
    let mut out = Vec::new();
    encode_patch_append(r, r.untouched_present(), now, &mut out);
    out
}

#[test]
fn an_untouched_log_is_not_sent_and_merges_to_the_masters_bytes() {
    let replica = committed();
    let master = after_take(committed());
    assert!(!master.untouched_present().is_empty());
    let bytes = patch_of(&master, NOW);
    assert!(is_patch(&bytes));
    assert!(bytes.len() < 40, "{} bytes", bytes.len());
    assert!(encode(&master).len() > 1000);
    let patch = decode_patch(&bytes, NOW).expect("a patch");
    let merged = patch.apply_onto(replica);
    assert_eq!(encode(&merged), encode(&master));
    assert_eq!(decode(&encode(&merged)), Ok(master));
}

#[test]
fn parts_reached_for_writing_are_sent() {
    let mut master = committed();
    master.set_part(Some(log(3)));
    assert!(master.untouched_present().is_empty(), "the log was set");
    let mut leased = committed();
    leased.leases_or_insert().acquire(b"job", 1, 30_000, NOW);
    // The leases were reached and go; the log was not and stays behind.
    assert!(!leased.untouched_present().is_empty());
    let merged = decode_patch(&patch_of(&leased, NOW), NOW)
        .expect("a patch")
        .apply_onto(committed());
    assert!(merged.leases().is_some());
    assert_eq!(encode(&merged), encode(&leased));
    let mut slotted = committed();
    let _ = crate::core::record::Holds::<WindowState>::slot(&mut slotted);
    assert!(slotted.untouched_present().is_empty());
    slotted.clear_touched();
    assert!(!slotted.untouched_present().is_empty());
}

#[test]
fn a_patch_onto_an_empty_record_keeps_the_parts_it_carries() {
    let master = after_take(committed());
    let merged = decode_patch(&patch_of(&master, NOW), NOW)
        .unwrap()
        .apply_onto(Record::default());
    assert_eq!(merged.bucket, master.bucket);
    assert_eq!(merged.part::<WindowState>(), None, "the log was never sent");
}

#[test]
fn the_unchanged_parts_are_pruned_at_the_masters_time() {
    let mut master = committed();
    let mut leases = Leases::new();
    leases.acquire(b"job", 1, 30_000, NOW);
    master.set_part(Some(Box::new(leases)));
    master.clear_touched();
    let replica = master.clone();
    let later = NOW + 30_000;
    master.prune(later);
    assert!(master.leases().is_none(), "the lease expired on the master");
    let merged = decode_patch(&patch_of(&master, later), later)
        .unwrap()
        .apply_onto(replica);
    assert_eq!(encode(&merged), encode(&master));
}

#[test]
fn malformed_patches_are_refused() {
    let bytes = patch_of(&after_take(committed()), NOW);
    for len in 0..bytes.len() {
        assert!(decode_patch(&bytes[..len], NOW).is_err(), "prefix {len}");
    }
    let mut trailing = bytes.clone();
    trailing.push(0);
    assert_eq!(decode_patch(&trailing, NOW), Err(CodecError::Malformed));
    let mut whole = vec![PAYLOAD_VERSION];
    whole.extend(&bytes[1..]);
    assert!(decode(&whole).is_err(), "a patch body is no record");
    assert_eq!(
        decode_patch(&encode(&committed()), NOW),
        Err(CodecError::UnknownVersion)
    );
    let record = after_take(committed());
    let mut unknown_part = Vec::new();
    let beyond = PartMask::NONE;
    append_patch(&record, beyond, NOW, PAYLOAD_VERSION + 1, &mut unknown_part);
    assert_eq!(
        decode_patch(&unknown_part, NOW),
        Err(CodecError::UnknownVersion)
    );
    let far = NOW + 10 * MAX_AHEAD_MS as Millis;
    assert_eq!(
        decode_patch(&patch_of(&record, far), NOW),
        Err(CodecError::Malformed),
        "a master far ahead of every clock"
    );
    // Flip each byte of the body: never a panic, and what decodes is
    // canonical and valid.
    for i in 1..bytes.len() {
        let mut flipped = bytes.clone();
        flipped[i] ^= 0x5a;
        if let Ok(p) = decode_patch(&flipped, NOW) {
            assert!(p.sent.is_valid());
        }
    }
}

#[test]
fn a_mask_beyond_the_versions_parts_is_refused() {
    let record = after_take(committed());
    let mut out = Vec::new();
    append_patch(&record, mask_with_bit(31), NOW, PAYLOAD_VERSION, &mut out);
    assert_eq!(decode_patch(&out, NOW), Err(CodecError::Malformed));
}

fn mask_with_bit(bit: u32) -> PartMask {
    PartMask::from_bits(1 << bit)
}
