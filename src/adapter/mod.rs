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

/// Module initialisation, called from `RedisModule_OnLoad`: the type, the
/// commands, the options and the `INFO` section.
pub fn init(ctx: &Context, _args: &[RedisString]) -> Status {
    let rl_ctx = ffi::Ctx::new(ctx.ctx);
    let ok = ffi::guard(false, || {
        // The type keeps no global state, so a replica may load an RDB
        // from the socket while it serves the old data (swapdb).
        let options = raw::REDISMODULE_OPTIONS_HANDLE_IO_ERRORS
            | raw::REDISMODULE_OPTIONS_HANDLE_REPL_ASYNC_LOAD
            | raw::REDISMODULE_OPTION_NO_IMPLICIT_SIGNAL_MODIFIED;
        ffi::command::set_module_options(rl_ctx, options);
        ffi::command::register_info(rl_ctx, stats::info);
        value::rtype::register(rl_ctx) && commands::register(rl_ctx)
    });
    if ok {
        Status::Ok
    } else {
        ctx.log_warning("rl: could not register the module type or a command");
        Status::Err
    }
}
