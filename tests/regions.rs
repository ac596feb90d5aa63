//! Regional quotas against real servers: `RL.QUOTA ... REGION` counts on
//! the local component and decides on the total, `RL.REGION MERGE` applies
//! other regions' components by maximum and refuses bad input whole, the
//! components survive replication, AOF and RDB restarts, `rl.quota.region`
//! is announced for local changes only, and a 3-primary cluster works.

mod common;

use std::time::Duration;

use common::*;
use redis::{ConnectionLike, Value};

/// Module arguments of a server in region `eu` of `eu,us,ap`.
const EU: &[&str] = &["region", "eu", "regions", "eu,us,ap"];

/// The server's time (ms) on `con`.
fn server_ms(con: &mut impl ConnectionLike) -> i64 {
    let time: Vec<String> = redis::cmd("TIME").query(con).expect("TIME");
    time[0].parse::<i64>().expect("seconds") * 1000
}

/// The epoch ms at which the current UTC month ends on `con`'s server.
fn month_end(con: &mut impl ConnectionLike) -> i64 {
    month_start(server_ms(con), 1)
}

/// `RL.REGION READ key` as `(period_end, period, [(region, added, refunded)])`,
/// `None` for nil.
type Components = (i64, String, Vec<(String, i64, i64)>);

fn read(con: &mut impl ConnectionLike, key: &str) -> Option<Components> {
    match call_ok(con, &format!("RL.REGION READ {key}")) {
        Value::Nil => None,
        v => {
            let parts = array(v);
            let comps = array(parts[2].clone())
                .into_iter()
                .map(|c| {
                    let c = array(c);
                    (value_str(&c[0]), value_i64(&c[1]), value_i64(&c[2]))
                })
                .collect();
            Some((value_i64(&parts[0]), value_str(&parts[1]), comps))
        }
    }
}

fn comps(list: &[(&str, i64, i64)]) -> Vec<(String, i64, i64)> {
    list.iter()
        .map(|&(r, a, f)| (r.to_string(), a, f))
        .collect()
}

#[test]
fn a_region_counts_its_component_and_decides_on_the_total() {
    let server = Server::start(EU);
    let mut con = server.client();
    let end = month_end(&mut con);
    let d = decide(&mut con, "RL.QUOTA q 100 MONTH COST 10 REGION");
    assert_eq!((d.status, d.limit, d.remaining), (ALLOWED, 100, 90));
    assert_eq!(
        int(&mut con, &format!("RL.REGION MERGE q MONTH {end} us 85 5")),
        1
    );
    let d = decide(&mut con, "RL.QUOTA q 100 MONTH COST 11 REGION");
    assert_eq!(
        (d.status, d.remaining),
        (THROTTLED, 10),
        "90 of 100 counted in all"
    );
    let d = decide(&mut con, "RL.QUOTA q 100 MONTH COST 10 REGION PEEK");
    assert_eq!(
        (d.status, d.remaining),
        (ALLOWED, 0),
        "a dry run: as if charged"
    );
    let d = decide(&mut con, "RL.QUOTA q 100 MONTH COST 10 REGION");
    assert_eq!((d.status, d.remaining), (ALLOWED, 0));
    // A refund gives back this region's own points only.
    let d = decide(&mut con, "RL.QUOTA q 100 MONTH REFUND 50 REGION");
    assert_eq!(d.remaining, 20);
    assert_eq!(
        read(&mut con, "q"),
        Some((end, "MONTH".into(), comps(&[("eu", 20, 20), ("us", 85, 5)])))
    );
    let at: i64 = redis::cmd("PEXPIRETIME")
        .arg("q")
        .query(&mut con)
        .expect("PEXPIRETIME");
    assert_eq!(at, end, "the key expires when its period ends");
    assert_eq!(read(&mut con, "missing"), None);
    ints(&mut con, "RL.TAKE bucket 5 5 60");
    assert_eq!(read(&mut con, "bucket"), None, "a key with no components");
    let info = server.info("rl");
    assert_eq!(info_field(&info, "rl_region_merges").as_deref(), Some("1"));
    assert_eq!(info_field(&info, "rl_quota_calls").as_deref(), Some("5"));
}

#[test]
fn merges_are_idempotent_and_commutative() {
    let server = Server::start(EU);
    let mut con = server.client();
    let end = month_end(&mut con);
    let merges = [
        format!("RL.REGION MERGE a MONTH {end} us 5 1"),
        format!("RL.REGION MERGE a MONTH {end} ap 3 0 us 4 2"),
        format!("RL.REGION MERGE a MONTH {end} ap 7 1"),
    ];
    let grown: Vec<i64> = merges.iter().map(|m| int(&mut con, m)).collect();
    assert_eq!(grown, [1, 2, 1]);
    for m in &merges {
        assert_eq!(int(&mut con, m), 0, "a repeat changes nothing");
    }
    for m in merges.iter().rev().chain(&merges) {
        int(&mut con, &m.replace(" a ", " b "));
    }
    let a = read(&mut con, "a").expect("a");
    assert_eq!(a.2, comps(&[("ap", 7, 1), ("us", 5, 2)]));
    assert_eq!(
        read(&mut con, "b"),
        Some(a),
        "any order, any repeat: the same"
    );
    // An older period is ignored; a newer one replaces the counts.
    let past = month_start(end - 1, 0);
    assert_eq!(
        int(&mut con, &format!("RL.REGION MERGE a MONTH {past} us 99 0")),
        0
    );
    assert_eq!(read(&mut con, "a").expect("a").2.len(), 2);
}

#[test]
fn the_next_period_merged_early_leaves_this_periods_counts_alone() {
    // A region whose clock is ahead at the turn of the month sends its
    // count of the next month before this server reaches it: this month's
    // counts, the local one above all, still decide.
    let server = Server::start(EU);
    let mut con = server.client();
    let end = month_end(&mut con);
    let next = month_start(end, 1);
    assert!(decide(&mut con, "RL.QUOTA q 10 MONTH REGION COST 10").allowed());
    assert!(!decide(&mut con, "RL.QUOTA q 10 MONTH REGION").allowed());
    assert_eq!(
        int(&mut con, &format!("RL.REGION MERGE q MONTH {next} ap 1 0")),
        0,
        "not taken while this month runs"
    );
    let (period_end, _, comps) = read(&mut con, "q").expect("q");
    assert_eq!((period_end, comps), (end, vec![("eu".to_string(), 10, 0)]));
    assert!(
        !decide(&mut con, "RL.QUOTA q 10 MONTH REGION").allowed(),
        "the month's own count still refuses"
    );
}

#[test]
fn bad_input_is_refused_whole() {
    let server = Server::start(EU);
    let mut con = server.client();
    let end = month_end(&mut con);
    let (next, far) = (month_start(end, 1), month_start(end, 2));
    let cases = [
        (
            format!("RL.REGION MERGE k MONTH {end} sa 1 0"),
            "region 'sa' is not in rl.regions",
        ),
        (
            format!("RL.REGION MERGE k MONTH {end} us 1 0 eu 5 0"),
            "region 'eu' is this server's own region",
        ),
        (
            format!("RL.REGION MERGE k MONTH {end} us 9007199254740993 0"),
            "added must be an integer from 0 to 9007199254740992",
        ),
        (
            format!("RL.REGION MERGE k MONTH {end} us 3 4"),
            "refunded is above added for region 'us'",
        ),
        (
            format!("RL.REGION MERGE k MONTH {} us 1 0", end + 1),
            "period_end_ms must be the end of",
        ),
        (
            format!("RL.REGION MERGE k MONTH {far} us 1 0"),
            "period_end_ms must be the end of",
        ),
        (
            format!("RL.REGION MERGE k WEEK {end}x us 1 0"),
            "period_end_ms",
        ),
        (
            format!("RL.REGION MERGE k MONTH {end} us 1 0 us 2 0"),
            "given more than once",
        ),
        (
            format!("RL.REGION MERGE k MONTH {end} us 1 0 ap"),
            "missing added",
        ),
        (
            "RL.QUOTA k 10 DAY REGION REGION".to_string(),
            "REGION is given more than once",
        ),
    ];
    let cases: Vec<(&str, &str)> = cases.iter().map(|(l, n)| (l.as_str(), *n)).collect();
    assert_rejected(&mut con, &cases);
    // The next month's end is accepted (a peer whose clock is ahead).
    assert_eq!(
        int(&mut con, &format!("RL.REGION MERGE n MONTH {next} us 1 0")),
        1
    );
    call_ok(&mut con, "DEL n");

    // On a key that exists, a refused merge leaves its bytes alone.
    ints(&mut con, "RL.QUOTA k 10 MONTH REGION");
    int(&mut con, &format!("RL.REGION MERGE k MONTH {end} us 2 0"));
    let before = snapshot(&mut con);
    for line in [
        format!("RL.REGION MERGE k MONTH {end} us 3 0 xx 1 0"),
        format!("RL.REGION MERGE k MONTH {end} ap 9007199254740993 0"),
        format!("RL.REGION MERGE k DAY {} us 3 0", end),
        "RL.QUOTA k 10 MONTH".to_string(),
        "RL.QUOTA k 10 DAY REGION".to_string(),
    ] {
        let e = expect_err(call(&mut con, &line), "ERR ");
        assert!(err_text(&e).starts_with("ERR "), "{line}");
    }
    assert_eq!(snapshot(&mut con), before, "nothing applied");
    // A plain key takes no REGION call and no merge.
    ints(&mut con, "RL.QUOTA plain 10 MONTH");
    expect_err(
        call(&mut con, "RL.QUOTA plain 10 MONTH REGION"),
        "the key counts without regions",
    );
    expect_err(
        call(
            &mut con,
            &format!("RL.REGION MERGE plain MONTH {end} us 1 0"),
        ),
        "the key counts without regions",
    );
    expect_err(
        call(&mut con, "RL.QUOTA k 10 MONTH"),
        "the key counts per region (add REGION)",
    );
    expect_err(
        call(&mut con, "RL.QUOTA plain 10 MONTH ALSO k 10 MONTH"),
        "the key counts per region",
    );
    let info = server.info("rl");
    assert_eq!(
        info_field(&info, "rl_region_refused").as_deref(),
        Some("13")
    );

    // Regions off: refused.
    let off = Server::start(&[]);
    let mut con = off.client();
    assert_rejected(
        &mut con,
        &[
            (
                "RL.QUOTA k 10 DAY REGION",
                "ERR REGION: rl.region is not configured",
            ),
            (
                &format!("RL.REGION MERGE k MONTH {end} us 1 0"),
                "ERR REGION: rl.region is not configured",
            ),
        ],
    );
    assert_eq!(read(&mut con, "k"), None, "READ works with regions off");
}

#[test]
fn configs_are_module_configs_and_checked() {
    let server = Server::start(EU);
    let mut con = server.client();
    let got: Vec<String> = redis::cmd("CONFIG")
        .arg("GET")
        .arg("rl.region*")
        .query(&mut con)
        .expect("GET");
    let mut pairs: Vec<(String, String)> = got
        .chunks(2)
        .map(|p| (p[0].clone(), p[1].clone()))
        .collect();
    pairs.sort();
    assert_eq!(
        pairs,
        [
            ("rl.region".into(), "eu".into()),
            ("rl.regions".into(), "eu,us,ap".into())
        ]
    );
    for (name, value) in [
        ("rl.regions", "eu,,us"),
        ("rl.regions", "eu,eu"),
        ("rl.region", "e u"),
    ] {
        let r: redis::RedisResult<()> = redis::cmd("CONFIG")
            .arg("SET")
            .arg(name)
            .arg(value)
            .query(&mut con);
        assert!(r.is_err(), "{name} {value} refused");
    }
    call_ok(&mut con, "CONFIG SET rl.regions us,ap");
    expect_err(
        call(&mut con, "RL.QUOTA k 10 DAY REGION"),
        "rl.region 'eu' is not in rl.regions",
    );
    call_ok(&mut con, "CONFIG SET rl.region us");
    ints(&mut con, "RL.QUOTA k 10 DAY REGION");
    assert_eq!(read(&mut con, "k").expect("k").2, comps(&[("us", 1, 0)]));
    // As config directives (redis.conf lines, or command-line options).
    let configured = Server::start(&["--rl.regions", "eu,us", "--rl.region", "us"]);
    let mut c = configured.client();
    ints(&mut c, "RL.QUOTA k 10 DAY REGION");
    assert_eq!(read(&mut c, "k").expect("k").2, comps(&[("us", 1, 0)]));
    // A bad load argument keeps the module from loading.
    let plain = Server::start_plain(&[]);
    let module = module_path();
    let r: redis::RedisResult<()> = redis::cmd("MODULE")
        .arg("LOAD")
        .arg(module.to_str().expect("utf-8"))
        .arg("regions")
        .arg("eu,,us")
        .query(&mut plain.client());
    assert!(r.is_err(), "an invalid rl.regions refuses the load");
    let keys: Vec<String> = redis::cmd("COMMAND")
        .arg("GETKEYS")
        .arg("RL.QUOTA")
        .arg("a")
        .arg("5")
        .arg("DAY")
        .arg("REGION")
        .arg("ALSO")
        .arg("b")
        .arg("5")
        .arg("DAY")
        .query(&mut con)
        .expect("GETKEYS");
    assert_eq!(keys, ["a", "b"]);
}

#[test]
fn replicas_and_restarts_keep_the_components() {
    let mut args: Vec<&str> = EU.to_vec();
    args.extend_from_slice(AOF_EVERY_WRITE);
    let master = Server::start(&args);
    let replica = start_replica(&master);
    let mut con = master.client();
    let end = month_end(&mut con);
    ints(
        &mut con,
        "RL.QUOTA {t}:a 100 MONTH COST 7 REGION ALSO {t}:b 100 MONTH",
    );
    ints(&mut con, "RL.QUOTA {t}:a 100 MONTH REFUND 2 REGION");
    int(
        &mut con,
        &format!("RL.REGION MERGE {{t}}:a MONTH {end} us 30 3 ap 1 0"),
    );
    wait_replica(&mut con, 1, 5000);
    let expected = snapshot(&mut con);
    let mut rcon = replica.client();
    assert_eq!(
        snapshot(&mut rcon),
        expected,
        "the replica holds the same bytes and expiry"
    );
    assert_eq!(read(&mut rcon, "{t}:a"), read(&mut con, "{t}:a"));
    // Effects only: the replica ran RL.APPLY, never the commands.
    let stats = replica.info("commandstats");
    assert!(stats.contains("cmdstat_rl.apply:"), "{stats}");
    assert!(
        !stats.contains("cmdstat_rl.quota") && !stats.contains("cmdstat_rl.region|merge"),
        "{stats}"
    );

    let a = read(&mut con, "{t}:a").expect("a");
    assert_eq!(a.2, comps(&[("ap", 1, 0), ("eu", 7, 2), ("us", 30, 3)]));
    // AOF restart.
    master.restart();
    let mut con = master.client();
    assert_eq!(snapshot(&mut con), expected, "after the AOF replay");
    // RDB restart.
    let rdb = Server::start(EU);
    let mut con = rdb.client();
    ints(&mut con, "RL.QUOTA r 100 MONTH COST 4 REGION");
    int(&mut con, &format!("RL.REGION MERGE r MONTH {end} us 9 1"));
    let before = snapshot(&mut con);
    rdb.shutdown(true);
    rdb.restart();
    let mut con = rdb.client();
    assert_eq!(snapshot(&mut con), before, "after the RDB load");
    assert_eq!(
        read(&mut con, "r").expect("r").2,
        comps(&[("eu", 4, 0), ("us", 9, 1)])
    );
    let d = decide(&mut con, "RL.QUOTA r 100 MONTH REGION");
    assert_eq!(d.remaining, 100 - 4 - 8 - 1);
}

/// The next message on `pubsub` as `(channel, key)`, or `None` within the
/// timeout set on it.
fn next_event(pubsub: &mut redis::PubSub<'_>) -> Option<(String, String)> {
    let msg = pubsub.get_message().ok()?;
    Some((msg.get_channel_name().to_string(), msg.get_payload().ok()?))
}

#[test]
fn local_changes_are_announced_and_merges_are_not() {
    let mut args: Vec<&str> = EU.to_vec();
    args.extend_from_slice(&["--notify-keyspace-events", "KEd"]);
    let server = Server::start(&args);
    let replica = start_replica(&server);
    call_ok(
        &mut replica.client(),
        "CONFIG SET notify-keyspace-events KEd",
    );
    let mut replica_sub = replica.client();
    let mut replica_events = rl_events(&mut replica_sub);
    let mut sub_con = server.client();
    let mut pubsub = rl_events(&mut sub_con);
    let mut con = server.client();
    let end = month_end(&mut con);
    ints(&mut con, "RL.QUOTA {t}:a 2 MONTH REGION");
    int(
        &mut con,
        &format!("RL.REGION MERGE {{t}}:a MONTH {end} us 1 0"),
    );
    ints(&mut con, "RL.QUOTA {t}:a 2 MONTH REGION PEEK");
    ints(&mut con, "RL.QUOTA {t}:a 2 MONTH COST 0 REGION");
    assert_eq!(
        ints(&mut con, "RL.QUOTA {t}:a 2 MONTH REGION")[0],
        0,
        "throttled"
    );
    ints(&mut con, "RL.QUOTA plain 2 MONTH");
    ints(
        &mut con,
        "RL.QUOTA {t}:a 5 MONTH REFUND 1 REGION ALSO {t}:b 5 MONTH",
    );
    ints(&mut con, "RL.QUOTA {t}:b 5 MONTH COST 2 DEBT REGION");
    ints(&mut con, "RL.BOX TRIP end-of-test 1 1");
    let mut seen = vec![];
    for _ in 0..4 {
        seen.push(next_event(&mut pubsub).expect("an event within 5 s"));
    }
    let ev = |name: &str, key: &str| (format!("__keyevent@0__:{name}"), key.to_string());
    assert_eq!(
        seen,
        [
            ev("rl.quota.region", "{t}:a"),
            // the refund: `{t}:b` holds nothing to give back
            ev("rl.quota.region", "{t}:a"),
            ev("rl.quota.region", "{t}:b"),
            ev("rl.boxed", "end-of-test"),
        ],
        "only the calls that changed the local component, one per key"
    );
    pubsub
        .set_read_timeout(Some(Duration::from_millis(300)))
        .expect("timeout");
    assert_eq!(next_event(&mut pubsub), None, "no further event");
    // A replica applies the effects and announces nothing of rl's.
    wait_replica(&mut con, 1, 5000);
    assert!(read(&mut replica.client(), "{t}:b").is_some(), "replicated");
    replica_events
        .set_read_timeout(Some(Duration::from_millis(300)))
        .expect("timeout");
    assert_eq!(
        next_event(&mut replica_events),
        None,
        "a replica announces nothing"
    );
}

#[test]
fn a_three_primary_cluster_counts_per_slot() {
    let cluster = Cluster::start(3, 0);
    for node in cluster.masters() {
        let mut c = node.client();
        call_ok(&mut c, "CONFIG SET rl.regions eu,us,ap");
        call_ok(&mut c, "CONFIG SET rl.region eu");
    }
    let mut con = cluster.client();
    let end = month_end(&mut cluster.masters()[0].client());
    let keys = [
        "quota:{t1}",
        "quota:{t2}",
        "quota:{t3}",
        "quota:{t4}",
        "quota:{t5}",
    ];
    let nodes: std::collections::HashSet<u16> = keys
        .iter()
        .map(|k| cluster.master_for_key(k.as_bytes()).port)
        .collect();
    assert!(nodes.len() >= 2, "keys on several primaries");
    for (i, key) in keys.iter().enumerate() {
        let i = i as i64;
        ints(
            &mut con,
            &format!("RL.QUOTA {key} 100 MONTH COST {} REGION", i + 1),
        );
        assert_eq!(
            int(
                &mut con,
                &format!("RL.REGION MERGE {key} MONTH {end} us {} 0", 10 * i)
            ),
            i64::from(i > 0)
        );
        let d = decide_on(&mut con, &format!("RL.QUOTA {key} 100 MONTH COST 0 REGION"));
        assert_eq!(d, 100 - (i + 1) - 10 * i, "{key}");
        let r = read(&mut con, key).expect("components");
        assert_eq!(r.0, end);
    }
}

/// `remaining` of a limiter reply through any connection.
fn decide_on(con: &mut impl ConnectionLike, line: &str) -> i64 {
    ints(con, line)[2]
}
