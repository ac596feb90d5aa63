//! `CL.THROTTLE key max_burst count period [quantity]`: redis-cell's
//! command and reply on rl's own bucket (the same GCRA, parser, decision
//! and call path as `RL.TAKE`), replicated as effects. A key holding a
//! redis-cell value (a string: the theoretical arrival time in
//! nanoseconds, with a TTL) is converted in place by a call that charges,
//! and replicated with the call's own effect; a call that charges nothing
//! answers from it as it is. redis-cell's key expires at its TAT, so a
//! value whose TAT is not within a second of the key's expiry (a user's
//! counter, a key without a TTL) is not one: any such string is refused
//! with `WRONGTYPE` and left untouched.
//!
//! Reply: `[limited, limit, remaining, retry_after_s, reset_after_s]`,
//! `limit = max_burst + 1`, `retry_after_s = -1` when allowed, whole
//! seconds rounded up.

use std::os::raw::c_int;

use super::limiter_call::{decide_call, Effect};
use crate::adapter::args::Cursor;
use crate::adapter::errors::{self, ArgError};
use crate::adapter::ffi::{reply_error, Arg, Ctx};
use crate::adapter::reply::reply_cell;
use crate::adapter::stats;
use crate::adapter::store::{Access, Call};
use crate::core::bucket::Rate;
use crate::core::cell::{answer, can_fit, redis_cell_bucket};
use crate::core::decision::Status;
use crate::core::limits::{MAX_DURATION_MS, MAX_POINTS};
use crate::core::penalty::Penalty;
use crate::core::record::Record;
use crate::core::take::{decide, TakeRequest};

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

/// Run `CL.THROTTLE`.
pub fn run(ctx: Ctx, args: &[Arg]) -> c_int {
    let throttle = match parse(args) {
        Ok(t) => t,
        Err(e) => return reply_error(ctx, &e.to_string()),
    };
    let rate = throttle.rate;
    let charges = throttle.quantity > 0 && can_fit(&rate, throttle.quantity);
    let access = if charges { Access::Write } else { Access::Read };
    let mut call = Call::new(ctx);
    if let Err(replied) = call.open(args, &[1], access, true) {
        return replied;
    }
    let cost = if charges { throttle.quantity } else { 0 };
    let req = TakeRequest::new(&[rate], cost);
    let Some(key) = call.key(0) else {
        return reply_error(ctx, errors::INTERNAL);
    };
    let decision = if key.record().is_ok() {
        decide_call(&mut call, &req, Effect::Commit)
    } else {
        let converted = key
            .string_value()
            .and_then(|bytes| redis_cell_bucket(bytes, key.pttl_ms(), call.now(), &rate));
        let Some(bucket) = converted else {
            return reply_error(ctx, errors::WRONGTYPE);
        };
        if charges {
            call.replace(0, Record::with_bucket(bucket));
            decide_call(&mut call, &req, Effect::Commit)
        } else {
            // Nothing is charged: answer from the value as it is.
            let mut state = [Some(bucket)];
            decide(&mut state, &mut Penalty::default(), &req, call.now(), 0).0
        }
    };
    let reply = answer(&decision, &rate, throttle.quantity);
    stats::THROTTLE.record(if can_fit(&rate, throttle.quantity) {
        decision.status
    } else {
        Status::Throttled
    });
    reply_cell(ctx, &reply)
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
