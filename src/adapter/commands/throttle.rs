//! `CL.THROTTLE key max_burst count period [quantity]`: redis-cell's
//! command and reply on rl's own bucket (the same GCRA, parser, decision
//! and commit path as `RL.TAKE`), replicated as effects. A key holding a
//! redis-cell value (a string: the theoretical arrival time in
//! nanoseconds) is converted in place, not reset, and replicated with the
//! call's own effect.
//!
//! Reply: `[limited, limit, remaining, retry_after_s, reset_after_s]`,
//! `limit = max_burst + 1`, `retry_after_s = -1` when allowed, whole
//! seconds rounded up.

use std::os::raw::c_int;

use super::limiter_call::{decide_call, Effect};
use crate::adapter::args::Cursor;
use crate::adapter::errors::{self, ArgError};
use crate::adapter::ffi::{now_ms, reply_error, reply_ints, Arg, Ctx};
use crate::adapter::stats;
use crate::adapter::store::{commit_in_place, Access, RlKey};
use crate::core::bucket::{from_tat_ns, Rate};
use crate::core::limits::{MAX_DURATION_MS, MAX_POINTS};
use crate::core::record::Record;
use crate::core::reply::{Reply, Status};
use crate::core::take::TakeRequest;

const NAME: &str = "cl.throttle";

/// A parsed `CL.THROTTLE` call.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Throttle {
    /// The bucket: `capacity = max_burst + 1`, `count` per `period`.
    pub rate: Rate,
    /// Points the call takes (`quantity`, default 1).
    pub quantity: u64,
}

/// Parse `CL.THROTTLE key max_burst count period [quantity]`; the key is
/// argument 1.
pub fn parse<A: AsRef<[u8]>>(args: &[A]) -> Result<Throttle, ArgError> {
    let mut c = Cursor::new(NAME, args);
    c.key("key")?;
    let max_burst = c.integer("max_burst", 0, MAX_POINTS - 1)?;
    let tokens = c.integer("count", 1, MAX_POINTS)?;
    let period_ms = c.duration_ms("period", false)?;
    let quantity = if c.has_more() {
        c.integer("quantity", 0, MAX_POINTS)?
    } else {
        1
    };
    c.finish()?;
    let rate = Rate {
        capacity: max_burst + 1,
        tokens,
        period_ms,
    };
    if rate.fill_ms() > MAX_DURATION_MS {
        return Err(ArgError::FillTooLong { index: 0 });
    }
    Ok(Throttle { rate, quantity })
}

/// Whole seconds, rounded up.
fn seconds(ms: i64) -> i64 {
    if ms <= 0 {
        0
    } else {
        (ms + 999) / 1000
    }
}

/// Replace a redis-cell value in the key by the equivalent rl bucket, not
/// yet committed (the call commits it, charged or not); true when there
/// was one.
fn convert_redis_cell(ctx: Ctx, name: Arg, rate: &Rate) -> Result<bool, c_int> {
    let mut key = RlKey::open(ctx, name, Access::Write);
    let Some(bytes) = key.string_value() else {
        return Ok(false);
    };
    let tat_ns = std::str::from_utf8(bytes)
        .ok()
        .and_then(|s| s.trim().parse::<i64>().ok())
        .ok_or_else(|| reply_error(ctx, errors::WRONGTYPE))?;
    key.store(Record::with_bucket(from_tat_ns(tat_ns, rate)));
    Ok(true)
}

/// Run `CL.THROTTLE`.
pub fn run(ctx: Ctx, args: &[Arg]) -> c_int {
    let throttle = match parse(args) {
        Ok(t) => t,
        Err(e) => return reply_error(ctx, &e.to_string()),
    };
    let Some(&name) = args.get(1) else {
        return reply_error(ctx, errors::INTERNAL);
    };
    let converted = match convert_redis_cell(ctx, name, &throttle.rate) {
        Ok(converted) => converted,
        Err(replied) => return replied,
    };
    let rate = throttle.rate;
    // redis-cell answers a quantity above the burst "limited, never": a
    // probe reads the state, nothing is taken.
    let too_big = throttle.quantity > rate.capacity;
    let cost = if too_big { 0 } else { throttle.quantity };
    let effect = if too_big {
        Effect::DryRun
    } else {
        Effect::Commit
    };
    let req = TakeRequest::new(&[rate], cost);
    let reply: Reply = match decide_call(ctx, args, &[1], &req, effect) {
        Ok(reply) => reply,
        Err(replied) => return replied,
    };
    // A charge committed the converted bucket with it; otherwise the
    // conversion is committed on its own.
    if converted && !(reply.status == Status::Allowed && cost > 0) {
        commit_in_place(ctx, &mut RlKey::open(ctx, name, Access::Write), now_ms(ctx));
    }
    stats::THROTTLE.record(if too_big {
        Status::Throttled
    } else {
        reply.status
    });
    let limited = too_big || reply.status != Status::Allowed;
    // -1 when allowed, when the quantity can never fit, and for a manual
    // box set with `RL.BOX TRIP` (which has no end).
    let retry_after = if too_big || !limited || reply.retry_after_ms < 0 {
        -1
    } else {
        seconds(reply.retry_after_ms).max(1)
    };
    reply_ints(
        ctx,
        &[
            i64::from(limited),
            i64::try_from(rate.capacity).unwrap_or(i64::MAX),
            reply.remaining,
            retry_after,
            seconds(reply.reset_ms),
        ],
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse_str(line: &str) -> Result<Throttle, ArgError> {
        let args: Vec<&str> = line.split_whitespace().collect();
        parse(&args)
    }

    #[test]
    fn syntax() {
        let t = parse_str("CL.THROTTLE user123 15 30 60").expect("valid");
        assert_eq!(
            t,
            Throttle {
                rate: Rate {
                    capacity: 16,
                    tokens: 30,
                    period_ms: 60_000
                },
                quantity: 1
            }
        );
        assert_eq!(
            parse_str("CL.THROTTLE k 0 1 1 5").expect("valid").quantity,
            5
        );
    }

    #[test]
    fn bad_input() {
        for (line, expected) in [
            ("CL.THROTTLE k", "missing max_burst"),
            ("CL.THROTTLE k -1 1 1", "max_burst must be"),
            ("CL.THROTTLE k 1 0 1", "count must be"),
            ("CL.THROTTLE k 1 1 0", "period must be"),
            ("CL.THROTTLE k 1 1 1 x", "quantity must be"),
            ("CL.THROTTLE k 1 1 1 1 1", "unexpected extra argument"),
        ] {
            let err = parse_str(line).expect_err(line).to_string();
            assert!(
                err.starts_with("ERR ") && err.contains(expected),
                "{line}: {err}"
            );
        }
    }
}
