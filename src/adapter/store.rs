//! The one call path. A command opens its keys once (each an [`RlKey`],
//! see [`super::key`]) and reads the clock once in a [`Call`]; every write
//! of the module then goes through [`Call::commit`] (or
//! [`apply_replicated`] on a replica): it prunes each written record where
//! it lives, puts it in Redis, sets the key's absolute expiry, signals the
//! modification, replicates the *effect* as one command for all the keys
//! of the call (`RL.APPLY key payload <at-ms | PERSIST> [key payload
//! <at-ms | PERSIST>]...`, or `RL.APPLY key payload` for one key whose
//! expiry stayed, each payload a whole record or a patch of the parts the
//! call reached, see [`crate::core::patch`]; `DEL key` for a key
//! deleted), never the time-dependent command, so replicas and AOF
//! replays reach the same bytes, and announces a trip or a release.

use std::cell::RefCell;
use std::ffi::CStr;
use std::ops::Range;
use std::os::raw::c_int;

use arrayvec::ArrayVec;

use super::errors;
use super::ffi::replicate::{replicate_applied, replicate_del, Expiry};
use super::ffi::{notify, now_ms, reply_error, Arg, Ctx};
use super::stats;
use crate::core::codec;
use crate::core::limits::MAX_BUCKETS;
use crate::core::patch;
use crate::core::patch_plan::PatchPlan;
use crate::core::record::{Record, Retention};
use crate::core::take::KeySet;

pub use super::key::{Access, RlKey, WrongType};
use crate::core::time::Millis;

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
    /// The keys' expiries usually stay where the previous call set them
    /// ([`Call::expect_steady_expiry`]).
    steady_expiry: bool,
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
            steady_expiry: false,
            keys: ArrayVec::new(),
        }
    }

    /// Say that the keys' expiries usually stay where the previous call
    /// set them (`Limiter::steady_expiry`), before the call changes any
    /// record: [`Call::commit`] then sets a stored key's expiry only when
    /// it moved, and does not replicate it when it did not. Where the
    /// key's record tells the expiry it was left with
    /// ([`RlKey::note_steady_until`], noted here), nothing is read;
    /// otherwise the commit reads the key's expiry (a read costs Redis 7.4
    /// about 60% of a write, 7.0 about the same).
    pub fn expect_steady_expiry(&mut self) {
        self.steady_expiry = true;
        let now = self.now;
        for key in &mut self.keys {
            key.note_steady_until(now);
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
        let (ctx, now, steady) = (self.ctx, self.now, self.steady_expiry);
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
                let created = key.created();
                let Ok(Some(record)) = key.record_mut() else {
                    continue;
                };
                let at = match record.prune(now) {
                    Retention::Delete => {
                        // The type's `free` gets the pruned record, so the
                        // leases just swept are not counted a second time.
                        key.delete();
                        if !created {
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
                let plan = if created || replaced.contains(i) {
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
                // In Redis before its expiry is set.
                key.write_back();
                // Read after the write back, which may have replaced the
                // value (and dropped its expiry: then nothing is noted,
                // nor for a value put anew by `replace`).
                let noted = if replaced.contains(i) {
                    None
                } else {
                    key.steady_until()
                };
                let kept = |at| match noted {
                    Some(was) => was == at,
                    None => key.expires_at() == Some(at),
                };
                let expiry = match at {
                    Some(at) if steady && !created && kept(at) => Expiry::Kept(at),
                    Some(at) => {
                        key.expire_at(at);
                        Expiry::At(at)
                    }
                    None => {
                        key.persist();
                        Expiry::Persist
                    }
                };
                // A call has at most MAX_BUCKETS keys, so this always fits.
                let _ = applied.try_push((key.name, start..payloads.len(), expiry));
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

impl Call {
    /// Announce `event` on each of the `keys` (after [`Call::commit`]).
    pub fn announce(&self, keys: KeySet, event: &CStr) {
        for (_, key) in self
            .keys
            .iter()
            .enumerate()
            .filter(|(i, _)| keys.contains(*i))
        {
            notify(self.ctx, event, key.name);
        }
    }
}

/// The keys of one `RL.APPLY`: name, payload (a range of the shared
/// buffer) and expiry.
type AppliedKeys = ArrayVec<(Arg, Range<usize>, Expiry), MAX_BUCKETS>;

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
