//! `RL.APPLY key payload`: the replicated effect of every RL write. It is
//! internal: accepted only over the replication link or while an AOF is
//! being loaded, so no client can overwrite its own limiter state (and,
//! say, empty its penalty box).

use std::os::raw::c_int;

use redis_module::raw;

use crate::adapter::args::Cursor;
use crate::adapter::errors;
use crate::adapter::ffi::{context_flags, reply_error, reply_simple, Arg, Ctx};
use crate::adapter::store::{apply_replicated, Access, RlKey};

/// Run `RL.APPLY`.
pub fn run(ctx: Ctx, args: &[Arg]) -> c_int {
    let trusted = raw::REDISMODULE_CTX_FLAGS_REPLICATED | raw::REDISMODULE_CTX_FLAGS_LOADING;
    if context_flags(ctx) & trusted == 0 {
        return reply_error(ctx, errors::INTERNAL_ONLY);
    }
    let mut c = Cursor::new("rl.apply", args);
    let parsed = c
        .key("key")
        .and_then(|key| Ok((key, c.key("payload")?)))
        .and_then(|kp| c.finish().map(|_| kp));
    let (key, payload) = match parsed {
        Ok(positions) => positions,
        Err(e) => return reply_error(ctx, &e.to_string()),
    };
    let mut key = RlKey::open(ctx, args[key], Access::Write);
    match apply_replicated(ctx, &mut key, args[payload].as_ref()) {
        Ok(()) => reply_simple(ctx, c"OK"),
        Err(_) => reply_error(ctx, errors::BAD_PAYLOAD),
    }
}
