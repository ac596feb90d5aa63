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
