//! Many clients at once on one key: exactly `capacity` points are
//! admitted, never more, when nothing refills during the test.

mod common;

use common::*;

/// 50 connections x 20 calls on a bucket of 100 points that refills one
/// point per 10^6 s: exactly 100 calls are allowed.
#[test]
fn fifty_connections_admit_exactly_the_capacity() {
    let server = Server::start(&[]);
    let allowed: i64 = std::thread::scope(|s| {
        let handles: Vec<_> = (0..50)
            .map(|_| {
                let server = &server;
                s.spawn(move || {
                    let mut con = server.client();
                    (0..20)
                        .map(|_| ints(&mut con, "RL.TAKE hot 100 1 1000000")[0])
                        .filter(|&st| st == 1)
                        .count() as i64
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().expect("client thread"))
            .sum()
    });
    assert_eq!(allowed, 100);
}

/// The same with a tenant bucket shared by several keys: the tenant's 60
/// points are never exceeded, and each key's 25 neither.
#[test]
fn a_shared_tenant_bucket_is_exact_under_concurrency() {
    let server = Server::start(&[]);
    let per_key: Vec<i64> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..50)
            .map(|i| {
                let server = &server;
                s.spawn(move || {
                    let mut con = server.client();
                    let line = format!("RL.TAKE rl:{{t:1}}:key:{} 25 1 1000000 ALSO rl:{{t:1}}:tenant 60 1 1000000", i % 4);
                    (0..10).map(|_| ints(&mut con, &line)[0]).filter(|&st| st == 1).count() as i64
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().expect("client thread"))
            .collect()
    });
    assert_eq!(per_key.iter().sum::<i64>(), 60);
    let mut con = server.client();
    let mut spent = 0;
    for k in 0..4 {
        let left = decide(
            &mut con,
            &format!("RL.TAKE rl:{{t:1}}:key:{k} 25 1 1000000 COST 0"),
        )
        .remaining;
        assert!(
            left >= 0 && 25 - left <= 25,
            "key {k} within its own capacity"
        );
        spent += 25 - left;
    }
    assert_eq!(
        spent, 60,
        "the points taken from the keys are the points taken from the tenant"
    );
}
