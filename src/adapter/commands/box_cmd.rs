//! `RL.BOX STATUS key` · `RL.BOX TRIP key level duration` ·
//! `RL.BOX RELEASE key [FORGET]`: read, trip and lift a key's penalty box.
//! Registered as subcommands so that `STATUS` is read-only (it works on a
//! replica) while `TRIP` and `RELEASE` write.

use std::os::raw::c_int;

use crate::adapter::args::{is, Cursor};
use crate::adapter::errors::{self, ArgError};
use crate::adapter::ffi::{notify, now_ms, reply_error, reply_int, reply_ints, Arg, Ctx};
use crate::adapter::stats;
use crate::adapter::store::{commit, Access, RlKey};
use crate::core::limits::MAX_BOX_LEVEL;
use crate::core::penalty::Penalty;
use crate::core::time::Millis;

const NAME: &str = "rl.box";

/// A parsed `RL.BOX` call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BoxCommand {
    /// `STATUS key`.
    Status { key: usize },
    /// `TRIP key level duration` (duration in ms, 0 = manual).
    Trip {
        key: usize,
        level: u8,
        duration_ms: u64,
    },
    /// `RELEASE key [FORGET]`.
    Release { key: usize, forget: bool },
}

/// Parse any `RL.BOX` subcommand.
pub fn parse<A: AsRef<[u8]>>(args: &[A]) -> Result<BoxCommand, ArgError> {
    let mut c = Cursor::new(NAME, args);
    let sub = c.word().ok_or(ArgError::Missing {
        command: NAME,
        what: "subcommand",
    })?;
    let command = if is(sub, "STATUS") {
        BoxCommand::Status { key: c.key("key")? }
    } else if is(sub, "TRIP") {
        let key = c.key("key")?;
        let level = c.integer("level", 1, u64::from(MAX_BOX_LEVEL))?;
        let duration_ms = c.duration_ms("duration", true)?;
        BoxCommand::Trip {
            key,
            level: u8::try_from(level).unwrap_or(MAX_BOX_LEVEL),
            duration_ms,
        }
    } else if is(sub, "RELEASE") {
        let key = c.key("key")?;
        let forget = match c.word() {
            None => false,
            Some(word) if is(word, "FORGET") => true,
            Some(word) => return Err(ArgError::unknown_option(NAME, word)),
        };
        BoxCommand::Release { key, forget }
    } else {
        return Err(ArgError::UnknownSubcommand { command: NAME });
    };
    c.finish()?;
    Ok(command)
}

/// `[level, ttl_ms, offenses, strikes]` of a penalty state at `now`.
fn status_reply(ctx: Ctx, penalty: &Penalty, now: Millis) -> c_int {
    let (level, ttl) = penalty
        .active_box(now)
        .map_or((0, 0), |b| (i64::from(b.level), b.ttl_ms(now)));
    let offenses = i64::try_from(penalty.live_offenses(now)).unwrap_or(i64::MAX);
    let strikes = i64::try_from(penalty.live_strikes(now)).unwrap_or(i64::MAX);
    reply_ints(ctx, &[level, ttl, offenses, strikes])
}

/// Parse, then open the key: the shared start of every subcommand.
fn open(ctx: Ctx, args: &[Arg], access: Access) -> Result<(BoxCommand, RlKey), c_int> {
    let command = parse(args).map_err(|e| reply_error(ctx, &e.to_string()))?;
    let (BoxCommand::Status { key }
    | BoxCommand::Trip { key, .. }
    | BoxCommand::Release { key, .. }) = command;
    let key = RlKey::open(ctx, args[key], access);
    if key.record().is_err() {
        return Err(reply_error(ctx, errors::WRONGTYPE));
    }
    Ok((command, key))
}

/// Run `RL.BOX STATUS`: never creates the key.
pub fn status(ctx: Ctx, args: &[Arg]) -> c_int {
    let (_, key) = match open(ctx, args, Access::Read) {
        Ok(opened) => opened,
        Err(replied) => return replied,
    };
    let penalty = key
        .record()
        .ok()
        .flatten()
        .map(|r| r.penalty_or_default())
        .unwrap_or_default();
    status_reply(ctx, &penalty, now_ms(ctx))
}

/// Run `RL.BOX TRIP`.
pub fn trip(ctx: Ctx, args: &[Arg]) -> c_int {
    let (command, mut key) = match open(ctx, args, Access::Write) {
        Ok(opened) => opened,
        Err(replied) => return replied,
    };
    let BoxCommand::Trip {
        level, duration_ms, ..
    } = command
    else {
        return reply_error(
            ctx,
            &ArgError::UnknownSubcommand { command: NAME }.to_string(),
        );
    };
    let now = now_ms(ctx);
    let mut record = key.working_copy();
    let mut penalty = record.penalty_or_default();
    penalty.trip(level, duration_ms, now);
    record.set_penalty(penalty, now);
    commit(ctx, &mut key, record, now);
    notify(ctx, c"rl.boxed", key.name);
    stats::trip(level);
    stats::MANUAL_TRIPS.incr();
    status_reply(ctx, &penalty, now)
}

/// Run `RL.BOX RELEASE`: replies 1 when a box was lifted.
pub fn release(ctx: Ctx, args: &[Arg]) -> c_int {
    let (command, mut key) = match open(ctx, args, Access::Write) {
        Ok(opened) => opened,
        Err(replied) => return replied,
    };
    let BoxCommand::Release { forget, .. } = command else {
        return reply_error(
            ctx,
            &ArgError::UnknownSubcommand { command: NAME }.to_string(),
        );
    };
    let Some(record) = key.record().ok().flatten() else {
        return reply_int(ctx, 0);
    };
    let now = now_ms(ctx);
    let before = record.penalty_or_default();
    let mut penalty = before;
    let lifted = penalty.release(forget, now);
    if penalty != before {
        let mut record = record.clone();
        record.set_penalty(penalty, now);
        commit(ctx, &mut key, record, now);
        notify(ctx, c"rl.released", key.name);
    }
    if lifted {
        stats::RELEASES.incr();
    }
    reply_int(ctx, i64::from(lifted))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse_str(line: &str) -> Result<BoxCommand, ArgError> {
        let args: Vec<&str> = line.split_whitespace().collect();
        parse(&args)
    }

    #[test]
    fn subcommands() {
        assert_eq!(
            parse_str("RL.BOX status k"),
            Ok(BoxCommand::Status { key: 2 })
        );
        assert_eq!(
            parse_str("RL.BOX TRIP k 3 0"),
            Ok(BoxCommand::Trip {
                key: 2,
                level: 3,
                duration_ms: 0
            })
        );
        assert_eq!(
            parse_str("RL.BOX TRIP k 1 0.5"),
            Ok(BoxCommand::Trip {
                key: 2,
                level: 1,
                duration_ms: 500
            })
        );
        assert_eq!(
            parse_str("RL.BOX RELEASE k forget"),
            Ok(BoxCommand::Release {
                key: 2,
                forget: true
            })
        );
        assert_eq!(
            parse_str("RL.BOX RELEASE k"),
            Ok(BoxCommand::Release {
                key: 2,
                forget: false
            })
        );
    }

    #[test]
    fn bad_input() {
        for (line, expected) in [
            ("RL.BOX TRIP k 4 10", "level must be"),
            ("RL.BOX TRIP k 0 10", "level must be"),
            ("RL.BOX TRIP k 1 -1", "duration must be"),
            ("RL.BOX TRIP k 1", "missing duration"),
            ("RL.BOX STATUS k extra", "unexpected extra argument"),
            ("RL.BOX RELEASE k FORGOT", "unknown option"),
            ("RL.BOX PEEK k", "unknown subcommand"),
        ] {
            let err = parse_str(line).expect_err(line).to_string();
            assert!(
                err.starts_with("ERR ") && err.contains(expected),
                "{line}: {err}"
            );
        }
    }
}
