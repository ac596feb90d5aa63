//! `RL.WINDOW key limit window [COST cost] [ALSO key limit window]...
//! [EXACT | FIXED] [STRIKES threshold window] [BOX d1 d2 d3]
//! [OFFENSES ttl] [JITTER percent]`: at most `limit` points per `window`
//! seconds, as a sliding window counter (default), an exact sliding log or
//! a fixed window offset per key. The same parser, decision, penalty
//! ladder and commit path as `RL.TAKE` (see [`super::limiter_call`]).

use std::os::raw::c_int;

use super::limiter_call::{check_cost, parse_call, run_parsed, Clause, Effect, KeyPositions};
use crate::adapter::args::{is, set_once, Cursor};
use crate::adapter::errors::ArgError;
use crate::adapter::ffi::{Arg, Ctx};
use crate::adapter::stats;
use crate::core::limits::{MAX_EXACT_LIMIT, MAX_POINTS};
use crate::core::take::Request;
use crate::core::window::{key_offset, Mode, Window};

const NAME: &str = "rl.window";

/// Parse an `RL.WINDOW` call; the key positions are pushed to `keys`.
/// `ALSO` windows take the first window's mode; each key's boundary
/// offset is a stable hash of its name.
pub fn parse<A: AsRef<[u8]>>(
    args: &[A],
    keys: &mut KeyPositions,
    req: &mut Request<Window>,
) -> Result<(), ArgError> {
    let mut c = Cursor::new(NAME, args);
    let mut mode = None;
    parse_call(&mut c, keys, req, window, |word, _| {
        let chosen = if is(word, "EXACT") {
            Mode::Exact
        } else if is(word, "FIXED") {
            Mode::Fixed
        } else {
            return Ok(false);
        };
        set_once(&mut mode, "EXACT or FIXED", chosen)?;
        Ok(true)
    })?;
    check_cost(req)?;
    let mode = mode.unwrap_or(Mode::Sliding);
    for (index, (w, &pos)) in req.limits.iter_mut().zip(keys.iter()).enumerate() {
        w.mode = mode;
        w.offset_ms = key_offset(c.bytes_at(pos), w.window_ms);
        if mode == Mode::Exact && w.limit > MAX_EXACT_LIMIT {
            return Err(ArgError::ExactLimit { index });
        }
    }
    Ok(())
}

/// Read `limit window`.
fn window<A: AsRef<[u8]>>(c: &mut Cursor<'_, A>, clause: Clause) -> Result<Window, ArgError> {
    let [limit, window] = match clause {
        Clause::First => ["limit", "window"],
        Clause::Also => ["ALSO limit", "ALSO window"],
    };
    Ok(Window {
        limit: c.integer(limit, 1, MAX_POINTS)?,
        window_ms: c.duration_ms(window, false)?,
        mode: Mode::Sliding,
        offset_ms: 0,
    })
}

/// Run `RL.WINDOW`.
pub fn run(ctx: Ctx, args: &[Arg]) -> c_int {
    let mut keys = KeyPositions::new();
    let mut req = Request::empty();
    let parsed = parse(args, &mut keys, &mut req);
    let lent = parsed.as_ref().map(|()| (&req, Effect::Commit));
    run_parsed(ctx, args, &keys, lent, &stats::WINDOW)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse_str(line: &str) -> Result<Request<Window>, ArgError> {
        let args: Vec<&str> = line.split_whitespace().collect();
        let mut req = Request::empty();
        parse(&args, &mut KeyPositions::new(), &mut req).map(|()| req)
    }

    #[test]
    fn modes_apply_to_every_window() {
        let req = parse_str("RL.WINDOW a 5 60 ALSO b 20 3600 FIXED COST 2").expect("valid");
        assert_eq!(req.cost, 2);
        assert!(req.limits.iter().all(|w| w.mode == Mode::Fixed));
        assert_eq!(
            (req.limits[1].limit, req.limits[1].window_ms),
            (20, 3_600_000)
        );
        let req = parse_str("RL.WINDOW a 5 60").expect("valid");
        assert_eq!(req.limits[0].mode, Mode::Sliding);
        assert_eq!(req.limits[0].offset_ms, key_offset(b"a", 60_000));
    }

    #[test]
    fn each_key_gets_its_own_offset() {
        // Every ALSO key of one call gets the offset of its own name: over
        // 16 keys of one tenant, nearly all offsets differ (a shared offset
        // would synchronise their resets).
        let mut line = String::from("RL.WINDOW rl:{t}:k0 5 60");
        for i in 1..16 {
            line.push_str(&format!(" ALSO rl:{{t}}:k{i} 5 60"));
        }
        let req = parse_str(&line).expect("valid");
        let offsets: std::collections::BTreeSet<u64> =
            req.limits.iter().map(|w| w.offset_ms).collect();
        assert!(offsets.len() >= 15, "{offsets:?}");
        for (i, w) in req.limits.iter().enumerate() {
            let name = format!("rl:{{t}}:k{i}");
            assert_eq!(w.offset_ms, key_offset(name.as_bytes(), 60_000));
            assert!(w.offset_ms < 60_000);
        }
    }

    #[test]
    fn bad_input() {
        for (line, expected) in [
            ("RL.WINDOW a 0 60", "limit must be"),
            ("RL.WINDOW a 5 0", "window must be"),
            (
                "RL.WINDOW a 5 60 EXACT FIXED",
                "EXACT or FIXED is given more than once",
            ),
            ("RL.WINDOW a 5 60 COST 6", "COST is above"),
            ("RL.WINDOW a 5 60 ALSO b 0 1", "ALSO limit"),
            ("RL.WINDOW a 10001 60 EXACT", "EXACT"),
            ("RL.WINDOW a 5 60 DELAY 1", "unknown option 'DELAY'"),
        ] {
            let err = parse_str(line).expect_err(line).to_string();
            assert!(
                err.starts_with("ERR ") && err.contains(expected),
                "{line}: {err}"
            );
        }
    }
}
