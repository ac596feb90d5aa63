//! The thin Redis adapter: argument parsing, the module type, the store
//! and commit path, replication of effects, keyspace events and `INFO`.

pub mod args;
pub mod commands;
pub mod errors;
pub mod ffi;
pub mod key;
pub mod regions;
pub mod reply;
pub mod stats;
pub mod store;
pub mod value;

use redis_module::{raw, Context, RedisString, Status};

use ffi::api;

/// Module initialisation, called from `RedisModule_OnLoad`: the type, the
/// commands, the options and the `INFO` section.
pub fn init(ctx: &Context, _args: &[RedisString]) -> Status {
    let raw_ctx = ctx.ctx;
    let rl_ctx = ffi::Ctx::new(raw_ctx);
    let ok = ffi::guard(false, || {
        // The type keeps no global state, so a replica may load an RDB
        // from the socket while it serves the old data (swapdb).
        let options = raw::REDISMODULE_OPTIONS_HANDLE_IO_ERRORS
            | raw::REDISMODULE_OPTIONS_HANDLE_REPL_ASYNC_LOAD
            | raw::REDISMODULE_OPTION_NO_IMPLICIT_SIGNAL_MODIFIED;
        // SAFETY: `raw_ctx` is the load context Redis passed to `OnLoad`,
        // valid while it runs; `stats::info` has the signature of an info
        // callback.
        unsafe {
            api!(RedisModule_SetModuleOptions)(raw_ctx, options as i32);
            api!(RedisModule_RegisterInfoFunc)(raw_ctx, Some(stats::info));
        }
        value::rtype::register(rl_ctx) && commands::register(rl_ctx)
    });
    if ok {
        Status::Ok
    } else {
        ctx.log_warning("rl: could not register the module type or a command");
        Status::Err
    }
}
