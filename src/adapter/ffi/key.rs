//! A key handle ([`KeyHandle`]) and the calls made on a key by name: what
//! [`crate::adapter::key`] needs of Redis to open, read, expire, delete
//! and signal a key, each wrapped once as a safe call.

use std::os::raw::{c_int, c_longlong};

use redis_module::raw;

use super::{api, Arg, Ctx};

/// A key opened in the running command, closed when dropped.
///
/// Invariant: `0` is null (a missing key opened only to read) or the
/// handle `RM_OpenKey` returned in the running command's context, open
/// until `drop`, which alone closes it. Every method checks for null.
pub struct KeyHandle(*mut raw::RedisModuleKey);

impl KeyHandle {
    /// Open `name` (a key name Redis passed to the running command) in the
    /// selected database, for writing too when `write`.
    #[inline]
    pub fn open(ctx: Ctx, name: Arg, write: bool) -> KeyHandle {
        let mode = if write {
            raw::REDISMODULE_READ | raw::REDISMODULE_WRITE
        } else {
            raw::REDISMODULE_READ
        };
        // SAFETY: `ctx` is the context of the running command and `name` a
        // string Redis passed to it; the handle is closed by `drop`.
        KeyHandle(unsafe { api!(RedisModule_OpenKey)(ctx.ptr(), name.0, mode as c_int) })
    }

    /// The raw handle (null or open until `self` drops), for the value
    /// owner's calls on the key's value.
    #[inline]
    pub(crate) fn ptr(&self) -> *mut raw::RedisModuleKey {
        self.0
    }

    /// Whether a key handle is open (not a missing key opened to read).
    #[inline]
    pub fn is_open(&self) -> bool {
        !self.0.is_null()
    }

    /// The bytes of a string value (`None` for any other type or no key).
    pub fn string_value(&self) -> Option<&[u8]> {
        if self.0.is_null() {
            return None;
        }
        // SAFETY: `self.0` is an open, non-null key handle (the invariant).
        let kind = unsafe { api!(RedisModule_KeyType)(self.0) } as isize;
        if kind != raw::REDISMODULE_KEYTYPE_STRING {
            return None;
        }
        let mut len = 0usize;
        // SAFETY: an open, non-null handle of a string key, read only;
        // `len` is a valid place for the length.
        let ptr = unsafe {
            api!(RedisModule_StringDMA)(self.0, &mut len, raw::REDISMODULE_READ as c_int)
        };
        if ptr.is_null() {
            return None;
        }
        // SAFETY: Redis returned the string's `len` bytes at `ptr`, valid
        // while the key is open and its value unchanged: the borrow of
        // `self` keeps it open, [`KeyHandle::delete`] takes `&mut self`,
        // and the value owner's writes are `unsafe` calls whose callers
        // hold no such borrow; an expiry does not move the bytes.
        Some(unsafe { std::slice::from_raw_parts(ptr.cast::<u8>(), len) })
    }

    /// Set the absolute expiry `at` (ms) with `RM_SetAbsExpire`; false
    /// where the server lacks it (before Redis 6.2.2) or no key is open.
    #[inline]
    pub fn set_abs_expire(&self, at: i64) -> bool {
        if self.0.is_null() {
            return false;
        }
        // SAFETY: written once by `RedisModule_Init` at load (null where
        // the server lacks the API), only read afterwards; a copy.
        let Some(set_abs) = (unsafe { raw::RedisModule_SetAbsExpire }) else {
            return false;
        };
        // SAFETY: `self.0` is an open, non-null key handle (Redis checks
        // that it is writable and holds a value).
        unsafe { set_abs(self.0, at) };
        true
    }

    /// The absolute expiry (ms) with `RM_GetAbsExpire`; `None` without a
    /// TTL or key, or where the server lacks the call.
    #[inline]
    pub fn abs_expire(&self) -> Option<i64> {
        if self.0.is_null() {
            return None;
        }
        // SAFETY: written once by `RedisModule_Init` at load (null where
        // the server lacks the API), only read afterwards; a copy.
        let get_abs = (unsafe { raw::RedisModule_GetAbsExpire })?;
        // SAFETY: `self.0` is an open, non-null key handle.
        let at = unsafe { get_abs(self.0) };
        (at != raw::REDISMODULE_NO_EXPIRE as raw::mstime_t).then_some(at)
    }

    /// Set the relative expiry `ms` (`None`: remove it) with
    /// `RM_SetExpire`; nothing when no key is open.
    #[inline]
    pub fn set_expire(&self, ms: Option<i64>) {
        if self.0.is_null() {
            return;
        }
        let ms = ms.unwrap_or(raw::REDISMODULE_NO_EXPIRE as raw::mstime_t);
        // SAFETY: `self.0` is an open, non-null key handle (Redis checks
        // that it is writable and holds a value).
        unsafe { api!(RedisModule_SetExpire)(self.0, ms) };
    }

    /// The remaining time to live in ms, `None` without a TTL or key.
    #[inline]
    pub fn expire_ms(&self) -> Option<u64> {
        if self.0.is_null() {
            return None;
        }
        // SAFETY: `self.0` is an open, non-null key handle.
        let ttl = unsafe { api!(RedisModule_GetExpire)(self.0) };
        if ttl == raw::REDISMODULE_NO_EXPIRE as raw::mstime_t {
            return None;
        }
        u64::try_from(ttl).ok()
    }

    /// Delete the key (nothing when no key is open).
    #[inline]
    pub fn delete(&mut self) {
        if self.0.is_null() {
            return;
        }
        // SAFETY: `self.0` is an open, non-null key handle (Redis checks
        // that it is writable); `&mut self` ends every borrow of its bytes.
        unsafe { api!(RedisModule_DeleteKey)(self.0) };
    }
}

impl Drop for KeyHandle {
    #[inline]
    fn drop(&mut self) {
        if !self.0.is_null() {
            // SAFETY: the handle `open` returned, closed only here.
            unsafe { api!(RedisModule_CloseKey)(self.0) };
        }
    }
}

/// Tell Redis the key `name` changed (for `WATCH` and client caching).
#[inline]
pub fn signal_modified(ctx: Ctx, name: Arg) {
    // SAFETY: `ctx` is the context of the running command and `name` a
    // string Redis passed to it.
    unsafe { api!(RedisModule_SignalModifiedKey)(ctx.ptr(), name.0) };
}

/// Run `PEXPIREAT name at` through Redis' own command.
pub fn pexpireat(ctx: Ctx, name: Arg, at: i64) {
    // SAFETY: `ctx` is the context of the running command; format `sl`
    // takes the key name Redis passed (a string) and a long long; the
    // reply, when there is one, is ours and freed once.
    unsafe {
        let reply = api!(RedisModule_Call)(
            ctx.ptr(),
            c"PEXPIREAT".as_ptr(),
            c"sl".as_ptr(),
            name.0,
            at as c_longlong,
        );
        if !reply.is_null() {
            api!(RedisModule_FreeCallReply)(reply);
        }
    }
}
