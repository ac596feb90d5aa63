//! How a window answers the shared decision ([`Limiter`]) and what the
//! record keeps of it ([`Part`]).

use super::*;
use crate::core::part::{within_reach, Part, MAX_COUNT};
use crate::core::penalty::MANUAL;

/// A window matters while it counts anything.
impl Part for WindowState {
    fn is_valid(&self) -> bool {
        WindowState::is_valid(self)
    }

    fn retain(&mut self, now: Millis) -> Option<Millis> {
        self.counts_until(now).map(|last| last.min(MANUAL - 1))
    }

    fn is_plausible(&self, now: Millis) -> bool {
        match self {
            WindowState::Sliding {
                start, prev, curr, ..
            } => within_reach(*start, now) && prev.max(curr) <= &MAX_COUNT,
            WindowState::Fixed { end, count } => within_reach(*end, now) && *count <= MAX_COUNT,
            WindowState::Exact { log, .. } => log
                .last()
                .is_none_or(|e| within_reach(e.at, now) && e.cost <= MAX_COUNT),
        }
    }

    fn heap_bytes(&self, _allocated: &dyn Fn(*const u8) -> usize) -> usize {
        WindowState::heap_bytes(self)
    }

    fn mark_committed(&mut self) {
        if let WindowState::Exact { log, .. } = self {
            log.mark_committed();
        }
    }
}

impl Window {
    /// A `Sliding` charge from the reading `seen` of `state` at `now`
    /// alone: the reading is the state rolled forward (and converted, when
    /// foreign) to `now`, so the stored state is that plus `cost`, and its
    /// reading follows without reading it again. `None` when there is no
    /// such reading (another mode, nothing counted): the general path.
    fn charge_sliding(
        &self,
        state: &mut Option<WindowState>,
        seen: &WindowSeen,
        cost: u64,
        now: Millis,
    ) -> Option<WindowSeen> {
        let Shape::Sliding {
            prev,
            curr,
            elapsed,
            delay,
        } = seen.shape
        else {
            return None;
        };
        if self.mode != Mode::Sliding {
            return None;
        }
        let (elapsed, delay) = (i128::from(elapsed), i128::from(delay));
        let start = i128::from(now) + delay - elapsed;
        let rolled = Rolled {
            start,
            prev,
            curr: curr.saturating_add(cost),
            elapsed,
            delay,
        };
        *state = Some(WindowState::Sliding {
            start: clamp_i64(start),
            prev,
            curr: rolled.curr,
            window_ms: self.stored_w(),
        });
        Some(rolled.seen(self.w(), now))
    }

    /// `state` read in this window's form at `now` (converted, when
    /// foreign), with `cost` points more: the general charge.
    pub(super) fn with_cost(
        &self,
        state: Option<&WindowState>,
        cost: u64,
        now: Millis,
    ) -> WindowState {
        let mut next = self
            .normalized(state, now)
            .unwrap_or_else(|| self.empty(now));
        match &mut next {
            WindowState::Sliding { curr, .. } => *curr = curr.saturating_add(cost),
            WindowState::Fixed { count, .. } => *count = count.saturating_add(cost),
            WindowState::Exact { log, .. } => log.add(now, cost),
        }
        next
    }

    /// A `Fixed` charge from the reading `seen` alone: a reading that
    /// counts something holds the count and the end of the window it
    /// counts in (the state converted, when foreign), so the stored state
    /// is those with `cost` more, and its reading follows. `None` when
    /// there is no such reading (another mode, nothing counted): the
    /// general path.
    fn charge_fixed(
        &self,
        state: &mut Option<WindowState>,
        seen: &WindowSeen,
        cost: u64,
    ) -> Option<WindowSeen> {
        let Shape::Fixed { end } = seen.shape else {
            return None;
        };
        if self.mode != Mode::Fixed {
            return None;
        }
        let count = seen.count.saturating_add(cost);
        *state = Some(WindowState::Fixed { end, count });
        Some(WindowSeen { count, ..*seen })
    }
}

/// A window is a [`Limiter`] whose reading at `now` is its count (the
/// estimate for `Sliding`) and what it takes to compute a wait.
impl Limiter for Window {
    type State = WindowState;
    type Seen = WindowSeen;

    fn limit(&self) -> u64 {
        self.limit
    }

    /// A fixed window's state lasts until its end, a sliding one's until
    /// the end of a sub-window; a log's moves with each entry.
    fn steady_expiry(&self) -> bool {
        self.mode != Mode::Exact
    }

    fn see(&self, state: Option<&WindowState>, now: Millis) -> WindowSeen {
        match self.mode {
            Mode::Sliding => self
                .sliding_view(state, now)
                .map_or_else(WindowSeen::default, |r| r.seen(self.w(), now)),
            Mode::Fixed => {
                self.fixed_view(state, now)
                    .map_or_else(WindowSeen::default, |(count, end)| WindowSeen {
                        count,
                        empty_in: end.saturating_sub(now).max(0),
                        shape: Shape::Fixed { end },
                    })
            }
            Mode::Exact => self.exact_view(state, now).seen(self.w(), now),
        }
    }

    fn fits(&self, seen: &WindowSeen, cost: u64) -> bool {
        i128::from(seen.count) + i128::from(cost) <= i128::from(self.limit)
    }

    /// Exact in every mode. A `cost` above `limit` never fits: the answer
    /// is the time until nothing counts.
    fn wait_ms(
        &self,
        state: Option<&WindowState>,
        seen: &WindowSeen,
        cost: u64,
        now: Millis,
    ) -> i64 {
        if self.fits(seen, cost) {
            return 0;
        }
        if cost > self.limit {
            return seen.empty_in;
        }
        match seen.shape {
            Shape::Empty | Shape::Fixed { .. } => seen.empty_in,
            Shape::Sliding { .. } => self.sliding_wait(seen, cost),
            Shape::Exact => self.exact_wait(state, seen, cost, now),
        }
    }

    fn balance(&self, seen: &WindowSeen) -> i64 {
        clamp_i64(i128::from(self.limit) - i128::from(seen.count))
    }

    /// Points come off the latest counts first: the current sub-window
    /// then the previous one; a log's newest entries.
    fn refund(
        &self,
        state: &mut WindowState,
        _seen: &WindowSeen,
        points: u64,
        now: Millis,
    ) -> WindowSeen {
        let mut next = self
            .normalized(Some(state), now)
            .unwrap_or_else(|| self.empty(now));
        let mut left = points;
        let mut take = |count: &mut u64| {
            let taken = left.min(*count);
            *count -= taken;
            left -= taken;
        };
        match &mut next {
            WindowState::Sliding { prev, curr, .. } => {
                take(curr);
                take(prev);
            }
            WindowState::Fixed { count, .. } => take(count),
            WindowState::Exact { log, .. } => {
                log.take_newest(left);
            }
        }
        *state = next;
        self.see(Some(state), now)
    }

    /// Read under this call's parameters, like every other reply field (a
    /// probe of a foreign state answers as the converted state would).
    fn reset_ms(&self, _state: Option<&WindowState>, seen: &WindowSeen, _now: Millis) -> i64 {
        seen.empty_in
    }

    /// A sliding or fixed reading is charged from the reading; a state of this
    /// window's own form otherwise where it is (an exact log drops its dead
    /// entries and gains one: nothing is copied); a foreign one is
    /// converted first.
    fn charge(
        &self,
        state: &mut Option<WindowState>,
        seen: &WindowSeen,
        cost: u64,
        now: Millis,
    ) -> WindowSeen {
        if let Some(after) = self.charge_sliding(state, seen, cost, now) {
            return after;
        }
        if let Some(after) = self.charge_fixed(state, seen, cost) {
            return after;
        }
        let in_place = self.is_native_exact(state.as_ref(), now);
        match state {
            Some(WindowState::Exact { log, .. }) if in_place => {
                log.charge_in_place(self.w(), now, cost);
            }
            _ => *state = Some(self.with_cost(state.as_ref(), cost, now)),
        }
        self.see(state.as_ref(), now)
    }

    /// Rewrites exactly when `state` is foreign (another mode, window
    /// length or offset; see the module docs) and still counts something:
    /// into the converted state, which later calls then read as it is.
    fn rewrite(&self, state: &mut WindowState, _seen: &WindowSeen, now: Millis) -> bool {
        if self.is_native(state, now) {
            return false;
        }
        match self.normalized(Some(state), now) {
            Some(converted) => {
                *state = converted;
                true
            }
            None => false,
        }
    }
}
