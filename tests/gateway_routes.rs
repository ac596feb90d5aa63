//! End to end, the tier form (see `tests/gateway.rs`): route costs (exports
//! by range, HEAD as GET), ambiguous arguments refused, and a load that
//! never admits more than the budget.

mod common;
#[path = "common/gateway.rs"]
mod gateway;
#[path = "common/gateway_tier.rs"]
mod gateway_tier;

use std::time::Instant;

use gateway::{agent, counter, get, head, leases, poll, post_form, problem, ratelimit};
use gateway_tier::{setup, ASYNC, GROWTH, GROWTH_2};

#[test]
fn exports_cost_25_or_50_beyond_90_days() {
    let (redis, nginx) = setup();
    let mut con = redis.client();
    let a = agent();
    let main = nginx.url(nginx.ports.main);
    let export =
        |from: &str, to: &str| format!("{main}/v1/reports/audit-export?from={from}&to={to}");
    let lease = "rl:{t:acme}:lease:export";
    let r = get(&a, &export("2026-01-01", "2026-03-31"), &[GROWTH]);
    assert_eq!(r.status, 200, "{r:#?}");
    assert_eq!(ratelimit(&r).1, 75, "cost 25 for 89 days");
    poll(ASYNC, "export lease released", || {
        leases(&mut con, lease) == 0
    });
    let r = get(&a, &export("2025-01-01", "2026-01-01"), &[GROWTH]);
    assert_eq!(r.status, 200, "{r:#?}");
    assert_eq!(ratelimit(&r).1, 25, "cost 50 for 365 days");
    poll(ASYNC, "export lease released", || {
        leases(&mut con, lease) == 0
    });
    let r = get(&a, &export("2025-01-01", "2026-01-01"), &[GROWTH]);
    let b = problem(&r, 429, "rate-limit-exceeded");
    assert!(
        b["detail"].as_str().unwrap().contains("costs 50 points"),
        "{b}"
    );
    // 25 more points at 1 per minute
    let retry = b["retry_after_seconds"].as_u64().unwrap();
    assert!((1440..=1500).contains(&retry), "{retry}");
    // exactly 90 days: 25
    let r = get(&a, &export("2026-01-01", "2026-04-01"), &[GROWTH]);
    assert_eq!(r.status, 200, "{r:#?}");
    assert_eq!(ratelimit(&r).1, 0);
    // one export at a time per growth tenant: a second one while the first runs
    // (the other key of the tenant: 100 points; the tenant has 50 left); the
    // first holds 8 s, so the second comes while it runs even on a loaded machine
    poll(ASYNC, "export lease released", || {
        leases(&mut con, lease) == 0
    });
    std::thread::scope(|s| {
        let first = s.spawn(|| {
            get(
                &agent(),
                &format!("{main}/v1/reports/audit-export?from=2026-03-01&to=2026-03-02&hold=8"),
                &[GROWTH_2],
            )
        });
        poll(ASYNC, "first export's lease", || {
            leases(&mut redis.client(), lease) == 1
        });
        let r = get(&a, &export("2026-03-01", "2026-03-02"), &[GROWTH_2]);
        let b = problem(&r, 429, "concurrency-limit-exceeded");
        assert_eq!(b["concurrency_limit"], 1);
        assert!(b["detail"].as_str().unwrap().contains("per tenant"), "{b}");
        assert_eq!(first.join().expect("first").status, 200);
    });
    assert_eq!(
        counter(&a, &main, "conflict", "GET /v1/reports/audit-export"),
        1
    );
    // the first export's count comes from its log phase, after its response
    poll(ASYNC, "4 exports counted", || {
        counter(&a, &main, "allowed", "GET /v1/reports/audit-export") == 4
    });
}

#[test]
fn under_load_admitted_points_never_exceed_the_budget() {
    let (_redis, nginx) = setup();
    let url = format!("{}/v1/ledgers/L-7/entries", nginx.url(nginx.ports.main));
    // 2 keys of one tenant, 3 connections each, 500 requests per connection
    let per_conn = 500;
    let start = Instant::now();
    let results: Vec<(usize, u64, u64)> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..6)
            .map(|c| {
                let url = &url;
                s.spawn(move || {
                    let key = if c % 2 == 0 { "k-load-1" } else { "k-load-2" };
                    let a = agent();
                    let (mut ok, mut limited) = (0, 0);
                    for _ in 0..per_conn {
                        let r = get(&a, url, &[("X-Api-Key", key)]);
                        match r.status {
                            200 => ok += 1,
                            429 => limited += 1,
                            s => panic!("status {s}: {r:#?}"),
                        }
                    }
                    (c % 2, ok, limited)
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().expect("load thread"))
            .collect()
    });
    let elapsed = start.elapsed().as_secs_f64();
    let admitted = |k: usize| -> u64 { results.iter().filter(|r| r.0 == k).map(|r| r.1).sum() };
    let total: u64 = results.iter().map(|r| r.1 + r.2).sum();
    assert_eq!(total, 6 * per_conn);
    let (k1, k2) = (admitted(0), admitted(1));
    // key: burst 50 + 100/s; tenant: burst 75 + 150/s (cost 1 each); the
    // module counts on its clock, within the interval measured here
    let key_cap = 50.0 + 100.0 * elapsed;
    let tenant_cap = 75.0 + 150.0 * elapsed;
    eprintln!(
        "load: {total} requests in {elapsed:.2} s, admitted {k1} + {k2} (key cap {key_cap:.0}, tenant cap {tenant_cap:.0})"
    );
    assert!(
        k1 as f64 <= key_cap && k2 as f64 <= key_cap,
        "{k1} {k2} > {key_cap}"
    );
    assert!(
        ((k1 + k2) as f64) <= tenant_cap,
        "{} > {tenant_cap}",
        k1 + k2
    );
    // and the budget was used, not refused wholesale: the tenant's burst
    // plus half its refill over the measured time, or half of what was
    // sent when the machine sent less than that (no minimum speed)
    let floor = (75.0 + 75.0 * elapsed).min(total as f64 / 2.0);
    assert!(
        (k1 + k2) as f64 >= floor,
        "admitted {} of a budget of {tenant_cap:.0} (floor {floor:.0})",
        k1 + k2
    );
    assert!(nginx.lua_errors().is_empty(), "{:?}", nginx.lua_errors());
}

#[test]
fn head_requests_pay_like_get_and_ambiguous_arguments_are_refused() {
    let (redis, nginx) = setup();
    let mut con = redis.client();
    let a = agent();
    let main = nginx.url(nginx.ports.main);
    let lease = "rl:{t:acme}:lease:export";
    // HEAD of an export: cost 25 and the export lease, as GET
    std::thread::scope(|s| {
        let first = s.spawn(|| {
            head(
                &agent(),
                &format!("{main}/v1/reports/audit-export?from=2026-03-01&to=2026-03-02&hold=1.5"),
                &[GROWTH],
            )
        });
        poll(ASYNC, "the HEAD export's lease", || {
            leases(&mut redis.client(), lease) == 1
        });
        let r = first.join().expect("HEAD");
        assert_eq!(r.status, 200, "{r:#?}");
        assert_eq!(ratelimit(&r).1, 75, "cost 25");
    });
    poll(ASYNC, "export lease released", || {
        leases(&mut con, lease) == 0
    });
    // a repeated `from`: the range cost (50), whichever value the upstream takes
    let r = get(
        &a,
        &format!("{main}/v1/reports/audit-export?from=2026-03-01&from=2000-01-01&to=2026-03-02"),
        &[GROWTH_2],
    );
    assert_eq!(r.status, 200, "{r:#?}");
    assert_eq!(ratelimit(&r).1, 50, "cost 50 for g2's 100 points");
    poll(ASYNC, "export lease released", || {
        leases(&mut con, lease) == 0
    });
    // reconcile: ledger_id in the query and a different one in the body
    let r = post_form(
        &a,
        &format!("{main}/v1/ledgers/reconcile?ledger_id=L1"),
        &[GROWTH],
        &[("ledger_id", "L2")],
    );
    let b = problem(&r, 400, "ambiguous-argument");
    assert!(b["detail"].as_str().unwrap().contains("ledger_id"), "{b}");
    for l in ["L1", "L2"] {
        assert_eq!(
            leases(
                &mut con,
                &format!("rl:{{t:acme}}:lease:reconcile-ledger:{l}")
            ),
            0
        );
    }
    assert_eq!(leases(&mut con, "rl:{t:acme}:lease:reconcile"), 0);
    // the same value in both, or in the body only: one defined ledger
    let r = post_form(
        &a,
        &format!("{main}/v1/ledgers/reconcile?ledger_id=L1"),
        &[GROWTH],
        &[("ledger_id", "L1")],
    );
    assert_eq!(r.status, 200, "{r:#?}");
    std::thread::scope(|s| {
        let first = s.spawn(|| {
            post_form(
                &agent(),
                &format!("{main}/v1/ledgers/reconcile?hold=1.5"),
                &[GROWTH],
                &[("ledger_id", "L7")],
            )
        });
        poll(ASYNC, "the body's ledger lease", || {
            leases(&mut redis.client(), "rl:{t:acme}:lease:reconcile-ledger:L7") == 1
        });
        assert_eq!(first.join().expect("reconcile").status, 200);
    });
    assert!(nginx.lua_errors().is_empty(), "{:?}", nginx.lua_errors());
}
