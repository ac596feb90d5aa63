//! An open key: what it holds, read once at open, and the one place a
//! record is put into Redis ([`RlKey::store`]). A key whose record has a
//! compact form keeps that in Redis (a bare bucket, a bucket with a
//! penalty: see [`super::rtype`]); while the key is open its record is a
//! copy beside it, written back by [`super::store::Call::commit`].

use std::cell::Cell;

use std::ffi::c_void;
use std::os::raw::{c_int, c_longlong};

use redis_module::raw;

use super::ffi::{api, Arg, Ctx};
use super::rtype::{compact_value, free_value, from_raw, into_raw, rl_type, Stored};
use crate::core::bucket::Bucket;
use crate::core::packed::BucketWithPenalty;
use crate::core::penalty::Penalty;
use crate::core::record::Record;
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
///
/// Invariants the `unsafe` blocks below rest on: `raw` is the handle
/// `RM_OpenKey` returned in the running command's context (null for a
/// missing key opened only to read), open until `drop`; `held` says what
/// the key holds now, and a pointer in it is the key's value, which Redis
/// owns and keeps while the key holds it. Nothing but this `RlKey` changes
/// the key while the command runs (a command's keys are distinct: the
/// parsers refuse a key given twice), and every write it makes updates
/// `held`; so a pointer in `held` is valid, and borrowing `self` is the
/// only way to reach what it points to.
pub struct RlKey {
    raw: *mut raw::RedisModuleKey,
    /// The key name as Redis gave it.
    pub name: Arg,
    /// The record was created by [`RlKey::edit`] in this call: the key did
    /// not exist before, so deleting it again is not an effect.
    created: bool,
    /// What the key holds, read once at open and kept up to date by this
    /// key's own writes (nothing else writes it during a command).
    held: Held,
    /// The record of a key held in a compact form, or not stored yet: the
    /// core reads and changes it here, and [`RlKey::write_back`] puts it in
    /// Redis.
    local: Record,
}

/// What an open key holds.
#[derive(Clone, Copy)]
enum Held {
    /// Nothing (no key, or the key could not be opened).
    Nothing,
    /// An rl record, owned by Redis, read and changed where it lives.
    Record(*mut Record),
    /// A bare bucket, owned by Redis; the key's `local` record holds a copy.
    Bucket(*mut Bucket),
    /// A bucket with a penalty, owned by Redis; `local` holds a copy.
    BucketWithPenalty(*mut BucketWithPenalty),
    /// A record made in this call and not in Redis yet: the key's `local`.
    Pending,
    /// A value of another type.
    Other,
}

impl RlKey {
    /// Open `name` in the selected database.
    pub fn open(ctx: Ctx, name: Arg, access: Access) -> RlKey {
        let mode = match access {
            Access::Read => raw::REDISMODULE_READ,
            Access::Write => raw::REDISMODULE_READ | raw::REDISMODULE_WRITE,
        };
        // SAFETY: `ctx` is the context of the running command and `name` a
        // string Redis passed to it; the handle is closed by `drop`.
        let raw = unsafe { api!(RedisModule_OpenKey)(ctx.ptr(), name.0, mode as c_int) };
        let held = held_by(raw);
        RlKey {
            raw,
            name,
            created: false,
            held,
            local: copy_of_compact(held),
        }
    }

    /// Replace `local`, keeping its penalty's allocation for the next key.
    fn set_local(&mut self, record: Record) {
        self.recycle_local_penalty();
        self.local = record;
    }

    /// Keep `local`'s penalty allocation, if any, for the next key.
    fn recycle_local_penalty(&mut self) {
        if let Some(spare) = self.local.penalty.take() {
            SPARE_PENALTY.set(Some(spare));
        }
    }

    /// Write `record` into the compact form the key holds, when it has that
    /// form.
    fn write_compact(&mut self, record: &Record) -> bool {
        match self.held {
            // SAFETY: `bare` is the key's value (the invariants of
            // `RlKey`), reached only through `&mut self`.
            Held::Bucket(bare) => match (record.bare_bucket(), unsafe { bare.as_mut() }) {
                (Some(bucket), Some(bare)) => *bare = bucket,
                _ => return false,
            },
            Held::BucketWithPenalty(both) => {
                // SAFETY: as above.
                match (BucketWithPenalty::of(record), unsafe { both.as_mut() }) {
                    (Some(packed), Some(both)) => *both = packed,
                    _ => return false,
                }
            }
            Held::Nothing | Held::Record(_) | Held::Pending | Held::Other => return false,
        }
        true
    }

    /// The record held by the key: `None` when the key does not exist,
    /// `WrongType` when it holds another type.
    pub fn record(&self) -> Result<Option<&Record>, WrongType> {
        match self.held {
            Held::Nothing => Ok(None),
            // SAFETY: `record` is the key's value (the invariants of
            // `RlKey`); the borrow of `self` bounds the reference.
            Held::Record(record) => Ok(unsafe { record.as_ref() }),
            Held::Bucket(_) | Held::BucketWithPenalty(_) | Held::Pending => Ok(Some(&self.local)),
            Held::Other => Err(WrongType),
        }
    }

    /// The bytes of a string value (`None` for any other type or no key):
    /// used to read the value of another limiter (redis-cell) to convert.
    pub fn string_value(&self) -> Option<&[u8]> {
        if self.raw.is_null() {
            return None;
        }
        // SAFETY: `self.raw` is an open, non-null key handle.
        let kind = unsafe { api!(RedisModule_KeyType)(self.raw) } as isize;
        if kind != raw::REDISMODULE_KEYTYPE_STRING {
            return None;
        }
        let mut len = 0usize;
        // SAFETY: an open, non-null handle of a string key, read only;
        // `len` is a valid place for the length.
        let ptr = unsafe {
            api!(RedisModule_StringDMA)(self.raw, &mut len, raw::REDISMODULE_READ as c_int)
        };
        if ptr.is_null() {
            return None;
        }
        // SAFETY: Redis returned the string's `len` bytes at `ptr`, valid
        // while the key is open and unmodified: the borrow of `self` keeps
        // it open, and changing the key takes `&mut self`.
        Some(unsafe { std::slice::from_raw_parts(ptr.cast::<u8>(), len) })
    }

    /// The record, writable in place (`None` when the key holds nothing).
    /// A change reaches Redis when the key is committed (a record in Redis
    /// is changed where it lives; a bare bucket or a new record is written
    /// back).
    pub fn record_mut(&mut self) -> Result<Option<&mut Record>, WrongType> {
        match self.held {
            Held::Nothing => Ok(None),
            // SAFETY: `record` is the key's value (the invariants of
            // `RlKey`), reached only through this `&mut self`.
            Held::Record(record) => Ok(unsafe { record.as_mut() }),
            Held::Bucket(_) | Held::BucketWithPenalty(_) | Held::Pending => {
                Ok(Some(&mut self.local))
            }
            Held::Other => Err(WrongType),
        }
    }

    /// The record to change in place and then commit: the key's own, or
    /// a new empty one (stored when committed).
    pub fn edit(&mut self) -> Result<&mut Record, WrongType> {
        if matches!(self.held, Held::Nothing) {
            // `local` is empty unless the key holds a compact form or a
            // pending record.
            self.held = Held::Pending;
            self.created = true;
        }
        self.record_mut()?.ok_or(WrongType)
    }

    /// Whether the record did not exist before this call (made by
    /// [`RlKey::edit`] or stored into a missing key): deleting it again
    /// is not an effect.
    pub fn created(&self) -> bool {
        self.created
    }

    /// Put `record` in the key now: in place when the key holds a whole
    /// record, or the compact form `record` has (either keeps the key's
    /// TTL until the caller sets a new one); otherwise in its compact form
    /// when it has one, replacing what the key holds (a value of another
    /// type too). Nothing is replicated: [`super::store::Call::commit`]
    /// the key before the command ends.
    pub fn store(&mut self, record: Record) {
        match self.held {
            Held::Record(existing) => {
                // SAFETY: `existing` is the key's value (the invariants of
                // `RlKey`), reached only through `&mut self`.
                if let Some(existing) = unsafe { existing.as_mut() } {
                    *existing = record;
                    return;
                }
            }
            Held::Bucket(_) | Held::BucketWithPenalty(_) => {
                if self.write_compact(&record) {
                    self.set_local(record);
                    return;
                }
                // Another form now: it replaces the one the key holds.
                let (value, kept) = value_of(record);
                let mut old = std::ptr::null_mut();
                // SAFETY: the key holds a value of ours, so `self.raw` is an
                // open, non-null handle; `value` is a fresh value of the
                // type, `old` a place for the one it replaces.
                let replaced = unsafe {
                    api!(RedisModule_ModuleTypeReplaceValue)(self.raw, rl_type(), value, &mut old)
                };
                // Ours to free: the value Redis gave back, or the one it
                // did not take.
                if replaced == raw::REDISMODULE_OK as c_int {
                    // SAFETY: Redis gave `old` back: a value of ours that
                    // nothing owns anymore (`held` is updated next).
                    unsafe { free_value(old) };
                    self.adopt(value, kept);
                } else {
                    // SAFETY: Redis did not take `value`: still only ours.
                    unsafe { free_value(value) };
                    self.set_local(copy_of_compact(self.held));
                }
                return;
            }
            Held::Nothing | Held::Pending => self.created = true,
            Held::Other => {}
        }
        let (value, kept) = value_of(record);
        let set = if self.raw.is_null() {
            raw::REDISMODULE_ERR as c_int
        } else {
            // SAFETY: `self.raw` is an open, non-null handle (Redis refuses
            // the value if it is not open for writing); `value` is a fresh
            // value of the registered type.
            unsafe { api!(RedisModule_ModuleTypeSetValue)(self.raw, rl_type(), value) }
        };
        if set == raw::REDISMODULE_OK as c_int {
            self.adopt(value, kept);
        } else {
            // SAFETY: not taken (a key not open for writing): `value` is
            // still only ours.
            unsafe { free_value(value) };
            self.held = held_by(self.raw);
            self.set_local(copy_of_compact(self.held));
        }
    }

    /// Hold `value`, just put in the key; `kept` is the record of a compact
    /// value (its copy beside the key).
    fn adopt(&mut self, value: *mut c_void, kept: Option<Record>) {
        // SAFETY: `value` came from `value_of` and the key now holds it.
        self.held = held_as(unsafe { from_raw(value) });
        let local = match kept {
            Some(record) => record,
            None => copy_of_compact(self.held),
        };
        self.set_local(local);
    }

    /// Put a record changed beside the key (a compact form's, a new one's)
    /// in Redis; a record in Redis was changed where it lives.
    pub fn write_back(&mut self) {
        match self.held {
            Held::Bucket(_) | Held::BucketWithPenalty(_) | Held::Pending => {
                let record = std::mem::take(&mut self.local);
                self.store(record);
            }
            Held::Nothing | Held::Record(_) | Held::Other => {}
        }
    }

    /// Set the key's expiry to the absolute time `at` (ms), exactly: a
    /// replica receives the same `at` and must end with the same
    /// `PEXPIRETIME`. Redis 7.0 has only a relative `RM_SetExpire`, so the
    /// clock is read around it until no millisecond boundary was crossed.
    /// Returns whether the expiry is exactly `at` (always, unless `at` is
    /// not in the future or the clock kept moving).
    pub(super) fn expire_at(&self, at: Millis) -> bool {
        if self.raw.is_null() {
            return false;
        }
        // SAFETY: written once by `RedisModule_Init` at load (null where
        // the server lacks the API), only read afterwards; a copy.
        if let Some(set_abs) = unsafe { raw::RedisModule_SetAbsExpire } {
            // SAFETY: `self.raw` is an open, non-null key handle (Redis
            // checks that it is writable and holds a value).
            unsafe { set_abs(self.raw, at) };
            return true;
        }
        let clock = api!(RedisModule_Milliseconds);
        let set = api!(RedisModule_SetExpire);
        for _ in 0..8 {
            // SAFETY: takes no argument.
            let before = unsafe { clock() };
            // SAFETY: `self.raw` is an open, non-null key handle.
            unsafe { set(self.raw, at.saturating_sub(before).max(0)) };
            // SAFETY: takes no argument.
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
    pub(super) fn expire_at_exactly(&self, ctx: Ctx, at: Millis) {
        if self.expire_at(at) {
            return;
        }
        // SAFETY: `ctx` is the context of the running command; format `sl`
        // takes the key name Redis passed (a string) and a long long; the
        // reply, when there is one, is ours and freed once.
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

    /// The key's remaining time to live in ms, `None` without a TTL.
    pub fn pttl_ms(&self) -> Option<u64> {
        if self.raw.is_null() {
            return None;
        }
        // SAFETY: `raw` is a non-null key handle this call opened and has
        // not closed.
        let ttl = unsafe { api!(RedisModule_GetExpire)(self.raw) };
        if ttl == raw::REDISMODULE_NO_EXPIRE as raw::mstime_t {
            return None;
        }
        u64::try_from(ttl).ok()
    }

    pub(super) fn persist(&self) {
        if self.raw.is_null() {
            return;
        }
        // SAFETY: `self.raw` is an open, non-null key handle (Redis checks
        // that it is writable and holds a value).
        unsafe {
            api!(RedisModule_SetExpire)(self.raw, raw::REDISMODULE_NO_EXPIRE as raw::mstime_t)
        };
    }

    pub(super) fn delete(&mut self) {
        if !matches!(self.held, Held::Pending) && !self.raw.is_null() {
            // SAFETY: `self.raw` is an open, non-null key handle (Redis
            // checks that it is writable); `held` is cleared next.
            unsafe { api!(RedisModule_DeleteKey)(self.raw) };
        }
        self.held = Held::Nothing;
        self.set_local(Record::default());
    }

    pub(super) fn signal_modified(&self, ctx: Ctx) {
        // SAFETY: `ctx` is the context of the running command and the name
        // a string Redis passed to it.
        unsafe { api!(RedisModule_SignalModifiedKey)(ctx.ptr(), self.name.0) };
    }
}

/// What the open key `raw` holds (null: nothing).
fn held_by(raw: *mut raw::RedisModuleKey) -> Held {
    if raw.is_null() {
        return Held::Nothing;
    }
    // SAFETY: `raw` is an open, non-null key handle.
    let kind = unsafe { api!(RedisModule_KeyType)(raw) } as isize;
    if kind == raw::REDISMODULE_KEYTYPE_EMPTY {
        return Held::Nothing;
    }
    if kind != raw::REDISMODULE_KEYTYPE_MODULE
        // SAFETY: as above, a key holding a module value.
        || unsafe { api!(RedisModule_ModuleTypeGetType)(raw) } != rl_type()
    {
        return Held::Other;
    }
    // SAFETY: as above, a key holding a value of our type.
    let value = unsafe { api!(RedisModule_ModuleTypeGetValue)(raw) };
    // SAFETY: a value of our type is made by `into_raw`/`compact_value`
    // (every path that puts one in Redis), and the key owns it.
    held_as(unsafe { from_raw(value) })
}

/// `record` as a type value, and the record itself when the value is its
/// compact form (for the key to keep beside it).
fn value_of(record: Record) -> (*mut c_void, Option<Record>) {
    match compact_value(&record) {
        Some(compact) => (compact, Some(record)),
        None => (into_raw(record), None),
    }
}

/// The record a key holding `held` keeps beside it: a copy of its compact
/// form, or nothing.
fn copy_of_compact(held: Held) -> Record {
    match held {
        // SAFETY: the pointer is the value of the key that holds `held`
        // (the invariants of `RlKey`), read to copy it.
        Held::Bucket(bucket) => match unsafe { bucket.as_ref() } {
            Some(bucket) => Record::with_bucket(*bucket),
            None => Record::default(),
        },
        // SAFETY: as above.
        Held::BucketWithPenalty(both) => match unsafe { both.as_ref() } {
            Some(both) => {
                let mut record = Record::with_bucket(both.bucket);
                record.penalty = Some(boxed_penalty(both.penalty.unpack()));
                record
            }
            None => Record::default(),
        },
        Held::Nothing | Held::Record(_) | Held::Pending | Held::Other => Record::default(),
    }
}

/// What a key holding `stored` holds.
fn held_as(stored: Option<Stored>) -> Held {
    match stored {
        Some(Stored::Record(record)) => Held::Record(record),
        Some(Stored::Bucket(bucket)) => Held::Bucket(bucket),
        Some(Stored::BucketWithPenalty(both)) => Held::BucketWithPenalty(both),
        None => Held::Nothing,
    }
}

thread_local! {
    /// One penalty allocation kept from the last key that held a bucket
    /// with a penalty, for the next (the server runs commands on one
    /// thread): opening such a key then allocates nothing.
    static SPARE_PENALTY: Cell<Option<Box<Penalty>>> = const { Cell::new(None) };
}

/// `penalty` boxed, in the spare allocation when there is one.
fn boxed_penalty(penalty: Penalty) -> Box<Penalty> {
    match SPARE_PENALTY.take() {
        Some(mut spare) => {
            *spare = penalty;
            spare
        }
        None => Box::new(penalty),
    }
}

impl Drop for RlKey {
    fn drop(&mut self) {
        self.recycle_local_penalty();
        if !self.raw.is_null() {
            // SAFETY: the handle `open` returned, closed only here.
            unsafe { api!(RedisModule_CloseKey)(self.raw) };
        }
    }
}
