//! `RL.REGION READ key` · `RL.REGION MERGE key DAY|WEEK|MONTH
//! period_end_ms region added refunded [region added refunded ...]`: read
//! a regional quota key's components, and apply the components of other
//! regions to it by maximum ([`crate::core::region::merge`]). Registered as
//! subcommands, so that `READ` is read-only (it works on a replica).
//! A merge is replicated as its effect and announces nothing: only a
//! region's own calls publish `rl.quota.region`.

use std::os::raw::c_int;

use crate::adapter::args::{is, parse_integer, Cursor};
use crate::adapter::errors::ArgError;
use crate::adapter::ffi::{reply_array, reply_bulk, reply_error, reply_int, reply_null, Arg, Ctx};
use crate::adapter::regions::{self, Regions};
use crate::adapter::stats;
use crate::adapter::store::{Access, Call};
use crate::core::quota::Period;
use crate::core::region::{
    is_acceptable_end, merge, merge_conflict, Component, Merge, RegionCounts, RegionName,
    MAX_COMPONENT,
};
use crate::core::take::KeySet;
use crate::core::time::Millis;

const NAME: &str = "rl.region";

/// The key is argument 2 of every subcommand.
const KEY: usize = 2;

/// Parse `READ key`.
pub fn parse_read<A: AsRef<[u8]>>(args: &[A]) -> Result<(), ArgError> {
    let mut c = Cursor::after_subcommand(NAME, args);
    c.key("key")?;
    c.finish()
}

/// Parse `MERGE key period period_end_ms (region added refunded)...`
/// against the `regions` at `now`: every triple is checked before
/// anything is applied.
pub fn parse_merge<A: AsRef<[u8]>>(
    args: &[A],
    regions: &Regions,
    now: Millis,
) -> Result<Merge, ArgError> {
    let mut c = Cursor::after_subcommand(NAME, args);
    c.key("key")?;
    let word = c.word().ok_or(ArgError::Missing {
        command: NAME,
        what: "period",
    })?;
    let period = [Period::Day, Period::Week, Period::Month]
        .into_iter()
        .find(|p| is(word, p.name()))
        .ok_or(ArgError::Period { what: "period" })?;
    let end = c.word().ok_or(ArgError::Missing {
        command: NAME,
        what: "period_end_ms",
    })?;
    let end = parse_integer(end)
        .and_then(|e| Millis::try_from(e).ok())
        .filter(|&e| is_acceptable_end(period, e, now))
        .ok_or(ArgError::PeriodEnd { period })?;
    let mut m = Merge {
        period,
        end,
        components: Default::default(),
    };
    loop {
        let region = c.word().ok_or(ArgError::Missing {
            command: NAME,
            what: "region",
        })?;
        let region = RegionName::new(region).ok_or(ArgError::RegionName)?;
        let name = || region.as_str().to_string();
        if region == regions.local {
            return Err(ArgError::OwnRegion { name: name() });
        }
        if !regions.all.contains(&region) {
            return Err(ArgError::UnknownRegion { name: name() });
        }
        if m.components.iter().any(|x| x.region == region) {
            return Err(ArgError::RepeatedRegion { name: name() });
        }
        let added = c.integer("added", 0, MAX_COMPONENT)?;
        let refunded = c.integer("refunded", 0, MAX_COMPONENT)?;
        if refunded > added {
            return Err(ArgError::RefundedAboveAdded { name: name() });
        }
        m.components
            .try_push(Component {
                region,
                added,
                refunded,
            })
            .map_err(|_| ArgError::TooManyRegions)?;
        if !c.has_more() {
            return Ok(m);
        }
    }
}

/// Run `RL.REGION READ`: nil, or `[period_end_ms, period, [[region,
/// added, refunded]...]]`.
pub fn read(ctx: Ctx, args: &[Arg]) -> c_int {
    if let Err(e) = parse_read(args) {
        return reply_error(ctx, &e.to_string());
    }
    let mut call = Call::new(ctx);
    if let Err(replied) = call.open(args, &[KEY], Access::Read, false) {
        return replied;
    }
    let now = call.now();
    let Some(counts) = call
        .record(0)
        .and_then(|r| r.part::<Box<RegionCounts>>())
        .filter(|c| now < c.end)
    else {
        return reply_null(ctx);
    };
    reply_array(ctx, 3);
    reply_int(ctx, counts.end);
    reply_bulk(ctx, counts.period.name().as_bytes());
    reply_array(ctx, counts.components().len());
    for c in counts.components() {
        reply_array(ctx, 3);
        reply_bulk(ctx, c.region.as_bytes());
        reply_int(ctx, i64::try_from(c.added).unwrap_or(i64::MAX));
        reply_int(ctx, i64::try_from(c.refunded).unwrap_or(i64::MAX));
    }
    0
}

/// Run `RL.REGION MERGE`: the number of components that grew.
pub fn merge_cmd(ctx: Ctx, args: &[Arg]) -> c_int {
    let mut call = Call::new(ctx);
    let now = call.now();
    let parsed = regions::current().and_then(|r| parse_merge(args, &r, now));
    let m = match parsed {
        Ok(m) => m,
        Err(e) => return refuse(ctx, &e),
    };
    if let Err(replied) = call.open(args, &[KEY], Access::Write, false) {
        return replied;
    }
    let record = call.record(0);
    if let Some(conflict) = record.and_then(|r| merge_conflict(r, m.period, now)) {
        return refuse(ctx, &ArgError::Conflict(conflict));
    }
    let mut counts = record.and_then(|r| r.part::<Box<RegionCounts>>()).cloned();
    let grown = merge(&mut counts, &m, now);
    if grown > 0 {
        if let Some(record) = call.edit(0) {
            record.set_part(counts);
        }
        call.commit(KeySet::first(1), None);
    }
    stats::REGION_MERGES.incr();
    stats::REGION_MERGED.add(grown as u64);
    reply_int(ctx, grown as i64)
}

/// Reply `e` to a refused merge, and count it.
fn refuse(ctx: Ctx, e: &ArgError) -> c_int {
    stats::REGION_REFUSED.incr();
    reply_error(ctx, &e.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::quota::days_from_civil;

    const DAY_MS: i64 = 86_400_000;

    fn regions() -> Regions {
        let name = |s: &str| RegionName::new(s.as_bytes()).expect("valid");
        Regions {
            local: name("eu"),
            all: [name("eu"), name("us"), name("ap")].into_iter().collect(),
        }
    }

    fn now() -> Millis {
        days_from_civil(2026, 6, 15) * DAY_MS
    }

    fn parse(line: &str) -> Result<Merge, ArgError> {
        let args: Vec<&str> = line.split_whitespace().collect();
        parse_merge(&args, &regions(), now())
    }

    #[test]
    fn merges_parse() {
        let end = days_from_civil(2026, 7, 1) * DAY_MS;
        let m = parse(&format!("RL.REGION MERGE k month {end} us 5 1 ap 3 0")).expect("valid");
        assert_eq!(
            (m.period, m.end, m.components.len()),
            (Period::Month, end, 2)
        );
        assert_eq!(parse_read(&["RL.REGION", "READ", "k"]), Ok(()));
    }

    #[test]
    fn bad_merges() {
        let end = days_from_civil(2026, 7, 1) * DAY_MS;
        let far = days_from_civil(2026, 9, 1) * DAY_MS;
        for (line, expected) in [
            (
                format!("RL.REGION MERGE k YEAR {end} us 1 0"),
                "period must be",
            ),
            (
                format!("RL.REGION MERGE k MONTH {} us 1 0", end + 1),
                "period_end_ms must be the end of a past, the current or the next MONTH",
            ),
            (
                format!("RL.REGION MERGE k MONTH {far} us 1 0"),
                "period_end_ms",
            ),
            (
                "RL.REGION MERGE k MONTH -5 us 1 0".to_string(),
                "period_end_ms",
            ),
            (
                format!("RL.REGION MERGE k MONTH {end} sa 1 0"),
                "region 'sa' is not in rl.regions",
            ),
            (
                format!("RL.REGION MERGE k MONTH {end} eu 1 0"),
                "region 'eu' is this server's own region",
            ),
            (
                format!("RL.REGION MERGE k MONTH {end} us 1 0 us 2 0"),
                "region 'us' is given more than once",
            ),
            (
                format!("RL.REGION MERGE k MONTH {end} us 9007199254740993 0"),
                "added must be an integer from 0 to 9007199254740992",
            ),
            (
                format!("RL.REGION MERGE k MONTH {end} us -1 0"),
                "added must be",
            ),
            (
                format!("RL.REGION MERGE k MONTH {end} us 1 2"),
                "refunded is above added for region 'us'",
            ),
            (
                format!("RL.REGION MERGE k MONTH {end} us 1"),
                "missing refunded",
            ),
            (format!("RL.REGION MERGE k MONTH {end}"), "missing region"),
            (
                format!("RL.REGION MERGE k MONTH {end} u.s 1 0"),
                "region must be 1 to 32 bytes",
            ),
        ] {
            let err = parse(&line).expect_err(&line).to_string();
            assert!(
                err.starts_with("ERR ") && err.contains(expected),
                "{line}: {err}"
            );
        }
    }
}
