//! The module type `rl-record`: one type for every RL key, its value a
//! [`Value`]. Its callbacks persist the record through the versioned codec
//! (RDB, AOF rewrite, `DUMP`/`RESTORE`), report memory, digest it for
//! `DEBUG DIGEST`, copy and free it, each through the value's safe API.
//! Every callback runs under [`guard`]; a corrupt payload is refused
//! (Redis then reports the error), never trusted.

use std::ffi::CStr;
use std::os::raw::{c_char, c_int, c_void};
use std::ptr;
use std::sync::atomic::{AtomicPtr, Ordering};

use redis_module::raw;

use super::{Lent, Value};
use crate::adapter::ffi::{api, clock_ms, guard, Ctx, RStr};
use crate::adapter::stats;
use crate::core::codec;

/// The type name Redis shows in `TYPE` (exactly 9 characters).
pub const TYPE_NAME: &CStr = c"rl-record";

/// The version of the type's RDB encoding (what Redis stores beside each
/// value: one string, a payload of [`codec`], which has versions of its
/// own).
pub const RDB_TYPE_VERSION: c_int = 1;

static TYPE: AtomicPtr<raw::RedisModuleType> = AtomicPtr::new(ptr::null_mut());

/// The registered type (null before [`register`]).
pub fn rl_type() -> *mut raw::RedisModuleType {
    TYPE.load(Ordering::Relaxed)
}

/// Register the type with Redis; call once from `OnLoad`.
pub fn register(ctx: Ctx) -> bool {
    let mut methods = raw::RedisModuleTypeMethods {
        version: u64::from(raw::REDISMODULE_TYPE_METHOD_VERSION),
        rdb_load: Some(rdb_load),
        rdb_save: Some(rdb_save),
        aof_rewrite: Some(aof_rewrite),
        mem_usage: Some(mem_usage),
        digest: Some(digest),
        free: Some(free),
        aux_load: None,
        aux_save: None,
        aux_save_triggers: 0,
        free_effort: None,
        unlink: None,
        copy: Some(copy),
        defrag: None,
        mem_usage2: None,
        free_effort2: None,
        unlink2: None,
        copy2: None,
        aux_save2: None,
    };
    // SAFETY: `ctx` is the load context of `OnLoad` (the only time a type
    // may be created); the name is NUL-terminated; Redis copies `methods`,
    // whose callbacks have the signatures of its version.
    let created = unsafe {
        api!(RedisModule_CreateDataType)(
            ctx.ptr(),
            TYPE_NAME.as_ptr(),
            RDB_TYPE_VERSION,
            &mut methods,
        )
    };
    TYPE.store(created, Ordering::Relaxed);
    !created.is_null()
}

extern "C" fn rdb_load(rdb: *mut raw::RedisModuleIO, encver: c_int) -> *mut c_void {
    guard(ptr::null_mut(), || {
        if encver != RDB_TYPE_VERSION {
            return ptr::null_mut();
        }
        let mut len = 0usize;
        // SAFETY: `rdb` is the IO handle Redis passed to this callback,
        // valid while it runs; `len` is a valid place for the length.
        let buf = unsafe { api!(RedisModule_LoadStringBuffer)(rdb, &mut len) };
        // SAFETY: as above.
        let io_error = unsafe { api!(RedisModule_IsIOError)(rdb) } != 0;
        if buf.is_null() {
            return ptr::null_mut();
        }
        let decoded = if io_error {
            None
        } else {
            // SAFETY: without an IO error, Redis returned a buffer of `len`
            // bytes at `buf` (non-null), ours until freed below.
            let bytes = unsafe { std::slice::from_raw_parts(buf.cast::<u8>(), len) };
            codec::decode_loaded(bytes, clock_ms()).ok()
        };
        // SAFETY: the buffer Redis allocated for us, freed once; `bytes`
        // is out of scope.
        unsafe { api!(RedisModule_Free)(buf.cast::<c_void>()) };
        decoded.map_or(ptr::null_mut(), |record| Value::new(record).into_raw())
    })
}

extern "C" fn rdb_save(rdb: *mut raw::RedisModuleIO, value: *mut c_void) {
    guard((), || {
        // SAFETY: the value of this callback, lent until it returns.
        if let Some(bytes) = unsafe { lent(value) }.map(|v| v.get().encode()) {
            // SAFETY: `rdb` is the IO handle of this callback; Redis copies
            // `bytes.len()` bytes of a live vector.
            unsafe {
                api!(RedisModule_SaveStringBuffer)(
                    rdb,
                    bytes.as_ptr().cast::<c_char>(),
                    bytes.len(),
                )
            };
        }
    })
}

extern "C" fn aof_rewrite(aof: *mut raw::RedisModuleIO, key: RStr, value: *mut c_void) {
    guard((), || {
        // SAFETY: the value of this callback, lent until it returns.
        if let Some(bytes) = unsafe { lent(value) }.map(|v| v.get().encode()) {
            // SAFETY: `aof` is the IO handle of this callback and `key` the
            // key's name it passed; format `sb` takes a string, then a
            // pointer and length of a live vector, which Redis copies.
            unsafe {
                api!(RedisModule_EmitAOF)(
                    aof,
                    c"RL.APPLY".as_ptr(),
                    c"sb".as_ptr(),
                    key,
                    bytes.as_ptr().cast::<c_char>(),
                    bytes.len(),
                );
            }
        }
    })
}

/// Bytes Redis allocates around every module value and does not count in
/// `MEMORY USAGE` itself: the value object (`robj`) and its module-value
/// wrapper (type and value pointers), 16 bytes each.
const REDIS_WRAPPERS: usize = 2 * 16;

/// The memory of a value as the allocator sees it: Redis' wrappers, then
/// each allocation of the value at its allocator size (`RM_MallocSize`).
extern "C" fn mem_usage(value: *const c_void) -> usize {
    // SAFETY: called by `heap_size` only with addresses of the value's own
    // allocations (the record or compact form, a record's heap parts), all
    // made by Redis' allocator (the module's global allocator) and alive
    // while this callback runs.
    let allocated = |ptr: *const u8| unsafe { api!(RedisModule_MallocSize)(ptr.cast_mut().cast()) };
    guard(0, || {
        // SAFETY: the value of this callback, lent until it returns.
        let value = unsafe { lent(value.cast_mut()) };
        value.map_or(0, |v| REDIS_WRAPPERS + v.get().heap_size(allocated))
    })
}

extern "C" fn digest(md: *mut raw::RedisModuleDigest, value: *mut c_void) {
    guard((), || {
        // SAFETY: the value of this callback, lent until it returns.
        if let Some(bytes) = unsafe { lent(value) }.map(|v| v.get().encode()) {
            // SAFETY: `md` is the digest of this callback; Redis reads
            // `bytes.len()` bytes of a live vector.
            unsafe {
                api!(RedisModule_DigestAddStringBuffer)(
                    md,
                    bytes.as_ptr().cast::<c_char>(),
                    bytes.len(),
                );
                api!(RedisModule_DigestEndSequence)(md);
            }
        }
    })
}

extern "C" fn copy(_from: RStr, _to: RStr, value: *const c_void) -> *mut c_void {
    // The value is only read (the `cast_mut` changes nothing).
    guard(ptr::null_mut(), || {
        // SAFETY: the value of this callback, lent until it returns.
        let value = unsafe { lent(value.cast_mut()) };
        value.map_or(ptr::null_mut(), |v| v.get().copy().into_raw())
    })
}

/// Free a value. Leases still in it whose deadline has passed (the key
/// expired with them) are counted as expired leases in `INFO`.
extern "C" fn free(value: *mut c_void) {
    guard((), || {
        // SAFETY: Redis passes a value of our type and gives it up for
        // good: ours to free (when `owned` drops).
        let owned = unsafe { Value::from_raw(value) };
        if let Some(leases) = owned.as_ref().and_then(|v| v.get().record()?.leases()) {
            stats::LEASES_EXPIRED.add(leases.expired(clock_ms()));
        }
    })
}

/// The value Redis passes to a callback, lent while it runs.
///
/// # Safety
/// `value` is the value Redis passed to the running callback of the type,
/// and the `Lent` is dropped before the callback returns.
unsafe fn lent(value: *mut c_void) -> Option<Lent> {
    // SAFETY: a value of our type (made by `Value::into_raw`: every value
    // Redis holds comes from `set`, `replace`, `rdb_load` or `copy`),
    // which Redis owns and keeps while the callback runs and does not
    // touch meanwhile; the caller drops the `Lent` in time.
    unsafe { Lent::from_raw(value) }
}
