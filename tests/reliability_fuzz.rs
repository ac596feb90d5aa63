//! Reliability, item 7: hostile input at the protocol level. A
//! proptest-driven fuzzer sends random argument vectors of every command
//! and subcommand (valid tokens, numbers at and beyond the limits, huge,
//! negative, NaN, empty and binary strings, options repeated or cut short)
//! to a live server for a bounded count and time, and checks after each
//! call: the server answers, a rejected call created and changed no key,
//! no error is an internal one, and accepted limiter calls answer 8
//! integers.

mod common;

use std::cell::{Cell, RefCell};
use std::time::{Duration, Instant};

use common::*;
use proptest::prelude::*;
use proptest::sample::select;
use proptest::test_runner::{Config, RngAlgorithm, TestCaseError, TestRng, TestRunner};

/// At most this many calls...
const MAX_CASES: u32 = 150_000;
/// ...and at most this long.
const BUDGET: Duration = Duration::from_secs(40);

/// One argument: a key of the call's namespace (0..3) or raw bytes.
#[derive(Clone, Debug)]
enum Tok {
    Key(u8),
    Raw(Vec<u8>),
}

fn raw(s: &str) -> Tok {
    Tok::Raw(s.as_bytes().to_vec())
}

/// Numbers and durations: mostly valid, many at or beyond a limit, some
/// malformed, some junk, rarely huge.
fn num() -> BoxedStrategy<Tok> {
    let edges = vec![
        "0",
        "1",
        "2",
        "100",
        "101",
        "1000",
        "1001",
        "10000",
        "10001",
        "1000000000",
        "1000000001",
        "999999999999999",
        "1000000000000000",
        "1000000000000001",
        "3153600000",
        "3153600000.000",
        "3153600000.001",
        "3153600001",
        "0.001",
        "0.0010",
        "0.0001",
        "1.5000",
        "18446744073709551615",
        "18446744073709551616",
        "9223372036854775807",
        "9223372036854775808",
        "99999999999999999999",
        "999999999999999999999",
        "00000000000000000001",
        "-1",
        "-0",
        "+1",
        "1e3",
        "1E3",
        "nan",
        "NaN",
        "inf",
        "-inf",
        "infinity",
        "",
        " 1",
        "1 ",
        "0x10",
        "1.",
        ".5",
        "1.2.3",
        "007",
        "\u{0663}",
        "\u{FF11}",
        "1\0",
    ];
    prop_oneof![
        6 => (1u64..200).prop_map(|n| Tok::Raw(n.to_string().into_bytes())),
        2 => select(vec!["0.5", "1", "60", "0.25", "1.5", "3600", "86400", "0.01"]).prop_map(raw),
        4 => select(edges).prop_map(raw),
        1 => any::<u64>().prop_map(|n| Tok::Raw(n.to_string().into_bytes())),
        1 => any::<i64>().prop_map(|n| Tok::Raw(n.to_string().into_bytes())),
        1 => any::<f64>().prop_map(|f| Tok::Raw(f.to_string().into_bytes())),
        1 => "[0-9]{1,25}".prop_map(|s| Tok::Raw(s.into_bytes())),
        1 => "[0-9]{1,10}\\.[0-9]{1,6}".prop_map(|s| Tok::Raw(s.into_bytes())),
        1 => prop::collection::vec(any::<u8>(), 0..24).prop_map(Tok::Raw),
    ]
    .boxed()
}

/// Option keywords and subcommands, in random letter case.
fn word() -> BoxedStrategy<Tok> {
    let words = vec![
        "COST", "ALSO", "STRIKES", "BOX", "OFFENSES", "JITTER", "DELAY", "EXACT", "FIXED", "PEEK",
        "DAY", "WEEK", "MONTH", "ID", "FORGET", "ACQUIRE", "RELEASE", "RENEW", "LIST", "STATUS",
        "TRIP", "HELP",
    ];
    (select(words), any::<u32>())
        .prop_map(|(w, bits)| {
            Tok::Raw(
                w.bytes()
                    .enumerate()
                    .map(|(i, b)| {
                        if bits >> (i % 32) & 1 == 1 {
                            b.to_ascii_lowercase()
                        } else {
                            b
                        }
                    })
                    .collect(),
            )
        })
        .boxed()
}

/// A positional number: mostly valid, so that calls get past the first
/// arguments and reach the deeper checks.
fn pos() -> BoxedStrategy<Tok> {
    prop_oneof![
        6 => (1u64..60).prop_map(|n| Tok::Raw(n.to_string().into_bytes())),
        1 => num(),
    ]
    .boxed()
}

fn key() -> BoxedStrategy<Tok> {
    (0u8..3).prop_map(Tok::Key).boxed()
}

/// Anything: a number, a keyword, a key, junk, or (rarely) a huge string.
fn any_tok() -> BoxedStrategy<Tok> {
    prop_oneof![
        4 => num(),
        3 => word(),
        2 => key(),
        1 => prop::collection::vec(any::<u8>(), 0..64).prop_map(Tok::Raw),
        1 => (any::<u8>(), 1000usize..70_000).prop_map(|(b, n)| Tok::Raw(vec![b; n])),
    ]
    .boxed()
}

/// A lease id: short names, generated-looking ids, empty, too long, binary.
fn lease_id() -> BoxedStrategy<Tok> {
    prop_oneof![
        3 => select(vec!["a", "b", "c"]).prop_map(raw),
        1 => "[0-9a-f]{32}".prop_map(|s| Tok::Raw(s.into_bytes())),
        1 => (0usize..3).prop_map(|n| Tok::Raw(vec![b'x'; [0, 128, 129][n]])),
        1 => prop::collection::vec(any::<u8>(), 0..140).prop_map(Tok::Raw),
    ]
    .boxed()
}

fn lit(s: &'static str) -> BoxedStrategy<Vec<Tok>> {
    Just(vec![raw(s)]).boxed()
}

fn seq(parts: Vec<BoxedStrategy<Tok>>) -> BoxedStrategy<Vec<Tok>> {
    parts.prop_map(|v| v).boxed()
}

/// Option clauses shared by RL.TAKE, RL.WINDOW and RL.QUOTA; `also` is the
/// shape of an ALSO clause after the keyword.
fn clauses(also: Vec<BoxedStrategy<Tok>>, extra: Vec<&'static str>) -> BoxedStrategy<Vec<Tok>> {
    let mut also_clause = vec![word_exact("ALSO"), key()];
    also_clause.extend(also);
    let clause = prop_oneof![
        3 => seq(vec![word_exact("COST"), prop_oneof![3 => (0u64..8).prop_map(|n| Tok::Raw(n.to_string().into_bytes())), 1 => num()].boxed()]),
        3 => seq(also_clause.clone()),
        2 => seq(vec![word_exact("STRIKES"), num(), num()]),
        1 => seq(vec![word_exact("BOX"), num(), num(), num()]),
        1 => seq(vec![word_exact("OFFENSES"), num()]),
        1 => seq(vec![word_exact("JITTER"), num()]),
        1 => seq(vec![word_exact("DELAY"), num()]),
        1 => select(extra).prop_map(|w| vec![raw(w)]),
        1 => any_tok().prop_map(|t| vec![t]),
    ];
    prop_oneof![
        8 => prop::collection::vec(clause, 0..6),
        1 => (14usize..18).prop_flat_map(move |n| prop::collection::vec(seq(also_clause.clone()), n)),
    ]
    .prop_map(|cs| cs.into_iter().flatten().collect())
    .boxed()
}

fn word_exact(w: &'static str) -> BoxedStrategy<Tok> {
    prop_oneof![9 => Just(raw(w)), 1 => word()].boxed()
}

fn period() -> BoxedStrategy<Tok> {
    prop_oneof![
        4 => select(vec!["DAY", "WEEK", "MONTH", "day", "Month"]).prop_map(raw),
        1 => any_tok(),
    ]
    .boxed()
}

fn with_tail(
    head: BoxedStrategy<Vec<Tok>>,
    tail: BoxedStrategy<Vec<Tok>>,
) -> BoxedStrategy<Vec<Tok>> {
    (head, tail)
        .prop_map(|(mut h, t)| {
            h.extend(t);
            h
        })
        .boxed()
}

/// Argument vectors of every command and subcommand.
fn argv() -> BoxedStrategy<Vec<Tok>> {
    let take = with_tail(
        with_tail(lit("RL.TAKE"), seq(vec![key(), pos(), pos(), pos()])),
        clauses(vec![pos(), pos(), pos()], vec!["EXACT", "PEEK"]),
    );
    let window = with_tail(
        with_tail(lit("RL.WINDOW"), seq(vec![key(), pos(), pos()])),
        clauses(vec![pos(), pos()], vec!["EXACT", "FIXED", "PEEK"]),
    );
    let quota = with_tail(
        with_tail(lit("RL.QUOTA"), seq(vec![key(), pos(), period()])),
        clauses(vec![pos(), period()], vec!["PEEK", "EXACT"]),
    );
    let throttle = with_tail(
        with_tail(lit("CL.THROTTLE"), seq(vec![key(), pos(), pos(), pos()])),
        prop::collection::vec(prop_oneof![3 => num(), 1 => any_tok()], 0..3).boxed(),
    );
    let lease_tail = prop_oneof![
        3 => Just(vec![]),
        1 => prop::collection::vec(
            prop_oneof![2 => num(), 2 => lease_id(), 1 => word_exact("ID"), 1 => any_tok()],
            1..3,
        ),
    ]
    .boxed();
    let lease = prop_oneof![
        3 => with_tail(
            seq(vec![Just(raw("RL.LEASE")).boxed(), word_exact("ACQUIRE"), key(), pos(), pos()]),
            prop_oneof![
                2 => Just(vec![]).boxed(),
                3 => seq(vec![word_exact("ID"), lease_id()]),
                1 => lease_tail.clone(),
            ]
            .boxed(),
        ),
        2 => with_tail(
            seq(vec![Just(raw("RL.LEASE")).boxed(), word_exact("RELEASE"), key(), lease_id()]),
            lease_tail.clone(),
        ),
        2 => with_tail(
            seq(vec![Just(raw("RL.LEASE")).boxed(), word_exact("RENEW"), key(), lease_id(), pos()]),
            lease_tail.clone(),
        ),
        1 => with_tail(
            seq(vec![Just(raw("RL.LEASE")).boxed(), word_exact("LIST"), key()]),
            lease_tail.clone(),
        ),
        1 => with_tail(lit("RL.LEASE"), prop::collection::vec(any_tok(), 0..5).boxed()),
    ]
    .boxed();
    let box_tail = prop_oneof![
        1 => Just(vec![]),
        3 => prop::collection::vec(
            prop_oneof![3 => pos(), 1 => word_exact("FORGET"), 1 => any_tok()],
            1..4,
        ),
    ]
    .boxed();
    let rlbox = prop_oneof![
        2 => with_tail(seq(vec![Just(raw("RL.BOX")).boxed(), word_exact("STATUS"), key()]), box_tail.clone()),
        3 => with_tail(seq(vec![Just(raw("RL.BOX")).boxed(), word_exact("TRIP"), key()]), box_tail.clone()),
        2 => with_tail(seq(vec![Just(raw("RL.BOX")).boxed(), word_exact("RELEASE"), key()]), box_tail.clone()),
        1 => with_tail(lit("RL.BOX"), prop::collection::vec(any_tok(), 0..5).boxed()),
    ]
    .boxed();
    let apply = with_tail(
        lit("RL.APPLY"),
        prop::collection::vec(any_tok(), 0..4).boxed(),
    );
    let commands = prop_oneof![
        6 => take,
        4 => window,
        3 => quota,
        2 => throttle,
        4 => lease,
        3 => rlbox,
        1 => apply,
    ]
    .boxed();
    // Cut some vectors short (a missing argument), and ask COMMAND GETKEYS
    // about some (the key-extraction callbacks get junk too).
    let cut = (commands, prop_oneof![6 => Just(0usize), 1 => 1usize..4])
        .prop_map(|(mut v, k)| {
            let keep = v.len().saturating_sub(k).max(1);
            v.truncate(keep);
            v
        })
        .boxed();
    prop_oneof![
        9 => cut.clone(),
        1 => with_tail(Just(vec![raw("COMMAND"), raw("GETKEYS")]).boxed(), cut),
    ]
    .boxed()
}

/// Which keys exist before the call.
#[derive(Clone, Copy, Debug)]
enum Pre {
    Nothing,
    /// Key 0 holds a string (WRONGTYPE; for CL.THROTTLE, not a
    /// redis-cell value).
    Text,
    /// Key 0 holds a bucket with strikes, key 1 a box, key 2 leases.
    Limiters,
}

fn pre() -> BoxedStrategy<Pre> {
    prop_oneof![6 => Just(Pre::Nothing), 1 => Just(Pre::Text), 2 => Just(Pre::Limiters)].boxed()
}

struct Counters {
    calls: Cell<u64>,
    errors: Cell<u64>,
    accepted: Cell<u64>,
    getkeys: Cell<u64>,
    namespace: Cell<u64>,
    /// Accepted calls that changed a key (shows the check can see changes).
    wrote: Cell<u64>,
    /// Error replies by text (numbers and quoted words removed).
    texts: RefCell<std::collections::BTreeMap<String, u64>>,
    /// Accepted calls by command.
    by_command: RefCell<std::collections::BTreeMap<String, u64>>,
}

fn resp_ints(r: &Resp) -> Option<Vec<i64>> {
    match r {
        Resp::Array(Some(items)) => items
            .iter()
            .map(|i| match i {
                Resp::Int(n) => Some(*n),
                _ => None,
            })
            .collect(),
        _ => None,
    }
}

#[test]
fn random_argument_vectors_never_crash_and_rejected_calls_change_nothing() {
    let fig = Figure::start();
    let server = Server::start(&[]);
    let conn = RefCell::new(RawConn::connect(&server));
    let counters = Counters {
        calls: Cell::new(0),
        errors: Cell::new(0),
        accepted: Cell::new(0),
        getkeys: Cell::new(0),
        namespace: Cell::new(0),
        wrote: Cell::new(0),
        texts: RefCell::new(Default::default()),
        by_command: RefCell::new(Default::default()),
    };
    let started = Instant::now();
    let seed: [u8; 32] = *b"rl reliability fuzzer, seed 0007";
    let config = Config {
        cases: MAX_CASES,
        failure_persistence: None,
        max_shrink_time: 60_000,
        max_shrink_iters: 2_000,
        ..Config::default()
    };
    let mut runner =
        TestRunner::new_with_rng(config, TestRng::from_seed(RngAlgorithm::ChaCha, &seed));
    let result = runner.run(&(argv(), pre()), |(args, pre)| {
        if started.elapsed() > BUDGET {
            return Ok(());
        }
        let mut raw = conn.borrow_mut();
        let n = counters.namespace.get();
        counters.namespace.set(n + 1);
        let keys: Vec<Vec<u8>> = (0..3)
            .map(|i| format!("{{f{n}}}:{i}").into_bytes())
            .collect();
        let k = |i: usize| String::from_utf8(keys[i].clone()).expect("utf8");
        let setup: Vec<Vec<String>> = match pre {
            Pre::Nothing => vec![],
            Pre::Text => vec![vec!["SET".into(), k(0), "not a limiter".into()]],
            Pre::Limiters => vec![
                format!("RL.TAKE {} 5 1 3600 COST 2", k(0)),
                format!("RL.TAKE {} 5 1 3600 COST 4 STRIKES 3 3600", k(0)),
                format!("RL.BOX TRIP {} 2 3600", k(1)),
                format!("RL.LEASE ACQUIRE {} 2 3600 ID a", k(2)),
                format!("RL.WINDOW {} 5 3600 EXACT", k(2)),
            ]
            .into_iter()
            .map(|l| l.split(' ').map(str::to_string).collect())
            .collect(),
        };
        if !setup.is_empty() {
            for r in raw
                .pipeline(&setup)
                .map_err(|e| TestCaseError::fail(format!("setup: {e}")))?
            {
                prop_assert!(!matches!(r, Resp::Error(_)), "setup failed: {r:?}");
            }
        }
        let state = |raw: &mut RawConn| -> Result<Vec<Resp>, TestCaseError> {
            let cmds: Vec<Vec<&[u8]>> = keys
                .iter()
                .flat_map(|k| [vec![&b"DUMP"[..], k], vec![&b"PEXPIRETIME"[..], k]])
                .collect();
            raw.pipeline(&cmds)
                .map_err(|e| TestCaseError::fail(format!("server gone? {e}")))
        };
        let before = state(&mut raw)?;
        let argv: Vec<Vec<u8>> = args
            .iter()
            .map(|t| match t {
                Tok::Key(i) => keys[usize::from(*i)].clone(),
                Tok::Raw(b) => b.clone(),
            })
            .collect();
        let reply = raw
            .call(&argv)
            .map_err(|e| TestCaseError::fail(format!("no reply (server crashed?): {e}")))?;
        counters.calls.set(counters.calls.get() + 1);
        let name = String::from_utf8_lossy(&argv[0]).to_ascii_uppercase();
        if name == "COMMAND" {
            counters.getkeys.set(counters.getkeys.get() + 1);
        }
        let after = state(&mut raw)?;
        match &reply {
            Resp::Error(e) => {
                counters.errors.set(counters.errors.get() + 1);
                let text = String::from_utf8_lossy(e);
                let shape: String = text.split('\'').step_by(2).collect::<Vec<_>>().join("'_'");
                *counters
                    .texts
                    .borrow_mut()
                    .entry(shape.chars().take(90).collect())
                    .or_default() += 1;
                prop_assert!(!text.contains("internal error"), "internal error: {text}");
                prop_assert_eq!(&before, &after, "a rejected call ({}) changed a key", text);
            }
            _ => {
                counters.accepted.set(counters.accepted.get() + 1);
                if before != after {
                    counters.wrote.set(counters.wrote.get() + 1);
                }
                *counters
                    .by_command
                    .borrow_mut()
                    .entry(name.clone())
                    .or_default() += 1;
                let limiter = ["RL.TAKE", "RL.WINDOW", "RL.QUOTA"].contains(&name.as_str());
                if limiter {
                    let ints = resp_ints(&reply);
                    prop_assert!(
                        matches!(&ints, Some(v) if v.len() == 8 && (-1..=2).contains(&v[0])),
                        "{name} answered {reply:?}"
                    );
                }
                if name == "CL.THROTTLE" {
                    let ints = resp_ints(&reply);
                    prop_assert!(
                        matches!(&ints, Some(v) if v.len() == 5 && (0..=1).contains(&v[0])),
                        "CL.THROTTLE answered {reply:?}"
                    );
                }
            }
        }
        Ok(())
    });
    let calls = counters.calls.get();
    let errors = counters.errors.get();
    let alive = server.is_alive() && !log_shows_crash(&server);
    fig.record(
        "7. Hostile input at the protocol level",
        &format!(
            "proptest (seeded ChaCha) argument vectors of RL.TAKE, RL.WINDOW, RL.QUOTA, CL.THROTTLE, RL.LEASE ACQUIRE/RELEASE/RENEW/LIST, RL.BOX STATUS/TRIP/RELEASE, RL.APPLY and COMMAND GETKEYS of them: valid tokens, limits and limit+1, huge, negative, NaN, empty, binary; keys fresh per call, some pre-set (string, bucket, box, leases); bounded by {MAX_CASES} calls or {} s",
            BUDGET.as_secs()
        ),
        &format!(
            "{calls} calls ({} COMMAND GETKEYS), {errors} errors ({} distinct texts), {} accepted ({} of them wrote); internal errors 0, rejected calls that created or changed a key 0, crashes {}",
            counters.getkeys.get(),
            counters.texts.borrow().len(),
            counters.accepted.get(),
            counters.wrote.get(),
            if alive { 0 } else { 1 }
        ),
    );
    eprintln!("accepted by command: {:#?}", counters.by_command.borrow());
    eprintln!("error texts: {:#?}", counters.texts.borrow());
    if let Err(e) = result {
        panic!("fuzzer found a failure (minimal case): {e}");
    }
    assert!(alive, "the server crashed");
    assert!(calls > 1000 && errors > 0 && counters.accepted.get() > 0);
}
