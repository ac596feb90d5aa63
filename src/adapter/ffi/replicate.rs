//! Replication of a call's effects: the `RL.APPLY` command a write sends
//! to replicas and the AOF, and `DEL` of a key it deleted, each one
//! `RM_Replicate` call with the arguments the store built.

use std::ops::Range;
use std::os::raw::c_char;

use arrayvec::ArrayVec;

use super::{api, Arg, Ctx, RStr};
use crate::core::limits::MAX_BUCKETS;
use crate::core::time::Millis;

/// A written key's expiry, as its `RL.APPLY` says it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Expiry {
    /// Set to this absolute time (ms).
    At(Millis),
    /// Already this absolute time before the call, left as it was.
    Kept(Millis),
    /// No expiry (a manual box).
    Persist,
}

/// Replicate `RL.APPLY key payload expiry [key payload expiry]...` for the
/// `applied` keys (nothing when there are none); `expiry` is the absolute
/// ms time or `PERSIST`. One key whose expiry was kept goes as
/// `RL.APPLY key payload`, which leaves the replica's expiry (the same)
/// alone.
pub fn replicate_applied(ctx: Ctx, applied: &[(Arg, Range<usize>, Expiry)], payloads: &[u8]) {
    if let [(name, range, expiry)] = applied {
        // One key (the common call): the server builds the arguments from a
        // format, with no string of ours to create and free. The expiry
        // goes as the digits written here (`b`): the same argument as a
        // long long (`l`), which Redis would make in two allocations.
        let payload = payloads.get(range.clone()).unwrap_or_default();
        let mut digits = Decimal::default();
        let expiry = match expiry {
            Expiry::At(at) => Some(digits.of(*at)),
            Expiry::Persist => Some(&b"PERSIST"[..]),
            Expiry::Kept(_) => None,
        };
        let replicate = api!(RedisModule_Replicate);
        match expiry {
            // SAFETY: `ctx` is the context of the running command; each
            // format letter matches its argument: `s` the key name Redis
            // passed to the command, `b` a pointer and length of a live
            // slice (twice); Redis copies them all.
            Some(expiry) => unsafe {
                replicate(
                    ctx.ptr(),
                    c"RL.APPLY".as_ptr(),
                    c"sbb".as_ptr(),
                    name.0,
                    payload.as_ptr().cast::<c_char>(),
                    payload.len(),
                    expiry.as_ptr().cast::<c_char>(),
                    expiry.len(),
                )
            },
            // SAFETY: as above, without the expiry (`sb`).
            None => unsafe {
                replicate(
                    ctx.ptr(),
                    c"RL.APPLY".as_ptr(),
                    c"sb".as_ptr(),
                    name.0,
                    payload.as_ptr().cast::<c_char>(),
                    payload.len(),
                )
            },
        };
        return;
    }
    if applied.is_empty() {
        return;
    }
    let create = api!(RedisModule_CreateString);
    let mut argv: ArrayVec<RStr, { 3 * MAX_BUCKETS }> = ArrayVec::new();
    let mut created: ArrayVec<RStr, { 2 * MAX_BUCKETS }> = ArrayVec::new();
    for (name, range, expiry) in applied {
        let payload = payloads.get(range.clone()).unwrap_or_default();
        let mut digits = Decimal::default();
        let expiry = match expiry {
            Expiry::At(at) | Expiry::Kept(at) => digits.of(*at),
            Expiry::Persist => &b"PERSIST"[..],
        };
        // SAFETY: `ctx` is the context of the running command; Redis copies
        // `expiry.len()` bytes of a live slice.
        let expiry = unsafe { create(ctx.ptr(), expiry.as_ptr().cast::<c_char>(), expiry.len()) };
        // SAFETY: `ctx` is the context of the running command; Redis copies
        // `payload.len()` bytes of a live slice.
        let payload =
            unsafe { create(ctx.ptr(), payload.as_ptr().cast::<c_char>(), payload.len()) };
        argv.push(name.0);
        argv.push(payload);
        argv.push(expiry);
        created.push(payload);
        created.push(expiry);
    }
    // SAFETY: `ctx` is the context of the running command; format `v` takes
    // a vector of `argv.len()` live strings (the key names Redis passed,
    // the strings made above), which Redis retains; then each string made
    // above is freed once, by its only owner, and not used again.
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

/// The decimal digits of an integer, written in place (an `i64` has at
/// most 20 with its sign).
#[derive(Default)]
struct Decimal([u8; 20]);

/// The two digits of each number below 100, in order (`00`, `01`, ...).
const DIGIT_PAIRS: [u8; 200] = {
    let mut pairs = [0u8; 200];
    let mut i = 0;
    while i < 100 {
        pairs[2 * i] = b'0' + (i / 10) as u8;
        pairs[2 * i + 1] = b'0' + (i % 10) as u8;
        i += 1;
    }
    pairs
};

impl Decimal {
    /// The digits of `v`, with a `-` before a negative one: two digits a
    /// step, from the last.
    fn of(&mut self, v: i64) -> &[u8] {
        let mut n = v.unsigned_abs();
        let mut start = self.0.len();
        // Eight digits a step while more remain (a time in ms has 13), each
        // step's pairs in 32-bit arithmetic.
        while n >= 100_000_000 {
            let eight = (n % 100_000_000) as u32;
            n /= 100_000_000;
            start -= 8;
            let (high, low) = ((eight / 10_000) as usize, (eight % 10_000) as usize);
            for (at, pair) in [
                (0, high / 100),
                (2, high % 100),
                (4, low / 100),
                (6, low % 100),
            ] {
                self.0[start + at..start + at + 2]
                    .copy_from_slice(&DIGIT_PAIRS[2 * pair..2 * pair + 2]);
            }
        }
        let mut n = n as u32;
        while n >= 100 {
            let pair = 2 * (n % 100) as usize;
            n /= 100;
            start -= 2;
            self.0[start..start + 2].copy_from_slice(&DIGIT_PAIRS[pair..pair + 2]);
        }
        if n >= 10 {
            let pair = 2 * n as usize;
            start -= 2;
            self.0[start..start + 2].copy_from_slice(&DIGIT_PAIRS[pair..pair + 2]);
        } else {
            start -= 1;
            self.0[start] = b'0' + n as u8;
        }
        if v < 0 {
            start -= 1;
            self.0[start] = b'-';
        }
        &self.0[start..]
    }
}

/// Replicate the deletion of `key`.
pub fn replicate_del(ctx: Ctx, key: Arg) {
    // SAFETY: `ctx` is the context of the running command, `key` a string
    // Redis passed to it; format `s` takes one string.
    unsafe { api!(RedisModule_Replicate)(ctx.ptr(), c"DEL".as_ptr(), c"s".as_ptr(), key.0) };
}

#[cfg(test)]
mod tests {
    use super::Decimal;

    #[test]
    fn decimals_match_std() {
        for v in [
            0,
            7,
            -7,
            10,
            99,
            100,
            -100,
            1_764_000_000_123,
            99_999_999,
            100_000_000,
            100_000_001,
            1_000_000_000_000_000,
            i64::MAX,
            i64::MIN,
            -1,
        ] {
            assert_eq!(Decimal::default().of(v), v.to_string().as_bytes(), "{v}");
        }
    }
}
