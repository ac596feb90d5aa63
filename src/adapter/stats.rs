//! The counters of `INFO rl`, since the module was loaded (per process:
//! a master and its replica count their own calls).

use std::ffi::CStr;
use std::sync::atomic::{AtomicU64, Ordering};

use redis_module::raw;

use super::ffi::command::InfoCtx;
use crate::core::decision::{Decision, Status};
use crate::core::take::{Request, Settle};

/// One counter.
pub struct Counter(AtomicU64);

impl Counter {
    const fn new() -> Self {
        Counter(AtomicU64::new(0))
    }

    /// Add one.
    pub fn incr(&self) {
        self.add(1);
    }

    /// Add `n`.
    pub fn add(&self, n: u64) {
        self.0.fetch_add(n, Ordering::Relaxed);
    }

    fn get(&self) -> u64 {
        self.0.load(Ordering::Relaxed)
    }
}

/// Calls and outcomes of one limiter command.
pub struct Outcomes {
    /// Calls answered with a decision.
    pub calls: Counter,
    /// Status 1.
    pub allowed: Counter,
    /// Status 0.
    pub throttled: Counter,
    /// Status -1.
    pub boxed: Counter,
    /// Status 2 (`DELAY`).
    pub delayed: Counter,
}

impl Outcomes {
    const fn new() -> Self {
        Outcomes {
            calls: Counter::new(),
            allowed: Counter::new(),
            throttled: Counter::new(),
            boxed: Counter::new(),
            delayed: Counter::new(),
        }
    }

    /// Count one decided call.
    pub fn record(&self, status: Status) {
        self.calls.incr();
        match status {
            Status::Allowed => self.allowed.incr(),
            Status::Throttled => self.throttled.incr(),
            Status::Boxed => self.boxed.incr(),
            Status::Delayed => self.delayed.incr(),
        }
    }
}

/// `RL.DISTINCT` calls and outcomes.
pub struct DistinctOutcomes {
    /// Calls answered with a decision.
    pub calls: Counter,
    /// Status 1: the count was at most the limit.
    pub allowed: Counter,
    /// The count was above the limit (status 0, or -1 when it tripped).
    pub over: Counter,
    /// Boxes tripped by `TRIP` (also counted in [`TRIPS`]).
    pub trips: Counter,
}

/// `RL.DISTINCT` outcomes.
pub static DISTINCT: DistinctOutcomes = DistinctOutcomes {
    calls: Counter::new(),
    allowed: Counter::new(),
    over: Counter::new(),
    trips: Counter::new(),
};

/// `RL.TAKE` outcomes.
pub static TAKE: Outcomes = Outcomes::new();
/// `RL.WINDOW` outcomes.
pub static WINDOW: Outcomes = Outcomes::new();
/// `RL.QUOTA` outcomes.
pub static QUOTA: Outcomes = Outcomes::new();
/// `CL.THROTTLE` outcomes (limited calls count as throttled).
pub static THROTTLE: Outcomes = Outcomes::new();
/// Leases granted by `RL.LEASE ACQUIRE` (new or refreshed by `ID`).
pub static LEASES_GRANTED: Counter = Counter::new();
/// `RL.LEASE ACQUIRE` calls denied because the key was full.
pub static LEASES_DENIED: Counter = Counter::new();
/// Leases removed by `RL.LEASE RELEASE`.
pub static LEASES_RELEASED: Counter = Counter::new();
/// Expired leases removed: swept by a successful `RL.LEASE` call, or gone
/// with their key when it expired or was deleted.
pub static LEASES_EXPIRED: Counter = Counter::new();
/// Box trips by level (index 0 = level 1), automatic and manual.
pub static TRIPS: [Counter; 3] = [Counter::new(), Counter::new(), Counter::new()];
/// Manual trips (`RL.BOX TRIP`), also counted in [`TRIPS`].
pub static MANUAL_TRIPS: Counter = Counter::new();
/// Boxes lifted by `RL.BOX RELEASE`.
pub static RELEASES: Counter = Counter::new();
/// Calls with `DEBT` (charged whether or not they fit), and their points.
pub static DEBT_CALLS: Counter = Counter::new();
/// Points charged by `DEBT` calls.
pub static DEBT_POINTS: Counter = Counter::new();
/// Calls with `REFUND`.
pub static REFUND_CALLS: Counter = Counter::new();
/// Points given back by `REFUND` calls (to every key of the call).
pub static REFUND_POINTS: Counter = Counter::new();
/// `PARTIAL` calls that granted points.
pub static PARTIAL_GRANTS: Counter = Counter::new();
/// Points granted by `PARTIAL` calls.
pub static PARTIAL_POINTS: Counter = Counter::new();
/// Refusals only because of a `RESERVE`.
pub static RESERVE_REFUSALS: Counter = Counter::new();
/// `RL.REGION MERGE` calls applied (a repeat included).
pub static REGION_MERGES: Counter = Counter::new();
/// Components that grew by a merge.
pub static REGION_MERGED: Counter = Counter::new();
/// `RL.REGION MERGE` calls refused with an error.
pub static REGION_REFUSED: Counter = Counter::new();

/// Count what a settled call did: `DEBT` and `REFUND` points, `PARTIAL`
/// grants (boxed calls settle nothing).
pub fn settled<L>(req: &Request<L>, decision: &Decision) {
    if decision.status == Status::Boxed {
        return;
    }
    match req.settle {
        Settle::Debt => {
            DEBT_CALLS.incr();
            DEBT_POINTS.add(req.cost);
        }
        Settle::Refund => {
            REFUND_CALLS.incr();
            REFUND_POINTS.add(req.cost);
        }
        Settle::Charge => {}
    }
    if let Some(granted) = decision.granted.filter(|&g| g > 0) {
        PARTIAL_GRANTS.incr();
        PARTIAL_POINTS.add(granted);
    }
}

/// Count a trip at `level` (1..=3).
pub fn trip(level: u8) {
    if let Some(c) = TRIPS.get(usize::from(level).wrapping_sub(1)) {
        c.incr();
    }
}

/// The `INFO` callback: one section named after the module (`INFO rl`).
pub(crate) extern "C" fn info(
    ctx: *mut raw::RedisModuleInfoCtx,
    _for_crash_report: std::os::raw::c_int,
) {
    super::ffi::guard((), || {
        let fields: &[(&CStr, &Counter)] = &[
            (c"take_calls", &TAKE.calls),
            (c"take_allowed", &TAKE.allowed),
            (c"take_throttled", &TAKE.throttled),
            (c"take_boxed", &TAKE.boxed),
            (c"take_delayed", &TAKE.delayed),
            (c"window_calls", &WINDOW.calls),
            (c"window_allowed", &WINDOW.allowed),
            (c"window_throttled", &WINDOW.throttled),
            (c"window_boxed", &WINDOW.boxed),
            (c"quota_calls", &QUOTA.calls),
            (c"quota_allowed", &QUOTA.allowed),
            (c"quota_throttled", &QUOTA.throttled),
            (c"quota_boxed", &QUOTA.boxed),
            (c"throttle_calls", &THROTTLE.calls),
            (c"throttle_allowed", &THROTTLE.allowed),
            (c"throttle_limited", &THROTTLE.throttled),
            (c"distinct_calls", &DISTINCT.calls),
            (c"distinct_allowed", &DISTINCT.allowed),
            (c"distinct_over", &DISTINCT.over),
            (c"distinct_trips", &DISTINCT.trips),
            (c"lease_granted", &LEASES_GRANTED),
            (c"lease_denied", &LEASES_DENIED),
            (c"lease_released", &LEASES_RELEASED),
            (c"lease_expired", &LEASES_EXPIRED),
            (c"box_trips_level1", &TRIPS[0]),
            (c"box_trips_level2", &TRIPS[1]),
            (c"box_trips_level3", &TRIPS[2]),
            (c"box_trips_manual", &MANUAL_TRIPS),
            (c"box_releases", &RELEASES),
            (c"debt_calls", &DEBT_CALLS),
            (c"debt_points", &DEBT_POINTS),
            (c"refund_calls", &REFUND_CALLS),
            (c"refund_points", &REFUND_POINTS),
            (c"partial_grants", &PARTIAL_GRANTS),
            (c"partial_points", &PARTIAL_POINTS),
            (c"reserve_refusals", &RESERVE_REFUSALS),
            (c"region_merges", &REGION_MERGES),
            (c"region_merged", &REGION_MERGED),
            (c"region_refused", &REGION_REFUSED),
        ];
        let info = InfoCtx::new(ctx);
        info.add_section(c"");
        for (name, counter) in fields {
            info.add_u64(name, counter.get());
        }
    })
}
