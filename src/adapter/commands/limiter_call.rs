//! What the limiter commands (`RL.TAKE`, `RL.WINDOW`) share: one parser
//! for `key <limiter arguments> [ALSO key <limiter arguments>]... [COST]
//! [STRIKES] [BOX] [OFFENSES] [JITTER]` plus each command's own words, and
//! one runner that reads every key, lets [`decide`] rule, and commits.

use std::hash::BuildHasher;
use std::os::raw::c_int;

use arrayvec::ArrayVec;

use crate::adapter::args::{is, set_once, Cursor};
use crate::adapter::errors::{self, ArgError};
use crate::adapter::ffi::{
    declare_key, is_keys_request, notify, now_ms, reply_error, reply_ints, Arg, Ctx,
};
use crate::adapter::stats::{self, Outcomes};
use crate::adapter::store::{commit_keys, Access, RlKey};
use crate::core::limiter::Limiter;
use crate::core::limits::{
    DEFAULT_BOX_MS, DEFAULT_OFFENSES_TTL_MS, MAX_BUCKETS, MAX_POINTS, MAX_THRESHOLD,
};
use crate::core::penalty::PenaltyPolicy;
use crate::core::record::InRecord;
use crate::core::reply::Reply;
use crate::core::take::{decide, Limits, Request};

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

/// Parse a limiter call after the command name. `limiter` reads one key's
/// limiter arguments; `own_word` consumes a word specific to the command
/// (returning `Ok(false)` when the word is not its own). The position of
/// every key is pushed to `keys` as soon as it is read, so a getkeys
/// request gets the keys even of a call that is otherwise invalid.
pub fn parse_call<'a, A: AsRef<[u8]>, L: Limiter>(
    c: &mut Cursor<'a, A>,
    keys: &mut KeyPositions,
    mut limiter: impl FnMut(&mut Cursor<'a, A>, Clause) -> Result<L, ArgError>,
    mut own_word: impl FnMut(&[u8], &mut Cursor<'a, A>) -> Result<bool, ArgError>,
) -> Result<Request<L>, ArgError> {
    keys.try_push(c.key("key")?)
        .map_err(|_| ArgError::TooManyBuckets)?;
    let mut limits = Limits::new();
    limits
        .try_push(limiter(c, Clause::First)?)
        .map_err(|_| ArgError::TooManyBuckets)?;
    let mut cost = None;
    let mut strikes = None;
    let mut boxes = None;
    let mut offenses = None;
    let mut jitter = None;
    while let Some(word) = c.word() {
        if is(word, "COST") {
            set_once(&mut cost, "COST", c.integer("COST", 0, MAX_POINTS)?)?;
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
    let cost = cost.unwrap_or(1);
    if let Some(index) = limits.iter().position(|l| cost > l.limit()) {
        return Err(ArgError::CostAboveCapacity { index });
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
    Ok(Request {
        limits,
        cost,
        penalty,
        jitter_percent: u8::try_from(jitter.unwrap_or(0)).unwrap_or(100),
        delay_ms: None,
    })
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
/// error, or run the call.
pub fn run_parsed<L: InRecord>(
    ctx: Ctx,
    args: &[Arg],
    key_positions: &[usize],
    parsed: Result<(Request<L>, Effect), ArgError>,
    outcomes: &Outcomes,
) -> c_int {
    if is_keys_request(ctx) {
        key_positions.iter().for_each(|&pos| declare_key(ctx, pos));
        return 0;
    }
    match parsed {
        Ok((req, effect)) => run_call(ctx, args, key_positions, &req, effect, outcomes),
        Err(e) => reply_error(ctx, &e.to_string()),
    }
}

/// Run a parsed limiter call on the keys at `key_positions`, reply with
/// the 8 integers and count the outcome in `outcomes`.
pub fn run_call<L: InRecord>(
    ctx: Ctx,
    args: &[Arg],
    key_positions: &[usize],
    req: &Request<L>,
    effect: Effect,
    outcomes: &Outcomes,
) -> c_int {
    match decide_call(ctx, args, key_positions, req, effect) {
        Ok(reply) => {
            outcomes.record(reply.status);
            reply_ints(ctx, &reply.to_array())
        }
        Err(replied) => replied,
    }
}

/// Read every key's state and the first key's penalty state, [`decide`],
/// and (unless a dry run or a probe) commit what changed and announce a
/// trip. A call that may write takes each state out of its record and
/// puts it back changed or not, so nothing is copied or allocated; the
/// others read copies. On an error the error reply is sent and returned
/// as `Err`.
pub fn decide_call<L: InRecord>(
    ctx: Ctx,
    args: &[Arg],
    key_positions: &[usize],
    req: &Request<L>,
    effect: Effect,
) -> Result<Reply, c_int> {
    let writes = req.cost > 0 && effect == Effect::Commit;
    let access = if writes { Access::Write } else { Access::Read };
    let mut keys: ArrayVec<RlKey, MAX_BUCKETS> = key_positions
        .iter()
        .take(MAX_BUCKETS)
        .filter_map(|&pos| args.get(pos))
        .map(|&name| RlKey::open(ctx, name, access))
        .collect();
    if keys.iter().any(|key| key.record().is_err()) {
        return Err(reply_error(ctx, errors::WRONGTYPE));
    }
    let Some(first) = keys.first() else {
        return Err(reply_error(ctx, errors::INTERNAL));
    };
    let mut penalty = first
        .record()
        .ok()
        .flatten()
        .map(|r| r.penalty_or_default())
        .unwrap_or_default();
    let mut states: ArrayVec<Option<L::State>, MAX_BUCKETS> = keys
        .iter_mut()
        .map(|key| match key.record_mut() {
            Ok(Some(record)) if writes => L::take(record),
            Ok(Some(record)) => L::read(record).cloned(),
            _ => None,
        })
        .collect();
    let now = now_ms(ctx);
    // Random bits only when JITTER asks for them (std seeds its hasher keys
    // from the OS; hashing the time gives a fresh draw per call).
    let random = if req.jitter_percent > 0 {
        std::hash::RandomState::new().hash_one(now)
    } else {
        0
    };
    let (reply, effects) = decide(&mut states, &mut penalty, req, now, random);
    if !writes {
        return Ok(reply);
    }
    let mut written = 0u32;
    for (i, (key, state)) in keys.iter_mut().zip(states).enumerate() {
        let penalty_changed = i == 0 && effects.penalty_changed;
        let state_changed = effects.states_changed & (1 << i) != 0;
        if !state_changed && !penalty_changed {
            // Put the state taken out back, unchanged.
            if let Ok(Some(record)) = key.record_mut() {
                L::write(record, state);
            }
            continue;
        }
        let Ok(record) = key.edit() else {
            continue;
        };
        L::write(record, state);
        if penalty_changed {
            record.set_penalty(penalty, now);
        }
        written |= 1 << i;
    }
    let changed_keys = keys
        .iter_mut()
        .enumerate()
        .filter(|(i, _)| written & (1 << i) != 0)
        .map(|(_, key)| key);
    commit_keys(ctx, changed_keys, now);
    if let Some(active) = effects.tripped {
        notify(ctx, c"rl.boxed", keys[0].name);
        stats::trip(active.level);
    }
    Ok(reply)
}
