//! Replication of a call's effects: the `RL.APPLY` command a write sends
//! to replicas and the AOF, and `DEL` of a key it deleted, each one
//! `RM_Replicate` call with the arguments the store built.

use std::ops::Range;
use std::os::raw::{c_char, c_longlong};

use arrayvec::ArrayVec;

use super::{api, Arg, Ctx, RStr};
use crate::core::limits::MAX_BUCKETS;

/// Replicate `RL.APPLY key payload expiry [key payload expiry]...` for the
/// `applied` keys (nothing when there are none); `expiry` is the absolute
/// ms time or `PERSIST`.
pub fn replicate_applied(ctx: Ctx, applied: &[(Arg, Range<usize>, Option<i64>)], payloads: &[u8]) {
    if let [(name, range, at)] = applied {
        // One key (the common call): the server builds the arguments from a
        // format, with no string of ours to create and free.
        let payload = payloads.get(range.clone()).unwrap_or_default();
        let (ptr, len) = (payload.as_ptr().cast::<c_char>(), payload.len());
        let replicate = api!(RedisModule_Replicate);
        // SAFETY: `ctx` is the context of the running command; each format
        // letter matches its argument: `s` the key name Redis passed to the
        // command, `b` a pointer and length of a live slice, `l` a long
        // long, `c` a NUL-terminated string; Redis copies them all.
        unsafe {
            match at {
                Some(at) => replicate(
                    ctx.ptr(),
                    c"RL.APPLY".as_ptr(),
                    c"sbl".as_ptr(),
                    name.0,
                    ptr,
                    len,
                    *at as c_longlong,
                ),
                None => replicate(
                    ctx.ptr(),
                    c"RL.APPLY".as_ptr(),
                    c"sbc".as_ptr(),
                    name.0,
                    ptr,
                    len,
                    c"PERSIST".as_ptr(),
                ),
            };
        }
        return;
    }
    if applied.is_empty() {
        return;
    }
    let create = api!(RedisModule_CreateString);
    let mut argv: ArrayVec<RStr, { 3 * MAX_BUCKETS }> = ArrayVec::new();
    let mut created: ArrayVec<RStr, { 2 * MAX_BUCKETS }> = ArrayVec::new();
    for (name, range, at) in applied {
        let payload = payloads.get(range.clone()).unwrap_or_default();
        let expiry = match at {
            // SAFETY: `ctx` is the context of the running command.
            Some(at) => unsafe { api!(RedisModule_CreateStringFromLongLong)(ctx.ptr(), *at) },
            // SAFETY: as above; `PERSIST` is 7 bytes.
            None => unsafe { create(ctx.ptr(), c"PERSIST".as_ptr(), 7) },
        };
        // SAFETY: `ctx` is the context of the running command; Redis copies
        // `payload.len()` bytes of a live slice.
        let payload =
            unsafe { create(ctx.ptr(), payload.as_ptr().cast::<c_char>(), payload.len()) };
        argv.push(name.0);
        argv.push(payload);
        argv.push(expiry);
        created.push(payload);
        created.push(expiry);
    }
    // SAFETY: `ctx` is the context of the running command; format `v` takes
    // a vector of `argv.len()` live strings (the key names Redis passed,
    // the strings made above), which Redis retains; then each string made
    // above is freed once, by its only owner, and not used again.
    unsafe {
        api!(RedisModule_Replicate)(
            ctx.ptr(),
            c"RL.APPLY".as_ptr(),
            c"v".as_ptr(),
            argv.as_mut_ptr(),
            argv.len(),
        );
        for s in created {
            api!(RedisModule_FreeString)(ctx.ptr(), s);
        }
    }
}

/// Replicate the deletion of `key`.
pub fn replicate_del(ctx: Ctx, key: Arg) {
    // SAFETY: `ctx` is the context of the running command, `key` a string
    // Redis passed to it; format `s` takes one string.
    unsafe { api!(RedisModule_Replicate)(ctx.ptr(), c"DEL".as_ptr(), c"s".as_ptr(), key.0) };
}
