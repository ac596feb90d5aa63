//! `RL.BOX STATUS key` · `RL.BOX TRIP key level duration` ·
//! `RL.BOX RELEASE key [FORGET]`: read, trip and lift a key's penalty box.
//! Registered as subcommands, each with its own entry and parser, so that
//! `STATUS` is read-only (it works on a replica) while `TRIP` and
//! `RELEASE` write.

use std::os::raw::c_int;

use crate::adapter::args::{is, Cursor};
use crate::adapter::errors::ArgError;
use crate::adapter::ffi::{reply_error, reply_int, reply_ints, Arg, Ctx};
use crate::adapter::stats;
use crate::adapter::store::{Access, Call, Event};
use crate::core::limits::MAX_BOX_LEVEL;
use crate::core::penalty::Penalty;
use crate::core::record::Record;
use crate::core::take::KeySet;
use crate::core::time::Millis;

const NAME: &str = "rl.box";

/// The subcommand's arguments: a cursor after `RL.BOX <subcommand>`.
fn cursor<A: AsRef<[u8]>>(args: &[A]) -> Cursor<'_, A> {
    Cursor::after_subcommand(NAME, args)
}

/// `TRIP key level duration` (duration in ms, 0 = manual).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Trip {
    /// Box level, 1 to 3.
    pub level: u8,
    /// How long, in ms; 0 for a manual box.
    pub duration_ms: u64,
}

/// Parse `STATUS key` (the key is argument 2).
pub fn parse_status<A: AsRef<[u8]>>(args: &[A]) -> Result<(), ArgError> {
    let mut c = cursor(args);
    c.key("key")?;
    c.finish()
}

/// Parse `TRIP key level duration`.
pub fn parse_trip<A: AsRef<[u8]>>(args: &[A]) -> Result<Trip, ArgError> {
    let mut c = cursor(args);
    c.key("key")?;
    let level = c.integer("level", 1, u64::from(MAX_BOX_LEVEL))?;
    let duration_ms = c.duration_ms("duration", true)?;
    c.finish()?;
    Ok(Trip {
        level: u8::try_from(level).unwrap_or(MAX_BOX_LEVEL),
        duration_ms,
    })
}

/// Parse `RELEASE key [FORGET]`: whether to forget.
pub fn parse_release<A: AsRef<[u8]>>(args: &[A]) -> Result<bool, ArgError> {
    let mut c = cursor(args);
    c.key("key")?;
    let forget = match c.word() {
        None => false,
        Some(word) if is(word, "FORGET") => true,
        Some(word) => return Err(ArgError::unknown_option(NAME, word)),
    };
    c.finish()?;
    Ok(forget)
}

/// The key is argument 2 of every subcommand.
const KEY: usize = 2;

/// `[level, ttl_ms, offenses, strikes]` of a penalty state at `now`.
fn status_reply(ctx: Ctx, penalty: &Penalty, now: Millis) -> c_int {
    let (level, ttl) = penalty
        .active_box(now)
        .map_or((0, 0), |b| (i64::from(b.level), b.ttl_ms(now)));
    let offenses = i64::try_from(penalty.live_offenses(now)).unwrap_or(i64::MAX);
    let strikes = i64::try_from(penalty.live_strikes(now)).unwrap_or(i64::MAX);
    reply_ints(ctx, &[level, ttl, offenses, strikes])
}

/// Run `RL.BOX STATUS`: never creates the key.
pub fn status(ctx: Ctx, args: &[Arg]) -> c_int {
    if let Err(e) = parse_status(args) {
        return reply_error(ctx, &e.to_string());
    }
    let mut call = Call::new(ctx);
    if let Err(replied) = call.open(args, &[KEY], Access::Read, false) {
        return replied;
    }
    let penalty = call
        .record(0)
        .map(Record::penalty_or_default)
        .unwrap_or_default();
    status_reply(ctx, &penalty, call.now())
}

/// Run `RL.BOX TRIP`.
pub fn trip(ctx: Ctx, args: &[Arg]) -> c_int {
    let trip = match parse_trip(args) {
        Ok(trip) => trip,
        Err(e) => return reply_error(ctx, &e.to_string()),
    };
    let mut call = Call::new(ctx);
    if let Err(replied) = call.open(args, &[KEY], Access::Write, false) {
        return replied;
    }
    let now = call.now();
    let Some(record) = call.edit(0) else {
        return reply_error(ctx, crate::adapter::errors::INTERNAL);
    };
    let mut penalty = record.penalty_or_default();
    penalty.trip(trip.level, trip.duration_ms, now);
    record.set_penalty(penalty, now);
    call.commit(KeySet::first(1), Some(Event::Boxed { level: trip.level }));
    stats::MANUAL_TRIPS.incr();
    status_reply(ctx, &penalty, now)
}

/// Run `RL.BOX RELEASE`: replies 1 when a box was lifted.
pub fn release(ctx: Ctx, args: &[Arg]) -> c_int {
    let forget = match parse_release(args) {
        Ok(forget) => forget,
        Err(e) => return reply_error(ctx, &e.to_string()),
    };
    let mut call = Call::new(ctx);
    if let Err(replied) = call.open(args, &[KEY], Access::Write, false) {
        return replied;
    }
    let now = call.now();
    let Some(before) = call.record(0).map(Record::penalty_or_default) else {
        return reply_int(ctx, 0);
    };
    let mut penalty = before;
    let lifted = penalty.release(forget, now);
    if penalty != before {
        if let Some(record) = call.edit(0) {
            record.set_penalty(penalty, now);
        }
        call.commit(KeySet::first(1), Some(Event::Released));
    }
    if lifted {
        stats::RELEASES.incr();
    }
    reply_int(ctx, i64::from(lifted))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(line: &str) -> Vec<&str> {
        line.split_whitespace().collect()
    }

    #[test]
    fn subcommands() {
        assert_eq!(parse_status(&args("RL.BOX status k")), Ok(()));
        assert_eq!(
            parse_trip(&args("RL.BOX TRIP k 3 0")),
            Ok(Trip {
                level: 3,
                duration_ms: 0
            })
        );
        assert_eq!(
            parse_trip(&args("RL.BOX TRIP k 1 0.5")),
            Ok(Trip {
                level: 1,
                duration_ms: 500
            })
        );
        assert_eq!(parse_release(&args("RL.BOX RELEASE k forget")), Ok(true));
        assert_eq!(parse_release(&args("RL.BOX RELEASE k")), Ok(false));
    }

    #[test]
    fn bad_input() {
        type Parse = fn(&str) -> Result<(), ArgError>;
        let trip: Parse = |line| parse_trip(&args(line)).map(|_| ());
        let status: Parse = |line| parse_status(&args(line));
        let release: Parse = |line| parse_release(&args(line)).map(|_| ());
        let cases: [(Parse, &str, &str); 7] = [
            (trip, "RL.BOX TRIP k 4 10", "level must be"),
            (trip, "RL.BOX TRIP k 0 10", "level must be"),
            (trip, "RL.BOX TRIP k 1 -1", "duration must be"),
            (trip, "RL.BOX TRIP k 1", "missing duration"),
            (status, "RL.BOX STATUS k extra", "unexpected extra argument"),
            (release, "RL.BOX RELEASE k FORGOT", "unknown option"),
            (status, "RL.BOX STATUS", "missing key"),
        ];
        for (parse, line, expected) in cases {
            let err = parse(line).expect_err(line).to_string();
            assert!(
                err.starts_with("ERR ") && err.contains(expected),
                "{line}: {err}"
            );
        }
    }
}
