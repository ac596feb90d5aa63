//! Key access and the one commit path. Every write of the module goes
//! through [`commit`] (or [`apply_replicated`] on a replica): it stores the
//! record, sets the key's absolute expiry, signals the modification and
//! replicates the *effect* (`RL.APPLY key payload` followed by
//! `PEXPIREAT key at`, `PERSIST key` or `DEL key`), never the
//! time-dependent command, so replicas and AOF replays reach the same bytes.

use std::os::raw::{c_char, c_int, c_longlong};

use redis_module::raw;

use super::ffi::{api, Arg, Ctx};
use super::rtype::{from_raw, into_raw, rl_type};
use crate::core::codec;
use crate::core::record::{Record, Retention};
use crate::core::time::Millis;

/// A key holds a value of another type.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WrongType;

/// How a key is opened.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Access {
    /// Only read (a probe, a status): a missing key is not created.
    Read,
    /// Read and maybe write.
    Write,
}

/// An open key, closed when dropped.
pub struct RlKey {
    raw: *mut raw::RedisModuleKey,
    /// The key name as Redis gave it.
    pub name: Arg,
}

impl RlKey {
    /// Open `name` in the selected database.
    pub fn open(ctx: Ctx, name: Arg, access: Access) -> RlKey {
        let mode = match access {
            Access::Read => raw::REDISMODULE_READ,
            Access::Write => raw::REDISMODULE_READ | raw::REDISMODULE_WRITE,
        };
        let raw = unsafe { api!(RedisModule_OpenKey)(ctx.ptr(), name.0, mode as c_int) };
        RlKey { raw, name }
    }

    /// The record held by the key: `None` when the key does not exist,
    /// `WrongType` when it holds another type.
    pub fn record(&self) -> Result<Option<&Record>, WrongType> {
        self.value().map(|v| v.map(|r| &*r))
    }

    /// The bytes of a string value (`None` for any other type or no key):
    /// used to read the value of another limiter (redis-cell) to convert.
    pub fn string_value(&self) -> Option<&[u8]> {
        if self.raw.is_null() {
            return None;
        }
        let kind = unsafe { api!(RedisModule_KeyType)(self.raw) } as isize;
        if kind != raw::REDISMODULE_KEYTYPE_STRING {
            return None;
        }
        let mut len = 0usize;
        let ptr = unsafe {
            api!(RedisModule_StringDMA)(self.raw, &mut len, raw::REDISMODULE_READ as c_int)
        };
        if ptr.is_null() {
            return None;
        }
        // Valid while the key is open and unmodified.
        Some(unsafe { std::slice::from_raw_parts(ptr.cast::<u8>(), len) })
    }

    /// A copy of the record to change and [`commit`] (empty when the key
    /// holds nothing).
    pub fn working_copy(&self) -> Record {
        self.record().ok().flatten().cloned().unwrap_or_default()
    }

    /// The record, writable in place.
    fn record_mut(&mut self) -> Result<Option<&mut Record>, WrongType> {
        self.value()
    }

    /// The value pointer behind the key. Private: callers get `&Record`
    /// from [`RlKey::record`], or `&mut` through `&mut self`.
    #[allow(clippy::mut_from_ref)]
    fn value(&self) -> Result<Option<&mut Record>, WrongType> {
        if self.raw.is_null() {
            return Ok(None);
        }
        let kind = unsafe { api!(RedisModule_KeyType)(self.raw) } as isize;
        if kind == raw::REDISMODULE_KEYTYPE_EMPTY {
            return Ok(None);
        }
        if kind != raw::REDISMODULE_KEYTYPE_MODULE
            || unsafe { api!(RedisModule_ModuleTypeGetType)(self.raw) } != rl_type()
        {
            return Err(WrongType);
        }
        Ok(unsafe { from_raw(api!(RedisModule_ModuleTypeGetValue)(self.raw)) })
    }

    /// Put `record` in the key, in place when it already holds one (which
    /// keeps its TTL until the caller sets a new one).
    fn store(&mut self, record: Record) {
        match self.record_mut() {
            Ok(Some(existing)) => *existing = record,
            _ => unsafe {
                api!(RedisModule_ModuleTypeSetValue)(self.raw, rl_type(), into_raw(record));
            },
        }
    }

    /// Set the key's expiry to the absolute time `at` (ms), exactly: a
    /// replica receives the same `PEXPIREAT` and must end with the same
    /// `PEXPIRETIME`. Redis 7.0 has only a relative `RM_SetExpire`, so the
    /// clock is read around it until no millisecond boundary was crossed.
    fn expire_at(&self, at: Millis) {
        if let Some(set_abs) = unsafe { raw::RedisModule_SetAbsExpire } {
            unsafe { set_abs(self.raw, at) };
            return;
        }
        let clock = api!(RedisModule_Milliseconds);
        let set = api!(RedisModule_SetExpire);
        for _ in 0..8 {
            let before = unsafe { clock() };
            unsafe { set(self.raw, at.saturating_sub(before).max(0)) };
            if unsafe { clock() } == before {
                return;
            }
        }
    }

    fn persist(&self) {
        unsafe {
            api!(RedisModule_SetExpire)(self.raw, raw::REDISMODULE_NO_EXPIRE as raw::mstime_t)
        };
    }

    fn delete(&self) {
        unsafe { api!(RedisModule_DeleteKey)(self.raw) };
    }

    fn signal_modified(&self, ctx: Ctx) {
        unsafe { api!(RedisModule_SignalModifiedKey)(ctx.ptr(), self.name.0) };
    }
}

impl Drop for RlKey {
    fn drop(&mut self) {
        if !self.raw.is_null() {
            unsafe { api!(RedisModule_CloseKey)(self.raw) };
        }
    }
}

/// Store `record` as the state of `key` at `now`: drop what no longer
/// matters, delete the key when nothing does, otherwise set the value and
/// the TTL of its longest-lived part; replicate exactly that.
pub fn commit(ctx: Ctx, key: &mut RlKey, mut record: Record, now: Millis) {
    let retention = record.prune(now);
    if retention == Retention::Delete {
        if matches!(key.record(), Ok(Some(_))) {
            // Free the pruned record, not the old one, so the type's `free`
            // does not count the leases just swept a second time.
            key.store(record);
            key.delete();
            replicate(ctx, c"DEL", key.name, None);
            key.signal_modified(ctx);
        }
        return;
    }
    let payload = codec::encode(&record);
    key.store(record);
    replicate(ctx, c"RL.APPLY", key.name, Some(&payload));
    set_retention(ctx, key, retention);
    key.signal_modified(ctx);
}

/// Apply a replicated payload on a replica or during AOF loading: the
/// value only; the `PEXPIREAT`/`PERSIST` that follows sets the TTL.
pub fn apply_replicated(
    ctx: Ctx,
    key: &mut RlKey,
    payload: &[u8],
) -> Result<(), codec::CodecError> {
    let record = codec::decode(payload)?;
    key.store(record);
    key.signal_modified(ctx);
    Ok(())
}

fn set_retention(ctx: Ctx, key: &RlKey, retention: Retention) {
    match retention {
        Retention::Until(at) => {
            key.expire_at(at);
            unsafe {
                api!(RedisModule_Replicate)(
                    ctx.ptr(),
                    c"PEXPIREAT".as_ptr(),
                    c"sl".as_ptr(),
                    key.name.0,
                    at as c_longlong,
                );
            }
        }
        Retention::Forever => {
            key.persist();
            replicate(ctx, c"PERSIST", key.name, None);
        }
        Retention::Delete => {}
    }
}

fn replicate(ctx: Ctx, command: &std::ffi::CStr, key: Arg, payload: Option<&[u8]>) {
    unsafe {
        match payload {
            Some(bytes) => api!(RedisModule_Replicate)(
                ctx.ptr(),
                command.as_ptr(),
                c"sb".as_ptr(),
                key.0,
                bytes.as_ptr().cast::<c_char>(),
                bytes.len(),
            ),
            None => api!(RedisModule_Replicate)(ctx.ptr(), command.as_ptr(), c"s".as_ptr(), key.0),
        };
    }
}
