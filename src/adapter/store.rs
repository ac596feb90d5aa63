//! Key access and the one call path. A command opens its keys once and
//! reads the clock once in a [`Call`]; every write of the module then goes
//! through [`Call::commit`] (or [`apply_replicated`] on a replica): it
//! prunes each written record where it lives, sets the key's absolute
//! expiry, signals the modification, replicates the *effect* as one
//! command for all the keys of the call (`RL.APPLY key payload <at-ms |
//! PERSIST> [key payload <at-ms | PERSIST>]...`, each payload a whole
//! record or a patch of the parts the call reached, see
//! [`crate::core::patch`]; `DEL key` for a key deleted), never the time-dependent command, so replicas and AOF replays
//! reach the same bytes, and announces a trip or a release.

use std::cell::RefCell;
use std::ops::Range;
use std::os::raw::{c_char, c_int, c_longlong};

use arrayvec::ArrayVec;

use redis_module::raw;

use super::errors;
use super::ffi::{api, notify, now_ms, reply_error, Arg, Ctx, RStr};
use super::rtype::{from_raw, into_raw, rl_type};
use super::stats;
use crate::core::codec;
use crate::core::limits::MAX_BUCKETS;
use crate::core::patch;
use crate::core::patch::PatchPlan;
use crate::core::record::{Record, Retention};
use crate::core::take::KeySet;
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
    /// What the key holds, read once at open and kept up to date by this
    /// key's own writes (nothing else writes it during a command).
    held: Held,
}

/// What an open key holds.
#[derive(Clone, Copy)]
enum Held {
    /// Nothing (no key, or the key could not be opened).
    Nothing,
    /// An rl record, owned by Redis.
    Record(*mut Record),
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
        let raw = unsafe { api!(RedisModule_OpenKey)(ctx.ptr(), name.0, mode as c_int) };
        RlKey {
            raw,
            name,
            created: false,
            held: held_by(raw),
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

    /// The record, writable in place (`None` when the key holds nothing).
    pub fn record_mut(&mut self) -> Result<Option<&mut Record>, WrongType> {
        self.value()
    }

    /// The record to change in place and then commit: the key's own, or
    /// a new empty one put in the key (opened for writing).
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
        match self.held {
            Held::Nothing => Ok(None),
            // Redis owns the value while the key holds it.
            Held::Record(record) => Ok(unsafe { record.as_mut() }),
            Held::Other => Err(WrongType),
        }
    }

    /// Put `record` in the key, in place when it already holds one (which
    /// keeps its TTL until the caller sets a new one); a value of another
    /// type is replaced. Nothing is replicated: [`Call::commit`] the key
    /// before the command ends.
    pub fn store(&mut self, record: Record) {
        match self.value() {
            Ok(Some(existing)) => *existing = record,
            missing_or_other => {
                self.created |= missing_or_other.is_ok();
                let value = into_raw(record);
                let set =
                    unsafe { api!(RedisModule_ModuleTypeSetValue)(self.raw, rl_type(), value) };
                self.held = if set == raw::REDISMODULE_OK as c_int {
                    Held::Record(value.cast::<Record>())
                } else {
                    // Not taken (a key not open for writing): ours to free.
                    drop(unsafe { Box::from_raw(value.cast::<Record>()) });
                    held_by(self.raw)
                };
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

    /// Whether the key has a TTL.
    pub fn has_ttl(&self) -> bool {
        !self.raw.is_null()
            && unsafe { api!(RedisModule_GetExpire)(self.raw) }
                != raw::REDISMODULE_NO_EXPIRE as raw::mstime_t
    }

    fn persist(&self) {
        unsafe {
            api!(RedisModule_SetExpire)(self.raw, raw::REDISMODULE_NO_EXPIRE as raw::mstime_t)
        };
    }

    fn delete(&mut self) {
        unsafe { api!(RedisModule_DeleteKey)(self.raw) };
        self.held = Held::Nothing;
    }

    fn signal_modified(&self, ctx: Ctx) {
        unsafe { api!(RedisModule_SignalModifiedKey)(ctx.ptr(), self.name.0) };
    }
}

/// What the open key `raw` holds (null: nothing).
fn held_by(raw: *mut raw::RedisModuleKey) -> Held {
    if raw.is_null() {
        return Held::Nothing;
    }
    let kind = unsafe { api!(RedisModule_KeyType)(raw) } as isize;
    if kind == raw::REDISMODULE_KEYTYPE_EMPTY {
        return Held::Nothing;
    }
    if kind != raw::REDISMODULE_KEYTYPE_MODULE
        || unsafe { api!(RedisModule_ModuleTypeGetType)(raw) } != rl_type()
    {
        return Held::Other;
    }
    let value = unsafe { api!(RedisModule_ModuleTypeGetValue)(raw) };
    match unsafe { from_raw(value) } {
        Some(record) => Held::Record(record),
        None => Held::Nothing,
    }
}

impl Drop for RlKey {
    fn drop(&mut self) {
        if !self.raw.is_null() {
            unsafe { api!(RedisModule_CloseKey)(self.raw) };
        }
    }
}

/// What a committed call announces to keyspace-notification subscribers
/// (and counts in `INFO`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Event {
    /// The first key's box tripped at this level (`rl.boxed`).
    Boxed { level: u8 },
    /// The first key's box was lifted (`rl.released`).
    Released,
}

/// One command's keys, each opened once, and its clock, read once: the
/// core reads and changes the records where they live, then
/// [`Call::commit`] writes back what changed.
pub struct Call {
    ctx: Ctx,
    keys: ArrayVec<RlKey, MAX_BUCKETS>,
    now: Millis,
    /// Keys given a new record by [`Call::replace`]: always committed.
    replaced: KeySet,
}

impl Call {
    /// A call with no key open yet, its clock read. Open its keys with
    /// [`Call::open`] where the call lives: a `Call` is large (room for
    /// every key), and opening in place spares copying it.
    #[inline]
    pub fn new(ctx: Ctx) -> Call {
        // The clock first: the empty key list is then written in place.
        let now = now_ms(ctx);
        Call {
            ctx,
            now,
            replaced: KeySet::default(),
            keys: ArrayVec::new(),
        }
    }

    /// Open the keys at `positions` of `args`. A key holding another type
    /// is refused with `WRONGTYPE` (already replied), unless
    /// `foreign_ok`: then the caller reads it with [`RlKey::string_value`]
    /// and must [`Call::replace`] it before any other use.
    pub fn open(
        &mut self,
        args: &[Arg],
        positions: &[usize],
        access: Access,
        foreign_ok: bool,
    ) -> Result<(), c_int> {
        let ctx = self.ctx;
        for &pos in positions.iter().take(MAX_BUCKETS) {
            let name = *args
                .get(pos)
                .ok_or_else(|| reply_error(ctx, errors::INTERNAL))?;
            let key = RlKey::open(ctx, name, access);
            if !foreign_ok && key.record().is_err() {
                return Err(reply_error(ctx, errors::WRONGTYPE));
            }
            self.keys.push(key);
        }
        if self.keys.is_empty() {
            return Err(reply_error(ctx, errors::INTERNAL));
        }
        Ok(())
    }

    /// The server time of the call (ms), the same for every step of it.
    pub fn now(&self) -> Millis {
        self.now
    }

    /// The context of the call.
    pub fn ctx(&self) -> Ctx {
        self.ctx
    }

    /// The `i`-th key (0 = the first).
    pub fn key(&self, i: usize) -> Option<&RlKey> {
        self.keys.get(i)
    }

    /// The keys, to read and change their records in place.
    pub fn keys_mut(&mut self) -> &mut [RlKey] {
        &mut self.keys
    }

    /// The record of the `i`-th key, if it holds one.
    pub fn record(&self, i: usize) -> Option<&Record> {
        self.keys.get(i)?.record().ok().flatten()
    }

    /// The record of the `i`-th key to change in place (created empty when
    /// the key holds none): [`Call::commit`] it then.
    pub fn edit(&mut self, i: usize) -> Option<&mut Record> {
        self.keys.get_mut(i)?.edit().ok()
    }

    /// Put `record` in the `i`-th key, whatever it held (a redis-cell
    /// value converted); the next [`Call::commit`] writes it, whatever else
    /// it writes.
    pub fn replace(&mut self, i: usize, record: Record) {
        if let Some(key) = self.keys.get_mut(i) {
            key.store(record);
            self.replaced.insert(i);
        }
    }

    /// Commit the records of the `written` keys as their states at the
    /// call's time: drop what no longer matters in each, delete a key when
    /// nothing does, otherwise set the TTL of its longest-lived part; then
    /// replicate exactly that, every kept key in one `RL.APPLY` (a key
    /// deleted replicates as `DEL`), and announce `event` on the first key.
    pub fn commit(&mut self, written: KeySet, event: Option<Event>) {
        let (ctx, now) = (self.ctx, self.now);
        let replaced = std::mem::take(&mut self.replaced);
        let written = written.union(replaced);
        with_buffer(|payloads| {
            let mut applied = AppliedKeys::new();
            for (i, key) in self
                .keys
                .iter_mut()
                .enumerate()
                .filter(|(i, _)| written.contains(*i))
            {
                let Ok(Some(record)) = key.value() else {
                    continue;
                };
                let at = match record.prune(now) {
                    Retention::Delete => {
                        // The type's `free` gets the pruned record, so the
                        // leases just swept are not counted a second time.
                        key.delete();
                        if !key.created {
                            replicate_del(ctx, key.name);
                            key.signal_modified(ctx);
                        }
                        continue;
                    }
                    Retention::Until(at) => Some(at),
                    Retention::Forever => None,
                };
                let start = payloads.len();
                // A record new to the replica goes whole; otherwise the
                // parts the call did not reach stay the replica's own.
                let plan = if key.created || replaced.contains(i) {
                    PatchPlan::default()
                } else {
                    record.patch_plan(now)
                };
                if plan.unchanged.is_empty() {
                    codec::encode_append(record, payloads);
                } else {
                    patch::encode_patch_append(record, &plan, now, payloads);
                }
                record.clear_touched();
                // A call has at most MAX_BUCKETS keys, so this always fits.
                let _ = applied.try_push((key.name, start..payloads.len(), at));
                match at {
                    Some(at) => {
                        key.expire_at(at);
                    }
                    None => key.persist(),
                }
                key.signal_modified(ctx);
            }
            replicate_applied(ctx, &applied, payloads);
        });
        let Some(first) = self.keys.first() else {
            return;
        };
        match event {
            Some(Event::Boxed { level }) => {
                notify(ctx, c"rl.boxed", first.name);
                stats::trip(level);
            }
            Some(Event::Released) => notify(ctx, c"rl.released", first.name),
            None => {}
        }
    }
}

/// The keys of one `RL.APPLY`: name, payload (a range of the shared
/// buffer) and absolute expiry (`None`: no expiry).
type AppliedKeys = ArrayVec<(Arg, Range<usize>, Option<Millis>), MAX_BUCKETS>;

/// What a replicated `RL.APPLY` says about the key's expiry.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ReplicatedExpiry {
    /// Expire at this absolute time (ms).
    At(Millis),
    /// `PERSIST`: no expiry (a manual box).
    Persist,
    /// Not given (the form written by older builds, followed by its own
    /// `PEXPIREAT` or `PERSIST`): leave the expiry alone.
    Unchanged,
}

/// Apply a replicated value (decoded and checked) on a replica or during
/// AOF loading, and, when the command carries it, its absolute expiry.
pub fn apply_replicated(ctx: Ctx, key: &mut RlKey, record: Record, expiry: ReplicatedExpiry) {
    key.store(record);
    match expiry {
        ReplicatedExpiry::At(at) => key.expire_at_exactly(ctx, at),
        ReplicatedExpiry::Persist => key.persist(),
        ReplicatedExpiry::Unchanged => {}
    }
    key.signal_modified(ctx);
}

/// Run `body` with a buffer reused across calls (the server runs commands
/// on one thread), so a write allocates nothing once warm.
fn with_buffer<T>(body: impl FnOnce(&mut Vec<u8>) -> T) -> T {
    /// Larger buffers (a key with many leases) are not kept.
    const KEEP_CAPACITY: usize = 64 * 1024;
    thread_local! {
        static BUFFER: RefCell<Vec<u8>> = const { RefCell::new(Vec::new()) };
    }
    BUFFER.with(|cell| match cell.try_borrow_mut() {
        Ok(mut buf) => {
            buf.clear();
            let out = body(&mut buf);
            if buf.capacity() > KEEP_CAPACITY {
                *buf = Vec::new();
            }
            out
        }
        Err(_) => body(&mut Vec::new()),
    })
}

/// Replicate `RL.APPLY key payload expiry [key payload expiry]...` for the
/// `applied` keys (nothing when there are none); `expiry` is the absolute
/// ms time or `PERSIST`.
fn replicate_applied(ctx: Ctx, applied: &AppliedKeys, payloads: &[u8]) {
    if let [(name, range, at)] = applied.as_slice() {
        // One key (the common call): the server builds the arguments from a
        // format, with no string of ours to create and free.
        let payload = payloads.get(range.clone()).unwrap_or_default();
        let (ptr, len) = (payload.as_ptr().cast::<c_char>(), payload.len());
        let replicate = api!(RedisModule_Replicate);
        unsafe {
            match at {
                Some(at) => replicate(
                    ctx.ptr(),
                    c"RL.APPLY".as_ptr(),
                    c"sbl".as_ptr(),
                    name.0,
                    ptr,
                    len,
                    *at as c_longlong,
                ),
                None => replicate(
                    ctx.ptr(),
                    c"RL.APPLY".as_ptr(),
                    c"sbc".as_ptr(),
                    name.0,
                    ptr,
                    len,
                    c"PERSIST".as_ptr(),
                ),
            };
        }
        return;
    }
    if applied.is_empty() {
        return;
    }
    let create = api!(RedisModule_CreateString);
    let mut argv: ArrayVec<RStr, { 3 * MAX_BUCKETS }> = ArrayVec::new();
    let mut created: ArrayVec<RStr, { 2 * MAX_BUCKETS }> = ArrayVec::new();
    for (name, range, at) in applied {
        let payload = payloads.get(range.clone()).unwrap_or_default();
        let expiry = match at {
            Some(at) => unsafe { api!(RedisModule_CreateStringFromLongLong)(ctx.ptr(), *at) },
            None => unsafe { create(ctx.ptr(), c"PERSIST".as_ptr(), 7) },
        };
        let payload =
            unsafe { create(ctx.ptr(), payload.as_ptr().cast::<c_char>(), payload.len()) };
        argv.push(name.0);
        argv.push(payload);
        argv.push(expiry);
        created.push(payload);
        created.push(expiry);
    }
    unsafe {
        api!(RedisModule_Replicate)(
            ctx.ptr(),
            c"RL.APPLY".as_ptr(),
            c"v".as_ptr(),
            argv.as_mut_ptr(),
            argv.len(),
        );
        for s in created {
            api!(RedisModule_FreeString)(ctx.ptr(), s);
        }
    }
}

/// Replicate the deletion of `key`.
fn replicate_del(ctx: Ctx, key: Arg) {
    unsafe { api!(RedisModule_Replicate)(ctx.ptr(), c"DEL".as_ptr(), c"s".as_ptr(), key.0) };
}
