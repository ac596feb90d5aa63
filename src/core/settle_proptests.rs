//! Property tests of how a call settles its cost: with `DEBT`, the points
//! admitted never exceed capacity + refill + the post-paid points (the
//! pre-paid ones alone stay within capacity + refill); a debt shows in
//! every later reply; `REFUND` never lifts a bucket above full; `PARTIAL` grants
//! what every bucket can give, at least `MIN`, the same from each; a call
//! with `RESERVE` never leaves its bucket below the reserve when it admits.

use proptest::prelude::*;

use super::take::Settle;
use super::testkit::*;

proptest! {
    #![proptest_config(config(256))]

    /// Over any run of pre-paid calls (admitted only if they fit) and
    /// post-paid ones (`DEBT`, always charged), the pre-paid points
    /// admitted never exceed capacity + refill + the post-paid points.
    #[test]
    fn debt_admits_no_more_than_capacity_refill_and_debt(
        (rates, calls) in run(1..=2, 150),
        debts in prop::collection::vec(any::<bool>(), 150),
    ) {
        let mut state = State::new(rates.len());
        let mut now = T0;
        let (mut admitted, mut post_paid) = (0i128, 0i128);
        for ((step, cost), debt) in calls.iter().zip(debts) {
            now += *step as i64;
            let mut r = req(&rates, *cost);
            if debt {
                r.settle = Settle::Debt;
            }
            let (reply, _) = state.call(&r, now);
            if debt {
                prop_assert_eq!(reply.status, Status::Allowed, "a debt is never refused");
            }
            if debt {
                post_paid += i128::from(*cost);
            } else if reply.status == Status::Allowed {
                admitted += i128::from(*cost);
            }
            for r in &rates {
                // Post-paid points only take room: the pre-paid ones still
                // fit capacity + refill (sum * period <= capacity * period
                // + travel * tokens), however much was post-paid.
                let travel = i128::from(now - T0);
                let bound = i128::from(r.capacity) * i128::from(r.period_ms)
                    + travel * i128::from(r.tokens);
                prop_assert!(admitted * i128::from(r.period_ms) <= bound,
                    "{} pre-paid after {} post-paid over {:?}", admitted, post_paid, r);
            }
        }
    }

    /// A debt is shown wherever its bucket is: after any run of pre-paid,
    /// post-paid (`DEBT`) and delayed (`DELAY`) calls, the `remaining` of
    /// every reply (a `COST 0` probe included) is its binding bucket's
    /// balance, negative by the debt; a probe is negative whenever any
    /// bucket is in debt, and otherwise shows the lowest balance.
    #[test]
    fn a_debt_is_shown_in_every_later_reply(
        (rates, calls) in run(1..=3, 60),
        modes in prop::collection::vec(0u8..3, 60),
    ) {
        let mut state = State::new(rates.len());
        let mut now = T0;
        let balance = |state: &State, i: usize, now| {
            let r = &rates[i];
            bucket::balance(bucket::debt(state.buckets[i].as_ref(), r, now), r)
        };
        for ((step, cost), mode) in calls.iter().zip(modes) {
            now += *step as i64;
            let mut r = req(&rates, *cost);
            match mode {
                0 => r.settle = Settle::Debt,
                1 => r.delay_ms = Some(3_600_000),
                _ => {}
            }
            let (reply, _) = state.call(&r, now);
            let b = reply.binding as usize;
            prop_assert_eq!(reply.remaining, balance(&state, b, now), "{:?}", reply);
            let (probe, _) = state.call(&req(&rates, 0), now);
            let b = probe.binding as usize;
            prop_assert_eq!(probe.remaining, balance(&state, b, now), "{:?}", probe);
            let lowest = (0..rates.len()).map(|i| balance(&state, i, now)).min().unwrap_or(0);
            if lowest < 0 {
                prop_assert!(probe.remaining < 0, "a debt of {} hidden: {:?}", lowest, probe);
            } else {
                prop_assert_eq!(probe.remaining, lowest, "{:?}", probe);
            }
        }
    }

    /// A refund never lifts a bucket above full, and refunding what a
    /// charge took restores its points.
    #[test]
    fn refund_never_lifts_above_full(r in rate(), spent in 0u64..=1000, back in 1u64..=2000) {
        let spent = spent.min(r.capacity);
        let mut state = State::new(1);
        state.call(&req(&[r], spent), T0);
        let mut refund = req(&[r], back);
        refund.settle = Settle::Refund;
        let (reply, _) = state.call(&refund, T0);
        prop_assert_eq!(reply.status, Status::Allowed);
        prop_assert!(reply.remaining <= r.capacity as i64);
        let expected = (r.capacity - spent + back.min(spent)).min(r.capacity);
        prop_assert!(state.probe_one(0, r, T0).remaining >= expected as i64 - 1);
        prop_assert!(bucket::debt(state.buckets[0].as_ref(), &r, T0) >= 0);
    }

    /// `PARTIAL` grants the fewest points any bucket can give (at most the
    /// cost), the same from each, when that is at least `MIN`; otherwise it
    /// is refused and takes nothing.
    #[test]
    fn partial_grants_the_minimum_available(
        (rates, calls) in run(1..=3, 40),
        want in 1u64..=3000,
        min in 1u64..=50,
    ) {
        let mut state = State::new(rates.len());
        let mut now = T0;
        for (step, cost) in calls {
            now += step as i64;
            state.call(&req(&rates, cost), now);
        }
        let min = min.min(want);
        let before: Vec<i64> = (0..rates.len()).map(|i| state.probe_one(i, rates[i], now).remaining).collect();
        let available = before.iter().copied().min().unwrap_or(0).max(0) as u64;
        let mut r = req(&rates, want);
        r.partial_min = Some(min);
        let mut buckets = state.buckets.clone();
        let (d, _) = take(&mut buckets, &mut state.penalty.clone(), &r, now, 0);
        let grant = available.min(want);
        if grant >= min {
            prop_assert_eq!((d.status, d.granted), (Status::Allowed, Some(grant)));
            for (i, rate) in rates.iter().enumerate() {
                let after = State { buckets: buckets.clone(), penalty: Penalty::default() }.probe_one(i, *rate, now).remaining;
                prop_assert_eq!(after, before[i] - grant as i64, "bucket {}", i);
            }
        } else {
            prop_assert_eq!(d.status, Status::Throttled);
            prop_assert_eq!(&buckets, &state.buckets, "a refused PARTIAL takes nothing");
        }
    }

    /// An admitted call with `RESERVE 0 p` leaves bucket 0 at least p % of
    /// its capacity (rounded up).
    #[test]
    fn a_reserve_is_kept_by_every_admitted_call(
        (rates, calls) in run(1..=1, 100),
        percent in 0u64..=100,
    ) {
        let r0 = rates[0];
        let reserve = (r0.capacity * percent).div_ceil(100);
        let mut state = State::new(1);
        let mut now = T0;
        for (step, cost) in calls {
            now += step as i64;
            let mut r = req(&rates, cost);
            r.reserve[0] = reserve;
            let (reply, _) = state.call(&r, now);
            if reply.status == Status::Allowed && cost > 0 {
                prop_assert!(state.probe_one(0, r0, now).remaining >= reserve as i64,
                    "{} left, reserve {}", state.probe_one(0, r0, now).remaining, reserve);
            }
        }
    }
}
