//! Stored-bytes compatibility: `tests/corpus/` holds one `DUMP` and one
//! replicated `RL.APPLY` payload per kind of state the module stores,
//! written by the module as it was when the corpus was made (see
//! `tests/corpus/README.md`). Every build must read them back to the same
//! state, and replay the payloads to the same `DUMP` bytes.
//!
//! Regenerate (only when a new kind of state is added; the point of the
//! corpus is that old bytes stay readable):
//! `RL_MODULE=$PWD/target/release/librl.so cargo test --release --test corpus -- --ignored`

mod common;

use std::path::{Path, PathBuf};

use common::*;
use redis::Connection;

/// The server's clock when the corpus was made: 2026-12-01T12:00:00Z.
const MADE_AT_MS: i64 = 1_796_126_400_000;

/// Slack for the millisecond fields: the probes run some seconds after
/// the clock was set to [`MADE_AT_MS`].
const SLACK_MS: i64 = 120_000;

/// One kind of stored state: its file name, its key, and the calls that
/// made it (`{k}` is the key; `ADVANCE ms` moves the server's clock).
struct Kind {
    name: &'static str,
    key: &'static str,
    writes: &'static [&'static str],
}

const PENALTY: &str = "STRIKES 5 3600 BOX 600 1200 0";

const KINDS: &[Kind] = &[
    Kind {
        name: "bucket",
        key: "corpus:bucket",
        writes: &["RL.TAKE {k} 10 1 3600 COST 3"],
    },
    Kind {
        name: "bucket-strikes",
        key: "corpus:strikes",
        writes: &[
            "RL.TAKE {k} 2 1 3600 COST 2 STRIKES 5 3600 BOX 600 1200 0",
            "RL.TAKE {k} 2 1 3600 STRIKES 5 3600 BOX 600 1200 0",
            "RL.TAKE {k} 2 1 3600 STRIKES 5 3600 BOX 600 1200 0",
        ],
    },
    Kind {
        name: "box-level-1",
        key: "corpus:box1",
        writes: &[
            "RL.TAKE {k} 1 1 3600 STRIKES 1 3600 BOX 600 1200 0",
            "RL.TAKE {k} 1 1 3600 STRIKES 1 3600 BOX 600 1200 0",
        ],
    },
    Kind {
        name: "box-level-2",
        key: "corpus:box2",
        writes: &["RL.BOX TRIP {k} 2 1200"],
    },
    Kind {
        name: "box-manual",
        key: "corpus:manual",
        writes: &["RL.BOX TRIP {k} 3 0"],
    },
    Kind {
        name: "window-sliding",
        key: "corpus:sliding",
        writes: &["RL.WINDOW {k} 10 3600 COST 4"],
    },
    Kind {
        name: "window-exact",
        key: "corpus:exact",
        writes: &[
            "RL.WINDOW {k} 10 3600 EXACT COST 1",
            "ADVANCE 1000",
            "RL.WINDOW {k} 10 3600 EXACT COST 2",
            "ADVANCE 1000",
            "RL.WINDOW {k} 10 3600 EXACT COST 3",
        ],
    },
    Kind {
        name: "window-fixed",
        key: "corpus:fixed",
        writes: &["RL.WINDOW {k} 10 3600 FIXED COST 5"],
    },
    Kind {
        name: "quota",
        key: "corpus:quota",
        writes: &["RL.QUOTA {k} 100 MONTH COST 25"],
    },
    Kind {
        name: "leases",
        key: "corpus:leases",
        writes: &[
            "RL.LEASE ACQUIRE {k} 3 3600 ID alpha",
            "RL.LEASE ACQUIRE {k} 3 7200 ID beta",
            "RL.LEASE ACQUIRE {k} 3 1800 ID gamma",
        ],
    },
    Kind {
        name: "everything",
        key: "corpus:everything",
        writes: &[
            "RL.TAKE {k} 5 1 3600 COST 2 STRIKES 5 3600 BOX 600 1200 0",
            "RL.WINDOW {k} 10 3600 COST 3",
            "RL.QUOTA {k} 100 DAY COST 7",
            "RL.LEASE ACQUIRE {k} 2 3600 ID one",
        ],
    },
];

/// One stored state as read from the corpus.
struct Stored {
    name: String,
    key: String,
    /// `PEXPIRETIME` of the key (Unix ms), or `None` without a TTL.
    expire_at: Option<i64>,
    dump: Vec<u8>,
    /// The payload of the key's last replicated `RL.APPLY`.
    apply: Vec<u8>,
}

fn corpus_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/corpus")
}

/// The expiry as `RL.APPLY` carries it: absolute ms or `PERSIST`.
fn expiry_arg(expire_at: Option<i64>) -> String {
    expire_at.map_or_else(|| "PERSIST".to_string(), |at| at.to_string())
}

/// Reads `manifest.txt` (`name key expiry` lines) and the `.dump` and
/// `.apply` files it names.
fn load_corpus() -> Vec<Stored> {
    let dir = corpus_dir();
    let manifest = std::fs::read_to_string(dir.join("manifest.txt")).expect("manifest.txt");
    let mut made_at = None;
    let mut out = Vec::new();
    for line in manifest.lines().filter(|l| !l.starts_with('#')) {
        let words: Vec<&str> = line.split_whitespace().collect();
        match words[..] {
            ["made_at_ms", at] => made_at = Some(at.parse::<i64>().expect("made_at_ms")),
            [name, key, expiry] => out.push(Stored {
                name: name.to_string(),
                key: key.to_string(),
                expire_at: (expiry != "PERSIST").then(|| expiry.parse().expect("expiry ms")),
                dump: std::fs::read(dir.join(format!("{name}.dump"))).expect("a .dump file"),
                apply: std::fs::read(dir.join(format!("{name}.apply"))).expect("an .apply file"),
            }),
            _ => panic!("manifest.txt: bad line {line:?}"),
        }
    }
    assert_eq!(made_at, Some(MADE_AT_MS), "manifest.txt: made_at_ms");
    let names: Vec<&str> = out.iter().map(|s| s.name.as_str()).collect();
    let expected: Vec<&str> = KINDS.iter().map(|k| k.name).collect();
    assert_eq!(names, expected, "the corpus holds every kind, in order");
    out
}

/// A server whose clock reads [`MADE_AT_MS`] now, so that the corpus'
/// states are as live as when they were written.
fn server_at_made_at(clock: &TimeShift, extra: &[&str]) -> Server {
    clock.set_now_ms(MADE_AT_MS);
    Server::start_with(&clock.prefix(), extra)
}

/// `ms` is a countdown that stood at `full` when the corpus was made (1 s
/// of leeway above: a regenerated corpus is written some ms after
/// [`MADE_AT_MS`]).
fn counting_down(ms: i64, full: i64, what: &str) {
    near(ms, full - SLACK_MS, full + 1_000, what);
}

/// Asserts what the key of `name` holds, through the module's own
/// read-only commands and `COST 0` probes (which write nothing).
fn check_state(con: &mut Connection, name: &str, key: &str) {
    let status = |con: &mut Connection| box_status(con, key);
    let what = |field: &str| format!("{name}: {field}");
    match name {
        "bucket" => {
            let d = decide(con, &format!("RL.TAKE {key} 10 1 3600 COST 0"));
            assert_eq!((d.status, d.limit, d.remaining), (ALLOWED, 10, 7), "{d:?}");
            counting_down(d.reset_ms, 3 * 3_600_000, &what("reset_ms"));
            assert_eq!(
                (d.retry_after_ms, d.box_level, d.strikes_remaining),
                (0, 0, -1)
            );
            assert_eq!(status(con).to_array(), [0, 0, 0, 0]);
        }
        "bucket-strikes" => {
            let d = decide(con, &format!("RL.TAKE {key} 2 1 3600 COST 0 {PENALTY}"));
            assert_eq!((d.status, d.limit, d.remaining), (ALLOWED, 2, 0), "{d:?}");
            assert_eq!((d.box_level, d.strikes_remaining), (0, 3), "{d:?}");
            assert_eq!(status(con).to_array(), [0, 0, 0, 2], "two strikes, no box");
        }
        "box-level-1" => {
            let s = status(con);
            assert_eq!((s.level, s.offenses, s.strikes), (1, 1, 0), "{s:?}");
            counting_down(s.ttl_ms, 600_000, &what("box ttl_ms"));
            let d = decide(con, &format!("RL.TAKE {key} 1 1 3600 COST 0 {PENALTY}"));
            assert_eq!((d.status, d.box_level, d.remaining), (BOXED, 1, 0), "{d:?}");
            counting_down(d.retry_after_ms, 600_000, &what("retry_after_ms"));
        }
        "box-level-2" => {
            let s = status(con);
            assert_eq!((s.level, s.offenses, s.strikes), (2, 1, 0), "{s:?}");
            counting_down(s.ttl_ms, 1_200_000, &what("box ttl_ms"));
        }
        "box-manual" => {
            assert_eq!(
                status(con).to_array(),
                [3, -1, 1, 0],
                "a manual level-3 box"
            );
            let d = decide(con, &format!("RL.TAKE {key} 5 1 60 COST 0"));
            assert_eq!((d.status, d.box_level, d.retry_after_ms), (BOXED, 3, -1));
        }
        "window-sliding" => {
            let d = decide(con, &format!("RL.WINDOW {key} 10 3600 COST 0"));
            assert_eq!((d.status, d.limit, d.remaining), (ALLOWED, 10, 6), "{d:?}");
            counting_down(d.reset_ms, 5_302_595, &what("reset_ms"));
        }
        "window-exact" => {
            let d = decide(con, &format!("RL.WINDOW {key} 10 3600 EXACT COST 0"));
            assert_eq!((d.status, d.limit, d.remaining), (ALLOWED, 10, 4), "{d:?}");
            // The last entry was written 2 s after the first.
            counting_down(d.reset_ms, 3_602_000, &what("reset_ms"));
        }
        "window-fixed" => {
            let d = decide(con, &format!("RL.WINDOW {key} 10 3600 FIXED COST 0"));
            assert_eq!((d.status, d.limit, d.remaining), (ALLOWED, 10, 5), "{d:?}");
            // This key's fixed windows end 759.8 s after the corpus' time.
            counting_down(d.reset_ms, 759_800, &what("reset_ms"));
        }
        "quota" => {
            let d = decide(con, &format!("RL.QUOTA {key} 100 MONTH COST 0"));
            assert_eq!(
                (d.status, d.limit, d.remaining),
                (ALLOWED, 100, 75),
                "{d:?}"
            );
            // The month ends on 2027-01-01T00:00:00Z, 30.5 days later.
            counting_down(d.reset_ms, 2_635_200_000, &what("reset_ms"));
        }
        "leases" => {
            let leases = lease_list(con, key);
            let ids: Vec<&str> = leases.iter().map(|(id, _)| id.as_str()).collect();
            assert_eq!(ids, ["alpha", "beta", "gamma"], "{leases:?}");
            for ((id, left), full) in leases.iter().zip([3_600_000, 7_200_000, 1_800_000]) {
                counting_down(*left, full, &what(id));
            }
        }
        "everything" => {
            let d = decide(con, &format!("RL.TAKE {key} 5 1 3600 COST 0 {PENALTY}"));
            assert_eq!(
                (d.status, d.remaining, d.strikes_remaining),
                (ALLOWED, 3, 5)
            );
            let d = decide(con, &format!("RL.WINDOW {key} 10 3600 COST 0"));
            assert_eq!((d.status, d.remaining), (ALLOWED, 7), "window: {d:?}");
            let d = decide(con, &format!("RL.QUOTA {key} 100 DAY COST 0"));
            assert_eq!((d.status, d.remaining), (ALLOWED, 93), "quota: {d:?}");
            let leases = lease_list(con, key);
            assert_eq!(leases.len(), 1, "{leases:?}");
            assert_eq!(leases[0].0, "one");
            counting_down(leases[0].1, 3_600_000, &what("lease one"));
        }
        other => panic!("no check for corpus kind {other}"),
    }
}

/// A stored `DUMP` as this build writes it back: the corpus was written
/// with payload version 4, whose layout today's keeps for its parts
/// ([`as_current`]), so the payload is the same stored under the current
/// version with the later parts empty (and the checksum follows).
/// `rdb_version` is the server's own (Valkey's RDB version is not Redis
/// 7.0's): a DUMP's trailer carries it.
fn as_current_dump(dump: &[u8], rdb_version: &[u8]) -> Vec<u8> {
    let (body, _) = split_dump(dump);
    let Some((head, payload)) = unframe(body) else {
        return dump.to_vec();
    };
    with_trailer(&frame(head, &as_current(payload)), rdb_version)
}

/// The key's `DUMP` and `PEXPIRETIME` match the stored state.
fn assert_holds_bytes(con: &mut Connection, s: &Stored, how: &str) {
    let dump: Vec<u8> = redis::cmd("DUMP").arg(&s.key).query(con).expect("DUMP");
    // A payload Redis stored LZF-compressed (0xC3 after the string opcode)
    // compresses differently once its version byte changes: then the bytes
    // this build writes must be stable (RESTORE of its own DUMP gives them
    // back), and the state checks of the caller say what they hold.
    let compressed = s.dump.get(11) == Some(&0xC3);
    let expected = if compressed {
        let copy = format!("{}:again", s.key);
        let _: () = redis::cmd("RESTORE")
            .arg(&copy)
            .arg(0)
            .arg(&dump[..])
            .query(con)
            .expect("RESTORE of its own DUMP");
        let again: Vec<u8> = redis::cmd("DUMP").arg(&copy).query(con).expect("DUMP");
        let _: i64 = redis::cmd("DEL").arg(&copy).query(con).expect("DEL");
        again
    } else {
        as_current_dump(&s.dump, split_dump(&dump).1)
    };
    assert!(dump == expected, "{}: {how} gives other DUMP bytes", s.name);
    let at: i64 = redis::cmd("PEXPIRETIME")
        .arg(&s.key)
        .query(con)
        .expect("PEXPIRETIME");
    assert_eq!(at, s.expire_at.unwrap_or(-1), "{}: PEXPIRETIME", s.name);
}

#[test]
fn every_stored_dump_restores_to_the_state_it_was_made_from() {
    let corpus = load_corpus();
    let clock = TimeShift::new();
    let server = server_at_made_at(&clock, &[]);
    let mut con = server.client();
    for s in &corpus {
        let mut restore = redis::cmd("RESTORE");
        restore.arg(&s.key);
        match s.expire_at {
            Some(at) => restore.arg(at).arg(&s.dump[..]).arg("ABSTTL"),
            None => restore.arg(0).arg(&s.dump[..]),
        };
        let _: () = restore
            .query(&mut con)
            .unwrap_or_else(|e| panic!("RESTORE {}: {e}", s.name));
        assert_holds_bytes(&mut con, s, "RESTORE then DUMP");
        check_state(&mut con, &s.name, &s.key);
    }
    assert_eq!(
        int(&mut con, "DBSIZE"),
        KINDS.len() as i64,
        "probes wrote nothing"
    );
}

#[test]
fn every_stored_apply_payload_replays_from_an_aof_to_the_same_dump() {
    let corpus = load_corpus();
    let clock = TimeShift::new();
    let server = server_at_made_at(&clock, AOF_EVERY_WRITE);
    server.kill9();
    let (incr, _) = incremental_aof(&server);
    let mut aof = Vec::new();
    for s in &corpus {
        let expiry = expiry_arg(s.expire_at);
        aof.extend(resp_command(&[
            b"RL.APPLY",
            s.key.as_bytes(),
            &s.apply,
            expiry.as_bytes(),
        ]));
    }
    std::fs::write(&incr, aof).expect("write the AOF");
    clock.set_now_ms(MADE_AT_MS);
    server.restart();
    let mut con = server.client();
    for s in &corpus {
        assert_holds_bytes(&mut con, s, "the RL.APPLY replay");
        check_state(&mut con, &s.name, &s.key);
    }
}

/// Writes the corpus: every kind made on a server whose clock reads
/// [`MADE_AT_MS`], its `DUMP`, and the payload of its last `RL.APPLY` in
/// the server's AOF.
#[test]
#[ignore = "regenerates tests/corpus/ from the module under test"]
fn regenerate_corpus() {
    let clock = TimeShift::new();
    let server = server_at_made_at(&clock, AOF_EVERY_WRITE);
    let mut con = server.client();
    for kind in KINDS {
        clock.set_now_ms(MADE_AT_MS);
        for write in kind.writes {
            if let Some(ms) = write.strip_prefix("ADVANCE ") {
                clock.advance_ms(ms.parse().expect("ADVANCE ms"));
                continue;
            }
            call_ok(&mut con, &write.replace("{k}", kind.key));
        }
    }
    let mut states = Vec::new();
    for kind in KINDS {
        let dump: Vec<u8> = redis::cmd("DUMP")
            .arg(kind.key)
            .query(&mut con)
            .expect("DUMP");
        let at: i64 = redis::cmd("PEXPIRETIME")
            .arg(kind.key)
            .query(&mut con)
            .expect("PEXPIRETIME");
        states.push((kind, dump, (at >= 0).then_some(at)));
    }
    server.kill9();
    let (_, cmds) = incremental_aof(&server);
    let dir = corpus_dir();
    let mut manifest = format!(
        "# Written by `regenerate_corpus` in tests/corpus.rs: see README.md.\n\
         # name key expiry (PEXPIRETIME in Unix ms, or PERSIST)\n\
         made_at_ms {MADE_AT_MS}\n"
    );
    for (kind, dump, expire_at) in states {
        let apply = cmds
            .iter()
            .rev()
            .find(|c| c[0].eq_ignore_ascii_case(b"RL.APPLY") && c[1] == kind.key.as_bytes())
            .unwrap_or_else(|| panic!("no RL.APPLY of {} in the AOF", kind.key));
        assert_eq!(
            apply.len(),
            4,
            "one key per RL.APPLY: {}",
            show_command(apply)
        );
        assert_eq!(apply[3], expiry_arg(expire_at).as_bytes(), "{}", kind.name);
        std::fs::write(dir.join(format!("{}.dump", kind.name)), dump).expect("write .dump");
        std::fs::write(dir.join(format!("{}.apply", kind.name)), &apply[2]).expect("write .apply");
        manifest += &format!("{} {} {}\n", kind.name, kind.key, expiry_arg(expire_at));
    }
    std::fs::write(dir.join("manifest.txt"), manifest).expect("write manifest.txt");
}
