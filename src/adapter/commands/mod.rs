//! The commands, one file each, and their registration with Redis.
//!
//! Commands are registered with `RedisModule_CreateCommand` and
//! `RedisModule_CreateSubcommand` (both in Redis 7.0), not with the
//! `#[command]` macro, whose key-spec API needs Redis 7.2. `RL.TAKE` has
//! keys at positions that depend on its options, so it uses the getkeys
//! API: Redis asks the same parser which arguments are keys.

pub mod apply;
pub mod box_cmd;
pub mod lease;
pub mod limiter_call;
pub mod quota;
pub mod take;
pub mod throttle;
pub mod window;

use std::ffi::CStr;
use std::os::raw::c_int;

use redis_module::raw;

use super::errors;
use super::ffi::{api, args, guard, reply_error, Arg, Ctx, RStr};

/// The body of a command: the context and its arguments (0 = the name).
type Body = fn(Ctx, &[Arg]) -> c_int;

/// Run a command body under [`guard`]: a panic becomes an error reply
/// instead of a crash.
fn run(ctx: *mut raw::RedisModuleCtx, argv: *mut RStr, argc: c_int, body: Body) -> c_int {
    let ctx = Ctx::new(ctx);
    // Redis keeps argv alive for the whole call.
    let args = unsafe { args(argv, argc) };
    guard(None, || Some(body(ctx, args))).unwrap_or_else(|| reply_error(ctx, errors::INTERNAL))
}

macro_rules! entry {
    ($name:ident, $body:path) => {
        extern "C" fn $name(ctx: *mut raw::RedisModuleCtx, argv: *mut RStr, argc: c_int) -> c_int {
            run(ctx, argv, argc, $body)
        }
    };
}

entry!(take_entry, take::run);
entry!(window_entry, window::run);
entry!(quota_entry, quota::run);
entry!(throttle_entry, throttle::run);
entry!(apply_entry, apply::run);
entry!(box_status_entry, box_cmd::status);
entry!(box_trip_entry, box_cmd::trip);
entry!(box_release_entry, box_cmd::release);
entry!(lease_acquire_entry, lease::acquire);
entry!(lease_release_entry, lease::release);
entry!(lease_renew_entry, lease::renew);
entry!(lease_list_entry, lease::list);

/// Register a command whose keys are the arguments `first`, `first +
/// step`, ... up to `last` (negative: counted from the end).
fn create(
    ctx: Ctx,
    name: &CStr,
    func: raw::RedisModuleCmdFunc,
    flags: &CStr,
    [first, last, step]: [c_int; 3],
) -> bool {
    let status = unsafe {
        api!(RedisModule_CreateCommand)(
            ctx.ptr(),
            name.as_ptr(),
            func,
            flags.as_ptr(),
            first,
            last,
            step,
        )
    };
    status == raw::REDISMODULE_OK as c_int
}

fn create_sub(
    ctx: Ctx,
    parent: &CStr,
    name: &CStr,
    func: raw::RedisModuleCmdFunc,
    flags: &CStr,
) -> bool {
    let parent = unsafe { api!(RedisModule_GetCommand)(ctx.ptr(), parent.as_ptr()) };
    if parent.is_null() {
        return false;
    }
    let status = unsafe {
        api!(RedisModule_CreateSubcommand)(parent, name.as_ptr(), func, flags.as_ptr(), 2, 2, 1)
    };
    status == raw::REDISMODULE_OK as c_int
}

/// Register every command; false if Redis refused one.
pub fn register(ctx: Ctx) -> bool {
    create(
        ctx,
        c"rl.take",
        Some(take_entry),
        c"write deny-oom getkeys-api",
        [1, 1, 1],
    ) && create(
        ctx,
        c"rl.window",
        Some(window_entry),
        c"write deny-oom getkeys-api",
        [1, 1, 1],
    ) && create(
        ctx,
        c"rl.quota",
        Some(quota_entry),
        c"write deny-oom getkeys-api",
        [1, 1, 1],
    ) && create(
        ctx,
        c"cl.throttle",
        Some(throttle_entry),
        c"write deny-oom",
        [1, 1, 1],
    ) && create(
        ctx,
        c"rl.apply",
        Some(apply_entry),
        c"write",
        // key payload expiry [key payload expiry]...
        [1, -1, 3],
    ) && create(ctx, c"rl.box", None, c"", [0, 0, 0])
        && create_sub(
            ctx,
            c"rl.box",
            c"status",
            Some(box_status_entry),
            c"readonly fast",
        )
        && create_sub(ctx, c"rl.box", c"trip", Some(box_trip_entry), c"write fast")
        && create_sub(
            ctx,
            c"rl.box",
            c"release",
            Some(box_release_entry),
            c"write fast",
        )
        && create(ctx, c"rl.lease", None, c"", [0, 0, 0])
        && create_sub(
            ctx,
            c"rl.lease",
            c"acquire",
            Some(lease_acquire_entry),
            c"write deny-oom fast",
        )
        && create_sub(
            ctx,
            c"rl.lease",
            c"release",
            Some(lease_release_entry),
            c"write fast",
        )
        && create_sub(
            ctx,
            c"rl.lease",
            c"renew",
            Some(lease_renew_entry),
            c"write fast",
        )
        && create_sub(
            ctx,
            c"rl.lease",
            c"list",
            Some(lease_list_entry),
            c"readonly",
        )
}
