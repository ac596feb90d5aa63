//! `RL.TAKE key capacity tokens period [COST cost] [ALSO key capacity tokens period]...
//! [STRIKES threshold window] [BOX d1 d2 d3] [OFFENSES ttl] [JITTER percent]
//! [DELAY max_wait]`
//!
//! Parses the call, reads every key's bucket and the first key's penalty
//! state, lets the shared decision rule (see [`super::limiter_call`]), and
//! commits what changed.

use std::os::raw::c_int;

use arrayvec::ArrayVec;

use super::limiter_call::{check_cost, parse_call, run_parsed, Clause, Effect, KeyPositions};
use crate::adapter::args::{is, set_once, Cursor};
use crate::adapter::errors::ArgError;
use crate::adapter::ffi::{Arg, Ctx};
use crate::adapter::stats;
use crate::core::bucket::Rate;
use crate::core::limits::{MAX_BUCKETS, MAX_DURATION_MS, MAX_POINTS};
use crate::core::take::{Settle, TakeRequest};

const NAME: &str = "rl.take";

/// Parse an `RL.TAKE` call into `req` (empty, filled in place); the key
/// positions are pushed to `keys`.
pub fn parse<A: AsRef<[u8]>>(
    args: &[A],
    keys: &mut KeyPositions,
    req: &mut TakeRequest,
) -> Result<(), ArgError> {
    let mut c = Cursor::new(NAME, args);
    let mut delay = None;
    let mut partial = None;
    let mut min = None;
    let mut reserves: ArrayVec<(usize, u64), MAX_BUCKETS> = ArrayVec::new();
    parse_call(&mut c, keys, req, rate, |word, c| {
        if is(word, "DELAY") {
            set_once(&mut delay, "DELAY", c.duration_ms("DELAY max_wait", false)?)?;
        } else if is(word, "PARTIAL") {
            set_once(&mut partial, "PARTIAL", ())?;
        } else if is(word, "MIN") {
            set_once(&mut min, "MIN", c.integer("MIN minimum", 1, MAX_POINTS)?)?;
        } else if is(word, "RESERVE") {
            let index = c.integer("RESERVE index", 0, MAX_BUCKETS as u64 - 1)?;
            let percent = c.integer("RESERVE percent", 0, 100)?;
            let index = usize::try_from(index).unwrap_or(MAX_BUCKETS);
            if reserves.iter().any(|&(i, _)| i == index) {
                return Err(ArgError::Repeated {
                    option: "RESERVE for one index",
                });
            }
            reserves
                .try_push((index, percent))
                .map_err(|_| ArgError::TooManyBuckets)?;
        } else {
            return Ok(false);
        }
        Ok(true)
    })?;
    let settle = match req.settle {
        Settle::Charge => None,
        Settle::Debt => Some("DEBT"),
        Settle::Refund => Some("REFUND"),
    };
    match (delay.is_some(), partial.is_some(), settle) {
        (true, _, Some(b)) => return Err(ArgError::Together { a: "DELAY", b }),
        (_, true, Some(b)) => return Err(ArgError::Together { a: "PARTIAL", b }),
        (true, true, None) => {
            return Err(ArgError::Together {
                a: "PARTIAL",
                b: "DELAY",
            })
        }
        _ => {}
    }
    if partial.is_some() {
        let min = min.unwrap_or(1);
        if min > req.cost {
            return Err(ArgError::MinAboveCost);
        }
        req.partial_min = Some(min);
    } else if min.is_some() {
        return Err(ArgError::Needs {
            option: "MIN",
            needed: "PARTIAL",
        });
    }
    for &(index, percent) in &reserves {
        let Some(rate) = req.limits.get(index) else {
            return Err(ArgError::ReserveIndex { index });
        };
        // At least `percent`% of the capacity, rounded up.
        req.reserve[index] = rate.capacity.saturating_mul(percent).div_ceil(100);
    }
    check_cost(req)?;
    req.delay_ms = delay;
    if let Some(index) = req
        .limits
        .iter()
        .position(|r| r.fill_ms() > MAX_DURATION_MS)
    {
        return Err(ArgError::FillTooLong { index });
    }
    Ok(())
}

/// Read `capacity tokens period`.
fn rate<A: AsRef<[u8]>>(c: &mut Cursor<'_, A>, clause: Clause) -> Result<Rate, ArgError> {
    let [capacity, tokens, period] = match clause {
        Clause::First => ["capacity", "tokens", "period"],
        Clause::Also => ["ALSO capacity", "ALSO tokens", "ALSO period"],
    };
    Ok(Rate {
        capacity: c.integer(capacity, 1, MAX_POINTS)?,
        tokens: c.integer(tokens, 1, MAX_POINTS)?,
        period_ms: c.duration_ms(period, false)?,
    })
}

/// Run `RL.TAKE`.
pub fn run(ctx: Ctx, args: &[Arg]) -> c_int {
    let mut keys = KeyPositions::new();
    // Parsed in place and lent: a request is large enough that moving it
    // shows in a call's cost.
    let mut req = TakeRequest::empty();
    let parsed = parse(args, &mut keys, &mut req);
    let lent = parsed.as_ref().map(|()| (&req, Effect::Commit));
    run_parsed(ctx, args, &keys, lent, &stats::TAKE)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse_str(line: &str) -> Result<TakeRequest, ArgError> {
        let args: Vec<&str> = line.split_whitespace().collect();
        let mut req = TakeRequest::empty();
        parse(&args, &mut KeyPositions::new(), &mut req).map(|()| req)
    }

    #[test]
    fn full_syntax() {
        let req = parse_str(
            "RL.TAKE k 3000 3000 60 cost 10 ALSO t 100 100 1.5 STRIKES 20 60 BOX 300 3600 0 OFFENSES 3600 JITTER 10",
        )
        .expect("valid");
        assert_eq!(req.cost, 10);
        assert_eq!(
            req.limits[1],
            Rate {
                capacity: 100,
                tokens: 100,
                period_ms: 1500
            }
        );
        let p = req.penalty.expect("strikes");
        assert_eq!(
            (p.threshold, p.window_ms, p.box_ms, p.offenses_ttl_ms),
            (20, 60_000, [300_000, 3_600_000, 0], 3_600_000)
        );
        assert_eq!(req.jitter_percent, 10);
        assert!(!p.every, "a strike is an early retry unless EVERY");
        let every = parse_str("RL.TAKE k 10 10 60 STRIKES 5 900 EVERY").expect("valid");
        assert!(every.penalty.expect("strikes").every);
    }

    #[test]
    fn keys_are_found_even_in_bad_calls() {
        let args = [
            "RL.TAKE", "a", "1", "1", "1", "ALSO", "b", "1", "1", "1", "ALSO", "c", "x",
        ];
        let mut keys = KeyPositions::new();
        assert!(parse(&args, &mut keys, &mut TakeRequest::empty()).is_err());
        assert_eq!(keys.as_slice(), &[1, 6, 11]);
    }

    #[test]
    fn bad_input_names_the_argument() {
        let cases = [
            ("RL.TAKE", "missing key"),
            ("RL.TAKE k 10 10", "missing period"),
            ("RL.TAKE k 0 10 60", "capacity must be"),
            ("RL.TAKE k 10 -1 60", "tokens must be"),
            ("RL.TAKE k 10 10 0", "period must be"),
            ("RL.TAKE k 10 10 nan", "period must be"),
            ("RL.TAKE k 10 10 inf", "period must be"),
            (
                "RL.TAKE k 10 10 60 COST 11",
                "COST is above the capacity of the first key",
            ),
            (
                "RL.TAKE k 10 10 60 ALSO t 5 5 60 COST 6",
                "COST is above the capacity of ALSO bucket 1",
            ),
            (
                "RL.TAKE k 10 10 60 COST 1 COST 2",
                "COST is given more than once",
            ),
            ("RL.TAKE k 10 10 60 BOX 1 2 3", "BOX requires STRIKES"),
            (
                "RL.TAKE k 10 10 60 OFFENSES 10",
                "OFFENSES requires STRIKES",
            ),
            ("RL.TAKE k 10 10 60 EVERY", "EVERY requires STRIKES"),
            (
                "RL.TAKE k 10 10 60 STRIKES 5 900 EVERY EVERY",
                "EVERY is given more than once",
            ),
            ("RL.TAKE k 10 10 60 JITTER 101", "JITTER percent must be"),
            (
                "RL.TAKE k 10 10 60 STRIKES 0 60",
                "STRIKES threshold must be",
            ),
            ("RL.TAKE k 10 10 60 FOO", "unknown option 'FOO'"),
            ("RL.TAKE k 10 10 60 ALSO t 0 1 1", "ALSO capacity"),
            ("RL.TAKE k 1000000000 1 3153600000", "time to refill"),
            ("RL.TAKE k 10 10 60 ALSO k 1 1 1", "repeats a key"),
            ("RL.TAKE k 10 10 60 COST", "missing COST"),
            ("RL.TAKE k 99999999999999999999 10 60", "capacity must be"),
            ("RL.TAKE k 10 10 60 COST 1 REFUND 1", "REFUND and COST"),
            ("RL.TAKE k 10 10 60 DEBT REFUND 1", "REFUND and DEBT"),
            ("RL.TAKE k 10 10 60 REFUND 0", "REFUND points must be"),
            ("RL.TAKE k 10 10 60 REFUND", "missing REFUND points"),
            (
                "RL.TAKE k 10 10 60 DEBT DEBT",
                "DEBT is given more than once",
            ),
            ("RL.TAKE k 10 10 60 DEBT DELAY 1", "DELAY and DEBT"),
        ];
        for (line, expected) in cases {
            let err = parse_str(line).expect_err(line).to_string();
            assert!(err.starts_with("ERR "), "{line}: {err}");
            assert!(err.contains(expected), "{line}: {err}");
        }
    }

    #[test]
    fn too_many_also() {
        let mut line = String::from("RL.TAKE k0 1 1 1");
        for i in 1..MAX_BUCKETS {
            line.push_str(&format!(" ALSO k{i} 1 1 1"));
        }
        assert!(parse_str(&line).is_ok());
        line.push_str(" ALSO extra 1 1 1");
        assert_eq!(parse_str(&line), Err(ArgError::TooManyBuckets));
    }
}
