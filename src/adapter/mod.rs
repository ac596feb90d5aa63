//! The thin Redis adapter: argument parsing, the module type, the store
//! and commit path, replication of effects, keyspace events and `INFO`.

pub mod args;
pub mod commands;
pub mod errors;
pub mod ffi;
pub mod rtype;
pub mod stats;
pub mod store;

use redis_module::{raw, Context, RedisString, Status};

use ffi::api;

/// Module initialisation, called from `RedisModule_OnLoad`: the type, the
/// commands, the options and the `INFO` section.
pub fn init(ctx: &Context, _args: &[RedisString]) -> Status {
    let raw_ctx = ctx.ctx;
    let rl_ctx = ffi::Ctx::new(raw_ctx);
    let ok = ffi::guard(false, || {
        let options = raw::REDISMODULE_OPTIONS_HANDLE_IO_ERRORS
            | raw::REDISMODULE_OPTION_NO_IMPLICIT_SIGNAL_MODIFIED;
        unsafe {
            api!(RedisModule_SetModuleOptions)(raw_ctx, options as i32);
            api!(RedisModule_RegisterInfoFunc)(raw_ctx, Some(stats::info));
        }
        rtype::register(rl_ctx) && commands::register(rl_ctx)
    });
    if ok {
        Status::Ok
    } else {
        ctx.log_warning("rl: could not register the module type or a command");
        Status::Err
    }
}
