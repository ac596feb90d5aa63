//! Tests of the record: retention, its size, the bare bucket, heap bytes.

use super::*;
use crate::core::bucket::{charge, Rate};

const NOW: Millis = 1_700_000_000_000;

/// 10 points, refilled in a second.
const RATE: Rate = Rate {
    capacity: 10,
    tokens: 10,
    period_ms: 1000,
};

/// A penalty with one strike counting until just after NOW.
fn one_strike() -> Penalty {
    Penalty {
        strikes: 1,
        strikes_until: NOW + 1,
        ..Penalty::default()
    }
}

#[test]
fn retention_follows_the_longest_part() {
    let mut r = Record {
        bucket: Some(charge(0, 5, &RATE, NOW).0),
        ..Record::default()
    };
    assert_eq!(r.prune(NOW), Retention::Until(NOW + 500));
    let mut p = Penalty::default();
    p.trip(1, 60_000, NOW);
    r.set_penalty(p, NOW);
    assert_eq!(r.prune(NOW), Retention::Until(NOW + 86_400_000));
    p.trip(3, 0, NOW);
    r.set_penalty(p, NOW);
    assert_eq!(r.prune(NOW), Retention::Forever);
    assert_ne!(r.prune(NOW + 1000), Retention::Delete);
    let mut empty = Record {
        bucket: Some(charge(0, 5, &RATE, NOW).0),
        ..Record::default()
    };
    assert_eq!(empty.prune(NOW + 500), Retention::Delete);
    let mut leased = Record::default();
    let mut leases = Leases::new();
    leases.acquire(b"job", 1, 30_000, NOW);
    leased.set_part(Some(Box::new(leases)));
    assert_eq!(leased.prune(NOW), Retention::Until(NOW + 30_000));
    assert_eq!(leased.prune(NOW + 30_000), Retention::Delete);
    assert_eq!(leased, Record::default());
    assert_eq!(empty, Record::default());
}

#[test]
fn a_bucket_only_record_is_its_parts_and_two_pointers() {
    // 48 bytes: the allocator's 48-byte class, not the 64-byte one.
    assert_eq!(std::mem::size_of::<Record>(), 48);
}

#[test]
fn only_a_record_with_nothing_but_a_bucket_has_a_bare_bucket() {
    // 32 bytes: what a key that holds only a bucket keeps.
    assert_eq!(std::mem::size_of::<Bucket>(), 32);
    let bucket = charge(0, 5, &RATE, NOW).0;
    let mut r = Record::with_bucket(bucket);
    assert_eq!(r.bare_bucket(), Some(bucket));
    r.set_penalty(one_strike(), NOW);
    assert_eq!(r.bare_bucket(), None, "a penalty beside it");
    r.set_penalty(Penalty::default(), NOW);
    assert_eq!(r.bare_bucket(), Some(bucket), "the penalty dropped");
    r.set_part(Some(QuotaState {
        end: NOW + 1,
        count: 1,
    }));
    assert_eq!(r.bare_bucket(), None, "another part beside it");
    r.set_part::<QuotaState>(None);
    assert_eq!(r.bare_bucket(), Some(bucket));
    assert_eq!(Record::default().bare_bucket(), None, "no bucket");
}

#[test]
fn heap_bytes_counts_each_allocation_once() {
    let class = |_: *const u8| 64;
    let mut r = Record::with_bucket(charge(0, 5, &RATE, NOW).0);
    assert_eq!(r.heap_bytes(class), 0, "the bucket is inline");
    r.set_penalty(one_strike(), NOW);
    assert_eq!(r.heap_bytes(class), 64);
    r.set_part(Some(QuotaState {
        end: NOW + 1,
        count: 1,
    }));
    assert_eq!(r.heap_bytes(class), 128, "penalty + the other parts");
    let mut leases = Leases::new();
    leases.acquire(b"job", 1, 30_000, NOW);
    let lease_heap = leases.heap_bytes();
    r.set_part::<Box<Leases>>(Some(Box::new(leases)));
    assert_eq!(r.heap_bytes(class), 192 + lease_heap);
    r.set_part::<QuotaState>(None);
    r.set_part::<Box<Leases>>(None);
    assert_eq!(r.heap_bytes(class), 64, "no empty allocation is kept");
}

/// `steady_until` is what `prune` keeps a steady record until, read at
/// any time before that instant; a record holding a part whose retention
/// moves with the clock has none.
#[test]
fn steady_until_is_the_retention_of_a_steady_record_at_any_time() {
    use crate::core::quota::{Period, QuotaState};
    use crate::core::region::RegionCounts;
    use crate::core::window::WindowState;
    let fixed = WindowState::Fixed {
        end: NOW + 60_000,
        count: 3,
    };
    let sliding = WindowState::Sliding {
        start: NOW - 30_000,
        prev: 2,
        curr: 5,
        window_ms: 60_000,
    };
    let quota = QuotaState {
        end: NOW + 90_000,
        count: 7,
    };
    let mut steady = Vec::new();
    for window in [None, Some(fixed.clone()), Some(sliding.clone())] {
        for q in [None, Some(quota)] {
            for regions in [
                None,
                Some(Box::new(RegionCounts::new(Period::Day, NOW + 45_000))),
            ] {
                let mut r = Record::default();
                r.set_part(window.clone());
                r.set_part(q);
                r.set_part(regions);
                steady.push(r);
            }
        }
    }
    for r in &steady {
        let first = r.steady_until(NOW);
        for later in [
            NOW,
            NOW + 1,
            NOW + 29_999,
            NOW + 44_999,
            NOW + 59_998,
            NOW + 89_999,
        ] {
            let mut pruned = r.clone();
            let kept = match pruned.prune(later) {
                Retention::Until(at) => Some(at),
                _ => None,
            };
            assert_eq!(r.steady_until(later), kept, "{r:?} at {later}");
            if kept.is_some() {
                assert_eq!(kept, first, "{r:?}: the same at {later}");
            }
        }
    }
    let mut moving = steady[steady.len() - 1].clone();
    moving.set_penalty(one_strike(), NOW);
    assert_eq!(moving.steady_until(NOW), None, "a penalty");
    let mut with_bucket = steady[1].clone();
    with_bucket.bucket = Some(charge(0, 5, &RATE, NOW).0);
    assert_eq!(with_bucket.steady_until(NOW), None, "a bucket");
    let mut log = Record::default();
    log.set_part(Some(WindowState::Exact {
        log: Default::default(),
        window_ms: 60_000,
    }));
    assert_eq!(log.steady_until(NOW), None, "a log");
}
