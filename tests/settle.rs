//! How a call settles its cost: post-paid `DEBT`, `REFUND`,
//! `PARTIAL` grants with their 9th integer, and `RESERVE` per bucket,
//! against a real server.

mod common;

use common::*;

#[test]
fn debt_goes_below_empty_and_refund_gives_back_up_to_full() {
    let server = Server::start(&[]);
    let mut con = server.client();
    // An estimate of 10 tokens, then the real price: 40 (30 more, post-paid).
    assert_eq!(
        decide(&mut con, "RL.TAKE llm:{t} 20 20 60 COST 10").status,
        ALLOWED
    );
    let d = decide(&mut con, "RL.TAKE llm:{t} 20 20 60 COST 30 DEBT");
    assert_eq!((d.status, d.remaining), (ALLOWED, -20), "20 points in debt");
    let d = decide(&mut con, "RL.TAKE llm:{t} 20 20 60 COST 1");
    assert_eq!(d.status, THROTTLED, "throttled while in debt");
    near(
        d.retry_after_ms,
        62_000,
        63_000,
        "the debt and one point repaid",
    );
    // Over-estimated next time: 5 of 25 given back.
    let d = decide(&mut con, "RL.TAKE llm:{t} 20 20 60 REFUND 5");
    assert_eq!((d.status, d.remaining), (ALLOWED, -15));
    let d = decide(&mut con, "RL.TAKE llm:{t} 20 20 60 REFUND 1000");
    assert_eq!((d.status, d.remaining), (ALLOWED, 20), "never above full");
    // A refund to a key that holds nothing creates nothing.
    let d = decide(&mut con, "RL.TAKE llm:{none} 20 20 60 REFUND 3");
    assert_eq!(d.status, ALLOWED);
    assert_eq!(int(&mut con, "EXISTS llm:{none}"), 0);
    // Windows and quotas settle the same way.
    decide(&mut con, "RL.QUOTA q:{t} 100 MONTH COST 90");
    let d = decide(&mut con, "RL.QUOTA q:{t} 100 MONTH COST 30 DEBT");
    assert_eq!((d.status, d.remaining), (ALLOWED, -20));
    let d = decide(&mut con, "RL.QUOTA q:{t} 100 MONTH REFUND 500");
    assert_eq!(
        (d.status, d.remaining),
        (ALLOWED, 100),
        "never below zero used"
    );
    decide(&mut con, "RL.WINDOW w:{t} 10 60 COST 8");
    let d = decide(&mut con, "RL.WINDOW w:{t} 10 60 REFUND 3");
    assert_eq!((d.status, d.remaining), (ALLOWED, 5));
    let info = server.info("rl");
    for (field, value) in [
        ("rl_debt_calls", "2"),
        ("rl_debt_points", "60"),
        ("rl_refund_calls", "5"),
    ] {
        assert_eq!(info_field(&info, field).as_deref(), Some(value), "{field}");
    }
}

/// Every reply about a bucket, window or quota that holds more than it may
/// admit gives the excess as a negative `remaining`: a probe, a refused
/// call, an `ALSO` bucket, a `DELAY` reservation, a lowered capacity. The
/// buckets refill one point per 6 minutes, the windows last a day: no
/// point comes back meanwhile.
#[test]
fn a_debt_is_shown_wherever_its_bucket_is_shown() {
    let server = Server::start(&[]);
    let mut con = server.client();
    let shown = |con: &mut redis::Connection, line: &str, status, remaining, binding| {
        let d = decide(con, line);
        assert_eq!(
            (d.status, d.remaining, d.binding),
            (status, remaining, binding),
            "{line}: {d:?}"
        );
    };
    shown(
        &mut con,
        "RL.TAKE k 10 10 3600 COST 30 DEBT",
        ALLOWED,
        -20,
        0,
    );
    shown(&mut con, "RL.TAKE k 10 10 3600 COST 0", THROTTLED, -20, 0);
    shown(&mut con, "RL.TAKE k 10 10 3600 COST 1", THROTTLED, -20, 0);
    // The bucket in debt binds next to a full one, in a probe as well.
    shown(
        &mut con,
        "RL.TAKE t 100 100 60 ALSO k 10 10 3600 COST 0",
        THROTTLED,
        -20,
        1,
    );
    // DELAY reserves beyond empty; later calls see it.
    shown(&mut con, "RL.TAKE d 10 10 3600 COST 10", ALLOWED, 0, 0);
    shown(
        &mut con,
        "RL.TAKE d 10 10 3600 COST 5 DELAY 3600",
        DELAYED,
        -5,
        0,
    );
    shown(&mut con, "RL.TAKE d 10 10 3600 COST 0", THROTTLED, -5, 0);
    // A capacity lowered below what was spent: 8 spent, room for 5.
    shown(&mut con, "RL.TAKE c 10 10 3600 COST 8", ALLOWED, 2, 0);
    shown(&mut con, "RL.TAKE c 5 5 3600 COST 0", THROTTLED, -3, 0);
    shown(&mut con, "RL.TAKE c 5 5 3600 COST 1", THROTTLED, -3, 0);
    // Windows and quotas: the limit minus the count.
    for (call, lowered) in [
        ("RL.WINDOW w 10 86400", "RL.WINDOW w 5 86400"),
        ("RL.WINDOW x 10 86400 FIXED", "RL.WINDOW x 5 86400 FIXED"),
        ("RL.WINDOW e 10 86400 EXACT", "RL.WINDOW e 5 86400 EXACT"),
        ("RL.QUOTA q 10 MONTH", "RL.QUOTA q 5 MONTH"),
    ] {
        shown(&mut con, &format!("{call} COST 30 DEBT"), ALLOWED, -20, 0);
        shown(&mut con, &format!("{call} COST 0"), THROTTLED, -20, 0);
        shown(&mut con, &format!("{call} COST 1"), THROTTLED, -20, 0);
        shown(&mut con, &format!("{lowered} COST 0"), THROTTLED, -25, 0);
    }
    shown(
        &mut con,
        "RL.QUOTA q 10 MONTH COST 1 PEEK",
        THROTTLED,
        -20,
        0,
    );
    // CL.THROTTLE keeps redis-cell's reply: `remaining` is never negative;
    // the debt shows in its wait (20 points, then one, at 6 minutes each).
    let r = ints(&mut con, "CL.THROTTLE k 9 10 3600");
    assert_eq!(r[..3], [1, 10, 0], "{r:?}");
    near(
        r[3],
        21 * 360 - 60,
        21 * 360,
        "retry_after_s waits out the debt",
    );
}

#[test]
fn partial_grants_an_allowance_and_never_more_than_the_bucket_holds() {
    let server = Server::start(&[]);
    let mut con = server.client();
    let r = ints(
        &mut con,
        "RL.TAKE edge:{t} 100 1 3600 COST 60 PARTIAL MIN 10",
    );
    assert_eq!((r.len(), r[0], r[8]), (9, ALLOWED, 60), "{r:?}");
    let r = ints(
        &mut con,
        "RL.TAKE edge:{t} 100 1 3600 COST 60 PARTIAL MIN 10",
    );
    assert_eq!((r[0], r[2], r[8]), (ALLOWED, 0, 40), "what is left: {r:?}");
    let r = ints(
        &mut con,
        "RL.TAKE edge:{t} 100 1 3600 COST 60 PARTIAL MIN 10",
    );
    assert_eq!((r[0], r[8]), (THROTTLED, 0), "below MIN: {r:?}");
    // 50 clients at once on a fresh key: the grants add up to its capacity.
    let threads: Vec<_> = (0..50)
        .map(|_| {
            let url = server.url();
            std::thread::spawn(move || {
                let mut con = redis::Client::open(url)
                    .expect("url")
                    .get_connection()
                    .expect("connect");
                let r = ints(
                    &mut con,
                    "RL.TAKE edge:{c} 500 1 3600 COST 30 PARTIAL MIN 1",
                );
                if r[0] == ALLOWED {
                    r[8]
                } else {
                    0
                }
            })
        })
        .collect();
    let granted: i64 = threads.into_iter().map(|t| t.join().expect("client")).sum();
    assert_eq!(granted, 500, "exactly the capacity granted, never more");
    assert_eq!(ints(&mut con, "RL.TAKE edge:{c} 500 1 3600 COST 0")[2], 0);
}

#[test]
fn a_reserve_sheds_the_lower_tiers_first() {
    let server = Server::start(&[]);
    let mut con = server.client();
    // One fleet bucket of 100; Free keeps 50 %, Business 20 %, Enterprise 0.
    let call = |tier_reserve: u64| format!("RL.TAKE fleet 100 1 3600 RESERVE 0 {tier_reserve}");
    let mut free = 0;
    while decide(&mut con, &call(50)).status == ALLOWED {
        free += 1;
        assert!(free <= 100, "a reserve never holds");
    }
    assert_eq!(free, 50);
    let mut business = 0;
    while decide(&mut con, &call(20)).status == ALLOWED {
        business += 1;
        assert!(business <= 100);
    }
    assert_eq!(business, 30);
    let d = decide(&mut con, &call(50));
    assert_eq!((d.status, d.binding), (THROTTLED, 0), "Free is still shed");
    assert!(d.retry_after_ms > 0);
    let mut enterprise = 0;
    while decide(&mut con, &call(0)).status == ALLOWED {
        enterprise += 1;
        assert!(enterprise <= 100);
    }
    assert_eq!(enterprise, 20, "the top tier gets through down to empty");
    let info = server.info("rl");
    // Free and Business at their reserves, then Free once more.
    assert_eq!(
        info_field(&info, "rl_reserve_refusals").as_deref(),
        Some("3")
    );
}

#[test]
fn bad_settle_options_change_nothing() {
    let server = Server::start(&[]);
    let mut con = server.client();
    assert_rejected(
        &mut con,
        &[
            ("RL.TAKE k 10 10 60 COST 1 REFUND 1", "REFUND and COST"),
            ("RL.TAKE k 10 10 60 DEBT REFUND 1", "REFUND and DEBT"),
            ("RL.TAKE k 10 10 60 REFUND 0", "REFUND points"),
            ("RL.TAKE k 10 10 60 COST 1 DEBT DELAY 1", "DELAY and DEBT"),
            ("RL.TAKE k 10 10 60 COST 5 PARTIAL DEBT", "PARTIAL and DEBT"),
            (
                "RL.TAKE k 10 10 60 COST 5 PARTIAL DELAY 1",
                "PARTIAL and DELAY",
            ),
            (
                "RL.TAKE k 10 10 60 COST 5 PARTIAL MIN 6",
                "MIN minimum is above COST",
            ),
            ("RL.TAKE k 10 10 60 COST 5 MIN 2", "MIN requires PARTIAL"),
            ("RL.TAKE k 10 10 60 RESERVE 1 50", "RESERVE index 1"),
            ("RL.TAKE k 10 10 60 RESERVE 0 101", "RESERVE percent"),
            (
                "RL.TAKE k 10 10 60 RESERVE 0 10 RESERVE 0 20",
                "RESERVE for one index",
            ),
            ("RL.TAKE k 10 10 60 COST 11", "COST is above"),
            ("RL.WINDOW k 10 60 PARTIAL", "unknown option 'PARTIAL'"),
            ("RL.QUOTA k 10 DAY RESERVE 0 5", "unknown option 'RESERVE'"),
        ],
    );
}
