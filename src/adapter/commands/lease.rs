//! `RL.LEASE ACQUIRE key max ttl [ID lease-id]` · `RL.LEASE RELEASE key
//! lease-id` · `RL.LEASE RENEW key lease-id ttl` · `RL.LEASE LIST key`:
//! concurrency leases that a crashed worker cannot leak. Registered as
//! subcommands, each with its own entry and parser: `LIST` is read-only; `RELEASE` and `RENEW` are not
//! `deny-oom`, so a worker can always give its slot back.

use std::hash::BuildHasher;
use std::os::raw::c_int;

use crate::adapter::args::{is, Cursor};
use crate::adapter::errors::{self, ArgError};
use crate::adapter::ffi::{reply_array, reply_bulk, reply_error, reply_int, reply_null, Arg, Ctx};
use crate::adapter::stats;
use crate::adapter::store::{Access, Call};
use crate::core::lease::{format_id, Acquire, GeneratedId, Leases};
use crate::core::limits::{MAX_LEASES, MAX_LEASE_ID_LEN};
use crate::core::record::Record;
use crate::core::take::KeySet;
use crate::core::time::Millis;

const NAME: &str = "rl.lease";

/// The key is argument 2 of every subcommand.
const KEY: usize = 2;

/// `ACQUIRE key max ttl [ID lease-id]`; `id` is an argument position.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AcquireArgs {
    /// Most leases at once.
    pub max: u64,
    /// The lease's time to live, in ms.
    pub ttl_ms: u64,
    /// The caller's own lease id, if given.
    pub id: Option<usize>,
}

/// Parse `ACQUIRE key max ttl [ID lease-id]`.
pub fn parse_acquire<A: AsRef<[u8]>>(args: &[A]) -> Result<AcquireArgs, ArgError> {
    let mut c = Cursor::after_subcommand(NAME, args);
    c.key("key")?;
    let max = c.integer("max", 1, MAX_LEASES)?;
    let ttl_ms = c.duration_ms("ttl", false)?;
    let id = match c.word() {
        None => None,
        Some(word) if is(word, "ID") => Some(lease_id(&mut c)?),
        Some(word) => return Err(ArgError::unknown_option(NAME, word)),
    };
    c.finish()?;
    Ok(AcquireArgs { max, ttl_ms, id })
}

/// Parse `RELEASE key lease-id`: the id's position.
pub fn parse_release<A: AsRef<[u8]>>(args: &[A]) -> Result<usize, ArgError> {
    let mut c = Cursor::after_subcommand(NAME, args);
    c.key("key")?;
    let id = lease_id(&mut c)?;
    c.finish()?;
    Ok(id)
}

/// Parse `RENEW key lease-id ttl`: the id's position and the ttl in ms.
pub fn parse_renew<A: AsRef<[u8]>>(args: &[A]) -> Result<(usize, u64), ArgError> {
    let mut c = Cursor::after_subcommand(NAME, args);
    c.key("key")?;
    let id = lease_id(&mut c)?;
    let ttl_ms = c.duration_ms("ttl", false)?;
    c.finish()?;
    Ok((id, ttl_ms))
}

/// Parse `LIST key`.
pub fn parse_list<A: AsRef<[u8]>>(args: &[A]) -> Result<(), ArgError> {
    let mut c = Cursor::after_subcommand(NAME, args);
    c.key("key")?;
    c.finish()
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

/// Parse the call with `parse` and open its key in `call`; on error the
/// reply is already sent.
fn open<T>(
    call: &mut Call,
    args: &[Arg],
    access: Access,
    parse: impl FnOnce(&[Arg]) -> Result<T, ArgError>,
) -> Result<T, c_int> {
    let parsed = parse(args).map_err(|e| reply_error(call.ctx(), &e.to_string()))?;
    call.open(args, &[KEY], access, false)?;
    Ok(parsed)
}

/// Run `change` on the key's leases where they live (a new empty set when
/// the key holds none and `create` is set; otherwise `None` without
/// running it). `change` returns its result and whether it changed the
/// set: then the call is committed (the leases it swept counted as
/// expired in `INFO`), otherwise nothing is written and nothing is left
/// behind. The core's lease operations change nothing when they fail.
fn with_leases<T>(
    call: &mut Call,
    create: bool,
    change: impl FnOnce(&mut Leases) -> (T, bool),
) -> Option<T> {
    let now = call.now();
    let has_leases = call.record(0).is_some_and(|r| r.leases().is_some());
    if !has_leases && !create {
        return None;
    }
    let is_new = call.record(0).is_none();
    let record = call.edit(0)?;
    let leases = record.leases_or_insert();
    let expired = leases.expired(now);
    let (out, changed) = change(leases);
    if changed {
        stats::LEASES_EXPIRED.add(expired);
        call.commit(KeySet::first(1), None);
    } else if !has_leases {
        // Leave no empty set behind (and no key this call created).
        record.set_part::<Box<Leases>>(None);
        if is_new {
            call.commit(KeySet::first(1), None);
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
    let mut call = Call::new(ctx);
    let AcquireArgs { max, ttl_ms, id } = match open(&mut call, args, Access::Write, parse_acquire)
    {
        Ok(parsed) => parsed,
        Err(replied) => return replied,
    };
    let now = call.now();
    let outcome = with_leases(&mut call, true, |leases| {
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
    let mut call = Call::new(ctx);
    let id = match open(&mut call, args, Access::Write, parse_release) {
        Ok(opened) => opened,
        Err(replied) => return replied,
    };
    let now = call.now();
    let released = with_leases(&mut call, false, |leases| {
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
    let mut call = Call::new(ctx);
    let (id, ttl_ms) = match open(&mut call, args, Access::Write, parse_renew) {
        Ok(opened) => opened,
        Err(replied) => return replied,
    };
    let now = call.now();
    let renewed = with_leases(&mut call, false, |leases| {
        let renewed = leases.renew(arg_bytes(args, id), ttl_ms, now);
        (renewed, renewed)
    })
    .unwrap_or(false);
    reply_int(ctx, i64::from(renewed))
}

/// Run `RL.LEASE LIST`: `[lease-id, ms_left]` pairs of the live leases.
pub fn list(ctx: Ctx, args: &[Arg]) -> c_int {
    let mut call = Call::new(ctx);
    if let Err(replied) = open(&mut call, args, Access::Read, parse_list) {
        return replied;
    }
    let now = call.now();
    let leases = call.record(0).and_then(Record::leases);
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

    fn args(line: &str) -> Vec<&str> {
        line.split_whitespace().collect()
    }

    #[test]
    fn subcommands() {
        assert_eq!(
            parse_acquire(&args("RL.LEASE acquire k 2 30")),
            Ok(AcquireArgs {
                max: 2,
                ttl_ms: 30_000,
                id: None
            })
        );
        assert_eq!(
            parse_acquire(&args("RL.LEASE ACQUIRE k 1 0.5 id job-7")),
            Ok(AcquireArgs {
                max: 1,
                ttl_ms: 500,
                id: Some(6)
            })
        );
        assert_eq!(parse_release(&args("RL.LEASE RELEASE k x")), Ok(3));
        assert_eq!(parse_renew(&args("RL.LEASE RENEW k x 60")), Ok((3, 60_000)));
        assert_eq!(parse_list(&args("RL.LEASE LIST k")), Ok(()));
    }

    #[test]
    fn bad_input() {
        let long_id = format!("RL.LEASE RELEASE k {}", "x".repeat(MAX_LEASE_ID_LEN + 1));
        type Parse = fn(&str) -> Result<(), ArgError>;
        let acquire: Parse = |line| parse_acquire(&args(line)).map(|_| ());
        let release: Parse = |line| parse_release(&args(line)).map(|_| ());
        let renew: Parse = |line| parse_renew(&args(line)).map(|_| ());
        let list: Parse = |line| parse_list(&args(line));
        let cases: [(Parse, &str, &str); 9] = [
            (acquire, "RL.LEASE ACQUIRE k 0 10", "max must be"),
            (acquire, "RL.LEASE ACQUIRE k 10001 10", "max must be"),
            (acquire, "RL.LEASE ACQUIRE k 1 0", "ttl must be"),
            (acquire, "RL.LEASE ACQUIRE k 1", "missing ttl"),
            (acquire, "RL.LEASE ACQUIRE k 1 10 ID", "missing lease-id"),
            (
                acquire,
                "RL.LEASE ACQUIRE k 1 10 NAME x",
                "unknown option 'NAME'",
            ),
            (renew, "RL.LEASE RENEW k x", "missing ttl"),
            (list, "RL.LEASE LIST k extra", "unexpected extra argument"),
            (release, long_id.as_str(), "lease-id must be"),
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
