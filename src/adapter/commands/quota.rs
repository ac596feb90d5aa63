//! `RL.QUOTA key limit DAY|WEEK|MONTH [COST cost] [PEEK] [REGION]`: at
//! most `limit` points per calendar day, ISO week or month in UTC. The
//! same parser, decision and commit path as `RL.TAKE` (so `ALSO`,
//! `STRIKES` and `JITTER` work here too); `PEEK` is a dry run of the
//! call's cost; `REGION` counts on this region's component of each key
//! and decides on the total ([`RegionalQuota`]).

use std::os::raw::c_int;

use super::limiter_call::{check_cost, parse_call, run_parsed, Clause, Effect, KeyPositions};
use crate::adapter::args::{is, set_once, Cursor};
use crate::adapter::errors::ArgError;
use crate::adapter::ffi::{Arg, Ctx};
use crate::adapter::regions;
use crate::adapter::stats;
use crate::core::limits::MAX_POINTS;
use crate::core::quota::{Period, Quota};
use crate::core::region::RegionalQuota;
use crate::core::take::Request;

const NAME: &str = "rl.quota";

/// The flags of an `RL.QUOTA` call.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Flags {
    /// `PEEK`: a dry run.
    pub peek: bool,
    /// `REGION`: count on this region's component.
    pub region: bool,
}

/// Parse an `RL.QUOTA` call into `req` (empty, filled in place): its
/// flags.
pub fn parse<A: AsRef<[u8]>>(
    args: &[A],
    keys: &mut KeyPositions,
    req: &mut Request<Quota>,
) -> Result<Flags, ArgError> {
    let mut c = Cursor::new(NAME, args);
    let (mut peek, mut region) = (None, None);
    parse_call(&mut c, keys, req, quota, |word, _| {
        if is(word, "PEEK") {
            set_once(&mut peek, "PEEK", ())?;
        } else if is(word, "REGION") {
            set_once(&mut region, "REGION", ())?;
        } else {
            return Ok(false);
        }
        Ok(true)
    })?;
    check_cost(req)?;
    Ok(Flags {
        peek: peek.is_some(),
        region: region.is_some(),
    })
}

/// Read `limit DAY|WEEK|MONTH`.
fn quota<A: AsRef<[u8]>>(c: &mut Cursor<'_, A>, clause: Clause) -> Result<Quota, ArgError> {
    let [limit, period] = match clause {
        Clause::First => ["limit", "period"],
        Clause::Also => ["ALSO limit", "ALSO period"],
    };
    let limit = c.integer(limit, 1, MAX_POINTS)?;
    let word = c.word().ok_or(ArgError::Missing {
        command: NAME,
        what: period,
    })?;
    let period = if is(word, "DAY") {
        Period::Day
    } else if is(word, "WEEK") {
        Period::Week
    } else if is(word, "MONTH") {
        Period::Month
    } else {
        return Err(ArgError::Period { what: period });
    };
    Ok(Quota { limit, period })
}

/// Run `RL.QUOTA`.
pub fn run(ctx: Ctx, args: &[Arg]) -> c_int {
    let mut keys = KeyPositions::new();
    let mut req = Request::empty();
    let parsed = parse(args, &mut keys, &mut req);
    let effect = match parsed {
        Ok(Flags { peek: true, .. }) => {
            // A dry run simulates no strike: it reports the cost's fit only.
            req.penalty = None;
            Effect::DryRun
        }
        _ => Effect::Commit,
    };
    if let Ok(Flags { region: true, .. }) = parsed {
        let regional =
            regions::local().map(|local| req.map_limits(|&quota| RegionalQuota { quota, local }));
        let lent = regional.as_ref().map(|r| (r, effect));
        return run_parsed(ctx, args, &keys, lent, &stats::QUOTA);
    }
    let lent = parsed.as_ref().map(|_| (&req, effect));
    run_parsed(ctx, args, &keys, lent, &stats::QUOTA)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse_str(line: &str) -> Result<(Request<Quota>, bool), ArgError> {
        let args: Vec<&str> = line.split_whitespace().collect();
        let mut req = Request::empty();
        parse(&args, &mut KeyPositions::new(), &mut req).map(|flags| (req, flags.peek))
    }

    #[test]
    fn region_flag() {
        let args: Vec<&str> = "RL.QUOTA k 10 MONTH REGION COST 2 ALSO t 5 MONTH"
            .split_whitespace()
            .collect();
        let mut req = Request::empty();
        let flags = parse(&args, &mut KeyPositions::new(), &mut req).expect("valid");
        assert_eq!(
            flags,
            Flags {
                peek: false,
                region: true
            }
        );
        assert_eq!(req.limits.len(), 2);
        let err = parse_str("RL.QUOTA k 10 DAY REGION region").expect_err("twice");
        assert_eq!(err.to_string(), "ERR REGION is given more than once");
    }

    #[test]
    fn syntax() {
        let (req, peek) = parse_str("RL.QUOTA k 10000 month COST 25 PEEK").expect("valid");
        assert_eq!(
            req.limits[0],
            Quota {
                limit: 10_000,
                period: Period::Month
            }
        );
        assert_eq!((req.cost, peek), (25, true));
        let (req, peek) = parse_str("RL.QUOTA k 5 DAY ALSO t 100 WEEK").expect("valid");
        assert_eq!(req.limits[1].period, Period::Week);
        assert!(!peek);
    }

    #[test]
    fn bad_input() {
        for (line, expected) in [
            ("RL.QUOTA k 10 YEAR", "period must be DAY, WEEK or MONTH"),
            ("RL.QUOTA k 10", "missing period"),
            ("RL.QUOTA k 0 DAY", "limit must be"),
            (
                "RL.QUOTA k 10 DAY PEEK PEEK",
                "PEEK is given more than once",
            ),
            ("RL.QUOTA k 10 DAY COST 11", "COST is above"),
            ("RL.QUOTA k 10 DAY ALSO t 5 HOUR", "ALSO period must be"),
        ] {
            let err = parse_str(line).expect_err(line).to_string();
            assert!(
                err.starts_with("ERR ") && err.contains(expected),
                "{line}: {err}"
            );
        }
    }
}
