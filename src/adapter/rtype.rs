//! The module type `rl-record`: one type for every RL key. Its callbacks
//! persist a [`Record`] through the versioned codec (RDB, AOF rewrite,
//! `DUMP`/`RESTORE`), report memory, digest it for `DEBUG DIGEST`, copy and
//! free it. Every callback runs under [`guard`]; a corrupt payload is
//! refused (Redis then reports the error), never trusted.

use std::ffi::CStr;
use std::os::raw::{c_char, c_int, c_void};
use std::ptr;
use std::sync::atomic::{AtomicPtr, Ordering};

use redis_module::raw;

use super::ffi::{api, guard, Ctx, RStr};
use super::stats;
use crate::core::bucket::Bucket;
use crate::core::codec;
use crate::core::packed::BucketWithPenalty;
use crate::core::record::Record;

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

/// The low bits of a value pointer that holds a compact form (the
/// allocator aligns every allocation to 8 bytes, so a record's pointer
/// has neither): a bare [`Bucket`], or a [`BucketWithPenalty`].
const BARE_BUCKET: usize = 1;
const BUCKET_WITH_PENALTY: usize = 2;
const TAGS: usize = BARE_BUCKET | BUCKET_WITH_PENALTY;

/// What a value pointer Redis gives back holds: a record, or the compact
/// form of one (see [`crate::core::packed`]): a key that holds only a
/// bucket keeps it alone, 32 bytes instead of a record's 48; a bucket and
/// a penalty take 64 bytes instead of 48 and 64.
#[derive(Clone, Copy)]
pub enum Stored {
    /// A whole record.
    Record(*mut Record),
    /// A bare bucket: the record holds it and nothing else.
    Bucket(*mut Bucket),
    /// A bucket and a penalty, and nothing else.
    BucketWithPenalty(*mut BucketWithPenalty),
}

/// Hand a record to Redis as a type value, in its compact form when it
/// has one.
pub fn into_raw(record: Record) -> *mut c_void {
    compact_value(&record).unwrap_or_else(|| Box::into_raw(Box::new(record)).cast::<c_void>())
}

/// The compact form of `record` as a type value, when it has one (the
/// record itself is then not needed by Redis).
pub fn compact_value(record: &Record) -> Option<*mut c_void> {
    if let Some(bucket) = record.bare_bucket() {
        return Some(tagged(Box::into_raw(Box::new(bucket)), BARE_BUCKET));
    }
    let both = BucketWithPenalty::of(record)?;
    Some(tagged(Box::into_raw(Box::new(both)), BUCKET_WITH_PENALTY))
}

fn tagged<T>(ptr: *mut T, tag: usize) -> *mut c_void {
    ptr.map_addr(|addr| addr | tag).cast::<c_void>()
}

/// What is behind a value pointer Redis gives back (`None` for null).
///
/// # Safety
/// `value` must come from [`into_raw`] (or [`compact_value`]) and still be
/// alive (owned by Redis, or by the caller about to free it): the pointers
/// returned are valid for as long as it is.
pub unsafe fn from_raw(value: *mut c_void) -> Option<Stored> {
    let untagged = value.map_addr(|addr| addr & !TAGS);
    match value.addr() & TAGS {
        _ if value.is_null() => None,
        BARE_BUCKET => Some(Stored::Bucket(untagged.cast())),
        BUCKET_WITH_PENALTY => Some(Stored::BucketWithPenalty(untagged.cast())),
        0 => Some(Stored::Record(value.cast())),
        // Never made by `into_raw`.
        _ => None,
    }
}

/// Run `read` on the record behind a value pointer (a compact form read as
/// the record it stands for).
///
/// # Safety
/// As [`from_raw`].
unsafe fn with_record<T>(value: *mut c_void, read: impl FnOnce(&Record) -> T) -> Option<T> {
    // SAFETY: the caller's promise.
    match unsafe { from_raw(value) }? {
        // SAFETY: a live value of ours (the caller's promise), only read
        // here while Redis runs this callback and nothing changes it.
        Stored::Record(record) => unsafe { record.as_ref() }.map(read),
        Stored::Bucket(bucket) => {
            // SAFETY: as above.
            let bucket = unsafe { bucket.as_ref() }?;
            Some(read(&Record::with_bucket(*bucket)))
        }
        Stored::BucketWithPenalty(both) => {
            // SAFETY: as above.
            let both = unsafe { both.as_ref() }?;
            let mut record = Record::with_bucket(both.bucket);
            record.penalty = Some(Box::new(both.penalty.unpack()));
            Some(read(&record))
        }
    }
}

/// Free a value of ours that Redis did not take, or gave back replaced.
///
/// # Safety
/// `value` must come from [`into_raw`], and nothing may own it anymore.
pub unsafe fn free_value(value: *mut c_void) {
    // SAFETY: the caller's promise (a value of ours, still alive).
    match unsafe { from_raw(value) } {
        // SAFETY: `into_raw`/`compact_value` made the pointer with
        // `Box::into_raw` of this very type, and the caller gives up the
        // only ownership left, so it is freed once.
        Some(Stored::Record(record)) => drop(unsafe { Box::from_raw(record) }),
        // SAFETY: as above.
        Some(Stored::Bucket(bucket)) => drop(unsafe { Box::from_raw(bucket) }),
        // SAFETY: as above.
        Some(Stored::BucketWithPenalty(both)) => drop(unsafe { Box::from_raw(both) }),
        None => {}
    }
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
            // SAFETY: takes no argument.
            let now = unsafe { api!(RedisModule_Milliseconds)() };
            codec::decode_loaded(bytes, now).ok()
        };
        // SAFETY: the buffer Redis allocated for us, freed once; `bytes`
        // is out of scope.
        unsafe { api!(RedisModule_Free)(buf.cast::<c_void>()) };
        decoded.map_or(ptr::null_mut(), into_raw)
    })
}

extern "C" fn rdb_save(rdb: *mut raw::RedisModuleIO, value: *mut c_void) {
    guard((), || {
        // SAFETY: Redis passes a value of our type, which it owns.
        if let Some(bytes) = unsafe { with_record(value, codec::encode) } {
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
        // SAFETY: Redis passes a value of our type, which it owns.
        if let Some(bytes) = unsafe { with_record(value, codec::encode) } {
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
/// each allocation of the record at its allocator size (`RM_MallocSize`).
extern "C" fn mem_usage(value: *const c_void) -> usize {
    // SAFETY: called below only with allocations of the value Redis passed
    // (the record, a compact form, a record's own heap parts), all made by
    // Redis' allocator (the module's global allocator) and alive.
    let allocated = |ptr: *const u8| unsafe { api!(RedisModule_MallocSize)(ptr.cast_mut().cast()) };
    // SAFETY: Redis passes a value of our type, which it owns.
    guard(0, || match unsafe { from_raw(value.cast_mut()) } {
        // SAFETY: as above, only read while this callback runs.
        Some(Stored::Record(record)) => match unsafe { record.as_ref() } {
            Some(r) => REDIS_WRAPPERS + allocated(record.cast()) + r.heap_bytes(allocated),
            None => 0,
        },
        Some(Stored::Bucket(bucket)) => REDIS_WRAPPERS + allocated(bucket.cast()),
        Some(Stored::BucketWithPenalty(both)) => REDIS_WRAPPERS + allocated(both.cast()),
        None => 0,
    })
}

extern "C" fn digest(md: *mut raw::RedisModuleDigest, value: *mut c_void) {
    guard((), || {
        // SAFETY: Redis passes a value of our type, which it owns.
        if let Some(bytes) = unsafe { with_record(value, codec::encode) } {
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
    guard(ptr::null_mut(), || {
        // SAFETY: Redis passes a value of our type, which it owns; it is
        // only read (the `cast_mut` changes nothing).
        unsafe { with_record(value.cast_mut(), |record| into_raw(record.clone())) }
            .unwrap_or(ptr::null_mut())
    })
}

/// Free a value. Leases still in it whose deadline has passed (the key
/// expired with them) are counted as expired leases in `INFO`.
extern "C" fn free(value: *mut c_void) {
    guard((), || {
        // SAFETY: Redis passes a value of our type, alive until freed below.
        if let Some(Stored::Record(record)) = unsafe { from_raw(value) } {
            // SAFETY: as above, only read.
            if let Some(leases) = unsafe { record.as_ref() }.and_then(Record::leases) {
                // SAFETY: takes no argument.
                let now = unsafe { api!(RedisModule_Milliseconds)() };
                stats::LEASES_EXPIRED.add(leases.expired(now));
            }
        }
        // SAFETY: Redis gives the value up for good here: ours to free.
        unsafe { free_value(value) };
    })
}
