//! `RL.WINDOW`: at most `limit` points per `window_ms`, in three modes,
//! exact in integers.
//!
//! # Modes
//!
//! Every mode lays its windows on a grid of *boundaries*
//! `offset_ms + k * window_ms` (any integer `k`), where `offset_ms` comes
//! from [`key_offset`], so that keys do not all roll over in the same
//! instant. A call of `cost` points *fits* when `count + cost <= limit`.
//!
//! - [`Mode::Sliding`] (the default), the sliding window counter: the
//!   *sub-window* `[s, s + W)` that holds `now` counts `curr` points, the one
//!   before it `prev`; at elapsed `e = now - s` the count is the estimate
//!   `curr + ceil(prev * (W - e) / W)`: the previous sub-window weighted by
//!   the share of it that lies at or after `now - W` (`W - e` of its `W`
//!   milliseconds, so at `e = 0` it counts in full), rounded **up**, so the
//!   estimate never under-counts. O(1) memory. With fixed parameters and a
//!   clock going forward this means: an aligned sub-window never admits
//!   more than `limit`, and with `p` points admitted in `[s - W, s)`, at most
//!   `limit - ceil(p * (W - x) / W)` are admitted in `[s, s + x]`, so
//!   `[s - W, s + x]` admits at most `limit + floor(limit * x / W)`: a
//!   burst of `limit` just before a boundary is not doubled just after it.
//! - [`Mode::Exact`], the sliding log: a point admitted at `t` counts while
//!   `now < t + W`, so the count is the sum of the costs admitted in
//!   `(now - W, now]`. The log holds one [`Entry`] per millisecond in which
//!   something was admitted (calls in the same millisecond merge), sorted by
//!   time; entries that no longer count are pruned whenever the log is
//!   charged. Every entry holds at least one point and the points counted
//!   after an admission are at most `limit`, so a log never holds more than
//!   `limit` entries; it never holds more than [`MAX_EXACT_LIMIT`] in any
//!   case (a larger `limit` is refused by the adapter; should the core be
//!   given one, the oldest entries are merged into the next one, which
//!   counts them longer, never shorter).
//! - [`Mode::Fixed`], the fixed window: the window `[b, b + W)` holding `now`
//!   counts every point admitted in it; at `b + W` the count starts again
//!   from zero.
//!
//! # Replies
//!
//! `remaining` is `limit - count` (never negative): with the estimate rounded
//! up it is rounded down. A count above `limit` (the limit was lowered) is
//! kept, and then even `COST 0` does not fit until enough has expired. `reset_ms` is the time until the key counts
//! nothing (for `Sliding`, until the estimate reaches 0: the end of the
//! sub-window after the last one that holds a point). `retry_after_ms`
//! ([`Limiter::wait_ms`]) is exact: absent other traffic, `cost` fits at
//! `now + wait` and not at `now + wait - 1`, in every mode.
//!
//! # Time
//!
//! Every time in a state is absolute, so a state means the same on a master,
//! a replica and after a reload, and a backward step of the clock never
//! releases a point: points admitted "in the future" still count. A
//! `Sliding` state whose current sub-window starts after `now` is read as at
//! that sub-window's first millisecond (its count is frozen until then); a
//! `Fixed` count holds until its window's end; a log entry counts while
//! `now < at + W`, however early `now` is. A state forgets only what no
//! longer counted when it was last written.
//!
//! # Changing the parameters
//!
//! A different `limit` is just a number: the count is compared with the new
//! one. A state written with another window length, offset or mode is
//! *foreign* and is converted so that a change **never admits more than
//! either configuration would**: the points the stored state counts at `now`
//! (`N`, under the parameters it was written with) are carried as one lump
//! into the new configuration, and that lump is released no earlier than
//! the old configuration would have released its last point (`H`, the end
//! of the old state) and no earlier than the new configuration would
//! release `N` points admitted at `now`. `H` is at most what the old
//! parameters give a point admitted at `now` (two windows for `Sliding`,
//! one for `Exact`): a later end holds points an earlier change carried,
//! and parameters that alternate between calls (two configurations served
//! at once) would otherwise push it further at every call. A `Fixed`
//! state is carried to its end.
//!
//! - to `Fixed`: `N` points counted until `max(H, end of the window holding
//!   now)`;
//! - to `Exact`: one entry of `N` points counting until
//!   `max(H, now + W)`;
//! - to `Sliding`: `N` points as the `prev` of a sub-window starting at the
//!   first boundary at or after `max(H, b + W)` (`b` the boundary at or
//!   before `now`), so they count in full until that boundary and then
//!   fade out over one `W`; that sub-window starts no later than
//!   [`MAX_AHEAD_MS`] from now (the latest a loaded state may hold, which
//!   only windows of more than 50 years reach).
//!
//! One exception keeps more detail: an `Exact` log under a new `W` keeps its
//! entries and counts each for `max(old W, new W)` after its admission,
//! when every entry was admitted by `now` (a log with later entries holds
//! points an earlier change moved, and is carried as a lump).
//! Points admitted after a change are counted in the converted state; when
//! it starts in the future (a `Sliding` lump) they count from there, which
//! is longer, never shorter. [`Limiter::rewrite`] stores the converted state
//! on a throttled call, so the replies of later calls stay true. A probe
//! (`COST 0`) writes nothing: its reply describes the converted state that
//! the next call spending points will store, so its `reset_ms` and
//! `retry_after_ms` are then upper bounds (never early) rather than exact.
//!
//! # Encoding
//!
//! States are MessagePack through serde (a one-key map naming the variant
//! with one letter, then the fields as an array; integers take their
//! shortest form). A `Sliding` state takes about 18 bytes, `Fixed` 14, and
//! `Exact` about 20 bytes plus, per further entry, the milliseconds since
//! the previous entry and the cost (1 to 5 bytes and, for costs up to
//! 10_000, 1 to 3 bytes). The encoding is a function of the state, so equal
//! states have equal bytes.

use serde::{Deserialize, Serialize};

mod exact;
mod limiter;
mod log;
mod offset;
mod sliding;

use exact::{log_codec, ExactView};
pub use log::{Log, LogEdit};
pub(crate) use offset::fnv1a_64;
pub use offset::key_offset;
use sliding::{roll, sat_u64, Rolled};

use crate::core::limiter::Limiter;
use crate::core::limits::MAX_DURATION_MS;
#[cfg(doc)]
use crate::core::limits::MAX_EXACT_LIMIT;
use crate::core::part::MAX_AHEAD_MS;
use crate::core::time::{clamp_i64, rem_floor, Millis};

/// Which window: `RL.WINDOW` default, `EXACT` or `FIXED`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub enum Mode {
    /// The sliding window counter (two sub-window counts); the default.
    #[default]
    Sliding,
    /// The sliding log: the true count over the last window.
    Exact,
    /// Fixed windows, offset per key.
    Fixed,
}

/// The parameters of one key in an `RL.WINDOW` call.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Window {
    /// At most this many points per window (>= 1).
    pub limit: u64,
    /// The window length in milliseconds (>= 1; 0 is read as 1).
    pub window_ms: u64,
    /// Which window.
    pub mode: Mode,
    /// Boundary offset of this key, `0..window_ms` (a larger value is taken
    /// modulo `window_ms`): the adapter computes it with [`key_offset`].
    pub offset_ms: u64,
}

/// One millisecond of an exact log: the points admitted at `at`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Entry {
    /// When the points were admitted (they count while `now < at + W`).
    pub at: Millis,
    /// How many points (>= 1).
    pub cost: u64,
}

/// What one key stores. Every time is absolute (see the module docs).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum WindowState {
    /// A sliding window counter.
    #[serde(rename = "s")]
    Sliding {
        /// Start of the current sub-window (a boundary).
        start: Millis,
        /// Points counted in the sub-window before it.
        prev: u64,
        /// Points counted in the current sub-window.
        curr: u64,
        /// The window length the sub-windows were laid out with.
        window_ms: u64,
    },
    /// A sliding log.
    #[serde(rename = "e")]
    Exact {
        /// The window length the entries count for.
        window_ms: u64,
        /// The entries, strictly increasing in `at`; encoded as a flat array
        /// `[at_0, cost_0, at_1 - at_0, cost_1, ...]` of unsigned integers
        /// (`at_0` as the two's complement bits of the `i64`).
        #[serde(with = "log_codec")]
        log: Log,
    },
    /// A fixed window (or a carried lump, see the module docs).
    #[serde(rename = "f")]
    Fixed {
        /// End of the window (exclusive): `count` holds while `now < end`.
        /// Storing the end rather than the start makes the state mean the
        /// same whatever the parameters of the call that reads it.
        end: Millis,
        /// Points counted in it.
        count: u64,
    },
}

/// What a call needs to know of one key at `now` ([`Limiter::see`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct WindowSeen {
    /// Points counted now: the estimate (rounded up) for `Sliding`.
    count: u64,
    /// Milliseconds from now until nothing counts.
    empty_in: i64,
    /// What the mode needs to compute a wait.
    shape: Shape,
}

impl WindowSeen {
    /// Points counted now (for `Sliding`, the estimate, rounded up).
    pub fn count(&self) -> u64 {
        self.count
    }
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
enum Shape {
    /// Nothing counts.
    #[default]
    Empty,
    /// The sub-window counts, read at `now + delay` (`delay > 0` when the
    /// current sub-window starts after `now`), `elapsed` into it.
    Sliding {
        prev: u64,
        curr: u64,
        elapsed: i64,
        delay: i64,
    },
    /// The count drops to zero at `empty_in`, at the end of the window
    /// that counts it, `end`.
    Fixed { end: Millis },
    /// A log: a wait walks its entries.
    Exact,
}

impl WindowState {
    /// Heap bytes behind the state (the log of `Exact`), for `MEMORY USAGE`.
    pub fn heap_bytes(&self) -> usize {
        match self {
            WindowState::Exact { log, .. } => log.heap_bytes(),
            _ => 0,
        }
    }

    /// Whether a decoded state satisfies its invariants: a window length in
    /// `1..=MAX_DURATION_MS`; for a log, entries strictly increasing in
    /// time, each of at least one point, at most [`MAX_EXACT_LIMIT`] of them.
    pub fn is_valid(&self) -> bool {
        let length = |w: &u64| (1..=MAX_DURATION_MS).contains(w);
        match self {
            WindowState::Sliding { window_ms, .. } => length(window_ms),
            WindowState::Exact { window_ms, log } => length(window_ms) && log.is_valid(),
            WindowState::Fixed { .. } => true,
        }
    }

    /// Which mode wrote this state.
    pub fn mode(&self) -> Mode {
        match self {
            WindowState::Sliding { .. } => Mode::Sliding,
            WindowState::Exact { .. } => Mode::Exact,
            WindowState::Fixed { .. } => Mode::Fixed,
        }
    }

    /// The points this state counts at `now`, under the parameters it was
    /// written with (for `Sliding`, the estimate rounded up); what the tests
    /// read.
    #[cfg(test)]
    pub(crate) fn count_at(&self, now: Millis) -> u64 {
        self.lump(now).0
    }

    /// The last instant anything in it still counts (the key's TTL can end
    /// one millisecond later), `None` if nothing counts at `now`. Read under
    /// the parameters it was written with: the state alone says it.
    #[inline]
    pub fn counts_until(&self, now: Millis) -> Option<Millis> {
        if let WindowState::Fixed { end, count } = self {
            // `now < end`, so `end - 1` does not overflow.
            return (*count > 0 && now < *end).then(|| end - 1);
        }
        if let WindowState::Sliding {
            start,
            prev,
            curr,
            window_ms,
        } = self
        {
            // The estimate is positive exactly when a count is (the
            // elapsed time stays below `w`): no need to compute it.
            let w = i128::from((*window_ms).max(1));
            let r = roll(*start, *prev, *curr, w, now);
            return r.end(w).map(|end| clamp_i64(end - 1));
        }
        match self.lump(now) {
            (0, _) => None,
            (_, end) => Some(clamp_i64(end - 1)),
        }
    }

    /// `(N, H)` as a conversion carries them into other parameters: the
    /// [`lump`](Self::lump), with `H` no later than the last instant at
    /// which the state's own parameters count a point admitted at `now`
    /// (two windows after it for `Sliding`, one for `Exact`). A state with
    /// a later end holds points carried by an earlier conversion (a
    /// converted `Sliding` state starts after the old end, a log read under
    /// a shorter window moves its entries later): without this bound,
    /// parameters that alternate between calls, as in a rolling
    /// deployment, would push the end further at every call. A `Fixed`
    /// state keeps no window length and is carried as it is: converting
    /// into `Fixed` adds nothing after the end it carries.
    #[inline(always)]
    fn carried(&self, now: Millis) -> (u64, i128) {
        let (n, end) = self.lump(now);
        let horizon = match self {
            WindowState::Sliding { window_ms, .. } => 2 * i128::from((*window_ms).max(1)),
            WindowState::Exact { window_ms, .. } => i128::from((*window_ms).max(1)),
            WindowState::Fixed { .. } => return (n, end),
        };
        (n, end.min(i128::from(now) + horizon))
    }

    /// `(N, H)`: the points counted at `now` and the first instant at which
    /// none counts any more, under the state's own parameters; `N == 0`
    /// when nothing counts. Inlined: a fixed window, the common call, then
    /// reads its two fields where it is asked.
    #[inline(always)]
    fn lump(&self, now: Millis) -> (u64, i128) {
        let none = (0, i128::from(now));
        match self {
            WindowState::Sliding {
                start,
                prev,
                curr,
                window_ms,
            } => {
                let w = i128::from((*window_ms).max(1));
                let r = roll(*start, *prev, *curr, w, now);
                match r.end(w) {
                    Some(end) => (r.estimate(w), end),
                    None => none,
                }
            }
            WindowState::Exact { window_ms, log } => {
                let w = i128::from((*window_ms).max(1));
                ExactView::native(log, w, 0, now).total(w).unwrap_or(none)
            }
            WindowState::Fixed { end, count } => {
                if *count > 0 && now < *end {
                    (*count, i128::from(*end))
                } else {
                    none
                }
            }
        }
    }
}

impl Window {
    /// The window length as stored, never 0.
    fn stored_w(&self) -> u64 {
        self.window_ms.max(1)
    }

    fn w(&self) -> i128 {
        i128::from(self.stored_w())
    }

    fn offset(&self) -> i128 {
        rem_floor(i128::from(self.offset_ms), self.w())
    }

    /// The boundary at or before `t`.
    fn boundary_before(&self, t: i128) -> i128 {
        t - rem_floor(t - self.offset(), self.w())
    }

    /// The boundary at or after `t`.
    fn boundary_after(&self, t: i128) -> i128 {
        t + rem_floor(self.offset() - t, self.w())
    }

    fn is_boundary(&self, t: Millis) -> bool {
        rem_floor(i128::from(t) - self.offset(), self.w()) == 0
    }

    /// The end of the window of this key that holds `now`.
    fn window_end(&self, now: Millis) -> i128 {
        // The usual parameters (an offset below the window, as
        // `key_offset` makes it) in 64-bit arithmetic: the same boundary.
        if let (Ok(w), Ok(offset)) = (i64::try_from(self.window_ms), i64::try_from(self.offset_ms))
        {
            if let (true, Some(since)) = ((0..w).contains(&offset), now.checked_sub(offset)) {
                return i128::from(now) - i128::from(since.rem_euclid(w)) + i128::from(w);
            }
        }
        self.boundary_before(i128::from(now)) + self.w()
    }

    /// Whether `state` was written with this window's parameters (a `Fixed`
    /// state: whether its window ends no earlier than the window holding
    /// `now`, or counts nothing), so it is read as it is.
    fn is_native(&self, state: &WindowState, now: Millis) -> bool {
        match (self.mode, state) {
            (
                Mode::Sliding,
                WindowState::Sliding {
                    start, window_ms, ..
                },
            ) => *window_ms == self.stored_w() && self.is_boundary(*start),
            (Mode::Exact, WindowState::Exact { window_ms, .. }) => *window_ms == self.stored_w(),
            (Mode::Fixed, WindowState::Fixed { end, .. }) => self
                .fixed_view(Some(state), now)
                .is_none_or(|(_, e)| e == *end),
            _ => false,
        }
    }

    /// Whether `state` is an exact log of this window's own length.
    fn is_native_exact(&self, state: Option<&WindowState>, now: Millis) -> bool {
        self.mode == Mode::Exact && state.is_some_and(|s| self.is_native(s, now))
    }

    /// A `Sliding` reading of `state` at `now`; `None` when nothing counts.
    fn sliding_view(&self, state: Option<&WindowState>, now: Millis) -> Option<Rolled> {
        let state = state?;
        let w = self.w();
        if let WindowState::Sliding {
            start, prev, curr, ..
        } = state
        {
            if self.is_native(state, now) {
                return Some(roll(*start, *prev, *curr, w, now));
            }
        }
        let (n, end) = state.carried(now);
        if n == 0 {
            return None;
        }
        let hold = end.max(self.window_end(now));
        // No later than `MAX_AHEAD_MS` from now (what a loaded state may
        // hold): with windows of up to `MAX_DURATION_MS`, that boundary is
        // still after the current sub-window.
        let latest = self.boundary_before(i128::from(now) + i128::from(MAX_AHEAD_MS));
        let start = clamp_i64(self.boundary_after(hold).min(latest));
        Some(roll(start, n, 0, w, now))
    }

    /// A `Fixed` reading of `state` at `now`: `(count, end)`; `None` when
    /// nothing counts.
    fn fixed_view(&self, state: Option<&WindowState>, now: Millis) -> Option<(u64, Millis)> {
        let (n, end) = state?.carried(now);
        if n == 0 {
            return None;
        }
        Some((n, clamp_i64(end.max(self.window_end(now)))))
    }

    /// An `Exact` reading of `state` at `now`.
    fn exact_view<'a>(&self, state: Option<&'a WindowState>, now: Millis) -> ExactView<'a> {
        let w = self.w();
        match state {
            None => ExactView::Empty,
            // A log of this window's length, or of another when every entry
            // was admitted by now: each entry counts for max(old W, new W)
            // after admission. (A log with later entries holds points a
            // change of length moved: it is carried as one lump.)
            Some(WindowState::Exact { window_ms, log })
                if i128::from((*window_ms).max(1)) == w
                    || log.last().is_none_or(|e| e.at <= now) =>
            {
                let shift = (i128::from((*window_ms).max(1)) - w).max(0);
                ExactView::native(log, w, shift, now)
            }
            Some(other) => {
                let (n, end) = other.carried(now);
                if n == 0 {
                    return ExactView::Empty;
                }
                let at = clamp_i64((end - w).max(i128::from(now)));
                ExactView::Lump(Entry { at, cost: n })
            }
        }
    }

    /// `state` as this window reads it at `now`, in this window's form
    /// (rolled forward, pruned, converted); `None` when nothing counts.
    fn normalized(&self, state: Option<&WindowState>, now: Millis) -> Option<WindowState> {
        match self.mode {
            Mode::Sliding => self.sliding_view(state, now).map(|r| WindowState::Sliding {
                start: clamp_i64(r.start),
                prev: r.prev,
                curr: r.curr,
                window_ms: self.stored_w(),
            }),
            Mode::Fixed => self
                .fixed_view(state, now)
                .map(|(count, end)| WindowState::Fixed { end, count }),
            Mode::Exact => {
                let log = self.exact_view(state, now).to_log();
                (!log.is_empty()).then(|| WindowState::Exact {
                    window_ms: self.stored_w(),
                    log,
                })
            }
        }
    }

    /// A state of this window's form that counts nothing at `now`.
    fn empty(&self, now: Millis) -> WindowState {
        let start = self.boundary_before(i128::from(now));
        match self.mode {
            Mode::Sliding => WindowState::Sliding {
                start: clamp_i64(start),
                prev: 0,
                curr: 0,
                window_ms: self.stored_w(),
            },
            Mode::Fixed => WindowState::Fixed {
                end: clamp_i64(start + self.w()),
                count: 0,
            },
            Mode::Exact => WindowState::Exact {
                window_ms: self.stored_w(),
                log: Log::default(),
            },
        }
    }

    /// Milliseconds until `cost` points fit in `state` at `now`:
    /// [`Limiter::wait_ms`] with the reading done here (what the tests
    /// compare with a wait found by stepping the clock).
    #[cfg(test)]
    pub(crate) fn wait_exact(&self, state: Option<&WindowState>, cost: u64, now: Millis) -> i64 {
        let seen = self.see(state, now);
        self.wait_ms(state, &seen, cost, now)
    }

    /// The wait of a log that does not fit now: until enough of its oldest
    /// entries stop counting.
    fn exact_wait(
        &self,
        state: Option<&WindowState>,
        seen: &WindowSeen,
        cost: u64,
        now: Millis,
    ) -> i64 {
        let excess = self.excess(seen, cost);
        match self.exact_view(state, now).freed_by(self.w(), excess) {
            Some(expiry) => clamp_i64(expiry - i128::from(now)).max(0),
            None => seen.empty_in,
        }
    }

    /// Points that must stop counting before `cost` fits.
    fn excess(&self, seen: &WindowSeen, cost: u64) -> u64 {
        sat_u64(i128::from(seen.count) + i128::from(cost) - i128::from(self.limit))
    }

    /// [`Limiter::wait_ms`] of a `Sliding` reading that does not fit now.
    fn sliding_wait(&self, seen: &WindowSeen, cost: u64) -> i64 {
        let Shape::Sliding {
            prev,
            curr,
            elapsed,
            delay,
        } = seen.shape
        else {
            return seen.empty_in;
        };
        let w = self.w();
        let room = i128::from(self.limit) - i128::from(cost);
        let (e, d) = (i128::from(elapsed), i128::from(delay));
        // In the current sub-window: `curr` stays, `prev` fades.
        let r1 = room - i128::from(curr);
        if r1 >= 0 {
            let x = first_elapsed(prev, r1, w);
            if x < w {
                return clamp_i64(d + x.max(e) - e);
            }
        }
        // In the next one: `curr` is the previous sub-window and fades.
        let x = first_elapsed(curr, room, w);
        if x < w {
            return clamp_i64(d + (w - e) + x);
        }
        clamp_i64(d + 2 * w - e)
    }
}

/// The least elapsed time `x >= 0` into a sub-window of `w` at which a
/// previous count `count` weighs at most `room >= 0`:
/// `ceil(count * (w - x) / w) <= room`, that is
/// `x >= w - floor(room * w / count)`. `w` or more: not in this sub-window.
fn first_elapsed(count: u64, room: i128, w: i128) -> i128 {
    if count == 0 {
        return 0;
    }
    (w - room.saturating_mul(w) / i128::from(count)).max(0)
}

#[cfg(test)]
mod change_proptests;
#[cfg(test)]
mod proptests;
#[cfg(test)]
mod tests;
