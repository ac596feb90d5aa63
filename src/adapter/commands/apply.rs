//! `RL.APPLY key payload expiry [key payload expiry]...`: the replicated
//! effect of every RL write: each key's new value and its absolute expiry
//! (`expiry` is a time in ms, or `PERSIST` for a manual box). The form
//! `RL.APPLY key payload`, written by older builds and by AOF rewrites
//! (followed by their own `PEXPIREAT`), sets the value only. It is
//! internal: accepted only over the replication link or while an AOF is
//! being loaded, so no client can overwrite its own limiter state (and,
//! say, empty its penalty box).
//!
//! A payload is a whole record ([`codec`]) or a patch ([`patch`]: the
//! parts the master's call reached, the others kept from the key's own
//! record). A patch for a key that holds no RL record here (which cannot
//! happen while the replica follows the master) is applied onto an empty
//! record: the key gets the parts the patch carries. Every payload is
//! checked before any key is written; one that does not decode is refused
//! with an error and nothing is written.

use std::os::raw::c_int;

use arrayvec::ArrayVec;
use redis_module::raw;

use crate::adapter::args::{is, parse_integer, Cursor};
use crate::adapter::errors::{self, ArgError};
use crate::adapter::ffi::{context_flags, now_ms, reply_error, reply_simple, Arg, Ctx};
use crate::adapter::store::{apply_replicated, Access, ReplicatedExpiry, RlKey};
use crate::core::limits::MAX_BUCKETS;
use crate::core::record::Record;
use crate::core::{codec, patch};

/// One key of the command: positions of the key and its payload, and the
/// expiry.
type Applied = (usize, usize, ReplicatedExpiry);

/// Parse `key payload [expiry [key payload expiry]...]`.
fn parse<A: AsRef<[u8]>>(args: &[A]) -> Result<ArrayVec<Applied, MAX_BUCKETS>, ArgError> {
    let mut c = Cursor::new("rl.apply", args);
    let mut applied = ArrayVec::new();
    let key = c.key("key")?;
    let payload = c.key("payload")?;
    if !c.has_more() {
        applied.push((key, payload, ReplicatedExpiry::Unchanged));
        return Ok(applied);
    }
    applied.push((key, payload, expiry(&mut c)?));
    while c.has_more() {
        let key = c.key("key")?;
        let payload = c.key("payload")?;
        let entry = (key, payload, expiry(&mut c)?);
        applied
            .try_push(entry)
            .map_err(|_| ArgError::TooManyBuckets)?;
    }
    Ok(applied)
}

/// An expiry: an absolute time in ms, or `PERSIST`.
fn expiry<A: AsRef<[u8]>>(c: &mut Cursor<'_, A>) -> Result<ReplicatedExpiry, ArgError> {
    let word = c.word().ok_or(ArgError::Missing {
        command: "rl.apply",
        what: "expiry",
    })?;
    if is(word, "PERSIST") {
        return Ok(ReplicatedExpiry::Persist);
    }
    parse_integer(word)
        .and_then(|at| i64::try_from(at).ok())
        .map(ReplicatedExpiry::At)
        .ok_or(ArgError::Integer {
            what: "expiry",
            min: 0,
            max: i64::MAX as u64,
        })
}

/// A decoded payload of `RL.APPLY`.
enum Payload {
    /// A whole record.
    Whole(Record),
    /// The parts a call reached.
    Patch(patch::Patch),
}

/// Run `RL.APPLY`: every payload is checked before any key is written.
pub fn run(ctx: Ctx, args: &[Arg]) -> c_int {
    let trusted = raw::REDISMODULE_CTX_FLAGS_REPLICATED | raw::REDISMODULE_CTX_FLAGS_LOADING;
    if context_flags(ctx) & trusted == 0 {
        return reply_error(ctx, errors::INTERNAL_ONLY);
    }
    let applied = match parse(args) {
        Ok(applied) => applied,
        Err(e) => return reply_error(ctx, &e.to_string()),
    };
    let now = now_ms(ctx);
    let mut payloads: ArrayVec<Payload, MAX_BUCKETS> = ArrayVec::new();
    for &(_, payload, _) in &applied {
        let bytes = args[payload].as_ref();
        let decoded = if patch::is_patch(bytes) {
            patch::decode_patch(bytes, now).map(Payload::Patch)
        } else {
            codec::decode_loaded(bytes, now).map(Payload::Whole)
        };
        match decoded {
            Ok(payload) => payloads.push(payload),
            Err(_) => return reply_error(ctx, errors::BAD_PAYLOAD),
        }
    }
    for (&(key, _, expiry), payload) in applied.iter().zip(payloads) {
        let mut key = RlKey::open(ctx, args[key], Access::Write);
        let record = match payload {
            Payload::Whole(record) => record,
            Payload::Patch(patch) => {
                let base = match key.record_mut() {
                    Ok(Some(own)) => std::mem::take(own),
                    _ => Record::default(),
                };
                patch.apply_onto(base)
            }
        };
        apply_replicated(ctx, &mut key, record, expiry);
    }
    reply_simple(ctx, c"OK")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse_str(line: &str) -> Result<Vec<Applied>, ArgError> {
        let args: Vec<&str> = line.split_whitespace().collect();
        parse(&args).map(|a| a.to_vec())
    }

    #[test]
    fn forms() {
        assert_eq!(
            parse_str("RL.APPLY k p"),
            Ok(vec![(1, 2, ReplicatedExpiry::Unchanged)])
        );
        assert_eq!(
            parse_str("RL.APPLY k p 1700000000000"),
            Ok(vec![(1, 2, ReplicatedExpiry::At(1_700_000_000_000))])
        );
        assert_eq!(
            parse_str("RL.APPLY k p persist j q 5"),
            Ok(vec![
                (1, 2, ReplicatedExpiry::Persist),
                (4, 5, ReplicatedExpiry::At(5))
            ])
        );
        let many = format!("RL.APPLY{}", " k p 1".repeat(MAX_BUCKETS + 1));
        for bad in [
            "RL.APPLY k",
            "RL.APPLY k p -1",
            "RL.APPLY k p 9223372036854775808",
            "RL.APPLY k p 1 j",
            "RL.APPLY k p 1 j q",
            "RL.APPLY k p PXAT 10",
            "RL.APPLY k p EX",
            many.as_str(),
        ] {
            assert!(parse_str(bad).is_err(), "{bad}");
        }
    }
}
