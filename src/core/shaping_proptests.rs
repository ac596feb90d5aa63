//! Property tests of `RL.TAKE ... DELAY` (shaping): callers that proceed
//! when told never exceed the rate, and a reservation never goes beyond
//! `max_wait` worth of points.

use proptest::prelude::*;

use super::testkit::*;

proptest! {
    #![proptest_config(config(256))]

    /// Every admitted call proceeds at `now` (status 1) or `now + wait`
    /// (status 2). Between any two proceed instants `a <= b`, the points
    /// proceeding are at most `capacity + (b - a + 1) * tokens / period_ms`:
    /// the schedule never exceeds the rate (the `+ 1` is the rounding of
    /// waits up to whole milliseconds: a caller may proceed up to 1 ms
    /// later than its exact slot, never earlier). And
    /// after every call the debt is at most an empty bucket plus `max_wait`
    /// worth of points.
    #[test]
    fn the_shaped_schedule_keeps_the_rate(
        capacity in 1u64..=20,
        tokens in 1u64..=20,
        period_ms in 1u64..=5_000,
        max_wait in 1u64..=20_000,
        calls in prop::collection::vec((0u64..=500, 1u64..=20), 1..=80),
    ) {
        let rate = Rate { capacity, tokens, period_ms };
        let mut req = TakeRequest::new(&[rate], 1);
        req.delay_ms = Some(max_wait);
        let mut buckets: [Option<Bucket>; 1] = [None];
        let mut penalty = Penalty::default();
        let mut now = T0;
        let mut proceeds: Vec<(Millis, u64)> = Vec::new();
        for (step, cost) in calls {
            now += step as i64;
            req.cost = cost.min(capacity);
            let reply = Wire::from(take(&mut buckets, &mut penalty, &req, now, 0).0);
            match reply.status {
                Status::Allowed => proceeds.push((now, req.cost)),
                Status::Delayed => {
                    prop_assert!(reply.retry_after_ms >= 1 && reply.retry_after_ms <= max_wait as i64);
                    proceeds.push((now + reply.retry_after_ms, req.cost));
                }
                Status::Throttled => prop_assert!(reply.retry_after_ms > max_wait as i64),
                Status::Boxed => prop_assert!(false, "no box without STRIKES"),
            }
            let debt = bucket::debt(buckets[0].as_ref(), &rate, now);
            let ceiling = i(capacity) * i(period_ms) + i(max_wait) * i(tokens);
            prop_assert!(debt <= ceiling, "debt {debt} above {ceiling}");
        }
        proceeds.sort();
        for (x, &(a, _)) in proceeds.iter().enumerate() {
            let mut total = 0i128;
            for &(b, cost) in &proceeds[x..] {
                total += i(cost);
                let bound = i(capacity) + (i128::from(b - a + 1) * i(tokens)) / i(period_ms);
                prop_assert!(total <= bound, "{total} points proceed in [{a}, {b}] above {bound}");
            }
        }
    }
}
