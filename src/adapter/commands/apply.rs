//! `RL.APPLY key payload [PXAT ms | PERSIST]`: the replicated effect of
//! every RL write: the key's new value and its absolute expiry (or none,
//! for a manual box). The form without `PXAT`/`PERSIST`, written by older
//! builds and by AOF rewrites (followed by their own `PEXPIREAT`), sets the
//! value only. It is internal: accepted only over the replication link or
//! while an AOF is being loaded, so no client can overwrite its own limiter
//! state (and, say, empty its penalty box).

use std::os::raw::c_int;

use redis_module::raw;

use crate::adapter::args::{is, Cursor};
use crate::adapter::errors::{self, ArgError};
use crate::adapter::ffi::{context_flags, reply_error, reply_simple, Arg, Ctx};
use crate::adapter::store::{apply_replicated, Access, ReplicatedExpiry, RlKey};

/// The largest `PXAT`: the latest time a signed ms clock holds.
const MAX_AT: u64 = i64::MAX as u64;

/// Parse `key payload [PXAT ms | PERSIST]`: the positions of the key and
/// the payload, and the expiry.
fn parse<A: AsRef<[u8]>>(args: &[A]) -> Result<(usize, usize, ReplicatedExpiry), ArgError> {
    let mut c = Cursor::new("rl.apply", args);
    let key = c.key("key")?;
    let payload = c.key("payload")?;
    let expiry = match c.word() {
        None => ReplicatedExpiry::Unchanged,
        Some(w) if is(w, "PXAT") => {
            let at = c.integer("PXAT", 0, MAX_AT)?;
            ReplicatedExpiry::At(i64::try_from(at).unwrap_or(i64::MAX))
        }
        Some(w) if is(w, "PERSIST") => ReplicatedExpiry::Persist,
        Some(w) => return Err(ArgError::unknown_option(c.command(), w)),
    };
    c.finish()?;
    Ok((key, payload, expiry))
}

/// Run `RL.APPLY`.
pub fn run(ctx: Ctx, args: &[Arg]) -> c_int {
    let trusted = raw::REDISMODULE_CTX_FLAGS_REPLICATED | raw::REDISMODULE_CTX_FLAGS_LOADING;
    if context_flags(ctx) & trusted == 0 {
        return reply_error(ctx, errors::INTERNAL_ONLY);
    }
    let (key, payload, expiry) = match parse(args) {
        Ok(parsed) => parsed,
        Err(e) => return reply_error(ctx, &e.to_string()),
    };
    let mut key = RlKey::open(ctx, args[key], Access::Write);
    match apply_replicated(ctx, &mut key, args[payload].as_ref(), expiry) {
        Ok(()) => reply_simple(ctx, c"OK"),
        Err(_) => reply_error(ctx, errors::BAD_PAYLOAD),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse_str(line: &str) -> Result<ReplicatedExpiry, ArgError> {
        let args: Vec<&str> = line.split_whitespace().collect();
        parse(&args).map(|(_, _, e)| e)
    }

    #[test]
    fn forms() {
        assert_eq!(parse_str("RL.APPLY k p"), Ok(ReplicatedExpiry::Unchanged));
        assert_eq!(
            parse_str("RL.APPLY k p PXAT 1700000000000"),
            Ok(ReplicatedExpiry::At(1_700_000_000_000))
        );
        assert_eq!(
            parse_str("RL.APPLY k p persist"),
            Ok(ReplicatedExpiry::Persist)
        );
        for bad in [
            "RL.APPLY k",
            "RL.APPLY k p PXAT",
            "RL.APPLY k p PXAT -1",
            "RL.APPLY k p PXAT 9223372036854775808",
            "RL.APPLY k p PERSIST extra",
            "RL.APPLY k p EX 10",
        ] {
            assert!(parse_str(bad).is_err(), "{bad}");
        }
    }
}
