//! Key access and the one commit path. Every write of the module goes
//! through [`commit_in_place`] (or [`apply_replicated`] on a replica): it
//! prunes the record where it lives, sets the key's absolute expiry,
//! signals the modification and replicates the *effect* as one command
//! (`RL.APPLY key payload PXAT at`, `RL.APPLY key payload PERSIST` or
//! `DEL key`), never the time-dependent command, so replicas and AOF
//! replays reach the same bytes.

use std::cell::RefCell;
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
    /// The record was created by [`RlKey::edit`] in this call: the key did
    /// not exist before, so deleting it again is not an effect.
    created: bool,
}

impl RlKey {
    /// Open `name` in the selected database.
    pub fn open(ctx: Ctx, name: Arg, access: Access) -> RlKey {
        let mode = match access {
            Access::Read => raw::REDISMODULE_READ,
            Access::Write => raw::REDISMODULE_READ | raw::REDISMODULE_WRITE,
        };
        let raw = unsafe { api!(RedisModule_OpenKey)(ctx.ptr(), name.0, mode as c_int) };
        RlKey {
            raw,
            name,
            created: false,
        }
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

    /// The record, writable in place (`None` when the key holds nothing).
    pub fn record_mut(&mut self) -> Result<Option<&mut Record>, WrongType> {
        self.value()
    }

    /// Whether this call created the key's record (the key did not exist).
    pub fn is_new(&self) -> bool {
        self.created
    }

    /// The record to change in place and then [`commit_in_place`]: the
    /// key's own, or a new empty one put in the key (opened for writing).
    pub fn edit(&mut self) -> Result<&mut Record, WrongType> {
        if self.value()?.is_none() {
            self.store(Record::default());
        }
        self.value()?.ok_or(WrongType)
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
    /// keeps its TTL until the caller sets a new one); a value of another
    /// type is replaced.
    fn store(&mut self, record: Record) {
        match self.value() {
            Ok(Some(existing)) => *existing = record,
            missing_or_other => {
                self.created |= missing_or_other.is_ok();
                unsafe {
                    api!(RedisModule_ModuleTypeSetValue)(self.raw, rl_type(), into_raw(record));
                }
            }
        }
    }

    /// Set the key's expiry to the absolute time `at` (ms), exactly: a
    /// replica receives the same `at` and must end with the same
    /// `PEXPIRETIME`. Redis 7.0 has only a relative `RM_SetExpire`, so the
    /// clock is read around it until no millisecond boundary was crossed.
    /// Returns whether the expiry is exactly `at` (always, unless `at` is
    /// not in the future or the clock kept moving).
    fn expire_at(&self, at: Millis) -> bool {
        if let Some(set_abs) = unsafe { raw::RedisModule_SetAbsExpire } {
            unsafe { set_abs(self.raw, at) };
            return true;
        }
        let clock = api!(RedisModule_Milliseconds);
        let set = api!(RedisModule_SetExpire);
        for _ in 0..8 {
            let before = unsafe { clock() };
            unsafe { set(self.raw, at.saturating_sub(before).max(0)) };
            if unsafe { clock() } == before {
                return at > before;
            }
        }
        false
    }

    /// [`RlKey::expire_at`] for a replicated `at`, which may already be
    /// past on this server's clock (a replica behind, an AOF replayed
    /// later): then Redis' own `PEXPIREAT` sets it (which, on a replica or
    /// while loading, keeps an expired key for the master's `DEL`).
    fn expire_at_exactly(&self, ctx: Ctx, at: Millis) {
        if self.expire_at(at) {
            return;
        }
        unsafe {
            let reply = api!(RedisModule_Call)(
                ctx.ptr(),
                c"PEXPIREAT".as_ptr(),
                c"sl".as_ptr(),
                self.name.0,
                at as c_longlong,
            );
            if !reply.is_null() {
                api!(RedisModule_FreeCallReply)(reply);
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

/// Store `record` as the state of `key` at `now` (see
/// [`commit_in_place`]).
pub fn commit(ctx: Ctx, key: &mut RlKey, record: Record, now: Millis) {
    key.store(record);
    commit_in_place(ctx, key, now);
}

/// Commit the record the key holds (changed through [`RlKey::edit`]) as
/// its state at `now`: drop what no longer matters, delete the key when
/// nothing does, otherwise set the TTL of its longest-lived part, and
/// replicate exactly that as one command.
pub fn commit_in_place(ctx: Ctx, key: &mut RlKey, now: Millis) {
    let Ok(Some(record)) = key.value() else {
        return;
    };
    let retention = record.prune(now);
    if retention == Retention::Delete {
        // The type's `free` gets the pruned record, so the leases just
        // swept are not counted a second time.
        key.delete();
        if !key.created {
            replicate_del(ctx, key.name);
            key.signal_modified(ctx);
        }
        return;
    }
    with_encoded(record, |payload| {
        replicate_apply(ctx, key.name, payload, retention);
    });
    match retention {
        Retention::Until(at) => {
            key.expire_at(at);
        }
        Retention::Forever => key.persist(),
        Retention::Delete => {}
    }
    key.signal_modified(ctx);
}

/// What a replicated `RL.APPLY` says about the key's expiry.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ReplicatedExpiry {
    /// `PXAT at`: expire at the absolute time `at` (ms).
    At(Millis),
    /// `PERSIST`: no expiry (a manual box).
    Persist,
    /// Neither (the form written by older builds, followed by its own
    /// `PEXPIREAT` or `PERSIST`): leave the expiry alone.
    Unchanged,
}

/// Apply a replicated payload on a replica or during AOF loading: the
/// value and, when the command carries it, the absolute expiry.
pub fn apply_replicated(
    ctx: Ctx,
    key: &mut RlKey,
    payload: &[u8],
    expiry: ReplicatedExpiry,
) -> Result<(), codec::CodecError> {
    let record = codec::decode(payload)?;
    key.store(record);
    match expiry {
        ReplicatedExpiry::At(at) => key.expire_at_exactly(ctx, at),
        ReplicatedExpiry::Persist => key.persist(),
        ReplicatedExpiry::Unchanged => {}
    }
    key.signal_modified(ctx);
    Ok(())
}

/// Encode `record` into a buffer reused across calls (the server runs
/// commands on one thread), so a write allocates nothing once warm.
fn with_encoded<T>(record: &Record, use_bytes: impl FnOnce(&[u8]) -> T) -> T {
    /// Larger buffers (a key with many leases) are not kept.
    const KEEP_CAPACITY: usize = 64 * 1024;
    thread_local! {
        static BUFFER: RefCell<Vec<u8>> = const { RefCell::new(Vec::new()) };
    }
    BUFFER.with(|cell| match cell.try_borrow_mut() {
        Ok(mut buf) => {
            codec::encode_into(record, &mut buf);
            let out = use_bytes(&buf);
            if buf.capacity() > KEEP_CAPACITY {
                *buf = Vec::new();
            }
            out
        }
        Err(_) => use_bytes(&codec::encode(record)),
    })
}

/// Replicate the new value of `key` with its expiry, as one command.
fn replicate_apply(ctx: Ctx, key: Arg, payload: &[u8], retention: Retention) {
    let (ptr, len) = (payload.as_ptr().cast::<c_char>(), payload.len());
    let apply = api!(RedisModule_Replicate);
    unsafe {
        match retention {
            Retention::Until(at) => apply(
                ctx.ptr(),
                c"RL.APPLY".as_ptr(),
                c"sbcl".as_ptr(),
                key.0,
                ptr,
                len,
                c"PXAT".as_ptr(),
                at as c_longlong,
            ),
            Retention::Forever => apply(
                ctx.ptr(),
                c"RL.APPLY".as_ptr(),
                c"sbc".as_ptr(),
                key.0,
                ptr,
                len,
                c"PERSIST".as_ptr(),
            ),
            Retention::Delete => 0,
        };
    }
}

/// Replicate the deletion of `key`.
fn replicate_del(ctx: Ctx, key: Arg) {
    unsafe { api!(RedisModule_Replicate)(ctx.ptr(), c"DEL".as_ptr(), c"s".as_ptr(), key.0) };
}
