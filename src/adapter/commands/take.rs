//! `RL.TAKE key capacity tokens period [COST cost] [ALSO key capacity tokens period]...
//! [STRIKES threshold window] [BOX d1 d2 d3] [OFFENSES ttl] [JITTER percent]`
//!
//! Parses the call, reads every key's bucket and the first key's penalty
//! state, lets [`crate::core::take::take`] decide, and commits what changed.

use std::hash::BuildHasher;
use std::os::raw::c_int;

use crate::adapter::args::{is, set_once, Cursor};
use crate::adapter::errors::{self, ArgError};
use crate::adapter::ffi::{
    declare_key, is_keys_request, notify, now_ms, reply_error, reply_ints, Arg, Ctx,
};
use crate::adapter::stats;
use crate::adapter::store::{commit, Access, RlKey, WrongType};
use crate::core::bucket::{Bucket, Rate};
use crate::core::limits::{
    DEFAULT_BOX_MS, DEFAULT_OFFENSES_TTL_MS, MAX_BUCKETS, MAX_DURATION_MS, MAX_POINTS,
    MAX_THRESHOLD,
};
use crate::core::penalty::PenaltyPolicy;
use crate::core::take::{take, TakeRequest};

const NAME: &str = "rl.take";

/// Parse an `RL.TAKE` call. The position of every key is pushed to `keys`
/// as soon as it is read, so a getkeys request gets the keys even of a
/// call that is otherwise invalid.
pub fn parse<A: AsRef<[u8]>>(args: &[A], keys: &mut Vec<usize>) -> Result<TakeRequest, ArgError> {
    let mut c = Cursor::new(NAME, args);
    keys.push(c.key("key")?);
    let mut rates = vec![rate(&mut c, FIRST)?];
    let mut cost = None;
    let mut strikes = None;
    let mut boxes = None;
    let mut offenses = None;
    let mut jitter = None;
    while let Some(word) = c.word() {
        if is(word, "COST") {
            set_once(&mut cost, "COST", c.integer("COST", 0, MAX_POINTS)?)?;
        } else if is(word, "ALSO") {
            if rates.len() >= MAX_BUCKETS {
                return Err(ArgError::TooManyBuckets);
            }
            keys.push(c.key("ALSO key")?);
            rates.push(rate(&mut c, ALSO)?);
        } else if is(word, "STRIKES") {
            let threshold = c.integer("STRIKES threshold", 1, MAX_THRESHOLD)?;
            let window = c.duration_ms("STRIKES window", false)?;
            set_once(&mut strikes, "STRIKES", (threshold, window))?;
        } else if is(word, "BOX") {
            let d1 = c.duration_ms("BOX d1", true)?;
            let d2 = c.duration_ms("BOX d2", true)?;
            let d3 = c.duration_ms("BOX d3", true)?;
            set_once(&mut boxes, "BOX", [d1, d2, d3])?;
        } else if is(word, "OFFENSES") {
            set_once(
                &mut offenses,
                "OFFENSES",
                c.duration_ms("OFFENSES ttl", false)?,
            )?;
        } else if is(word, "JITTER") {
            set_once(&mut jitter, "JITTER", c.integer("JITTER percent", 0, 100)?)?;
        } else {
            return Err(ArgError::unknown_option(NAME, word));
        }
    }
    c.finish()?;
    let cost = cost.unwrap_or(1);
    if let Some(index) = rates.iter().position(|r| cost > r.capacity) {
        return Err(ArgError::CostAboveCapacity { index });
    }
    if let Some(index) = rates.iter().position(|r| r.fill_ms() > MAX_DURATION_MS) {
        return Err(ArgError::FillTooLong { index });
    }
    for (i, &a) in keys.iter().enumerate() {
        if keys[..i].iter().any(|&b| c.bytes_at(a) == c.bytes_at(b)) {
            return Err(ArgError::DuplicateKey);
        }
    }
    let penalty = match strikes {
        Some((threshold, window_ms)) => Some(PenaltyPolicy {
            threshold,
            window_ms,
            box_ms: boxes.unwrap_or(DEFAULT_BOX_MS),
            offenses_ttl_ms: offenses.unwrap_or(DEFAULT_OFFENSES_TTL_MS),
        }),
        None if boxes.is_some() => return Err(ArgError::NeedsStrikes { option: "BOX" }),
        None if offenses.is_some() => return Err(ArgError::NeedsStrikes { option: "OFFENSES" }),
        None => None,
    };
    Ok(TakeRequest {
        limits: rates,
        cost,
        penalty,
        jitter_percent: u8::try_from(jitter.unwrap_or(0)).unwrap_or(100),
    })
}

/// The argument names of a bucket's three numbers, as errors name them.
type RateNames = [&'static str; 3];
const FIRST: RateNames = ["capacity", "tokens", "period"];
const ALSO: RateNames = ["ALSO capacity", "ALSO tokens", "ALSO period"];

fn rate<A: AsRef<[u8]>>(
    c: &mut Cursor<'_, A>,
    [capacity, tokens, period]: RateNames,
) -> Result<Rate, ArgError> {
    Ok(Rate {
        capacity: c.integer(capacity, 1, MAX_POINTS)?,
        tokens: c.integer(tokens, 1, MAX_POINTS)?,
        period_ms: c.duration_ms(period, false)?,
    })
}

/// Run `RL.TAKE`.
pub fn run(ctx: Ctx, args: &[Arg]) -> c_int {
    let mut key_positions = Vec::with_capacity(2);
    let parsed = parse(args, &mut key_positions);
    if is_keys_request(ctx) {
        key_positions.iter().for_each(|&pos| declare_key(ctx, pos));
        return 0;
    }
    let req = match parsed {
        Ok(req) => req,
        Err(e) => return reply_error(ctx, &e.to_string()),
    };
    let access = if req.cost == 0 {
        Access::Read
    } else {
        Access::Write
    };
    let mut keys: Vec<RlKey> = key_positions
        .iter()
        .map(|&pos| RlKey::open(ctx, args[pos], access))
        .collect();
    let mut buckets: [Option<Bucket>; MAX_BUCKETS] = [None; MAX_BUCKETS];
    for (slot, key) in buckets.iter_mut().zip(&keys) {
        match key.record() {
            Ok(record) => *slot = record.and_then(|r| r.bucket),
            Err(WrongType) => return reply_error(ctx, errors::WRONGTYPE),
        }
    }
    let first = keys[0].record().ok().flatten();
    let mut penalty = first.map(|r| r.penalty_or_default()).unwrap_or_default();
    let now = now_ms(ctx);
    let random = std::hash::RandomState::new().hash_one(now);
    let (reply, effects) = take(&mut buckets[..keys.len()], &mut penalty, &req, now, random);

    for (i, key) in keys.iter_mut().enumerate() {
        let penalty_changed = i == 0 && effects.penalty_changed;
        let bucket_changed = effects.states_changed & (1 << i) != 0;
        if !bucket_changed && !penalty_changed {
            continue;
        }
        let mut record = key.working_copy();
        if bucket_changed {
            record.bucket = buckets[i];
        }
        if penalty_changed {
            record.set_penalty(penalty, now);
        }
        commit(ctx, key, record, now);
    }
    if let Some(active) = effects.tripped {
        notify(ctx, c"rl.boxed", keys[0].name);
        stats::trip(active.level);
    }
    stats::TAKE.record(reply.status);
    reply_ints(ctx, &reply.to_array())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse_str(line: &str) -> Result<TakeRequest, ArgError> {
        let args: Vec<&str> = line.split_whitespace().collect();
        parse(&args, &mut Vec::new())
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
    }

    #[test]
    fn keys_are_found_even_in_bad_calls() {
        let args = [
            "RL.TAKE", "a", "1", "1", "1", "ALSO", "b", "1", "1", "1", "ALSO", "c", "x",
        ];
        let mut keys = vec![];
        assert!(parse(&args, &mut keys).is_err());
        assert_eq!(keys, vec![1, 6, 11]);
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
