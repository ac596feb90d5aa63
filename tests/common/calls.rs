//! Helpers for calling the rl commands and comparing whole datasets.

use std::collections::BTreeMap;

use redis::{Connection, ConnectionLike, RedisResult, Value};

use super::{array, int_array, value_i64, value_str};

/// Send one command given as a whitespace-separated line.
pub fn call(con: &mut impl ConnectionLike, line: &str) -> RedisResult<Value> {
    let mut words = line.split_whitespace();
    let mut cmd = redis::cmd(words.next().expect("a command"));
    for w in words {
        cmd.arg(w);
    }
    cmd.query(con)
}

/// A command that must succeed: its reply, or a panic naming the line.
pub fn call_ok(con: &mut impl ConnectionLike, line: &str) -> Value {
    call(con, line).unwrap_or_else(|e| panic!("{line}: {e}"))
}

/// A command whose reply is an array of integers.
pub fn ints(con: &mut impl ConnectionLike, line: &str) -> Vec<i64> {
    int_array(call_ok(con, line))
}

/// A command whose reply is an integer.
pub fn int(con: &mut impl ConnectionLike, line: &str) -> i64 {
    value_i64(&call_ok(con, line))
}

/// The `[lease-id, ms_left]` pairs of `RL.LEASE LIST key`.
pub fn lease_list(con: &mut impl ConnectionLike, key: &str) -> Vec<(String, i64)> {
    array(call_ok(con, &format!("RL.LEASE LIST {key}")))
        .into_iter()
        .map(|pair| {
            let pair = array(pair);
            (value_str(&pair[0]), value_i64(&pair[1]))
        })
        .collect()
}

/// Every line of `cases` is rejected with an error that starts with `ERR`
/// and contains its needle, and no key exists afterwards (the database was
/// empty): bad input changes nothing.
pub fn assert_rejected(con: &mut Connection, cases: &[(&str, &str)]) {
    for (line, needle) in cases {
        let e = super::expect_err(call(con, line), needle);
        let text = super::err_text(&e);
        assert!(text.starts_with("ERR "), "{line}: {text}");
    }
    assert_eq!(int(con, "DBSIZE"), 0, "no key created by a rejected call");
}

/// Assert `v` is in `lo..=hi` (for millisecond fields that move with the
/// real clock between two calls).
pub fn near(v: i64, lo: i64, hi: i64, what: &str) {
    assert!((lo..=hi).contains(&v), "{what}: {v} not in {lo}..={hi}");
}

/// A deterministic mix of every kind of write on `keys` keys: charges,
/// throttles, strikes, automatic and manual trips, releases, forgets and
/// probes, with ALSO buckets; windows of every mode; leases acquired,
/// released and renewed. Long periods, so nothing expires while a
/// test compares states.
pub fn mixed_workload(con: &mut Connection, keys: usize) {
    for i in 0..keys {
        let k = format!("w:{{{i}}}:key");
        let t = format!("w:{{{i}}}:tenant");
        let take = format!(
            "RL.TAKE {k} 5 1 3600 COST {} ALSO {t} 8 2 3600 STRIKES 3 3600 BOX 600 1200 0",
            1 + i % 3
        );
        for _ in 0..(1 + i % 6) {
            call(con, &take).expect("RL.TAKE");
        }
        match i % 7 {
            0 => {
                call(
                    con,
                    &format!("RL.BOX TRIP {k} {} {}", 1 + i % 3, (i % 2) * 900),
                )
                .expect("TRIP");
            }
            1 => {
                call(con, &format!("RL.BOX RELEASE {k}")).expect("RELEASE");
            }
            2 => {
                call(con, &format!("RL.BOX RELEASE {k} FORGET")).expect("RELEASE FORGET");
            }
            3 => {
                call(con, &format!("RL.TAKE {k} 5 1 3600 COST 0")).expect("probe");
            }
            _ => {}
        }
        for _ in 0..(i % 4) {
            call(con, &format!("RL.TAKE {k}:shaped 2 1 3600 DELAY 7200")).expect("DELAY");
        }
        let period = ["DAY", "WEEK", "MONTH"][i % 3];
        call(
            con,
            &format!("RL.QUOTA {k}:quota 100 {period} COST {}", 1 + i % 50),
        )
        .expect("RL.QUOTA");
        let mode = ["", "EXACT", "FIXED"][i % 3];
        for _ in 0..(1 + i % 4) {
            let line = format!("RL.WINDOW {k} 3 3600 {mode} ALSO {t} 4 7200 STRIKES 2 3600");
            call(con, &line).expect("RL.WINDOW");
        }
        if i % 4 == 0 {
            let l = format!("w:{{{i}}}:lease");
            for id in ["a", "b", "c"] {
                call(con, &format!("RL.LEASE ACQUIRE {l} 2 3600 ID {id}{i}")).expect("ACQUIRE");
            }
            call(con, &format!("RL.LEASE RELEASE {l} a{i}")).expect("RELEASE");
            call(con, &format!("RL.LEASE RENEW {l} b{i} 7200")).expect("RENEW");
            call(con, &format!("RL.LEASE ACQUIRE {l} 2 1800")).expect("ACQUIRE");
        }
    }
}

/// `DUMP` and `PEXPIRETIME` of every key in the database.
pub fn snapshot(con: &mut Connection) -> BTreeMap<String, (Vec<u8>, i64)> {
    let keys: Vec<String> = redis::cmd("KEYS").arg("*").query(con).expect("KEYS");
    keys.into_iter()
        .filter_map(|k| {
            let dump: Vec<u8> = redis::cmd("DUMP").arg(&k).query(con).expect("DUMP");
            let at: i64 = redis::cmd("PEXPIRETIME")
                .arg(&k)
                .query(con)
                .expect("PEXPIRETIME");
            // a key that expired between KEYS and its DUMP is not there
            (at != -2).then_some((k, (dump, at)))
        })
        .collect()
}

/// `snapshot` without the keys that expire by `cutoff_ms` (Unix ms): what
/// stays the same across a reload that takes less than the time to the
/// cutoff, whatever ends on its own meanwhile (a fixed window ends at its
/// boundary, wherever that falls).
pub fn snapshot_lasting_past(
    con: &mut Connection,
    cutoff_ms: i64,
) -> BTreeMap<String, (Vec<u8>, i64)> {
    snapshot(con)
        .into_iter()
        .filter(|(_, (_, at))| *at < 0 || *at > cutoff_ms)
        .collect()
}

/// A subscriber on `con` to the module's keyspace events
/// (`__keyevent@0__:rl.*`), waiting at most 5 s for each message.
pub fn rl_events(con: &mut Connection) -> redis::PubSub<'_> {
    let mut pubsub = con.as_pubsub();
    pubsub
        .psubscribe("__keyevent@0__:rl.*")
        .expect("PSUBSCRIBE");
    pubsub
        .set_read_timeout(Some(std::time::Duration::from_secs(5)))
        .expect("timeout");
    pubsub
}
