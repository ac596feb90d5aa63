//! An open key: what it holds, read once at open, and the one place a
//! record is put into Redis ([`RlKey::store`]). A key whose record has a
//! compact form keeps that in Redis (a bare bucket, a bucket with a
//! penalty: see [`super::value`]); while the key is open its record is a
//! copy beside it, written back by [`super::store::Call::commit`]. The
//! value itself is reached only through [`super::value`]'s safe API.

use super::ffi::key::{pexpireat, signal_modified, KeyHandle};
use super::ffi::{clock_ms, Arg, Ctx};
use super::value::{self, Holding, Lent, Value};
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
/// Invariants the `unsafe` blocks below (the value owner's calls) rest on:
/// `handle` is open until the key drops (a [`KeyHandle`]); `held` says what
/// the key holds now, and the [`Lent`] in it is the key's value, which
/// Redis owns and keeps while the key holds it. Nothing but this `RlKey`
/// changes the key while the command runs (a command's keys are distinct:
/// the parsers refuse a key given twice), and every write it makes updates
/// `held`; so the `Lent` in `held` is valid, and borrowing `self` is the
/// only way to reach it.
pub struct RlKey {
    handle: KeyHandle,
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
    /// The expiry the call that stored the key's record left it with,
    /// where the record tells it for certain ([`Record::steady_until`],
    /// noted by [`RlKey::note_steady_until`] before this call changes the
    /// record); `None` when unknown, and after any [`RlKey::store`].
    steady_until: Option<Millis>,
}

/// What an open key holds.
enum Held {
    /// Nothing (no key, or the key could not be opened).
    Nothing,
    /// A value of the type, owned by Redis: a whole record is read and
    /// changed where it lives; of a compact form, the key's `local` record
    /// holds a copy.
    Value(Lent),
    /// A record made in this call and not in Redis yet: the key's `local`.
    Pending,
    /// A value of another type.
    Other,
}

impl RlKey {
    /// Open `name` in the selected database.
    #[inline]
    pub fn open(ctx: Ctx, name: Arg, access: Access) -> RlKey {
        let handle = KeyHandle::open(ctx, name, access == Access::Write);
        // SAFETY: the handle just opened, kept open by the key until it
        // drops; the `Lent` goes into `held` (the invariants of `RlKey`).
        let held = Held::from(unsafe { value::held_by(&handle) });
        let local = copy_of_compact(&held);
        RlKey {
            handle,
            name,
            created: false,
            held,
            local,
            steady_until: None,
        }
    }

    /// Note the expiry the key holds from the call that stored its record,
    /// when the record tells it ([`Record::steady_until`]): read before
    /// this call changes the record.
    pub(super) fn note_steady_until(&mut self, now: Millis) {
        self.steady_until = match self.record() {
            Ok(Some(record)) => record.steady_until(now),
            _ => None,
        };
    }

    /// The expiry noted by [`RlKey::note_steady_until`], if still known.
    pub(super) fn steady_until(&self) -> Option<Millis> {
        self.steady_until
    }

    /// Replace `local`, keeping its penalty's allocation for the next key.
    fn set_local(&mut self, record: Record) {
        self.recycle_local_penalty();
        self.local = record;
    }

    /// Keep `local`'s penalty allocation, if any, for the next key.
    fn recycle_local_penalty(&mut self) {
        value::recycle_penalty(&mut self.local);
    }

    /// The record held by the key: `None` when the key does not exist,
    /// `WrongType` when it holds another type.
    pub fn record(&self) -> Result<Option<&Record>, WrongType> {
        match &self.held {
            Held::Nothing => Ok(None),
            Held::Value(lent) => Ok(Some(lent.get().record().unwrap_or(&self.local))),
            Held::Pending => Ok(Some(&self.local)),
            Held::Other => Err(WrongType),
        }
    }

    /// The bytes of a string value (`None` for any other type or no key):
    /// used to read the value of another limiter (redis-cell) to convert.
    pub fn string_value(&self) -> Option<&[u8]> {
        self.handle.string_value()
    }

    /// The record, writable in place (`None` when the key holds nothing).
    /// A change reaches Redis when the key is committed (a record in Redis
    /// is changed where it lives; a bare bucket or a new record is written
    /// back).
    pub fn record_mut(&mut self) -> Result<Option<&mut Record>, WrongType> {
        match &mut self.held {
            Held::Nothing => Ok(None),
            Held::Value(lent) => Ok(Some(match lent.get_mut().record_mut() {
                Some(record) => record,
                None => &mut self.local,
            })),
            Held::Pending => Ok(Some(&mut self.local)),
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
        // A value put anew may drop the key's expiry.
        self.steady_until = None;
        let record = match &mut self.held {
            Held::Value(lent) => match lent.write(record) {
                Ok(kept) => {
                    if let Some(kept) = kept {
                        self.set_local(kept);
                    }
                    return;
                }
                // Another form now: it replaces the one the key holds.
                Err(record) => {
                    let (new, kept) = Value::of(record);
                    // SAFETY: the key holds a value of ours, so its handle
                    // is open; the `Lent` of the old value in `held` is
                    // replaced next, unused.
                    let lent = unsafe { value::replace(&self.handle, new) };
                    self.adopt(lent, kept);
                    return;
                }
            },
            Held::Nothing | Held::Pending => {
                self.created = true;
                record
            }
            Held::Other => record,
        };
        let (new, kept) = Value::of(record);
        let lent = if self.handle.is_open() {
            // SAFETY: the handle is open, holding no value of ours (`held`
            // says so), so no `Lent` borrows one.
            unsafe { value::set(&self.handle, new) }
        } else {
            None
        };
        self.adopt(lent, kept);
    }

    /// Hold `lent`, just put in the key (`None`: Redis did not take it, and
    /// the key holds what it held); `kept` is the record of a compact
    /// value (its copy beside the key).
    fn adopt(&mut self, lent: Option<Lent>, kept: Option<Record>) {
        let Some(lent) = lent else {
            // SAFETY: the `Lent` goes into `held`, replacing the old one
            // (the invariants of `RlKey`).
            self.held = Held::from(unsafe { value::held_by(&self.handle) });
            let local = copy_of_compact(&self.held);
            self.set_local(local);
            return;
        };
        self.held = Held::Value(lent);
        let local = match kept {
            Some(record) => record,
            None => copy_of_compact(&self.held),
        };
        self.set_local(local);
    }

    /// Put a record changed beside the key (a compact form's, a new one's)
    /// in Redis; a record in Redis was changed where it lives.
    pub fn write_back(&mut self) {
        let compact = |lent: &Lent| lent.get().record().is_none();
        match &self.held {
            Held::Value(lent) if !compact(lent) => {}
            Held::Value(_) | Held::Pending => {
                let record = std::mem::take(&mut self.local);
                self.store(record);
            }
            Held::Nothing | Held::Other => {}
        }
    }

    /// Set the key's expiry to the absolute time `at` (ms), exactly: a
    /// replica receives the same `at` and must end with the same
    /// `PEXPIRETIME`. A server without `RM_SetAbsExpire` (before Redis
    /// 6.2.2) has only a relative `RM_SetExpire`: then the clock is read
    /// around it until no millisecond boundary was crossed.
    /// Returns whether the expiry is exactly `at` (always, unless `at` is
    /// not in the future or the clock kept moving).
    pub(super) fn expire_at(&self, at: Millis) -> bool {
        if !self.handle.is_open() {
            return false;
        }
        if self.handle.set_abs_expire(at) {
            return true;
        }
        for _ in 0..8 {
            let before = clock_ms();
            self.handle
                .set_expire(Some(at.saturating_sub(before).max(0)));
            if clock_ms() == before {
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
        if !self.expire_at(at) {
            pexpireat(ctx, self.name, at);
        }
    }

    /// The key's absolute expiry in ms, `None` without a TTL (or where the
    /// server cannot tell).
    pub(super) fn expires_at(&self) -> Option<Millis> {
        self.handle.abs_expire()
    }

    /// The key's remaining time to live in ms, `None` without a TTL.
    pub fn pttl_ms(&self) -> Option<u64> {
        self.handle.expire_ms()
    }

    /// Remove the key's expiry.
    pub(super) fn persist(&self) {
        self.handle.set_expire(None);
    }

    /// Delete the key (a record made in this call is only dropped).
    pub(super) fn delete(&mut self) {
        if !matches!(self.held, Held::Pending) {
            self.handle.delete();
        }
        self.held = Held::Nothing;
        self.set_local(Record::default());
    }

    /// Tell Redis the key changed.
    pub(super) fn signal_modified(&self, ctx: Ctx) {
        signal_modified(ctx, self.name);
    }
}

impl From<Holding> for Held {
    fn from(holding: Holding) -> Held {
        match holding {
            Holding::Nothing => Held::Nothing,
            Holding::Ours(lent) => Held::Value(lent),
            Holding::Other => Held::Other,
        }
    }
}

/// The record a key holding `held` keeps beside it: a copy of its compact
/// form, or nothing.
fn copy_of_compact(held: &Held) -> Record {
    match held {
        Held::Value(lent) => lent.get().compact_record().unwrap_or_default(),
        Held::Nothing | Held::Pending | Held::Other => Record::default(),
    }
}

impl Drop for RlKey {
    fn drop(&mut self) {
        self.recycle_local_penalty();
    }
}
