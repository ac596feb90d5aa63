//! `RL.DISTINCT key member limit window [PEEK] [TRIP level duration]`:
//! how many distinct members `key` has seen in the last `window` seconds
//! (see [`crate::core::distinct`]). Status 1 up to `limit`, 0 above; with
//! `TRIP` a count above the limit trips the key's box and answers -1.
//! `PEEK` counts without recording and never trips.

use std::os::raw::c_int;

use crate::adapter::args::{is, set_once, Cursor};
use crate::adapter::errors::ArgError;
use crate::adapter::ffi::{reply_error, Arg, Ctx};
use crate::adapter::reply::reply_decision;
use crate::adapter::stats;
use crate::adapter::store::{Access, Call, Event};
use crate::core::decision::Status;
use crate::core::distinct::{
    decide, member_hash, Distinct, DistinctCall, DistinctEffects, DistinctState, TripOnOver,
};
use crate::core::limits::{MAX_BOX_LEVEL, MAX_DISTINCT_LIMIT};
use crate::core::penalty::Penalty;
use crate::core::record::{Holds, Record};
use crate::core::take::KeySet;

const NAME: &str = "rl.distinct";

/// The key is argument 1.
const KEY: usize = 1;

/// Parse an `RL.DISTINCT` call (the member hashed).
pub fn parse<A: AsRef<[u8]>>(args: &[A]) -> Result<DistinctCall, ArgError> {
    let mut c = Cursor::new(NAME, args);
    c.key("key")?;
    let member_at = c.key("member")?;
    let member = member_hash(c.bytes_at(member_at));
    let limit = c.integer("limit", 1, MAX_DISTINCT_LIMIT)?;
    let window_ms = c.duration_ms("window", false)?;
    let mut peek = None;
    let mut trip = None;
    while let Some(word) = c.word() {
        if is(word, "PEEK") {
            set_once(&mut peek, "PEEK", ())?;
        } else if is(word, "TRIP") {
            let level = c.integer("TRIP level", 1, u64::from(MAX_BOX_LEVEL))?;
            let duration_ms = c.duration_ms("TRIP duration", true)?;
            let level = u8::try_from(level).unwrap_or(MAX_BOX_LEVEL);
            set_once(&mut trip, "TRIP", TripOnOver { level, duration_ms })?;
        } else {
            return Err(ArgError::unknown_option(NAME, word));
        }
    }
    c.finish()?;
    Ok(DistinctCall {
        distinct: Distinct { limit, window_ms },
        member,
        peek: peek.is_some(),
        trip,
    })
}

/// Run `RL.DISTINCT`: decide on the key's members where its record keeps
/// them, commit what changed (a key's set, once replicated whole, then
/// replicates each call's member and the members it trimmed), and count
/// the outcome.
pub fn run(ctx: Ctx, args: &[Arg]) -> c_int {
    let call_args = match parse(args) {
        Ok(parsed) => parsed,
        Err(e) => return reply_error(ctx, &e.to_string()),
    };
    let access = if call_args.peek {
        Access::Read
    } else {
        Access::Write
    };
    let mut call = Call::new(ctx);
    if let Err(replied) = call.open(args, &[KEY], access, false) {
        return replied;
    }
    let now = call.now();
    let mut penalty = call
        .record(0)
        .map(Record::penalty_or_default)
        .unwrap_or_default();
    let mut fresh: Option<Box<DistinctState>> = None;
    let (decision, effects) = {
        let slot = match call.keys_mut().first_mut().map(|k| k.record_mut()) {
            Some(Ok(Some(record))) => {
                Holds::<Box<DistinctState>>::slot(record).unwrap_or(&mut fresh)
            }
            _ => &mut fresh,
        };
        decide(slot, &mut penalty, &call_args, now)
    };
    commit(&mut call, effects, fresh, penalty);
    stats::DISTINCT.calls.incr();
    // A call that trips was over the limit too.
    if effects.tripped.is_some() {
        stats::DISTINCT.trips.incr();
    }
    match (decision.status, effects.tripped) {
        (Status::Allowed, _) => stats::DISTINCT.allowed.incr(),
        (Status::Throttled, _) | (_, Some(_)) => stats::DISTINCT.over.incr(),
        _ => {}
    }
    reply_decision(ctx, &decision)
}

/// Write what the call changed: the members decided on a fresh copy, the
/// tripped penalty; then commit the key, announcing a trip.
fn commit(
    call: &mut Call,
    effects: DistinctEffects,
    fresh: Option<Box<DistinctState>>,
    penalty: Penalty,
) {
    if !effects.state && effects.tripped.is_none() {
        return;
    }
    let now = call.now();
    let Some(record) = call.edit(0) else {
        return;
    };
    if let Some(state) = fresh {
        record.set_part(Some(state));
    }
    if effects.tripped.is_some() {
        record.set_penalty(penalty, now);
    }
    let event = effects.tripped.map(|active| Event::Boxed {
        level: active.level,
    });
    call.commit(KeySet::first(1), event);
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse_str(line: &str) -> Result<DistinctCall, ArgError> {
        let args: Vec<&str> = line.split_whitespace().collect();
        parse(&args)
    }

    #[test]
    fn syntax() {
        let c = parse_str("RL.DISTINCT ip:1 alice 50 600").expect("valid");
        assert_eq!(
            c.distinct,
            Distinct {
                limit: 50,
                window_ms: 600_000
            }
        );
        assert_eq!(
            (c.member, c.peek, c.trip),
            (member_hash(b"alice"), false, None)
        );
        let c = parse_str("RL.DISTINCT ip:1 alice 50 0.5 trip 3 0 peek").expect("valid");
        assert_eq!(
            c.trip,
            Some(TripOnOver {
                level: 3,
                duration_ms: 0
            })
        );
        assert!(c.peek);
        assert_eq!(c.distinct.window_ms, 500);
    }

    #[test]
    fn bad_input() {
        for (line, expected) in [
            ("RL.DISTINCT k", "missing member"),
            ("RL.DISTINCT k m", "missing limit"),
            ("RL.DISTINCT k m 10", "missing window"),
            ("RL.DISTINCT k m 0 10", "limit must be"),
            ("RL.DISTINCT k m 10001 10", "limit must be"),
            ("RL.DISTINCT k m -1 10", "limit must be"),
            ("RL.DISTINCT k m 10 0", "window must be"),
            ("RL.DISTINCT k m 10 nan", "window must be"),
            ("RL.DISTINCT k m 10 10 TRIP", "missing TRIP level"),
            ("RL.DISTINCT k m 10 10 TRIP 4 10", "TRIP level must be"),
            ("RL.DISTINCT k m 10 10 TRIP 0 10", "TRIP level must be"),
            ("RL.DISTINCT k m 10 10 TRIP 1", "missing TRIP duration"),
            ("RL.DISTINCT k m 10 10 TRIP 1 -1", "TRIP duration must be"),
            (
                "RL.DISTINCT k m 10 10 PEEK PEEK",
                "PEEK is given more than once",
            ),
            (
                "RL.DISTINCT k m 10 10 TRIP 1 1 TRIP 1 1",
                "TRIP is given more",
            ),
            ("RL.DISTINCT k m 10 10 COST 1", "unknown option"),
        ] {
            let err = parse_str(line).expect_err(line).to_string();
            assert!(
                err.starts_with("ERR ") && err.contains(expected),
                "{line}: {err}"
            );
        }
    }
}
