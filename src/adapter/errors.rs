//! Every error text the module replies with, in one place. Each names the
//! argument at fault; Redis's own wording is kept where it has one.

use std::fmt;

use crate::core::limiter::Conflict;
use crate::core::limits::{MAX_BUCKETS, MAX_DURATION_MS, MAX_EXACT_LIMIT, MAX_LEASE_ID_LEN};
use crate::core::quota::Period;
use crate::core::region::{MAX_REGIONS, MAX_REGION_NAME};

/// Redis's own text for a key of another type.
pub const WRONGTYPE: &str = "WRONGTYPE Operation against a key holding the wrong kind of value";

/// Reply to an internal command called by a client.
pub const INTERNAL_ONLY: &str =
    "ERR RL.APPLY is internal: it is accepted only from the replication link or an AOF being loaded";

/// Reply to a replicated payload that cannot be decoded.
pub const BAD_PAYLOAD: &str = "ERR RL.APPLY payload is not a valid rl value";

/// Reply when a bug was caught instead of crashing the server.
pub const INTERNAL: &str = "ERR rl internal error (caught, the server keeps running)";

/// What is wrong with a command's arguments.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ArgError {
    /// A required argument is missing (`what` names it).
    Missing {
        command: &'static str,
        what: &'static str,
    },
    /// Arguments are left over after a complete command.
    Extra { command: &'static str },
    /// An option word this command does not know (shown sanitised).
    UnknownOption { command: &'static str, word: String },
    /// An option given twice.
    Repeated { option: &'static str },
    /// A whole number outside `min..=max` or not a number.
    Integer {
        what: &'static str,
        min: u64,
        max: u64,
    },
    /// A duration in seconds that is not a plain decimal in range.
    Duration {
        what: &'static str,
        zero_allowed: bool,
    },
    /// A bucket that would take longer than the longest duration to refill
    /// (`capacity x period / tokens`), bucket `index` (0 = first key).
    FillTooLong { index: usize },
    /// `COST` above the capacity of bucket `index` (0 = first key).
    CostAboveCapacity { index: usize },
    /// An option that needs `STRIKES` given without it.
    NeedsStrikes { option: &'static str },
    /// More `ALSO` clauses than the cap.
    TooManyBuckets,
    /// The same key twice in one call.
    DuplicateKey,
    /// A `limit` above the `EXACT` cap, window `index` (0 = first key).
    ExactLimit { index: usize },
    /// A calendar period that is not `DAY`, `WEEK` or `MONTH`.
    Period { what: &'static str },
    /// A lease id that is empty or too long.
    LeaseId,
    /// A subcommand this command does not know.
    UnknownSubcommand { command: &'static str },
    /// Two options that exclude each other.
    Together { a: &'static str, b: &'static str },
    /// An option given without the one it needs.
    Needs {
        option: &'static str,
        needed: &'static str,
    },
    /// `MIN` above `COST`.
    MinAboveCost,
    /// `RESERVE` naming a key the call does not have.
    ReserveIndex { index: usize },
    /// `REGION` or `RL.REGION MERGE` while `rl.region` is empty.
    RegionsOff,
    /// `rl.region` is not one of `rl.regions`.
    LocalNotListed { name: String },
    /// A key that counts the quota another way.
    Conflict(Conflict),
    /// A region name outside the alphabet or too long.
    RegionName,
    /// A region not in `rl.regions`.
    UnknownRegion { name: String },
    /// This server's own region in a merge.
    OwnRegion { name: String },
    /// A region twice in one merge.
    RepeatedRegion { name: String },
    /// More components than regions.
    TooManyRegions,
    /// `refunded` above `added`.
    RefundedAboveAdded { name: String },
    /// A `period_end_ms` that is not an acceptable end of `period`.
    PeriodEnd { period: Period },
}

impl ArgError {
    /// An unknown option, quoting at most 32 printable characters of it.
    pub fn unknown_option(command: &'static str, word: &[u8]) -> ArgError {
        let word = word
            .iter()
            .take(32)
            .map(|&b| if b.is_ascii_graphic() { b as char } else { '?' })
            .collect();
        ArgError::UnknownOption { command, word }
    }
}

impl fmt::Display for ArgError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ArgError::Missing { command, what } => {
                write!(
                    f,
                    "ERR wrong number of arguments for '{command}' command (missing {what})"
                )
            }
            ArgError::Extra { command } => {
                write!(f, "ERR wrong number of arguments for '{command}' command (unexpected extra argument)")
            }
            ArgError::UnknownOption { command, word } => {
                write!(f, "ERR unknown option '{word}' for '{command}'")
            }
            ArgError::Repeated { option } => write!(f, "ERR {option} is given more than once"),
            ArgError::Integer { what, min, max } => {
                write!(f, "ERR {what} must be an integer from {min} to {max}")
            }
            ArgError::Duration { what, zero_allowed } => {
                let low = if *zero_allowed {
                    "from 0"
                } else {
                    "greater than 0"
                };
                let max_s = MAX_DURATION_MS / 1000;
                write!(
                    f,
                    "ERR {what} must be seconds {low} up to {max_s}, with at most 3 decimals"
                )
            }
            ArgError::CostAboveCapacity { index: 0 } => {
                write!(
                    f,
                    "ERR COST is above the capacity of the first key's bucket"
                )
            }
            ArgError::CostAboveCapacity { index } => {
                write!(f, "ERR COST is above the capacity of ALSO bucket {index}")
            }
            ArgError::FillTooLong { index } => {
                let which = if *index == 0 {
                    "the first key's bucket".to_string()
                } else {
                    format!("ALSO bucket {index}")
                };
                let max_s = MAX_DURATION_MS / 1000;
                write!(f, "ERR capacity x period / tokens (the time to refill {which}) must be at most {max_s} seconds")
            }
            ArgError::NeedsStrikes { option } => write!(f, "ERR {option} requires STRIKES"),
            ArgError::TooManyBuckets => {
                write!(f, "ERR ALSO may be given at most {} times", MAX_BUCKETS - 1)
            }
            ArgError::DuplicateKey => write!(f, "ERR ALSO key repeats a key of the same call"),
            ArgError::ExactLimit { index } => {
                let which = if *index == 0 { "limit" } else { "ALSO limit" };
                write!(
                    f,
                    "ERR {which} must be at most {MAX_EXACT_LIMIT} with EXACT"
                )
            }
            ArgError::Period { what } => write!(f, "ERR {what} must be DAY, WEEK or MONTH"),
            ArgError::LeaseId => {
                write!(f, "ERR lease-id must be 1 to {MAX_LEASE_ID_LEN} bytes")
            }
            ArgError::Needs { option, needed } => write!(f, "ERR {option} requires {needed}"),
            ArgError::MinAboveCost => write!(f, "ERR MIN minimum is above COST"),
            ArgError::ReserveIndex { index } => {
                write!(f, "ERR RESERVE index {index} names no bucket of this call")
            }
            ArgError::Together { a, b } => {
                write!(f, "ERR {a} and {b} cannot be given together")
            }
            ArgError::RegionsOff => write!(f, "ERR REGION: rl.region is not configured"),
            ArgError::LocalNotListed { name } => {
                write!(f, "ERR REGION: rl.region '{name}' is not in rl.regions")
            }
            ArgError::Conflict(Conflict::Regional) => {
                write!(f, "ERR REGION: the key counts per region (add REGION)")
            }
            ArgError::Conflict(Conflict::Plain) => {
                write!(f, "ERR REGION: the key counts without regions")
            }
            ArgError::Conflict(Conflict::Period(p)) => {
                write!(f, "ERR period: the key counts a {} period", p.name())
            }
            ArgError::RegionName => write!(
                f,
                "ERR region must be 1 to {MAX_REGION_NAME} bytes of A-Z a-z 0-9 _ -"
            ),
            ArgError::UnknownRegion { name } => {
                write!(f, "ERR region '{name}' is not in rl.regions")
            }
            ArgError::OwnRegion { name } => write!(
                f,
                "ERR region '{name}' is this server's own region (only its own calls change it)"
            ),
            ArgError::RepeatedRegion { name } => {
                write!(f, "ERR region '{name}' is given more than once")
            }
            ArgError::TooManyRegions => {
                write!(f, "ERR region may be given at most {MAX_REGIONS} times")
            }
            ArgError::RefundedAboveAdded { name } => {
                write!(f, "ERR refunded is above added for region '{name}'")
            }
            ArgError::PeriodEnd { period } => write!(
                f,
                "ERR period_end_ms must be the end of a past, the current or the next {} period",
                period.name()
            ),
            ArgError::UnknownSubcommand { command } => {
                write!(f, "ERR unknown subcommand for '{command}'")
            }
        }
    }
}
