//! The value layer without Redis: random sequences of writes carry a key
//! through every form (nothing, a bare bucket, a bucket with a penalty, a
//! whole record, and back) the way an open key writes it
//! ([`Lent::write`], else a new [`Value::of`] the record replacing the old
//! one), with `COPY`s and reloads between. After every step the value's
//! bytes must be the whole-record encoding of the record it stands for,
//! and the memory it reports (what the `mem_usage` callback adds Redis'
//! wrappers to) must be what the allocator holds for it.
//!
//! The allocator's side: unit tests run with [`Counting`] as the global
//! allocator (the system allocator, counting per thread the bytes of every
//! live block at its usable size, `malloc_usable_size`), and the value's
//! memory is reported with that same function as its `allocated` (in
//! Redis, `RM_MallocSize`: jemalloc's usable size). What the allocator
//! holds for a value is measured twice: the live bytes a `COPY` adds (its
//! temporaries are freed by then), and the live bytes freeing a value
//! gives back.

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::ffi::c_void;

use proptest::prelude::*;

use super::{Lent, Value, ValueRef};
use crate::core::bucket::Bucket;
use crate::core::codec;
use crate::core::lease::Leases;
use crate::core::penalty::Penalty;
use crate::core::record::Record;
use crate::core::testkit::{any_valid_bucket, any_valid_penalty, config};
use crate::core::window::WindowState;

extern "C" {
    /// glibc: the usable size of a live block of `malloc` and its kin.
    fn malloc_usable_size(ptr: *mut c_void) -> usize;
}

thread_local! {
    /// Bytes of the live blocks this thread allocated (and not freed).
    static LIVE: Cell<isize> = const { Cell::new(0) };
}

/// The allocator of unit tests: [`System`], counting live bytes per thread.
pub struct Counting;

/// The usable size of a live block of the system allocator.
fn usable(ptr: *const u8) -> usize {
    // SAFETY: called only with blocks `System` returned (through
    // `Counting`, the global allocator of tests) and not freed yet, which
    // on Linux come from glibc's malloc, posix_memalign or aligned_alloc.
    unsafe { malloc_usable_size(ptr.cast_mut().cast()) }
}

fn count(delta: isize) {
    let _ = LIVE.try_with(|live| live.set(live.get() + delta));
}

// SAFETY: every call is passed on to `System` as is; only the counter
// changes, which allocates nothing.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        // SAFETY: the caller's promises are `System`'s.
        let ptr = unsafe { System.alloc(layout) };
        if !ptr.is_null() {
            count(usable(ptr) as isize);
        }
        ptr
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        count(-(usable(ptr) as isize));
        // SAFETY: the caller's promises are `System`'s.
        unsafe { System.dealloc(ptr, layout) }
    }
}

fn live() -> isize {
    LIVE.with(Cell::get)
}

/// The bytes `value` reports.
fn reported(value: ValueRef<'_>) -> usize {
    value.heap_size(usable)
}

/// The bytes of `value` that are an estimate rather than the allocator's:
/// a lease set's heap (its B-tree nodes are not visible: a record of one
/// lease reports 364 bytes where glibc frees 872).
fn estimated(value: ValueRef<'_>) -> usize {
    value
        .record()
        .and_then(Record::leases)
        .map_or(0, Leases::heap_bytes)
}

/// Check that the memory a value reports, `(claimed, estimated share)`,
/// is what the allocator holds for it (`actual`), the estimated share
/// aside: that share must stand for some of what is left.
fn check_memory((claimed, estimate): (usize, usize), actual: usize) -> Result<(), TestCaseError> {
    if estimate == 0 {
        prop_assert_eq!(claimed, actual, "reported vs the allocator's");
    } else {
        prop_assert!(
            claimed - estimate < actual,
            "{claimed} ({estimate} estimated) vs {actual}"
        );
    }
    Ok(())
}

fn memory(value: ValueRef<'_>) -> (usize, usize) {
    (reported(value), estimated(value))
}

/// Check that the memory `value` reports is what freeing it gives back.
fn check_freed(value: Value) -> Result<(), TestCaseError> {
    let claimed = memory(value.get());
    let before = live();
    drop(value);
    check_memory(claimed, (before - live()) as usize)
}

/// One step of a sequence.
#[derive(Clone, Debug)]
enum Step {
    /// Set or remove the bucket.
    Bucket(Option<Bucket>),
    /// Set or remove the penalty (which may or may not pack).
    Penalty(Option<Penalty>),
    /// Set or remove a part kept beside (a window: no heap of its own).
    Window(Option<u64>),
    /// Hold this many leases (0: none).
    Leases(u8),
    /// `COPY` the key, then overwrite it with the copy.
    Copy,
    /// Save and load the key (`DUMP`/`RESTORE`, RDB).
    Reload,
}

fn step() -> impl Strategy<Value = Step> {
    prop_oneof![
        4 => prop::option::weighted(0.8, any_valid_bucket()).prop_map(Step::Bucket),
        3 => prop::option::weighted(0.6, any_valid_penalty()).prop_map(Step::Penalty),
        1 => prop::option::weighted(0.5, 1u64..1_000_000).prop_map(Step::Window),
        1 => (0u8..4).prop_map(Step::Leases),
        1 => Just(Step::Copy),
        1 => Just(Step::Reload),
    ]
}

/// Change `record` as a command's step would.
fn change(record: &mut Record, step: &Step) {
    match step {
        Step::Bucket(bucket) => record.bucket = *bucket,
        Step::Penalty(penalty) => record.penalty = penalty.map(Box::new),
        Step::Window(count) => record.set_part(count.map(|count| WindowState::Fixed {
            end: 1_700_000_000_000,
            count,
        })),
        Step::Leases(0) => record.set_part::<Box<Leases>>(None),
        Step::Leases(n) => {
            let mut leases = Leases::new();
            for id in 0..*n {
                leases.acquire(&[b'j', id], 10, 60_000, 1_700_000_000_000);
            }
            record.set_part(Some(Box::new(leases)));
        }
        Step::Copy | Step::Reload => {}
    }
}

/// A key as Redis keeps it: the value's pointer (null: no key).
struct Key(*mut c_void);

impl Key {
    /// Write `step` through the key the way an open key does: a whole
    /// record changed where it lives, a compact form's record changed
    /// beside it and written back, in place when its form holds it.
    fn write(&mut self, step: &Step) {
        // SAFETY: `self.0` is a value this key owns (made by `into_raw`),
        // and the `Lent` is dropped before the key changes it.
        let Some(mut lent) = (unsafe { Lent::from_raw(self.0) }) else {
            let mut record = Record::default();
            change(&mut record, step);
            self.0 = Value::new(record).into_raw();
            return;
        };
        if let Some(record) = lent.get_mut().record_mut() {
            return change(record, step);
        }
        let mut record = lent.get().compact_record().unwrap_or_default();
        change(&mut record, step);
        if let Err(record) = lent.write(record) {
            self.set(Value::new(record));
        }
    }

    /// Put `value` in the key, freeing the one it replaces.
    fn set(&mut self, value: Value) {
        let old = std::mem::replace(&mut self.0, value.into_raw());
        // SAFETY: the key's value, which it gives up.
        drop(unsafe { Value::from_raw(old) });
    }

    fn take(&mut self) -> Option<Value> {
        // SAFETY: the key's value, which it gives up (null left behind).
        unsafe { Value::from_raw(std::mem::replace(&mut self.0, std::ptr::null_mut())) }
    }

    fn lent(&self) -> Option<Lent> {
        // SAFETY: the key's value, not changed while the `Lent` lives.
        unsafe { Lent::from_raw(self.0) }
    }
}

impl Drop for Key {
    fn drop(&mut self) {
        drop(self.take());
    }
}

/// The forms a value takes, for coverage.
fn form(value: ValueRef<'_>) -> usize {
    match value {
        ValueRef::Record(_) => 0,
        ValueRef::Bucket(_) => 1,
        ValueRef::BucketWithPenalty(_) => 2,
    }
}

/// Run `steps` on a new key, checking bytes and memory after each; the
/// forms the value took, in order.
fn run(steps: &[Step]) -> Result<Vec<usize>, TestCaseError> {
    let mut key = Key(std::ptr::null_mut());
    let mut expected = Record::default();
    let mut forms = Vec::new();
    for step in steps {
        match step {
            Step::Copy => {
                let Some(original) = key.lent().map(|lent| lent.get().encode()) else {
                    continue;
                };
                let before = live();
                let copy = key.lent().map(|lent| lent.get().copy());
                let made = (live() - before) as usize;
                let Some(copy) = copy else { continue };
                check_memory(memory(copy.get()), made)?;
                prop_assert_eq!(copy.get().encode(), original);
                if let Some(original) = key.take() {
                    check_freed(original)?;
                }
                key.set(copy);
            }
            Step::Reload => {
                let Some(bytes) = key.lent().map(|lent| lent.get().encode()) else {
                    continue;
                };
                let loaded = codec::decode(&bytes);
                prop_assert!(loaded.is_ok(), "{:?}", loaded);
                key.set(Value::new(loaded.unwrap_or_default()));
            }
            _ => {
                change(&mut expected, step);
                key.write(step);
            }
        }
        let Some(lent) = key.lent() else { continue };
        prop_assert_eq!(
            lent.get().encode(),
            codec::encode(&expected),
            "after {:?}",
            step
        );
        forms.push(form(lent.get()));
    }
    if let Some(value) = key.take() {
        check_freed(value)?;
    }
    Ok(forms)
}

proptest! {
    #![proptest_config(config(400))]

    #[test]
    fn every_form_and_back_keeps_bytes_and_memory(
        steps in prop::collection::vec(step(), 1..40)
    ) {
        run(&steps)?;
    }
}

#[test]
fn a_key_goes_through_every_form_and_back() {
    let bucket = Bucket {
        tat_ms: 1_700_000_000_000,
        tat_frac: 0,
        tokens: std::num::NonZeroU64::MIN,
        period_ms: 1000,
    };
    let penalty = Penalty {
        strikes: 1,
        strikes_until: 1_700_000_060_000,
        ..Penalty::default()
    };
    // Deadlines too far apart to pack.
    let far = Penalty {
        offenses: 1,
        offenses_until: i64::MAX / 2,
        ..penalty
    };
    let steps = [
        Step::Bucket(Some(bucket)),
        Step::Penalty(Some(penalty)),
        Step::Copy,
        Step::Penalty(None),
        Step::Penalty(Some(far)),
        Step::Penalty(None),
        Step::Copy,
        Step::Window(Some(3)),
        Step::Leases(2),
        Step::Copy,
        Step::Leases(0),
        Step::Window(None),
        Step::Copy,
        Step::Penalty(Some(penalty)),
        Step::Reload,
        Step::Penalty(None),
    ];
    // A whole record written in place stays whole until a copy or a
    // reload makes it compact again.
    let forms = run(&steps).expect("checks hold");
    assert_eq!(forms, [1, 2, 2, 1, 0, 0, 1, 0, 0, 0, 0, 0, 1, 2, 2, 1]);
}
