//! Table tests of the shared decision.

use super::*;
use crate::core::bucket;
use crate::core::penalty::MANUAL;
use crate::core::testkit::{rate_of as rate, req, ToWire, T0 as NOW};

fn strikes(threshold: u64) -> Option<PenaltyPolicy> {
    Some(PenaltyPolicy {
        threshold,
        window_ms: 60_000,
        box_ms: [300_000, 3_600_000, 0],
        offenses_ttl_ms: 86_400_000,
        every: false,
    })
}

#[test]
fn table_of_single_bucket_calls() {
    // (ms after start, cost, expected reply)
    let r = rate(10, 1, 1000);
    let rows: &[(i64, u64, [i64; 8])] = &[
        (0, 4, [1, 10, 6, 4000, 0, 0, -1, 0]),
        (0, 6, [1, 10, 0, 10000, 0, 0, -1, 0]),
        (0, 1, [0, 10, 0, 10000, 1000, 0, -1, 0]),
        (999, 1, [0, 10, 0, 9001, 1, 0, -1, 0]),
        (1000, 1, [1, 10, 0, 10000, 0, 0, -1, 0]),
        (1000, 0, [1, 10, 0, 10000, 0, 0, -1, 0]),
        (4000, 3, [1, 10, 0, 10000, 0, 0, -1, 0]),
        (24000, 0, [1, 10, 10, 0, 0, 0, -1, 0]),
    ];
    let mut buckets = [None];
    let mut penalty = Penalty::default();
    for (at, cost, expected) in rows {
        let (reply, _) = take(&mut buckets, &mut penalty, &req(&[r], *cost), NOW + at, 0);
        assert_eq!(reply.wire(), *expected, "at +{at} ms, cost {cost}");
    }
}

#[test]
fn all_or_nothing_across_buckets_and_the_stricter_binds() {
    let key = rate(100, 100, 60_000);
    let tenant = rate(10, 10, 60_000);
    let mut buckets = [None, None];
    let mut penalty = Penalty::default();
    let r = req(&[key, tenant], 6);
    let (reply, fx) = take(&mut buckets, &mut penalty, &r, NOW, 0);
    assert_eq!(reply.wire(), [1, 10, 4, 36000, 0, 0, -1, 1]);
    assert_eq!(fx.states, KeySet::first(2));
    let before = buckets;
    let (reply, fx) = take(&mut buckets, &mut penalty, &r, NOW, 0);
    assert_eq!(reply.wire(), [0, 10, 4, 36000, 12000, 0, -1, 1]);
    assert_eq!(fx, Effects::default());
    assert_eq!(
        buckets, before,
        "a throttled call takes nothing from any bucket"
    );
}

#[test]
fn strikes_then_box_then_status_minus_one() {
    let mut buckets = [None];
    let mut penalty = Penalty::default();
    let mut r = req(&[rate(1, 1, 60_000)], 1);
    r.penalty = strikes(2);
    let (reply, _) = take(&mut buckets, &mut penalty, &r, NOW, 0);
    assert_eq!(reply.wire(), [1, 1, 0, 60000, 0, 0, 2, 0]);
    // The first refusal announces a retry at NOW + 60000: no strike.
    let (reply, fx) = take(&mut buckets, &mut penalty, &r, NOW + 1, 0);
    assert_eq!(reply.wire(), [0, 1, 0, 59999, 59999, 0, 2, 0]);
    assert!(fx.penalty && fx.tripped.is_none());
    assert_eq!(penalty.retry_at, NOW + 60_000);
    // Retrying before it is a strike, each time.
    let (reply, fx) = take(&mut buckets, &mut penalty, &r, NOW + 2, 0);
    assert_eq!(reply.wire(), [0, 1, 0, 59998, 59998, 0, 1, 0]);
    assert!(fx.penalty && fx.tripped.is_none());
    let (reply, fx) = take(&mut buckets, &mut penalty, &r, NOW + 2, 0);
    assert_eq!(reply.wire(), [-1, 1, 0, 300000, 300000, 1, 0, 0]);
    assert_eq!(fx.tripped.map(|b| b.level), Some(1));
    // Boxed: nothing is read or charged, even when the bucket is full.
    let (reply, fx) = take(&mut buckets, &mut penalty, &r, NOW + 120_000, 0);
    assert_eq!(reply.wire(), [-1, 1, 0, 180002, 180002, 1, 0, 0]);
    assert_eq!(fx, Effects::default());
}

#[test]
fn debt_charges_past_empty_and_refund_gives_back_up_to_full() {
    let mut buckets = [None, None];
    let mut penalty = Penalty::default();
    let rates = [rate(10, 1, 1000), rate(100, 10, 1000)];
    let mut r = req(&rates, 25);
    r.settle = Settle::Debt;
    // 25 points on a bucket of 10: allowed, 15 in debt.
    let (d, fx) = take(&mut buckets, &mut penalty, &r, NOW, 0);
    assert_eq!(d.wire(), [1, 10, -15, 25_000, 0, 0, -1, 0]);
    assert_eq!(fx.states, KeySet::first(2));
    // Throttled until the debt is repaid at the refill rate.
    let one = req(&rates, 1);
    let (d, _) = take(&mut buckets, &mut penalty, &one, NOW, 0);
    assert_eq!(
        (d.status, d.retry_after),
        (Status::Throttled, Span::Ms(16_000))
    );
    let (d, _) = take(&mut buckets, &mut penalty, &one, NOW + 16_000, 0);
    assert_eq!(d.status, Status::Allowed);
    // A refund gives back, never beyond full.
    let mut back = req(&rates, 1000);
    back.settle = Settle::Refund;
    let (d, fx) = take(&mut buckets, &mut penalty, &back, NOW + 16_000, 0);
    assert_eq!(d.wire(), [1, 10, 10, 0, 0, 0, -1, 0]);
    assert_eq!(fx.states, KeySet::first(2));
    // A refund to keys that hold nothing changes nothing.
    let mut empty = [None];
    let (d, fx) = take(&mut empty, &mut penalty, &req(&rates[..1], 5), NOW, 0);
    assert_eq!(d.status, Status::Allowed);
    let mut nothing = [None];
    let (_, fx2) = take(
        &mut nothing,
        &mut penalty,
        &{
            let mut b = req(&rates[..1], 5);
            b.settle = Settle::Refund;
            b
        },
        NOW,
        0,
    );
    assert!(fx.states.contains(0) && fx2.states.is_empty() && nothing[0].is_none());
}

#[test]
fn debt_and_refund_never_strike_and_a_box_still_answers() {
    let mut buckets = [None];
    let mut penalty = Penalty::default();
    penalty.trip(1, 60_000, NOW);
    let mut r = req(&[rate(1, 1, 1000)], 5);
    r.penalty = strikes(1);
    r.settle = Settle::Debt;
    let (d, fx) = take(&mut buckets, &mut penalty, &r, NOW, 0);
    assert_eq!((d.status, fx), (Status::Boxed, Effects::default()));
    penalty.release(true, NOW);
    let (d, _) = take(&mut buckets, &mut penalty, &r, NOW, 0);
    assert_eq!((d.status, d.strikes_remaining), (Status::Allowed, Some(1)));
    let (d, _) = take(&mut buckets, &mut penalty, &r, NOW, 0);
    assert_eq!((d.status, d.remaining), (Status::Allowed, -9));
}

#[test]
fn a_client_that_waits_as_told_is_never_struck() {
    let mut buckets = [None];
    let mut penalty = Penalty::default();
    let mut r = req(&[rate(2, 1, 1000)], 1);
    r.penalty = strikes(1);
    let mut now = NOW;
    for _ in 0..50 {
        let (reply, _) = take(&mut buckets, &mut penalty, &r, now, 0);
        assert_ne!(reply.status, Status::Boxed);
        assert_eq!(reply.strikes_remaining, Some(1));
        now += i64::try_from(reply.retry_after.as_ms().unwrap_or(0)).unwrap_or(0);
    }
    // One early retry with a threshold of 1 trips the box.
    let (refused, _) = take(&mut buckets, &mut penalty, &r, now, 0);
    let (refused, _) = match refused.status {
        Status::Allowed => take(&mut buckets, &mut penalty, &r, now, 0),
        _ => (refused, Effects::default()),
    };
    assert_eq!(refused.status, Status::Throttled);
    let (early, _) = take(&mut buckets, &mut penalty, &r, now, 0);
    assert_eq!(early.status, Status::Boxed);
}

#[test]
fn with_every_each_refusal_is_a_strike_even_after_waiting() {
    // Five failed logins for one subject in 15 minutes lock it out: the
    // sixth is refused and, with EVERY, struck at once.
    let w = rate(5, 5, 900_000);
    let mut buckets = [None];
    let mut penalty = Penalty::default();
    let mut r = req(&[w], 1);
    // STRIKES 2 900 EVERY: the strike window lasts the 15 minutes.
    r.penalty = strikes(2).map(|p| PenaltyPolicy {
        window_ms: 900_000,
        every: true,
        ..p
    });
    for _ in 0..5 {
        let (reply, fx) = take(&mut buckets, &mut penalty, &r, NOW, 0);
        assert_eq!(
            (reply.status, reply.strikes_remaining),
            (Status::Allowed, Some(2))
        );
        assert!(fx.tripped.is_none());
    }
    let (first, fx) = take(&mut buckets, &mut penalty, &r, NOW, 0);
    assert_eq!(
        (first.status, first.strikes_remaining),
        (Status::Throttled, Some(1)),
        "the first refusal after allowed calls is a strike"
    );
    assert!(fx.penalty);
    // The client waits exactly as told, spends the point it gets back, and
    // is refused again: a strike all the same, the second, which trips.
    let later = NOW + i64::try_from(first.retry_after.as_ms().unwrap_or(0)).unwrap_or(0);
    let (ok, _) = take(&mut buckets, &mut penalty, &r, later, 0);
    assert_eq!(
        (ok.status, ok.strikes_remaining),
        (Status::Allowed, Some(1))
    );
    let (boxed, fx) = take(&mut buckets, &mut penalty, &r, later, 0);
    assert_eq!((boxed.status, boxed.box_level), (Status::Boxed, 1));
    assert_eq!(fx.tripped.map(|b| b.level), Some(1));

    // Without EVERY the same client is never struck.
    let mut buckets = [None];
    let mut penalty = Penalty::default();
    r.penalty = strikes(1);
    for _ in 0..5 {
        take(&mut buckets, &mut penalty, &r, NOW, 0);
    }
    let (first, _) = take(&mut buckets, &mut penalty, &r, NOW, 0);
    assert_eq!(
        (first.status, first.strikes_remaining),
        (Status::Throttled, Some(1))
    );
    let (ok, _) = take(&mut buckets, &mut penalty, &r, later, 0);
    assert_eq!(ok.status, Status::Allowed);
    let (again, _) = take(&mut buckets, &mut penalty, &r, later, 0);
    assert_eq!(
        (again.status, again.strikes_remaining),
        (Status::Throttled, Some(1))
    );
    // A probe and a debt are never strikes, EVERY or not.
    r.penalty = strikes(1).map(|p| PenaltyPolicy { every: true, ..p });
    r.cost = 0;
    let (probe, fx) = take(&mut buckets, &mut penalty, &r, later, 0);
    assert_eq!((probe.strikes_remaining, fx.penalty), (Some(1), false));
    r.cost = 1;
    r.settle = Settle::Debt;
    let (debt, _) = take(&mut buckets, &mut penalty, &r, later, 0);
    assert_eq!(
        (debt.status, debt.strikes_remaining),
        (Status::Allowed, Some(1))
    );
}

#[test]
fn a_manual_box_answers_minus_one() {
    let mut penalty = Penalty::default();
    penalty.trip(3, 0, NOW);
    assert_eq!(penalty.box_until, MANUAL);
    let (reply, _) = take(
        &mut [None],
        &mut penalty,
        &req(&[rate(5, 5, 1000)], 1),
        NOW,
        0,
    );
    assert_eq!(reply.wire(), [-1, 5, 0, -1, -1, 3, 0, 0]);
}

#[test]
fn a_probe_writes_nothing_and_counts_no_strike() {
    let mut buckets = [None];
    let mut penalty = Penalty::default();
    let mut r = req(&[rate(2, 1, 1000)], 2);
    r.penalty = strikes(1);
    take(&mut buckets, &mut penalty, &r, NOW, 0);
    r.cost = 0;
    let before = (buckets, penalty);
    let (reply, fx) = take(&mut buckets, &mut penalty, &r, NOW, 0);
    assert_eq!(reply.wire(), [1, 2, 0, 2000, 0, 0, 1, 0]);
    assert_eq!(fx, Effects::default());
    assert_eq!((buckets, penalty), before);
}

#[test]
fn jitter_stretches_the_wait_within_its_bound() {
    let mut buckets = [None];
    let mut penalty = Penalty::default();
    let mut r = req(&[rate(1, 1, 10_000)], 1);
    take(&mut buckets, &mut penalty, &r, NOW, 0);
    r.jitter_percent = 50;
    let (low, _) = take(&mut buckets, &mut penalty, &r, NOW, 0);
    let (high, _) = take(&mut buckets, &mut penalty, &r, NOW, u64::MAX);
    assert_eq!(low.retry_after, Span::Ms(10_000));
    assert_eq!(high.retry_after, Span::Ms(15_000));
}

#[test]
fn a_backward_step_grants_nothing_until_the_clock_passes_again() {
    let now = 1_700_000_000_000;
    let rate = Rate {
        capacity: 5,
        tokens: 5,
        period_ms: 10_000,
    };
    let mut buckets = [None];
    let mut penalty = Penalty::default();
    let mut req = TakeRequest::new(&[rate], 5);
    take(&mut buckets, &mut penalty, &req, now, 0);
    req.cost = 1;
    let back = now - 3_600_000;
    let (reply, fx) = take(&mut buckets, &mut penalty, &req, back, 0);
    // Read an hour early, the bucket holds 1805 points more than it
    // admits: the reply shows them, as its wait does.
    assert_eq!(reply.wire(), [0, 5, -1800, 3_610_000, 3_602_000, 0, -1, 0]);
    assert_eq!(fx, Effects::default(), "a throttled call writes nothing");
    req.cost = 5;
    let (reply, _) = take(&mut buckets, &mut penalty, &req, back + 10_000, 0);
    assert_eq!(reply.status, Status::Throttled, "the hour is not refilled");
    let (reply, _) = take(&mut buckets, &mut penalty, &req, now + 10_000, 0);
    assert_eq!(reply.status, Status::Allowed);
}

#[test]
fn delay_reserves_within_max_wait_and_throttles_beyond() {
    let now = 1_700_000_000_000;
    let rate = Rate {
        capacity: 1,
        tokens: 1,
        period_ms: 100,
    };
    let mut buckets = [None];
    let mut penalty = Penalty::default();
    let mut req = TakeRequest::new(&[rate], 1);
    req.delay_ms = Some(1000);
    let (first, _) = take(&mut buckets, &mut penalty, &req, now, 0);
    assert_eq!(first.wire(), [1, 1, 0, 100, 0, 0, -1, 0]);
    for k in 1..=10 {
        let (reply, fx) = take(&mut buckets, &mut penalty, &req, now, 0);
        assert_eq!(
            reply.wire(),
            [2, 1, -k, 100 * (k + 1), 100 * k, 0, -1, 0],
            "call {k}"
        );
        assert_eq!(fx.states, KeySet::first(1));
    }
    let before = buckets;
    let (reply, fx) = take(&mut buckets, &mut penalty, &req, now, 0);
    assert_eq!(
        reply.wire(),
        [0, 1, -10, 1100, 1100, 0, -1, 0],
        "beyond max_wait"
    );
    assert_eq!(
        (fx, buckets),
        (Effects::default(), before),
        "throttled: nothing reserved"
    );
    // Without DELAY the reservations are debt: nothing fits for 1.1 s.
    req.delay_ms = None;
    let (reply, _) = take(&mut buckets, &mut penalty, &req, now + 1099, 0);
    assert_eq!(
        (reply.status, reply.retry_after),
        (Status::Throttled, Span::Ms(1))
    );
    let debt = bucket::debt(buckets[0].as_ref(), &rate, now);
    assert_eq!(
        debt, 1100,
        "one point plus max_wait worth of points, in ticks"
    );
}

#[test]
fn partial_grants_what_every_bucket_can_give() {
    let rates = [rate(10, 1, 1000), rate(4, 1, 1000)];
    let mut buckets = [None, None];
    let mut penalty = Penalty::default();
    let mut r = req(&rates, 25);
    r.partial_min = Some(2);
    // The smaller bucket gives 4: 4 from each.
    let (d, fx) = take(&mut buckets, &mut penalty, &r, NOW, 0);
    assert_eq!(
        (d.status, d.granted, d.binding),
        (Status::Allowed, Some(4), 1)
    );
    assert_eq!(fx.states, KeySet::first(2));
    assert_eq!(d.remaining, 0);
    // Nothing left: below MIN, refused until 2 points are back.
    let (d, fx) = take(&mut buckets, &mut penalty, &r, NOW, 0);
    assert_eq!((d.status, d.granted), (Status::Throttled, None));
    assert_eq!(d.retry_after, Span::Ms(2000));
    assert!(fx.states.is_empty());
    let (d, _) = take(&mut buckets, &mut penalty, &r, NOW + 3000, 0);
    assert_eq!((d.status, d.granted), (Status::Allowed, Some(3)));
}

#[test]
fn a_reserve_keeps_its_share_for_other_callers() {
    let fleet = rate(10, 1, 1000);
    let mut buckets = [None];
    let mut penalty = Penalty::default();
    let mut low = req(&[fleet], 1);
    low.reserve[0] = 5; // keep 50 %
    let top = req(&[fleet], 1);
    for _ in 0..5 {
        assert_eq!(
            take(&mut buckets, &mut penalty, &low, NOW, 0).0.status,
            Status::Allowed
        );
    }
    let (d, fx) = take(&mut buckets, &mut penalty, &low, NOW, 0);
    assert_eq!((d.status, d.binding), (Status::Throttled, 0));
    assert_eq!(
        d.retry_after,
        Span::Ms(1000),
        "until it fits above the reserve"
    );
    assert!(fx.reserve_refused);
    // The top tier still gets through, down to empty.
    for _ in 0..5 {
        assert_eq!(
            take(&mut buckets, &mut penalty, &top, NOW, 0).0.status,
            Status::Allowed
        );
    }
    let (d, fx) = take(&mut buckets, &mut penalty, &top, NOW, 0);
    assert!(d.status == Status::Throttled && !fx.reserve_refused);
}
