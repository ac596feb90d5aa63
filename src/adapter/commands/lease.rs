//! `RL.LEASE ACQUIRE key max ttl [ID lease-id]` · `RL.LEASE RELEASE key
//! lease-id` · `RL.LEASE RENEW key lease-id ttl` · `RL.LEASE LIST key`:
//! concurrency leases that a crashed worker cannot leak. Registered as
//! subcommands: `LIST` is read-only; `RELEASE` and `RENEW` are not
//! `deny-oom`, so a worker can always give its slot back.

use std::hash::BuildHasher;
use std::os::raw::c_int;

use crate::adapter::args::{is, Cursor};
use crate::adapter::errors::{self, ArgError};
use crate::adapter::ffi::{
    now_ms, reply_array, reply_bulk, reply_error, reply_int, reply_null, Arg, Ctx,
};
use crate::adapter::stats;
use crate::adapter::store::{commit_in_place, Access, RlKey};
use crate::core::lease::{format_id, Acquire, GeneratedId, Leases};
use crate::core::limits::{MAX_LEASES, MAX_LEASE_ID_LEN};
use crate::core::record::Record;
use crate::core::time::Millis;

const NAME: &str = "rl.lease";

/// A parsed `RL.LEASE` call; `key` and `id` are argument positions.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LeaseCommand {
    /// `ACQUIRE key max ttl [ID lease-id]`.
    Acquire {
        key: usize,
        max: u64,
        ttl_ms: u64,
        id: Option<usize>,
    },
    /// `RELEASE key lease-id`.
    Release { key: usize, id: usize },
    /// `RENEW key lease-id ttl`.
    Renew { key: usize, id: usize, ttl_ms: u64 },
    /// `LIST key`.
    List { key: usize },
}

impl LeaseCommand {
    fn key(&self) -> usize {
        match *self {
            LeaseCommand::Acquire { key, .. }
            | LeaseCommand::Release { key, .. }
            | LeaseCommand::Renew { key, .. }
            | LeaseCommand::List { key } => key,
        }
    }
}

/// Parse any `RL.LEASE` subcommand.
pub fn parse<A: AsRef<[u8]>>(args: &[A]) -> Result<LeaseCommand, ArgError> {
    let mut c = Cursor::new(NAME, args);
    let sub = c.word().ok_or(ArgError::Missing {
        command: NAME,
        what: "subcommand",
    })?;
    let command = if is(sub, "ACQUIRE") {
        let key = c.key("key")?;
        let max = c.integer("max", 1, MAX_LEASES)?;
        let ttl_ms = c.duration_ms("ttl", false)?;
        let id = match c.word() {
            None => None,
            Some(word) if is(word, "ID") => Some(lease_id(&mut c)?),
            Some(word) => return Err(ArgError::unknown_option(NAME, word)),
        };
        LeaseCommand::Acquire {
            key,
            max,
            ttl_ms,
            id,
        }
    } else if is(sub, "RELEASE") {
        let key = c.key("key")?;
        LeaseCommand::Release {
            key,
            id: lease_id(&mut c)?,
        }
    } else if is(sub, "RENEW") {
        let key = c.key("key")?;
        let id = lease_id(&mut c)?;
        LeaseCommand::Renew {
            key,
            id,
            ttl_ms: c.duration_ms("ttl", false)?,
        }
    } else if is(sub, "LIST") {
        LeaseCommand::List { key: c.key("key")? }
    } else {
        return Err(ArgError::UnknownSubcommand { command: NAME });
    };
    c.finish()?;
    Ok(command)
}

/// A lease id argument: 1 to [`MAX_LEASE_ID_LEN`] bytes.
fn lease_id<A: AsRef<[u8]>>(c: &mut Cursor<'_, A>) -> Result<usize, ArgError> {
    let pos = c.key("lease-id")?;
    let len = c.bytes_at(pos).len();
    if len == 0 || len > MAX_LEASE_ID_LEN {
        return Err(ArgError::LeaseId);
    }
    Ok(pos)
}

/// Parse the call and open its key; on error the reply is already sent.
fn open(ctx: Ctx, args: &[Arg], access: Access) -> Result<(LeaseCommand, RlKey), c_int> {
    let command = parse(args).map_err(|e| reply_error(ctx, &e.to_string()))?;
    let name = args
        .get(command.key())
        .copied()
        .ok_or_else(|| reply_error(ctx, errors::INTERNAL))?;
    let key = RlKey::open(ctx, name, access);
    if key.record().is_err() {
        return Err(reply_error(ctx, errors::WRONGTYPE));
    }
    Ok((command, key))
}

/// Run `change` on the key's leases where they live (a new empty set when
/// the key holds none and `create` is set; otherwise `None` without
/// running it). `change` returns its result and whether it changed the
/// set: then the call is committed (the leases it swept counted as
/// expired in `INFO`), otherwise nothing is written and nothing is left
/// behind. The core's lease operations change nothing when they fail.
fn with_leases<T>(
    ctx: Ctx,
    key: &mut RlKey,
    now: Millis,
    create: bool,
    change: impl FnOnce(&mut Leases) -> (T, bool),
) -> Option<T> {
    let has_leases = matches!(key.record(), Ok(Some(r)) if r.leases().is_some());
    if !has_leases && !create {
        return None;
    }
    let record = key.edit().ok()?;
    let leases = record.leases_or_insert();
    let expired = leases.expired(now);
    let (out, changed) = change(leases);
    if changed {
        stats::LEASES_EXPIRED.add(expired);
        commit_in_place(ctx, key, now);
    } else if !has_leases {
        // Leave no empty set behind (and no key this call created).
        record.set_leases(None);
        if key.is_new() {
            commit_in_place(ctx, key, now);
        }
    }
    Some(out)
}

/// A new opaque lease id: the time and 80 random bits from two
/// independently seeded hashers (std seeds them from the OS), never a
/// counter; drawn again in the unlikely case it is live on this key.
fn new_id(leases: &Leases, now: Millis) -> GeneratedId {
    let draw = |attempt: u64| {
        let words = [
            std::hash::RandomState::new().hash_one((now, attempt)),
            std::hash::RandomState::new().hash_one((attempt, now)),
        ];
        format_id(words, now)
    };
    let mut id = draw(0);
    for attempt in 1..4u64 {
        if !leases.is_live(id.as_bytes(), now) {
            break;
        }
        id = draw(attempt);
    }
    id
}

fn arg_bytes(args: &[Arg], pos: usize) -> &[u8] {
    args.get(pos).map_or(&[], |a| a.as_ref())
}

/// Run `RL.LEASE ACQUIRE`.
pub fn acquire(ctx: Ctx, args: &[Arg]) -> c_int {
    let (command, mut key) = match open(ctx, args, Access::Write) {
        Ok(opened) => opened,
        Err(replied) => return replied,
    };
    let LeaseCommand::Acquire {
        max, ttl_ms, id, ..
    } = command
    else {
        return reply_error(ctx, errors::INTERNAL);
    };
    let now = now_ms(ctx);
    let outcome = with_leases(ctx, &mut key, now, true, |leases| {
        let generated = id.is_none().then(|| new_id(leases, now));
        let id = generated
            .as_ref()
            .map_or_else(|| arg_bytes(args, id.unwrap_or_default()), |g| g.as_bytes());
        let outcome = leases.acquire(id, max, ttl_ms, now);
        let granted = !matches!(outcome, Acquire::Denied { .. });
        ((outcome, generated), granted)
    });
    let Some((outcome, generated)) = outcome else {
        return reply_error(ctx, errors::INTERNAL);
    };
    let id = match (&generated, id) {
        (Some(g), _) => g.as_bytes(),
        (None, Some(pos)) => arg_bytes(args, pos),
        (None, None) => &[],
    };
    let max_reply = i64::try_from(max).unwrap_or(i64::MAX);
    match outcome {
        Acquire::Granted { in_use } | Acquire::Refreshed { in_use } => {
            stats::LEASES_GRANTED.incr();
            reply_array(ctx, 5);
            reply_int(ctx, 1);
            reply_bulk(ctx, id);
            reply_int(ctx, i64::try_from(in_use).unwrap_or(i64::MAX));
            reply_int(ctx, max_reply);
            reply_int(ctx, 0)
        }
        Acquire::Denied {
            in_use,
            retry_after_ms,
        } => {
            stats::LEASES_DENIED.incr();
            reply_array(ctx, 5);
            reply_int(ctx, 0);
            reply_null(ctx);
            reply_int(ctx, i64::try_from(in_use).unwrap_or(i64::MAX));
            reply_int(ctx, max_reply);
            reply_int(ctx, retry_after_ms)
        }
    }
}

/// Run `RL.LEASE RELEASE`: 1 when a live lease was removed.
pub fn release(ctx: Ctx, args: &[Arg]) -> c_int {
    let (command, mut key) = match open(ctx, args, Access::Write) {
        Ok(opened) => opened,
        Err(replied) => return replied,
    };
    let LeaseCommand::Release { id, .. } = command else {
        return reply_error(ctx, errors::INTERNAL);
    };
    let now = now_ms(ctx);
    let released = with_leases(ctx, &mut key, now, false, |leases| {
        let released = leases.release(arg_bytes(args, id), now);
        (released, released)
    })
    .unwrap_or(false);
    if released {
        stats::LEASES_RELEASED.incr();
    }
    reply_int(ctx, i64::from(released))
}

/// Run `RL.LEASE RENEW`: 1 when the lease was live and now expires `ttl`
/// from now.
pub fn renew(ctx: Ctx, args: &[Arg]) -> c_int {
    let (command, mut key) = match open(ctx, args, Access::Write) {
        Ok(opened) => opened,
        Err(replied) => return replied,
    };
    let LeaseCommand::Renew { id, ttl_ms, .. } = command else {
        return reply_error(ctx, errors::INTERNAL);
    };
    let now = now_ms(ctx);
    let renewed = with_leases(ctx, &mut key, now, false, |leases| {
        let renewed = leases.renew(arg_bytes(args, id), ttl_ms, now);
        (renewed, renewed)
    })
    .unwrap_or(false);
    reply_int(ctx, i64::from(renewed))
}

/// Run `RL.LEASE LIST`: `[lease-id, ms_left]` pairs of the live leases.
pub fn list(ctx: Ctx, args: &[Arg]) -> c_int {
    let (_, key) = match open(ctx, args, Access::Read) {
        Ok(opened) => opened,
        Err(replied) => return replied,
    };
    let now = now_ms(ctx);
    let leases = key.record().ok().flatten().and_then(Record::leases);
    let live: Vec<(&[u8], i64)> = leases.into_iter().flat_map(|l| l.list(now)).collect();
    reply_array(ctx, live.len());
    for (id, ms_left) in live {
        reply_array(ctx, 2);
        reply_bulk(ctx, id);
        reply_int(ctx, ms_left);
    }
    0
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse_str(line: &str) -> Result<LeaseCommand, ArgError> {
        let args: Vec<&str> = line.split_whitespace().collect();
        parse(&args)
    }

    #[test]
    fn subcommands() {
        assert_eq!(
            parse_str("RL.LEASE acquire k 2 30"),
            Ok(LeaseCommand::Acquire {
                key: 2,
                max: 2,
                ttl_ms: 30_000,
                id: None
            })
        );
        assert_eq!(
            parse_str("RL.LEASE ACQUIRE k 1 0.5 id job-7"),
            Ok(LeaseCommand::Acquire {
                key: 2,
                max: 1,
                ttl_ms: 500,
                id: Some(6)
            })
        );
        assert_eq!(
            parse_str("RL.LEASE RELEASE k x"),
            Ok(LeaseCommand::Release { key: 2, id: 3 })
        );
        assert_eq!(
            parse_str("RL.LEASE RENEW k x 60"),
            Ok(LeaseCommand::Renew {
                key: 2,
                id: 3,
                ttl_ms: 60_000
            })
        );
        assert_eq!(
            parse_str("RL.LEASE LIST k"),
            Ok(LeaseCommand::List { key: 2 })
        );
    }

    #[test]
    fn bad_input() {
        let long_id = format!("RL.LEASE RELEASE k {}", "x".repeat(MAX_LEASE_ID_LEN + 1));
        for (line, expected) in [
            ("RL.LEASE ACQUIRE k 0 10", "max must be"),
            ("RL.LEASE ACQUIRE k 10001 10", "max must be"),
            ("RL.LEASE ACQUIRE k 1 0", "ttl must be"),
            ("RL.LEASE ACQUIRE k 1", "missing ttl"),
            ("RL.LEASE ACQUIRE k 1 10 ID", "missing lease-id"),
            ("RL.LEASE ACQUIRE k 1 10 NAME x", "unknown option 'NAME'"),
            ("RL.LEASE RENEW k x", "missing ttl"),
            ("RL.LEASE LIST k extra", "unexpected extra argument"),
            ("RL.LEASE STEAL k", "unknown subcommand"),
            (long_id.as_str(), "lease-id must be"),
        ] {
            let err = parse_str(line).expect_err(line).to_string();
            assert!(
                err.starts_with("ERR ") && err.contains(expected),
                "{line}: {err}"
            );
        }
    }
}
