//! What the limiter commands (`RL.TAKE`, `RL.WINDOW`, `RL.QUOTA`) share:
//! one parser for `key <limiter arguments> [ALSO key <limiter
//! arguments>]... [COST cost [DEBT] | REFUND points] [STRIKES [EVERY]]
//! [BOX] [OFFENSES] [JITTER]` plus each command's own words, and
//! one runner that opens every key in a [`Call`], lets [`decide`] rule on
//! the states where they are stored, and commits.

use std::hash::BuildHasher;
use std::os::raw::c_int;

use arrayvec::ArrayVec;

use crate::adapter::args::{is, set_once, Cursor};
use crate::adapter::errors::ArgError;
use crate::adapter::ffi::{declare_key, is_keys_request, reply_error, Arg, Ctx};
use crate::adapter::reply::{reply_decision, reply_partial};
use crate::adapter::stats::{self, Outcomes};
use crate::adapter::store::{Access, Call, Event};
use crate::core::decision::Decision;
use crate::core::limiter::{Conflict, Limiter};
use crate::core::limits::{
    DEFAULT_BOX_MS, DEFAULT_OFFENSES_TTL_MS, MAX_BUCKETS, MAX_POINTS, MAX_THRESHOLD,
};
use crate::core::penalty::PenaltyPolicy;
use crate::core::record::{Holds, Record};
use crate::core::take::{decide, Request, Settle};

/// The positions of a call's keys in its arguments, first key first (a
/// fixed array: parsing allocates nothing).
pub type KeyPositions = ArrayVec<usize, MAX_BUCKETS>;

/// Which key's limiter arguments are being read: errors name them
/// `capacity` for the first key and `ALSO capacity` for the others.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Clause {
    /// The first key.
    First,
    /// An `ALSO` clause.
    Also,
}

/// Parse a limiter call after the command name into `req` (an empty
/// request, filled in place). `limiter` reads one key's
/// limiter arguments; `own_word` consumes a word specific to the command
/// (returning `Ok(false)` when the word is not its own). The position of
/// every key is pushed to `keys` as soon as it is read, so a getkeys
/// request gets the keys even of a call that is otherwise invalid.
pub fn parse_call<'a, A: AsRef<[u8]>, L: Limiter>(
    c: &mut Cursor<'a, A>,
    keys: &mut KeyPositions,
    req: &mut Request<L>,
    mut limiter: impl FnMut(&mut Cursor<'a, A>, Clause) -> Result<L, ArgError>,
    mut own_word: impl FnMut(&[u8], &mut Cursor<'a, A>) -> Result<bool, ArgError>,
) -> Result<(), ArgError> {
    keys.try_push(c.key("key")?)
        .map_err(|_| ArgError::TooManyBuckets)?;
    let limits = &mut req.limits;
    limits
        .try_push(limiter(c, Clause::First)?)
        .map_err(|_| ArgError::TooManyBuckets)?;
    let mut cost = None;
    let mut strikes = None;
    let mut boxes = None;
    let mut offenses = None;
    let mut jitter = None;
    let mut every = None;
    let mut debt = None;
    let mut refund = None;
    while let Some(word) = c.word() {
        if is(word, "COST") {
            set_once(&mut cost, "COST", c.integer("COST", 0, MAX_POINTS)?)?;
        } else if is(word, "DEBT") {
            set_once(&mut debt, "DEBT", ())?;
        } else if is(word, "REFUND") {
            set_once(
                &mut refund,
                "REFUND",
                c.integer("REFUND points", 1, MAX_POINTS)?,
            )?;
        } else if is(word, "ALSO") {
            if limits.len() >= MAX_BUCKETS {
                return Err(ArgError::TooManyBuckets);
            }
            keys.try_push(c.key("ALSO key")?)
                .map_err(|_| ArgError::TooManyBuckets)?;
            limits
                .try_push(limiter(c, Clause::Also)?)
                .map_err(|_| ArgError::TooManyBuckets)?;
        } else if is(word, "STRIKES") {
            let threshold = c.integer("STRIKES threshold", 1, MAX_THRESHOLD)?;
            let window = c.duration_ms("STRIKES window", false)?;
            set_once(&mut strikes, "STRIKES", (threshold, window))?;
        } else if is(word, "EVERY") {
            set_once(&mut every, "EVERY", ())?;
        } else if is(word, "BOX") {
            let d1 = c.duration_ms("BOX d1", true)?;
            let d2 = c.duration_ms("BOX d2", true)?;
            let d3 = c.duration_ms("BOX d3", true)?;
            set_once(&mut boxes, "BOX", [d1, d2, d3])?;
        } else if is(word, "OFFENSES") {
            let ttl = c.duration_ms("OFFENSES ttl", false)?;
            set_once(&mut offenses, "OFFENSES", ttl)?;
        } else if is(word, "JITTER") {
            set_once(&mut jitter, "JITTER", c.integer("JITTER percent", 0, 100)?)?;
        } else if !own_word(word, c)? {
            return Err(ArgError::unknown_option(c.command(), word));
        }
    }
    c.finish()?;
    let (cost, settle) = match (cost, debt, refund) {
        (Some(_), _, Some(_)) => {
            return Err(ArgError::Together {
                a: "REFUND",
                b: "COST",
            })
        }
        (_, Some(()), Some(_)) => {
            return Err(ArgError::Together {
                a: "REFUND",
                b: "DEBT",
            })
        }
        (_, None, Some(points)) => (points, Settle::Refund),
        (cost, Some(()), None) => (cost.unwrap_or(1), Settle::Debt),
        (cost, None, None) => (cost.unwrap_or(1), Settle::Charge),
    };

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
            every: every.is_some(),
        }),
        None if boxes.is_some() => return Err(ArgError::NeedsStrikes { option: "BOX" }),
        None if offenses.is_some() => return Err(ArgError::NeedsStrikes { option: "OFFENSES" }),
        None if every.is_some() => return Err(ArgError::NeedsStrikes { option: "EVERY" }),
        None => None,
    };
    req.cost = cost;
    req.penalty = penalty;
    req.jitter_percent = u8::try_from(jitter.unwrap_or(0)).unwrap_or(100);
    req.settle = settle;
    Ok(())
}

/// `COST` must fit every key's limit, except for a price known after the
/// fact (`DEBT`), points given back (`REFUND`) and a `PARTIAL` grant.
pub fn check_cost<L: Limiter>(req: &Request<L>) -> Result<(), ArgError> {
    if req.settle != Settle::Charge || req.partial_min.is_some() {
        return Ok(());
    }
    match req.limits.iter().position(|l| req.cost > l.limit()) {
        Some(index) => Err(ArgError::CostAboveCapacity { index }),
        None => Ok(()),
    }
}

/// Whether a call may write.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Effect {
    /// Commit what the decision changed (a `COST 0` call writes nothing
    /// anyway).
    Commit,
    /// A dry run (`RL.QUOTA ... PEEK`): decide, reply, write nothing.
    DryRun,
}

/// The entry of a limiter command once parsed: answer a getkeys request
/// with the keys the parser found (even in an invalid call), reply a parse
/// error, or run the call: open its keys, decide, commit, reply and count
/// the outcome in `outcomes`.
pub fn run_parsed<L>(
    ctx: Ctx,
    args: &[Arg],
    key_positions: &[usize],
    parsed: Result<(&Request<L>, Effect), &ArgError>,
    outcomes: &Outcomes,
) -> c_int
where
    L: Limiter,
    Record: Holds<L::State>,
{
    if is_keys_request(ctx) {
        key_positions.iter().for_each(|&pos| declare_key(ctx, pos));
        return 0;
    }
    let (req, effect) = match parsed {
        Ok(parsed) => parsed,
        Err(e) => return reply_error(ctx, &e.to_string()),
    };
    let writes = req.cost > 0 && effect == Effect::Commit;
    let access = if writes { Access::Write } else { Access::Read };
    let mut call = Call::new(ctx);
    if let Err(replied) = call.open(args, key_positions, access, false) {
        return replied;
    }
    if L::CHECKS_RECORD {
        if let Some(conflict) = conflict(&call, req) {
            return reply_error(ctx, &ArgError::Conflict(conflict).to_string());
        }
    }
    let decision = decide_call(&mut call, req, effect);
    outcomes.record(decision.status);
    stats::settled(req, &decision);
    if req.partial_min.is_some() {
        reply_partial(ctx, &decision)
    } else {
        reply_decision(ctx, &decision)
    }
}

/// The first key of the call whose record its limiter must not count on
/// ([`Limiter::conflict`]), and why.
fn conflict<L: Limiter>(call: &Call, req: &Request<L>) -> Option<Conflict> {
    let now = call.now();
    req.limits
        .iter()
        .enumerate()
        .find_map(|(i, limit)| call.record(i).and_then(|r| limit.conflict(r, now)))
}

/// Decide a call on its open keys, each key's state read and changed
/// where its record keeps it (a key or part not stored yet starts empty
/// beside it), and commit what changed (unless a dry run or a probe),
/// announcing a trip, and the limiter's change event on each key whose
/// state changed. A dry run decides on copies.
pub fn decide_call<L>(call: &mut Call, req: &Request<L>, effect: Effect) -> Decision
where
    L: Limiter,
    Record: Holds<L::State>,
{
    let writes = req.cost > 0 && effect == Effect::Commit;
    let now = call.now();
    let mut penalty = call
        .record(0)
        .map(Record::penalty_or_default)
        .unwrap_or_default();
    // Random bits only when JITTER asks for them (std seeds its hasher keys
    // from the OS; hashing the time gives a fresh draw per call).
    let random = if req.jitter_percent > 0 {
        std::hash::RandomState::new().hash_one(now)
    } else {
        0
    };
    // A state for each key that holds none yet (only as many as keys).
    // Pushed one by one, not collected: a collected array is built
    // elsewhere and then copied whole.
    let n = req.limits.len().min(MAX_BUCKETS);
    let mut fresh: ArrayVec<Option<L::State>, MAX_BUCKETS> = ArrayVec::new();
    for _ in 0..n {
        fresh.push(None);
    }
    // Before any record changes (the expiries its records tell).
    if writes && req.limits.iter().all(L::steady_expiry) {
        call.expect_steady_expiry();
    }
    let (decision, effects) = if writes || req.cost == 0 {
        // A probe changes nothing: it reads in place too.
        let mut slots: ArrayVec<&mut Option<L::State>, MAX_BUCKETS> = ArrayVec::new();
        for (key, local) in call.keys_mut().iter_mut().zip(fresh.iter_mut()) {
            slots.push(match key.record_mut() {
                Ok(Some(record)) => Holds::<L::State>::slot(record).unwrap_or(local),
                _ => local,
            });
        }
        decide(&mut slots, &mut penalty, req, now, random)
    } else {
        for (i, local) in fresh.iter_mut().enumerate() {
            *local = call.record(i).and_then(|r| r.part::<L::State>()).cloned();
        }
        decide(&mut fresh[..], &mut penalty, req, now, random)
    };
    if effects.reserve_refused {
        stats::RESERVE_REFUSALS.incr();
    }
    if !writes {
        return decision;
    }
    let written = effects.written();
    for (i, local) in fresh.iter_mut().enumerate() {
        if let (true, Some(state)) = (effects.states.contains(i), local.take()) {
            if let Some(record) = call.edit(i) {
                record.set_part(Some(state));
            }
        }
    }
    if effects.penalty {
        if let Some(record) = call.edit(0) {
            record.set_penalty(penalty, now);
        }
    }
    let event = effects.tripped.map(|active| Event::Boxed {
        level: active.level,
    });
    call.commit(written, event);
    if let Some(change) = L::CHANGE_EVENT {
        call.announce(effects.states, change);
    }
    decision
}
