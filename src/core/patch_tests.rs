//! The patch codec: round trips, merging onto the replica's record to the
//! master's exact bytes, and refusal of every malformed patch.

use super::*;
use crate::core::bucket::{tick_scale, Bucket};
use crate::core::codec::{decode, decode_loaded, encode};
use crate::core::lease::Leases;
use crate::core::part::PartMask;
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
    encode_patch_append(r, &r.patch_plan(now), now, &mut out);
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
    append_patch(
        &record,
        &only_unchanged(beyond),
        NOW,
        PAYLOAD_VERSION + 1,
        &mut unknown_part,
    );
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
    append_patch(
        &record,
        &only_unchanged(mask_with_bit(31)),
        NOW,
        PAYLOAD_VERSION,
        &mut out,
    );
    assert_eq!(decode_patch(&out, NOW), Err(CodecError::Malformed));
}

fn only_unchanged(unchanged: PartMask) -> PatchPlan {
    PatchPlan {
        unchanged,
        ..PatchPlan::default()
    }
}

fn mask_with_bit(bit: u32) -> PartMask {
    PartMask::from_bits(1 << bit)
}

/// The master's `RL.WINDOW ... EXACT` call at `now`: the log charged in
/// place, then the record pruned as the commit does.
fn after_exact_charge(mut r: Record, now: Millis, cost: u64) -> Record {
    if let Some(Some(WindowState::Exact { window_ms, log })) =
        crate::core::record::Holds::<WindowState>::slot(&mut r)
    {
        log.charge_in_place(i128::from(*window_ms), now, cost);
    }
    r.prune(now);
    r
}

#[test]
fn a_charged_log_sends_one_entry_and_merges_to_the_masters_bytes() {
    // At NOW + 2_605_000 about half of the log has stopped counting.
    for now in [NOW, NOW + 7, NOW + 2_605_000] {
        let master = after_exact_charge(committed(), now, 2);
        let plan = master.patch_plan(now);
        assert!(!plan.unchanged.is_empty());
        assert_eq!(plan.log, Some(LogCharge(2)));
        let bytes = patch_of(&master, now);
        assert!(bytes.len() < 40, "{} bytes", bytes.len());
        let merged = decode_patch(&bytes, now)
            .expect("a patch")
            .apply_onto(committed());
        assert_eq!(encode(&merged), encode(&master), "at {now}");
    }
}

#[test]
fn a_log_changed_otherwise_is_sent_whole() {
    let mut master = committed();
    if let Some(Some(WindowState::Exact { log, .. })) =
        crate::core::record::Holds::<WindowState>::slot(&mut master)
    {
        log.charge_in_place(3_600_000, NOW, 1);
        // A second charge at another time is not one entry any more.
        log.charge_in_place(3_600_000, NOW + 1, 1);
    }
    assert_eq!(master.patch_plan(NOW + 1).log, None);
    let fresh = Record::default();
    assert_eq!(fresh.patch_plan(NOW), PatchPlan::default());
}

#[test]
fn malformed_log_charges_are_refused() {
    let master = after_exact_charge(committed(), NOW, 2);
    let plan = master.patch_plan(NOW);
    assert!(plan.log.is_some());
    let bad = [
        PatchPlan {
            unchanged: PartMask::NONE,
            ..plan.clone()
        },
        PatchPlan {
            log: Some(LogCharge(crate::core::part::MAX_COUNT + 1)),
            ..plan.clone()
        },
    ];
    for plan in bad {
        let mut out = Vec::new();
        append_patch(&master, &plan, NOW, PAYLOAD_VERSION, &mut out);
        assert_eq!(
            decode_patch(&out, NOW),
            Err(CodecError::Malformed),
            "{plan:?}"
        );
    }
}

/// A record as the master committed it: 999 leases beside a bucket.
fn leased() -> Record {
    let mut r = committed();
    r.set_part::<WindowState>(None);
    let leases = r.leases_or_insert();
    for i in 0..999u32 {
        let id = format!("job-{i:04}");
        leases.acquire(id.as_bytes(), 1000, 60_000 + u64::from(i), NOW);
    }
    r.prune(NOW);
    r.clear_touched();
    r
}

/// A lease call on the master's set at a time; true when it changed it.
type LeaseCall = fn(&mut Leases, Millis) -> bool;

#[test]
fn one_lease_changed_is_all_a_patch_carries() {
    // A grant, a refresh, a release, a renew, and a grant once the oldest
    // leases expired (the replica sweeps them when it prunes).
    let later = NOW + 60_500;
    let calls: [(Millis, LeaseCall); 5] = [
        (NOW, |l, now| {
            matches!(
                l.acquire(b"new", 1000, 5_000, now),
                crate::core::lease::Acquire::Granted { .. }
            )
        }),
        (NOW, |l, now| {
            matches!(
                l.acquire(b"job-0007", 1000, 5_000, now),
                crate::core::lease::Acquire::Refreshed { .. }
            )
        }),
        (NOW, |l, now| l.release(b"job-0998", now)),
        (NOW, |l, now| l.renew(b"job-0003", 90_000, now)),
        (later, |l, now| {
            matches!(
                l.acquire(b"late", 1000, 5_000, now),
                crate::core::lease::Acquire::Granted { .. }
            )
        }),
    ];
    for (i, (now, call)) in calls.into_iter().enumerate() {
        let mut master = leased();
        assert!(call(master.leases_or_insert(), now), "call {i}");
        master.prune(now);
        let plan = master.patch_plan(now);
        assert!(plan.lease.is_some(), "call {i}");
        let bytes = patch_of(&master, now);
        assert!(bytes.len() < 60, "call {i}: {} bytes", bytes.len());
        let merged = decode_patch(&bytes, now)
            .expect("a patch")
            .apply_onto(leased());
        assert_eq!(encode(&merged), encode(&master), "call {i}");
    }
}

#[test]
fn leases_changed_twice_are_sent_whole() {
    let mut master = leased();
    let leases = master.leases_or_insert();
    leases.acquire(b"a", 1000, 5_000, NOW);
    leases.release(b"job-0001", NOW);
    assert_eq!(master.patch_plan(NOW).lease, None);
    let mut bad = leased();
    bad.leases_or_insert().release(b"job-0001", NOW);
    let mut plan = bad.patch_plan(NOW);
    if let Some(change) = plan.lease.as_mut() {
        change.id = Box::default();
    }
    let mut out = Vec::new();
    append_patch(&bad, &plan, NOW, PAYLOAD_VERSION, &mut out);
    assert_eq!(
        decode_patch(&out, NOW),
        Err(CodecError::Malformed),
        "an empty id"
    );
}

#[test]
fn a_forged_stream_of_new_leases_leaves_a_set_that_loads() {
    // Each patch adds one new lease to a master's full set of 999 (what a
    // master can send); replayed one after another on one replica record,
    // they would make it hold more than any master can.
    let mut replica = leased();
    for i in 0..50u32 {
        let mut master = leased();
        let id = format!("forged-{i}");
        master
            .leases_or_insert()
            .acquire(id.as_bytes(), 1000, 5_000, NOW);
        master.prune(NOW);
        let bytes = patch_of(&master, NOW);
        replica = decode_patch(&bytes, NOW)
            .expect("a patch")
            .apply_onto(replica);
    }
    assert_eq!(replica.leases().map(Leases::len), Some(1000));
    assert!(decode_loaded(&encode(&replica), NOW).is_ok(), "it loads");
}
