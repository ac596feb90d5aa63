//! Table tests of the lease set.

use super::*;

const NOW: Millis = 1_700_000_000_000;

/// One call in a table.
#[derive(Clone, Copy, Debug)]
enum Op {
    Acquire(&'static str, u64, u64),
    Release(&'static str),
    Renew(&'static str, u64),
    Sweep,
    InUse,
}

/// What the call answered.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Out {
    A(Acquire),
    B(bool),
    N(u64),
}

fn granted(in_use: u64) -> Out {
    Out::A(Acquire::Granted { in_use })
}

fn refreshed(in_use: u64) -> Out {
    Out::A(Acquire::Refreshed { in_use })
}

fn denied(in_use: u64, retry_after_ms: i64) -> Out {
    Out::A(Acquire::Denied {
        in_use,
        retry_after_ms,
    })
}

/// Run `rows` of (ms after `NOW`, call, answer), checking that a denial
/// and a false release or renew change nothing.
fn run(leases: &mut Leases, rows: &[(i64, Op, Out)]) {
    for (i, &(at, op, expected)) in rows.iter().enumerate() {
        let now = NOW + at;
        let before = leases.clone();
        let out = match op {
            Op::Acquire(id, max, ttl) => Out::A(leases.acquire(id.as_bytes(), max, ttl, now)),
            Op::Release(id) => Out::B(leases.release(id.as_bytes(), now)),
            Op::Renew(id, ttl) => Out::B(leases.renew(id.as_bytes(), ttl, now)),
            Op::Sweep => Out::N(leases.sweep(now)),
            Op::InUse => Out::N(leases.in_use(now)),
        };
        assert_eq!(out, expected, "row {i}: {op:?} at +{at} ms");
        if matches!(out, Out::A(Acquire::Denied { .. }) | Out::B(false)) {
            assert_eq!(*leases, before, "row {i}: nothing changes");
        }
        assert!(leases.is_valid(), "row {i}");
    }
}

#[test]
fn table_of_calls_on_max_two() {
    let mut leases = Leases::new();
    run(
        &mut leases,
        &[
            (0, Op::Acquire("a", 2, 1000), granted(1)),
            (100, Op::Acquire("b", 2, 1000), granted(2)),
            // Full: retry when `a` expires.
            (200, Op::Acquire("c", 2, 1000), denied(2, 800)),
            // A retry of `a` refreshes it even though the key is full.
            (300, Op::Acquire("a", 2, 1000), refreshed(2)),
            // Now `b` (deadline 1100) is the earliest.
            (400, Op::Acquire("c", 2, 1000), denied(2, 700)),
            (1099, Op::Acquire("c", 2, 1000), denied(2, 1)),
            // `b` expires at its deadline (exclusive) and frees its slot.
            (1100, Op::InUse, Out::N(1)),
            (1100, Op::Acquire("c", 2, 1000), granted(2)),
            (1100, Op::Release("b"), Out::B(false)),
            (1200, Op::Renew("a", 1000), Out::B(true)),
            (1300, Op::Acquire("d", 2, 1000), denied(2, 800)),
            (1300, Op::Release("c"), Out::B(true)),
            (1300, Op::Release("c"), Out::B(false)),
            (1300, Op::Acquire("d", 2, 1000), granted(2)),
            // `a` expires at 2200: no renew, no release.
            (2200, Op::Renew("a", 1000), Out::B(false)),
            (2200, Op::Release("a"), Out::B(false)),
            (2200, Op::InUse, Out::N(1)),
            // `a` is still stored, expired: a sweep removes it.
            (2250, Op::Sweep, Out::N(1)),
            (2250, Op::Sweep, Out::N(0)),
            (2299, Op::Release("d"), Out::B(true)),
            (2299, Op::InUse, Out::N(0)),
        ],
    );
    assert!(leases.is_empty());
}

#[test]
fn a_lock_with_max_one() {
    let mut leases = Leases::new();
    run(
        &mut leases,
        &[
            (0, Op::Acquire("w1", 1, 30_000), granted(1)),
            (10, Op::Acquire("w2", 1, 30_000), denied(1, 29_990)),
            (20_000, Op::Renew("w1", 30_000), Out::B(true)),
            (20_000, Op::Acquire("w2", 1, 30_000), denied(1, 30_000)),
            (20_001, Op::Renew("w2", 30_000), Out::B(false)),
            // w1 crashed: its slot comes back at 50 000.
            (49_999, Op::Acquire("w2", 1, 30_000), denied(1, 1)),
            (50_000, Op::Acquire("w2", 1, 30_000), granted(1)),
            // w1's late release does not free w2's slot.
            (50_001, Op::Release("w1"), Out::B(false)),
            (50_002, Op::Acquire("w1", 1, 30_000), denied(1, 29_998)),
            // Acquiring an expired id again is a new grant.
            (80_000, Op::Acquire("w2", 1, 30_000), granted(1)),
        ],
    );
}

#[test]
fn a_grant_sweeps_a_denial_does_not() {
    let mut leases = Leases::new();
    leases.acquire(b"a", 2, 100, NOW);
    leases.acquire(b"b", 2, 1000, NOW);
    leases.acquire(b"c", 3, 1000, NOW);
    // At +500 `a` expired; `b` and `c` fill max 2.
    assert_eq!(leases.expired(NOW + 500), 1);
    assert_eq!(
        leases.acquire(b"d", 2, 1000, NOW + 500),
        Acquire::Denied {
            in_use: 2,
            retry_after_ms: 500
        }
    );
    assert_eq!(leases.len(), 3, "the denial kept the expired lease");
    assert_eq!(
        leases.acquire(b"d", 3, 1000, NOW + 500),
        Acquire::Granted { in_use: 3 }
    );
    assert_eq!(leases.len(), 3, "the grant swept `a`");
    assert_eq!(leases.expired(NOW + 500), 0);
    assert!(!leases.is_live(b"a", NOW));
}

#[test]
fn release_and_renew_sweep_when_they_succeed() {
    let mut leases = Leases::new();
    leases.acquire(b"a", 5, 100, NOW);
    leases.acquire(b"b", 5, 1000, NOW);
    leases.acquire(b"c", 5, 1000, NOW);
    assert!(!leases.release(b"a", NOW + 100));
    assert_eq!(leases.len(), 3);
    assert!(leases.renew(b"b", 10, NOW + 100));
    assert_eq!(leases.len(), 2);
    assert_eq!(leases.deadline_of(b"b", NOW + 100), Some(NOW + 110));
    assert!(leases.release(b"c", NOW + 200));
    assert!(leases.is_empty(), "`b` expired at +110 and was swept");
}

#[test]
fn a_backward_clock_step_never_frees_a_slot() {
    let mut leases = Leases::new();
    assert_eq!(
        leases.acquire(b"a", 1, 1000, NOW),
        Acquire::Granted { in_use: 1 }
    );
    assert_eq!(
        leases.acquire(b"b", 1, 1000, NOW + 1000),
        Acquire::Granted { in_use: 1 }
    );
    // Back 600 ms: `b` (deadline +2000) still counts; `a` was swept by
    // the grant and does not come back.
    assert_eq!(leases.in_use(NOW + 400), 1);
    assert_eq!(
        leases.acquire(b"c", 1, 1000, NOW + 400),
        Acquire::Denied {
            in_use: 1,
            retry_after_ms: 1600
        }
    );
    // An unswept lease counts again when the clock goes back before its
    // deadline: a denial at +2500 keeps `b`, and at +1500 it is live.
    assert_eq!(leases.in_use(NOW + 2500), 0);
    assert!(leases.is_live(b"b", NOW + 1500));
    assert_eq!(
        leases.acquire(b"c", 1, 1000, NOW + 1500),
        Acquire::Denied {
            in_use: 1,
            retry_after_ms: 500
        }
    );
    // A refresh after a backward step takes `now + ttl` literally.
    assert_eq!(
        leases.acquire(b"b", 1, 100, NOW + 1500),
        Acquire::Refreshed { in_use: 1 }
    );
    assert_eq!(leases.last_deadline(NOW + 1500), Some(NOW + 1600));
}

#[test]
fn list_and_last_deadline() {
    let mut leases = Leases::new();
    assert_eq!(leases.last_deadline(NOW), None);
    leases.acquire(b"m", 9, 3000, NOW);
    leases.acquire(b"z", 9, 1000, NOW);
    leases.acquire(b"a", 9, 2000, NOW);
    let listed: Vec<(&[u8], i64)> = leases.list(NOW + 500).collect();
    assert_eq!(
        listed,
        vec![(&b"a"[..], 1500), (&b"m"[..], 2500), (&b"z"[..], 500)]
    );
    assert_eq!(leases.last_deadline(NOW + 500), Some(NOW + 3000));
    let listed: Vec<(&[u8], i64)> = leases.list(NOW + 1000).collect();
    assert_eq!(listed, vec![(&b"a"[..], 1000), (&b"m"[..], 2000)]);
    assert_eq!(leases.last_deadline(NOW + 2999), Some(NOW + 3000));
    assert_eq!(leases.last_deadline(NOW + 3000), None);
    assert_eq!(leases.list(NOW + 3000).count(), 0);
}

#[test]
fn bounds_are_clamped_and_deadlines_saturate() {
    let mut leases = Leases::new();
    // max 0 acts as 1, ttl 0 as 1 ms.
    assert_eq!(
        leases.acquire(b"a", 0, 0, NOW),
        Acquire::Granted { in_use: 1 }
    );
    assert_eq!(leases.deadline_of(b"a", NOW), Some(NOW + 1));
    assert_eq!(
        leases.acquire(b"b", 0, 0, NOW),
        Acquire::Denied {
            in_use: 1,
            retry_after_ms: 1
        }
    );
    let late = MAX_DEADLINE - 10;
    assert_eq!(
        leases.acquire(b"b", 1, u64::MAX, late),
        Acquire::Granted { in_use: 1 }
    );
    assert_eq!(leases.last_deadline(late), Some(MAX_DEADLINE));
    assert!(leases.renew(b"b", u64::MAX, late + 1));
    assert_eq!(leases.list(late).next(), Some((&b"b"[..], 10)));
    assert!(leases.is_valid());
    assert_eq!(leases.in_use(i64::MAX), 0);
    assert_eq!(leases.sweep(i64::MAX), 1);
    // Far in the past nothing overflows either.
    leases.acquire(b"c", 1, 5, i64::MIN);
    assert_eq!(leases.list(i64::MIN).next(), Some((&b"c"[..], 5)));
    assert_eq!(leases.in_use(i64::MIN), 1);
}

#[test]
fn max_leases_is_the_ceiling() {
    let mut leases = Leases::new();
    for i in 0..MAX_LEASES {
        let id = i.to_be_bytes();
        let out = leases.acquire(&id, u64::MAX, 1000, NOW);
        assert_eq!(out, Acquire::Granted { in_use: i + 1 });
    }
    assert_eq!(
        leases.acquire(b"one more", u64::MAX, 1000, NOW),
        Acquire::Denied {
            in_use: MAX_LEASES,
            retry_after_ms: 1000
        }
    );
    assert!(leases.is_valid());
    assert!(leases.heap_bytes() > MAX_LEASES as usize * 16);
}

#[test]
fn valid_ids() {
    assert!(!valid_id(b""));
    assert!(valid_id(b"x"));
    assert!(valid_id(&[0xff; MAX_LEASE_ID_LEN]));
    assert!(!valid_id(&[b'x'; MAX_LEASE_ID_LEN + 1]));
}

#[test]
fn generated_ids_are_time_then_random_hex() {
    let id = format_id([0x0123_4567_89ab_cdef, 0xffff_ffff_ffff_beef], NOW);
    assert_eq!(id, "018bcfe56800beef0123456789abcdef");
    assert_eq!(id.len(), GENERATED_ID_LEN);
    assert_eq!(&id[..12], format!("{NOW:012x}"));
    assert_eq!(format_id([0, 0], 0), "00000000000000000000000000000000");
    // The time wraps at 48 bits; a negative time wraps too.
    assert_eq!(&format_id([0, 0], 1 << 48)[..12], "000000000000");
    assert_eq!(&format_id([0, 0], -1)[..12], "ffffffffffff");
    assert_eq!(
        format_id([u64::MAX, u64::MAX], i64::MAX),
        "ffffffffffffffffffffffffffffffff"
    );
    // Later ids sort after earlier ones.
    assert!(format_id([u64::MAX, u64::MAX], NOW) < format_id([0, 0], NOW + 1));
    let id = format_id([7, 9], NOW);
    assert!(valid_id(id.as_bytes()));
    assert!(id
        .bytes()
        .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b)));
}

fn sample() -> Leases {
    let mut leases = Leases::new();
    leases.acquire(b"b", 3, 1000, NOW);
    leases.acquire(b"a", 3, 2000, NOW);
    leases
}

#[test]
fn serde_round_trip_and_shape() {
    for leases in [Leases::new(), sample()] {
        let bytes = rmp_serde::to_vec(&leases).unwrap_or_default();
        let back: Leases = rmp_serde::from_slice(&bytes).unwrap_or_default();
        assert_eq!(back, leases);
        assert!(back.is_valid());
    }
    // A map of bin ids to integer deadlines, in id order.
    let mut one = Leases::new();
    one.acquire(b"a", 1, 5, 0);
    assert_eq!(
        rmp_serde::to_vec(&one).unwrap_or_default(),
        [0x81, 0xc4, 0x01, b'a', 0x05]
    );
    assert_eq!(
        rmp_serde::to_vec(&Leases::new()).unwrap_or_default(),
        [0x80]
    );
    // A generated id at a current time: 43 bytes a lease.
    let mut big = Leases::new();
    for i in 0..10 {
        big.acquire(format_id([i, i], NOW).as_bytes(), 10, 60_000, NOW);
    }
    assert_eq!(
        rmp_serde::to_vec(&big).unwrap_or_default().len(),
        1 + 10 * 43
    );
}

#[test]
fn decoding_refuses_non_canonical_or_invalid_maps() {
    let decode = |bytes: &[u8]| rmp_serde::from_slice::<Leases>(bytes).ok();
    // {"a": 5, "b": 6} decodes.
    let good = [0x82, 0xc4, 1, b'a', 5, 0xc4, 1, b'b', 6];
    assert_eq!(decode(&good).map(|l| l.len()), Some(2));
    let cases: &[(&str, &[u8])] = &[
        ("unsorted", &[0x82, 0xc4, 1, b'b', 6, 0xc4, 1, b'a', 5]),
        ("duplicate", &[0x82, 0xc4, 1, b'a', 5, 0xc4, 1, b'a', 6]),
        ("empty id", &[0x81, 0xc4, 0, 5]),
        ("str id", &[0x81, 0xa1, b'a', 5]),
        ("array id", &[0x81, 0x91, 0x61, 5]),
        ("array", &[0x92, 0xc4, 1, b'a', 5]),
        (
            "deadline i64::MAX",
            &[
                0x81, 0xc4, 1, b'a', 0xcf, 0x7f, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff,
            ],
        ),
        ("truncated", &good[..8]),
    ];
    for (what, bytes) in cases {
        assert_eq!(decode(bytes), None, "{what}");
    }
    let mut long = vec![0x81, 0xc4, 129];
    long.extend([b'x'; 129]);
    long.push(5);
    assert_eq!(decode(&long), None, "id too long");
    let header = |n: u64| u16::try_from(n).expect("a map16 length").to_be_bytes();
    let mut too_many = vec![0xde]; // map16 of MAX_LEASES + 1 entries
    too_many.extend(header(MAX_LEASES + 1));
    for i in 0..=MAX_LEASES {
        too_many.extend([0xc4, 8]);
        too_many.extend(i.to_be_bytes());
        too_many.push(5);
    }
    assert_eq!(decode(&too_many), None, "too many leases");
    too_many[1..3].copy_from_slice(&header(MAX_LEASES));
    too_many.truncate(too_many.len() - 11);
    assert_eq!(decode(&too_many).map(|l| l.len() as u64), Some(MAX_LEASES));
}

#[test]
fn is_valid_checks_the_index() {
    let mut leases = sample();
    assert!(leases.is_valid());
    leases.by_deadline.pop_first();
    assert!(!leases.is_valid());
    let mut leases = sample();
    if let Some(d) = leases.by_id.get_mut(&b"a"[..]) {
        *d += 1;
    }
    assert!(!leases.is_valid());
    let mut leases = sample();
    leases.insert(b"", NOW);
    assert!(!leases.is_valid());
}
