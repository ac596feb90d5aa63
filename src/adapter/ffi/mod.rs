//! Every raw call the adapter makes to Redis outside the value owner, each
//! wrapped once as a safe function or method: here the [`api!`] macro (a
//! module API function pointer), the call context ([`Ctx`]) and argument
//! ([`Arg`]) handles, [`guard`], the command entry points
//! ([`command_entry!`]) and the calls every command makes (the clock, the
//! replies, keyspace events, the getkeys API); an open key and the calls on
//! a key by name in [`key`]; replication of a call's effects in
//! [`replicate`]; what the module registers while it loads (options,
//! `INFO`, commands, ACL categories, key specs) in [`command`]. A key's
//! value and the type's callbacks are reached only in [`super::value`],
//! through [`api!`] too. The API that older servers lack is read from its
//! pointer, which may be null, where it is used (`RM_SetAbsExpire` and `RM_GetAbsExpire` in
//! [`key`], the ACL and command-info calls in [`command`]). Every `unsafe`
//! block says why it is sound.
//!
//! Every entry point from Redis into Rust goes through [`guard`] so that a
//! panic can never unwind across the FFI boundary.

use std::ffi::CStr;
use std::os::raw::{c_char, c_int, c_long, c_longlong};
use std::panic::{catch_unwind, AssertUnwindSafe};

use redis_module::raw;

use super::errors;

pub mod command;
pub mod key;
pub mod replicate;

/// A Redis call context, valid for the duration of one callback: made only
/// from the context Redis passed to the callback running (a command, the
/// module's load), and not kept beyond it.
#[derive(Clone, Copy)]
pub struct Ctx(*mut raw::RedisModuleCtx);

impl Ctx {
    /// Wrap the context Redis passed to a callback.
    pub(crate) fn new(raw: *mut raw::RedisModuleCtx) -> Ctx {
        Ctx(raw)
    }

    /// The raw pointer, for a Redis API call.
    pub(crate) fn ptr(self) -> *mut raw::RedisModuleCtx {
        self.0
    }
}

/// A raw Redis string (command argument or key name).
pub type RStr = *mut raw::RedisModuleString;

/// Call a Redis API function pointer, which Redis fills in before any
/// command runs; a missing one is a broken server and panics (caught by
/// [`guard`]).
///
/// Calling the function it gives is `unsafe`: each call site says why its
/// arguments are what the function expects.
macro_rules! api {
    ($name:ident) => {{
        #[allow(unused_unsafe)]
        // SAFETY: the API pointers are written once, by `RedisModule_Init`
        // while the module loads, before any command or callback runs, and
        // only read afterwards; this copies the pointer out.
        let f = unsafe { redis_module::raw::$name };
        match f {
            Some(f) => f,
            None => panic!(concat!(
                "Redis module API ",
                stringify!($name),
                " is missing"
            )),
        }
    }};
}
pub(crate) use api;

/// Run `body`, turning a panic into `fallback` instead of unwinding into
/// Redis (a command then replies its internal error).
pub fn guard<T>(fallback: T, body: impl FnOnce() -> T) -> T {
    match catch_unwind(AssertUnwindSafe(body)) {
        Ok(v) => v,
        Err(_) => fallback,
    }
}

/// One command argument (or key name), readable as bytes without copying.
#[derive(Clone, Copy)]
#[repr(transparent)]
pub struct Arg(pub(crate) RStr);

impl AsRef<[u8]> for Arg {
    #[inline]
    fn as_ref(&self) -> &[u8] {
        let mut len = 0usize;
        // SAFETY: `self.0` is a string Redis passed to the running command
        // (an argument or key name), alive until it returns; `len` is a
        // valid place for the length.
        let ptr = unsafe { api!(RedisModule_StringPtrLen)(self.0, &mut len) };
        if ptr.is_null() {
            return &[];
        }
        // SAFETY: Redis returned `len` bytes at `ptr`, which stay valid and
        // unchanged while the argument is alive (the whole command, longer
        // than any borrow of `self` a command holds); no one writes them.
        unsafe { std::slice::from_raw_parts(ptr.cast::<u8>(), len) }
    }
}

/// The arguments of a command call, as given by Redis.
///
/// # Safety
/// `argv` must point to `argc` strings that outlive `'a` (Redis keeps a
/// command's arguments alive while the command runs).
pub unsafe fn args<'a>(argv: *mut RStr, argc: c_int) -> &'a [Arg] {
    let len = usize::try_from(argc).unwrap_or(0);
    if argv.is_null() || len == 0 {
        return &[];
    }
    // SAFETY: `Arg` is a transparent wrapper of the pointer, so `argc`
    // pointers at `argv` are `len` `Arg`s; the caller promises they are
    // alive for `'a`, and no one writes them meanwhile.
    unsafe { std::slice::from_raw_parts(argv.cast::<Arg>(), len) }
}

/// The server clock in milliseconds since the epoch, read in a command.
pub fn now_ms(_ctx: Ctx) -> i64 {
    clock_ms()
}

/// The server clock in milliseconds since the epoch (in a command, a type
/// callback, or between the calls that set an expiry).
pub fn clock_ms() -> i64 {
    // SAFETY: takes no argument; the server's clock, read on its main
    // thread, where every command and type callback runs.
    unsafe { api!(RedisModule_Milliseconds)() }
}

/// Reply with an array of integers.
pub fn reply_ints(ctx: Ctx, values: &[i64]) -> c_int {
    let reply_int = api!(RedisModule_ReplyWithLongLong);
    // SAFETY: `ctx` is the context of the running command (valid until it
    // returns); the array announces exactly the integers that follow.
    unsafe {
        api!(RedisModule_ReplyWithArray)(ctx.0, values.len() as c_long);
        for v in values {
            reply_int(ctx.0, *v as c_longlong);
        }
    }
    raw::REDISMODULE_OK as c_int
}

/// Start an array reply of `len` elements (each sent by the following
/// reply calls).
pub fn reply_array(ctx: Ctx, len: usize) -> c_int {
    // SAFETY: `ctx` is the context of the running command; the caller
    // sends the `len` elements next.
    unsafe { api!(RedisModule_ReplyWithArray)(ctx.0, len as c_long) }
}

/// Reply with a bulk string.
pub fn reply_bulk(ctx: Ctx, bytes: &[u8]) -> c_int {
    // SAFETY: `ctx` is the context of the running command; Redis copies
    // `bytes.len()` bytes from a live slice.
    unsafe {
        api!(RedisModule_ReplyWithStringBuffer)(ctx.0, bytes.as_ptr().cast::<c_char>(), bytes.len())
    }
}

/// Reply with a null.
pub fn reply_null(ctx: Ctx) -> c_int {
    // SAFETY: `ctx` is the context of the running command.
    unsafe { api!(RedisModule_ReplyWithNull)(ctx.0) }
}

/// Reply with an integer.
pub fn reply_int(ctx: Ctx, value: i64) -> c_int {
    // SAFETY: `ctx` is the context of the running command.
    unsafe { api!(RedisModule_ReplyWithLongLong)(ctx.0, value as c_longlong) }
}

/// Reply with a simple string.
pub fn reply_simple(ctx: Ctx, text: &CStr) -> c_int {
    // SAFETY: `ctx` is the context of the running command; `text` is
    // NUL-terminated and Redis copies it.
    unsafe { api!(RedisModule_ReplyWithSimpleString)(ctx.0, text.as_ptr()) }
}

/// Reply with an error (the text must start with an error code such as
/// `ERR` and hold no line break).
pub fn reply_error(ctx: Ctx, text: &str) -> c_int {
    let mut buf = Vec::with_capacity(text.len() + 1);
    buf.extend(text.bytes().map(|b| {
        if b == b'\r' || b == b'\n' || b == 0 {
            b' '
        } else {
            b
        }
    }));
    buf.push(0);
    // SAFETY: `ctx` is the context of the running command; `buf` is
    // NUL-terminated (with no NUL inside) and Redis copies it.
    unsafe { api!(RedisModule_ReplyWithError)(ctx.0, buf.as_ptr().cast::<c_char>()) }
}

/// The context flags (`REDISMODULE_CTX_FLAGS_*`).
pub fn context_flags(ctx: Ctx) -> u32 {
    // SAFETY: `ctx` is the context of the running command.
    unsafe { api!(RedisModule_GetContextFlags)(ctx.0) as u32 }
}

/// Whether this call only asks which arguments are keys (the getkeys API).
pub fn is_keys_request(ctx: Ctx) -> bool {
    // SAFETY: `ctx` is the context of the running command.
    unsafe { api!(RedisModule_IsKeysPositionRequest)(ctx.0) != 0 }
}

/// Declare argument `pos` a key, answering a getkeys request.
pub fn declare_key(ctx: Ctx, pos: usize) {
    // SAFETY: `ctx` is the context of a getkeys request (the caller asked
    // [`is_keys_request`]); Redis checks `pos` against the arguments.
    unsafe { api!(RedisModule_KeyAtPos)(ctx.0, pos as c_int) }
}

/// Announce `event` on `key` to keyspace-notification subscribers.
pub fn notify(ctx: Ctx, event: &CStr, key: Arg) {
    // SAFETY: `ctx` is the context of the running command, `event` is
    // NUL-terminated, `key` a string Redis passed to it (Redis retains it
    // if it keeps it).
    unsafe {
        api!(RedisModule_NotifyKeyspaceEvent)(
            ctx.0,
            raw::REDISMODULE_NOTIFY_MODULE,
            event.as_ptr(),
            key.0,
        );
    }
}

/// Run a command body with the context and arguments Redis passed to the
/// command's entry point, under [`guard`] (a panic replies an internal
/// error). Called only by the entry points [`command_entry!`] defines,
/// with what Redis passed them.
pub(crate) fn run_command(
    ctx: *mut raw::RedisModuleCtx,
    argv: *mut RStr,
    argc: c_int,
    body: fn(Ctx, &[Arg]) -> c_int,
) -> c_int {
    let ctx = Ctx::new(ctx);
    // SAFETY: the caller is a command's entry point, passing on what Redis
    // gave it: `argc` strings at `argv`, alive for the whole call, which
    // outlives `args`.
    let args = unsafe { args(argv, argc) };
    guard(None, || Some(body(ctx, args))).unwrap_or_else(|| reply_error(ctx, errors::INTERNAL))
}

/// Define `$name`, a command entry point Redis calls, running `$body`
/// through [`run_command`].
macro_rules! command_entry {
    ($name:ident, $body:path) => {
        extern "C" fn $name(
            ctx: *mut redis_module::raw::RedisModuleCtx,
            argv: *mut $crate::adapter::ffi::RStr,
            argc: std::os::raw::c_int,
        ) -> std::os::raw::c_int {
            $crate::adapter::ffi::run_command(ctx, argv, argc, $body)
        }
    };
}
pub(crate) use command_entry;
