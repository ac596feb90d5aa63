//! Reliability, item 8: memory stays bounded. Attacker-chosen keys cost a
//! bounded number of bytes, all carry a TTL, and memory returns to its
//! baseline once the TTLs pass; under `maxmemory` with `noeviction` the
//! charging commands answer `OOM` while the releasing ones still work; an
//! eviction policy does reset limits (as commands.md warns).

mod common;

use std::time::{Duration, Instant};

use common::*;

/// Attacker keys created by the bounded-memory test.
const KEYS: usize = 1_000_000;

/// The call made for attacker key `i`: the gateway's policies, with the
/// key named by the attacker (a long, unique name).
fn attack(i: usize) -> (usize, Vec<String>) {
    let key = format!(
        "rl:{{ip:203.0.{}.{}}}:login:{:08x}",
        i % 256,
        (i / 256) % 256,
        i
    );
    let kind = i % 20;
    let line = match kind {
        0..=9 => format!("RL.TAKE {key} 10 10 60 COST 10 STRIKES 3 60"),
        10..=11 => format!("RL.WINDOW {key} 5 60"),
        12 => format!("RL.WINDOW {key} 5 60 EXACT"),
        13 => format!("RL.WINDOW {key} 5 60 FIXED"),
        14..=15 => format!("RL.LEASE ACQUIRE {key} 2 60"),
        16..=17 => format!("CL.THROTTLE {key} 9 10 60 10"),
        _ => format!("RL.QUOTA {key} 100 DAY"),
    };
    (kind, line.split(' ').map(str::to_string).collect())
}

fn kind_name(kind: usize) -> &'static str {
    match kind {
        0..=9 => "RL.TAKE",
        10..=13 => "RL.WINDOW",
        14..=15 => "RL.LEASE",
        16..=17 => "CL.THROTTLE",
        _ => "RL.QUOTA",
    }
}

#[test]
fn a_million_attacker_keys_cost_bounded_memory_and_all_expire() {
    let fig = Figure::start();
    let clock = TimeShift::new();
    // No slow log: on a busy machine calls preempted past 10 ms fill it
    // (up to 128 entries with their arguments, ~100 KB), memory that has
    // nothing to do with the keys and would stay after they expire.
    let server = Server::start_with(
        &clock.prefix(),
        &["--hz", "50", "--slowlog-log-slower-than", "-1"],
    );
    let mut con = server.client();
    // A warm-up cycle of the same calls (first allocations of Redis and the
    // module: Redis keeps about 50 KB after its first keys expire, plain
    // SET keys included), then the baseline.
    let mut raw = RawConn::connect(&server);
    let warm: Vec<Vec<String>> = (0..20_000).map(|i| attack(KEYS + i).1).collect();
    raw.pipeline(&warm).expect("warm-up");
    clock.advance(Duration::from_secs(86_400 + 120));
    wait_until(Duration::from_secs(60), "warm-up keys expired", || {
        keyspace_counts(&server).0 == 0
    });
    std::thread::sleep(Duration::from_millis(500));
    let baseline = info_u64(&server, "memory", "used_memory");
    let expired_before = info_u64(&server, "stats", "expired_keys");

    let t0 = Instant::now();
    for start in (0..KEYS).step_by(10_000) {
        let cmds: Vec<Vec<String>> = (start..(start + 10_000).min(KEYS))
            .map(|i| attack(i).1)
            .collect();
        for (j, r) in raw
            .pipeline(&cmds)
            .expect("attack batch")
            .iter()
            .enumerate()
        {
            assert!(!matches!(r, Resp::Error(_)), "{:?}: {r:?}", cmds[j]);
        }
    }
    let load_s = t0.elapsed().as_secs_f64();
    let (keys, expires) = keyspace_counts(&server);
    // Keys whose TTL (a fixed window's boundary) passed during the load are
    // counted by expired_keys.
    let created = keys + info_u64(&server, "stats", "expired_keys") - expired_before;
    let used = info_u64(&server, "memory", "used_memory");
    let per_key = (used - baseline) as f64 / KEYS as f64;
    // MEMORY USAGE of a sample of each kind.
    let mut usage: std::collections::BTreeMap<&str, (i64, i64)> = Default::default();
    for i in (0..KEYS).step_by(KEYS / 2000 - 1) {
        let (kind, argv) = attack(i);
        let key = argv[if argv[0] == "RL.LEASE" { 2 } else { 1 }].clone();
        let bytes: Option<i64> = redis::cmd("MEMORY")
            .arg("USAGE")
            .arg(&key)
            .arg("SAMPLES")
            .arg(0)
            .query(&mut con)
            .expect("MEMORY USAGE");
        // A key whose TTL (a fixed window's boundary) passed since it was
        // written is gone: nothing to sample.
        let Some(bytes) = bytes else {
            continue;
        };
        let e = usage.entry(kind_name(kind)).or_default();
        e.0 += bytes;
        e.1 += 1;
    }
    let usage_text: Vec<String> = usage
        .iter()
        .map(|(k, (sum, n))| format!("{k} {} B", sum / n))
        .collect();

    // Let every TTL pass (a day and a minute on the server's clock: quotas
    // end at midnight UTC), then wait for active expiry.
    clock.advance(Duration::from_secs(86_400 + 120));
    let t1 = Instant::now();
    wait_until(
        Duration::from_secs(120),
        "every attacker key expired",
        || keyspace_counts(&server).0 == 0,
    );
    let expire_s = t1.elapsed().as_secs_f64();
    // Memory back within 5% of the baseline, or its last reading after 30 s.
    let mut after = 0;
    let _ = poll_for(Duration::from_secs(30), Duration::from_millis(200), || {
        after = info_u64(&server, "memory", "used_memory");
        (after as f64 <= baseline as f64 * 1.05).then_some(())
    });
    let back_pct = 100.0 * (after as f64 - baseline as f64) / baseline as f64;
    fig.record(
        "8. Memory stays bounded",
        &format!(
            "after a warm-up cycle of 20000 keys: {KEYS} attacker-named keys (50% RL.TAKE with STRIKES, 20% RL.WINDOW of 3 modes, 10% RL.LEASE, 10% CL.THROTTLE, 10% RL.QUOTA DAY) pipelined in {load_s:.1} s; INFO keyspace; used_memory delta; MEMORY USAGE of 2000 samples; server clock moved 1 day + 2 min ahead, active expiry"
        ),
        &format!(
            "{per_key:.0} B per key (used_memory delta), MEMORY USAGE {}; keys without TTL {}; all expired in {expire_s:.1} s; used_memory {} -> {} -> {} B ({back_pct:+.2}% of baseline)",
            usage_text.join(", "),
            keys - expires,
            baseline,
            used,
            after
        ),
    );
    assert_eq!(created, KEYS as u64, "every call created its key");
    assert_eq!(expires, keys, "every key has a TTL");
    assert!(per_key < 1000.0, "{per_key} B per key");
    assert!(
        back_pct <= 5.0,
        "used_memory {after} not within 5% of the baseline {baseline}"
    );
}

#[test]
fn under_maxmemory_noeviction_charging_is_oom_and_releasing_works() {
    let fig = Figure::start();
    let server = Server::start(&["--maxmemory-policy", "noeviction"]);
    let mut con = server.client();
    call_ok(&mut con, "RL.LEASE ACQUIRE oom:lease 2 600 ID a");
    call_ok(&mut con, "RL.LEASE ACQUIRE oom:lease 2 600 ID b");
    call_ok(&mut con, "RL.BOX TRIP oom:box 2 600");
    call_ok(&mut con, "RL.BOX TRIP oom:manual 3 0");
    call_ok(&mut con, "RL.TAKE oom:bucket 10 1 600 COST 3");
    let used = info_u64(&server, "memory", "used_memory");
    call_ok(
        &mut con,
        &format!("CONFIG SET maxmemory {}", used + 2_000_000),
    );
    // Fill memory until Redis refuses.
    let filler = "x".repeat(10_000);
    let mut filled = 0;
    loop {
        let r: redis::RedisResult<()> = redis::cmd("SET")
            .arg(format!("fill:{filled}"))
            .arg(&filler)
            .query(&mut con);
        match r {
            Ok(()) => filled += 1,
            Err(e) => {
                assert!(err_text(&e).starts_with("OOM"), "{e}");
                break;
            }
        }
        assert!(filled < 10_000, "maxmemory never reached");
    }
    let keys_before = int(&mut con, "DBSIZE");
    let must_oom = [
        "RL.TAKE oom:bucket 10 1 600",
        "RL.TAKE oom:bucket 10 1 600 COST 0",
        "RL.TAKE oom:new 10 1 600",
        "RL.WINDOW oom:w 5 60",
        "RL.QUOTA oom:q 5 DAY",
        "CL.THROTTLE oom:c 5 5 60",
        "RL.LEASE ACQUIRE oom:lease 3 600",
        "RL.BOX TRIP oom:trip 1 60",
    ];
    let mut not_oom = Vec::new();
    for line in must_oom {
        match call(&mut con, line) {
            Err(e) if err_text(&e).starts_with("OOM") => {}
            other => not_oom.push(format!("{line}: {other:?}")),
        }
    }
    let must_work: &[(&str, i64)] = &[
        ("RL.LEASE RENEW oom:lease a 900", 1),
        ("RL.LEASE RELEASE oom:lease a", 1),
        ("RL.LEASE RELEASE oom:lease b", 1),
        ("RL.BOX RELEASE oom:box", 1),
        ("RL.BOX RELEASE oom:manual FORGET", 1),
    ];
    let mut failed = Vec::new();
    for (line, want) in must_work {
        match call(&mut con, line) {
            Ok(v) if value_i64(&v) == *want => {}
            other => failed.push(format!("{line}: {other:?}")),
        }
    }
    let status_ok = call(&mut con, "RL.BOX STATUS oom:box").is_ok()
        && call(&mut con, "RL.LEASE LIST oom:lease").is_ok();
    // Releasing freed keys; nothing was evicted.
    let keys_after = int(&mut con, "DBSIZE");
    // RL.BOX TRIP creates keys: it is deny-oom (in must_oom above).
    // Free memory: charging works again. SYNC: Valkey 8 flushes in the
    // background by default (lazyfree-lazy-user-flush yes), and the next
    // call could still see the memory in use.
    let _: () = redis::cmd("FLUSHALL")
        .arg("SYNC")
        .query(&mut con)
        .expect("FLUSHALL SYNC");
    let recovered = decide(&mut con, "RL.TAKE oom:bucket 10 1 600").allowed();
    fig.record(
        "8. OOM: charging refused, releasing works",
        "maxmemory = used + 2 MB, noeviction, filled with strings until OOM; then every charging form and every releasing form",
        &format!(
            "charging calls not answered OOM: {} of {}; releases (LEASE RENEW/RELEASE, BOX RELEASE incl. FORGET) failed: {} of {}; STATUS/LIST answer: {status_ok}; RL.BOX TRIP refused like every writer; keys {keys_before} -> {keys_after} (2 freed by releases, none evicted); charging works again after freeing memory: {recovered}",
            not_oom.len(),
            must_oom.len(),
            failed.len(),
            must_work.len()
        ),
    );
    assert!(not_oom.is_empty(), "{not_oom:#?}");
    assert!(failed.is_empty(), "{failed:#?}");
    assert!(status_ok && recovered);
    assert_eq!(
        keys_after,
        keys_before - 2,
        "the lease key and the manual box were deleted"
    );
}

#[test]
fn an_eviction_policy_resets_limits_as_documented() {
    let fig = Figure::start();
    let server = Server::start(&["--maxmemory-policy", "allkeys-lru"]);
    let mut con = server.client();
    for i in 0..2000 {
        let d = decide(&mut con, &format!("RL.TAKE ev:{i} 5 1 3600 COST 5"));
        assert_eq!(d.status, ALLOWED);
    }
    let used = info_u64(&server, "memory", "used_memory");
    call_ok(
        &mut con,
        &format!("CONFIG SET maxmemory {}", used + 1_000_000),
    );
    let filler = "x".repeat(10_000);
    for i in 0..400 {
        let _: () = redis::cmd("SET")
            .arg(format!("fill:{i}"))
            .arg(&filler)
            .query(&mut con)
            .expect("SET under allkeys-lru evicts instead of failing");
    }
    let mut reset = 0;
    for i in 0..2000 {
        // A bucket emptied an hour ago admits a call only if it was evicted.
        if decide(&mut con, &format!("RL.TAKE ev:{i} 5 1 3600 COST 0")).remaining == 5 {
            reset += 1;
        }
    }
    let evicted = info_u64(&server, "stats", "evicted_keys");
    fig.record(
        "8. Eviction policies reset limits (documented)",
        "2000 emptied buckets, maxmemory-policy allkeys-lru, maxmemory = used + 1 MB, 4 MB of strings written",
        &format!(
            "{evicted} keys evicted; {reset} of 2000 emptied buckets read as full again (commands.md, Expiry: keep limiter keys under noeviction)"
        ),
    );
    assert!(
        reset > 0,
        "eviction reset some limits, as commands.md warns"
    );
}
