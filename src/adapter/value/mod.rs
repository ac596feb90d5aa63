//! The value of an RL key, owned here alone. What Redis keeps for a key of
//! the type `rl-record` ([`rtype`]) is one pointer: to a whole [`Record`],
//! or to the compact form of one (see [`crate::core::packed`]): a key that
//! holds only a bucket keeps it alone, 32 bytes instead of a record's 48;
//! a bucket and a penalty take 64 bytes instead of 48 and 64. The form is
//! in the pointer's low bits (every allocation is 8-byte aligned).
//!
//! Every `unsafe` that reaches a value is in this module, behind a safe
//! API. A [`Value`] is owned by the module (made from a record, or taken
//! back from Redis with [`Value::from_raw`]); a [`Lent`] is one Redis owns,
//! lent while a type callback runs or a key holding it is open
//! ([`Lent::from_raw`]). Both are read as a record, written, encoded (RDB,
//! AOF, `DUMP`, `DEBUG DIGEST`), copied and measured (`MEMORY USAGE`)
//! through [`ValueRef`] and [`ValueMut`], which need no `unsafe`. The key
//! API calls that read, set and replace a key's value are here too
//! ([`held_by`], [`set`], [`replace`]).

pub mod rtype;

#[cfg(test)]
mod tests;
#[cfg(test)]
pub(crate) use tests::Counting;

use std::cell::Cell;
use std::ffi::c_void;
use std::os::raw::c_int;
use std::ptr::NonNull;

use redis_module::raw;

use super::ffi::api;
use super::ffi::key::KeyHandle;
use crate::core::bucket::Bucket;
use crate::core::codec;
use crate::core::packed::BucketWithPenalty;
use crate::core::penalty::Penalty;
use crate::core::record::Record;

/// The low bits of a value pointer that holds a compact form (a record's
/// pointer has neither): a bare [`Bucket`], or a [`BucketWithPenalty`].
const BARE_BUCKET: usize = 1;
const BUCKET_WITH_PENALTY: usize = 2;
const TAGS: usize = BARE_BUCKET | BUCKET_WITH_PENALTY;

// The tags fit below the alignment of every form.
const _: () = assert!(std::mem::align_of::<Record>() > TAGS);
const _: () = assert!(std::mem::align_of::<Bucket>() > TAGS);
const _: () = assert!(std::mem::align_of::<BucketWithPenalty>() > TAGS);

/// A value of the type that the module owns (as a `Box` does): a whole
/// record or a compact form of one. Dropping it frees it.
#[derive(Debug, PartialEq, Eq)]
pub enum Value {
    /// A whole record.
    Record(Box<Record>),
    /// A record holding a bucket and nothing else.
    Bucket(Box<Bucket>),
    /// A record holding a bucket and a penalty that packs, nothing else.
    BucketWithPenalty(Box<BucketWithPenalty>),
}

/// A value, read.
#[derive(Clone, Copy, Debug)]
pub enum ValueRef<'a> {
    /// A whole record.
    Record(&'a Record),
    /// A bare bucket.
    Bucket(&'a Bucket),
    /// A bucket and a packed penalty.
    BucketWithPenalty(&'a BucketWithPenalty),
}

/// A value, to write in place.
pub enum ValueMut<'a> {
    /// A whole record.
    Record(&'a mut Record),
    /// A bare bucket.
    Bucket(&'a mut Bucket),
    /// A bucket and a packed penalty.
    BucketWithPenalty(&'a mut BucketWithPenalty),
}

impl Value {
    /// `record` as a value: its compact form when it has one.
    pub fn new(record: Record) -> Value {
        Value::of(record).0
    }

    /// `record` as a value, and the record itself when the value is its
    /// compact form (for an open key to keep beside it).
    #[inline]
    pub fn of(record: Record) -> (Value, Option<Record>) {
        if let Some(bucket) = record.bare_bucket() {
            return (Value::Bucket(Box::new(bucket)), Some(record));
        }
        match BucketWithPenalty::of(&record) {
            Some(both) => (Value::BucketWithPenalty(Box::new(both)), Some(record)),
            None => (Value::Record(Box::new(record)), None),
        }
    }

    /// The value, read.
    pub fn get(&self) -> ValueRef<'_> {
        match self {
            Value::Record(r) => ValueRef::Record(r),
            Value::Bucket(b) => ValueRef::Bucket(b),
            Value::BucketWithPenalty(both) => ValueRef::BucketWithPenalty(both),
        }
    }

    /// The value, to write in place.
    pub fn get_mut(&mut self) -> ValueMut<'_> {
        match self {
            Value::Record(r) => ValueMut::Record(r),
            Value::Bucket(b) => ValueMut::Bucket(b),
            Value::BucketWithPenalty(both) => ValueMut::BucketWithPenalty(both),
        }
    }

    /// Hand the value to Redis: the pointer to keep (its form in the low
    /// bits). [`Value::from_raw`] takes it back.
    pub fn into_raw(self) -> *mut c_void {
        match self {
            Value::Record(r) => Box::into_raw(r).cast(),
            Value::Bucket(b) => tagged(Box::into_raw(b), BARE_BUCKET),
            Value::BucketWithPenalty(both) => tagged(Box::into_raw(both), BUCKET_WITH_PENALTY),
        }
    }

    /// Take back a value Redis gives up (to free, or one it did not take);
    /// `None` for null.
    ///
    /// # Safety
    /// `raw` must come from [`Value::into_raw`], and no one may own or use
    /// it any more: the value is the caller's alone.
    pub unsafe fn from_raw(raw: *mut c_void) -> Option<Value> {
        // SAFETY: `untag` gives back the pointer `into_raw` took from
        // `Box::into_raw` of that very type (the tag says which), and the
        // caller gives up every other use of it: the box owns it again,
        // once.
        Some(unsafe {
            match untag(raw)? {
                Form::Record(r) => Value::Record(Box::from_raw(r.as_ptr())),
                Form::Bucket(b) => Value::Bucket(Box::from_raw(b.as_ptr())),
                Form::BucketWithPenalty(both) => {
                    Value::BucketWithPenalty(Box::from_raw(both.as_ptr()))
                }
            }
        })
    }
}

/// A value Redis owns, lent to the module: reached only while Redis keeps
/// it and nothing else touches it (a type callback runs, or an open key
/// of the running command holds it and has not changed it). Dropping it
/// frees nothing.
#[derive(Debug)]
pub struct Lent(Form);

/// Where a value pointer leads, by its tag.
#[derive(Debug)]
enum Form {
    Record(NonNull<Record>),
    Bucket(NonNull<Bucket>),
    BucketWithPenalty(NonNull<BucketWithPenalty>),
}

impl Lent {
    /// Borrow the value Redis keeps at `raw` (`None` for null).
    ///
    /// # Safety
    /// `raw` must come from [`Value::into_raw`] and be owned by Redis (a
    /// key's value, or the one a callback is given); the caller must drop
    /// the `Lent` before Redis may free or change the value (the callback
    /// returns, the key is closed, written by another handle or deleted),
    /// and must not reach the value otherwise meanwhile.
    #[inline]
    pub unsafe fn from_raw(raw: *mut c_void) -> Option<Lent> {
        untag(raw).map(Lent)
    }

    /// The value, read.
    #[inline]
    pub fn get(&self) -> ValueRef<'_> {
        // SAFETY: the pointer leads to a live value of its form while the
        // `Lent` exists (the promise of `from_raw`), and only the `Lent`
        // reaches it: the borrow of `self` bounds the reference, and no
        // `&mut` to it exists meanwhile (that takes `&mut self`).
        unsafe {
            match &self.0 {
                Form::Record(r) => ValueRef::Record(r.as_ref()),
                Form::Bucket(b) => ValueRef::Bucket(b.as_ref()),
                Form::BucketWithPenalty(both) => ValueRef::BucketWithPenalty(both.as_ref()),
            }
        }
    }

    /// The value, to write in place.
    #[inline]
    pub fn get_mut(&mut self) -> ValueMut<'_> {
        // SAFETY: as in `get`; the exclusive borrow of `self` makes this
        // the only reference to the value while it lasts.
        unsafe {
            match &mut self.0 {
                Form::Record(r) => ValueMut::Record(r.as_mut()),
                Form::Bucket(b) => ValueMut::Bucket(b.as_mut()),
                Form::BucketWithPenalty(both) => ValueMut::BucketWithPenalty(both.as_mut()),
            }
        }
    }

    /// Write `record` where the value lives when its form can hold it (a
    /// whole record always can; a compact form, the same compact form):
    /// `Ok` with the record back when the value is a compact copy of it
    /// (for the key to keep beside it); otherwise `Err(record)`, and the
    /// key must be given [`Value::of`] it.
    #[inline]
    pub fn write(&mut self, record: Record) -> Result<Option<Record>, Record> {
        match self.get_mut() {
            ValueMut::Record(r) => {
                *r = record;
                Ok(None)
            }
            compact => {
                if compact.write_compact(&record) {
                    Ok(Some(record))
                } else {
                    Err(record)
                }
            }
        }
    }
}

fn tagged<T>(ptr: *mut T, tag: usize) -> *mut c_void {
    ptr.map_addr(|addr| addr | tag).cast()
}

/// The form and untagged pointer of a value pointer (`None` for null or a
/// tag `into_raw` never makes).
#[inline]
fn untag(raw: *mut c_void) -> Option<Form> {
    let untagged = NonNull::new(raw.map_addr(|addr| addr & !TAGS))?;
    match raw.addr() & TAGS {
        0 => Some(Form::Record(untagged.cast())),
        BARE_BUCKET => Some(Form::Bucket(untagged.cast())),
        BUCKET_WITH_PENALTY => Some(Form::BucketWithPenalty(untagged.cast())),
        _ => None,
    }
}

impl<'a> ValueRef<'a> {
    /// The whole record, when the value is one (not a compact form).
    #[inline]
    pub fn record(self) -> Option<&'a Record> {
        match self {
            ValueRef::Record(r) => Some(r),
            ValueRef::Bucket(_) | ValueRef::BucketWithPenalty(_) => None,
        }
    }

    /// The record a compact form stands for (its penalty in the spare
    /// allocation when there is one); `None` for a whole record.
    #[inline]
    pub fn compact_record(self) -> Option<Record> {
        match self {
            ValueRef::Record(_) => None,
            ValueRef::Bucket(bucket) => Some(Record::with_bucket(*bucket)),
            ValueRef::BucketWithPenalty(both) => {
                let mut record = Record::with_bucket(both.bucket);
                record.penalty = Some(boxed_penalty(both.penalty.unpack()));
                Some(record)
            }
        }
    }

    /// Run `read` on the record the value is or stands for.
    pub fn read<T>(self, read: impl FnOnce(&Record) -> T) -> T {
        match self {
            ValueRef::Record(r) => read(r),
            compact => {
                let mut record = compact.compact_record().unwrap_or_default();
                let out = read(&record);
                recycle_penalty(&mut record);
                out
            }
        }
    }

    /// The whole-record encoding ([`codec`]): what RDB, AOF rewrite,
    /// `DUMP` and `DEBUG DIGEST` hold.
    pub fn encode(self) -> Vec<u8> {
        self.read(codec::encode)
    }

    /// A new value holding the same record (in its compact form when it
    /// has one).
    pub fn copy(self) -> Value {
        match self {
            ValueRef::Record(r) => Value::new(r.clone()),
            ValueRef::Bucket(b) => Value::Bucket(Box::new(*b)),
            ValueRef::BucketWithPenalty(both) => Value::BucketWithPenalty(Box::new(*both)),
        }
    }

    /// The bytes the value holds: each of its allocations at the size
    /// `allocated` gives for its address (the allocator's size class).
    pub fn heap_size(self, allocated: impl Fn(*const u8) -> usize) -> usize {
        match self {
            ValueRef::Record(r) => {
                allocated(std::ptr::from_ref(r).cast()) + r.heap_bytes(allocated)
            }
            ValueRef::Bucket(b) => allocated(std::ptr::from_ref(b).cast()),
            ValueRef::BucketWithPenalty(both) => allocated(std::ptr::from_ref(both).cast()),
        }
    }
}

impl<'a> ValueMut<'a> {
    /// Write `record` into a compact form of the same shape; false (and
    /// nothing written) for another shape or a whole record.
    #[inline]
    fn write_compact(self, record: &Record) -> bool {
        match self {
            ValueMut::Bucket(bare) => match record.bare_bucket() {
                Some(bucket) => *bare = bucket,
                None => return false,
            },
            ValueMut::BucketWithPenalty(both) => match BucketWithPenalty::of(record) {
                Some(packed) => *both = packed,
                None => return false,
            },
            ValueMut::Record(_) => return false,
        }
        true
    }

    /// The whole record, when the value is one.
    #[inline]
    pub fn record_mut(self) -> Option<&'a mut Record> {
        match self {
            ValueMut::Record(r) => Some(r),
            ValueMut::Bucket(_) | ValueMut::BucketWithPenalty(_) => None,
        }
    }
}

thread_local! {
    /// One penalty allocation kept from the last record a compact form was
    /// read into, for the next (the server runs commands on one thread):
    /// reading a bucket with a penalty then allocates nothing.
    static SPARE_PENALTY: Cell<Option<Box<Penalty>>> = const { Cell::new(None) };
}

/// `penalty` boxed, in the spare allocation when there is one.
#[inline]
fn boxed_penalty(penalty: Penalty) -> Box<Penalty> {
    match SPARE_PENALTY.take() {
        Some(mut spare) => {
            *spare = penalty;
            spare
        }
        None => Box::new(penalty),
    }
}

/// Keep `record`'s penalty allocation, if any, for the next compact form
/// read (the record is left without a penalty).
#[inline]
pub fn recycle_penalty(record: &mut Record) {
    if let Some(spare) = record.penalty.take() {
        SPARE_PENALTY.set(Some(spare));
    }
}

/// What an open key holds.
#[derive(Debug)]
pub enum Holding {
    /// Nothing (no key, or the handle is null).
    Nothing,
    /// A value of the type, lent while the key holds it.
    Ours(Lent),
    /// A value of another type.
    Other,
}

/// What the open key `key` holds (null: nothing).
///
/// # Safety
/// A [`Holding::Ours`] must be dropped before `key` drops (closing it) or
/// its value is changed other than through it.
pub unsafe fn held_by(key: &KeyHandle) -> Holding {
    let key = key.ptr();
    if key.is_null() {
        return Holding::Nothing;
    }
    // The module type first: null for an empty key or one of another
    // type, which the key's type then tells apart (one call into Redis for
    // a key of ours, the common case).
    let ours = rtype::rl_type();
    // SAFETY: `key` is an open, non-null handle (a `KeyHandle`'s).
    let module_type = unsafe { api!(RedisModule_ModuleTypeGetType)(key) };
    if ours.is_null() || module_type != ours {
        // SAFETY: as above.
        let kind = unsafe { api!(RedisModule_KeyType)(key) } as isize;
        return if kind == raw::REDISMODULE_KEYTYPE_EMPTY {
            Holding::Nothing
        } else {
            Holding::Other
        };
    }
    // SAFETY: as above, a key holding a value of our type: every path that
    // puts one in Redis made it with `Value::into_raw` (`set`, `replace`,
    // the type's `rdb_load` and `copy`), and the key owns it; the caller
    // drops the `Lent` in time.
    match unsafe { Lent::from_raw(api!(RedisModule_ModuleTypeGetValue)(key)) } {
        Some(lent) => Holding::Ours(lent),
        None => Holding::Nothing,
    }
}

/// Put `value` in the key `key`, replacing what it holds (a value of
/// another type too): the value lent back while the key holds it, or
/// `None` when Redis refused it (the key not open for writing), which
/// frees it.
///
/// # Safety
/// As [`held_by`], `key` open; the key holds none of our values that a
/// [`Lent`] still borrows, nor a string whose bytes are borrowed.
pub unsafe fn set(key: &KeyHandle, value: Value) -> Option<Lent> {
    let key = key.ptr();
    let raw = value.into_raw();
    // SAFETY: `key` is an open handle (the caller's promise; Redis refuses
    // the value if it is not open for writing); `raw` is a fresh value of
    // the registered type.
    let set = unsafe { api!(RedisModule_ModuleTypeSetValue)(key, rtype::rl_type(), raw) };
    take_or_lend(set, raw)
}

/// Replace the value of ours the key `key` holds with `value`, freeing the
/// old one: `value` lent back while the key holds it, or `None` when
/// Redis refused it (and freed here).
///
/// # Safety
/// As [`held_by`], `key` open and holding a value of ours, which no
/// [`Lent`] is used to reach afterwards (it is freed).
pub unsafe fn replace(key: &KeyHandle, value: Value) -> Option<Lent> {
    let key = key.ptr();
    let raw = value.into_raw();
    let mut old = std::ptr::null_mut();
    // SAFETY: `key` is an open handle holding a value of ours (the
    // caller's promise); `raw` is a fresh value of the type, `old` a place
    // for the one it replaces.
    let replaced =
        unsafe { api!(RedisModule_ModuleTypeReplaceValue)(key, rtype::rl_type(), raw, &mut old) };
    if replaced == raw::REDISMODULE_OK as c_int {
        // SAFETY: Redis gave `old` back: a value of ours that nothing owns
        // any more (the caller no longer reaches it).
        drop(unsafe { Value::from_raw(old) });
    }
    take_or_lend(replaced, raw)
}

/// After a set or a replace of `raw`: lend it back when Redis took it,
/// free it when not.
fn take_or_lend(status: c_int, raw: *mut c_void) -> Option<Lent> {
    if status == raw::REDISMODULE_OK as c_int {
        // SAFETY: the key now owns `raw`, a value of ours; the callers'
        // promises (of `set`, `replace`) make the `Lent` dropped in time.
        unsafe { Lent::from_raw(raw) }
    } else {
        // SAFETY: Redis did not take `raw`: still only ours, freed here.
        drop(unsafe { Value::from_raw(raw) });
        None
    }
}
