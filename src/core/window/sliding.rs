//! The sliding window counter's reading: two sub-window counts rolled
//! forward to the instant they are read at.

use super::{Shape, WindowSeen};
use crate::core::time::{ceil_div, clamp_i64, div_floor, Millis};

/// `v` clamped into `u64`.
pub(super) fn sat_u64(v: i128) -> u64 {
    u64::try_from(v).unwrap_or(if v < 0 { 0 } else { u64::MAX })
}

/// A stored sub-window count rolled forward to the instant it is read at.
#[derive(Clone, Copy, Debug)]
pub(super) struct Rolled {
    /// Start of the sub-window holding the reading instant.
    pub(super) start: i128,
    pub(super) prev: u64,
    pub(super) curr: u64,
    /// Reading instant minus `start`, in `0..W`.
    pub(super) elapsed: i128,
    /// Reading instant minus `now` (> 0 when the state starts after now).
    pub(super) delay: i128,
}

/// Read the counts `(start, prev, curr)` of sub-windows of `w` at `now`:
/// at `max(now, start)`, rolled forward by as many sub-windows as passed.
pub(super) fn roll(start: Millis, prev: u64, curr: u64, w: i128, now: Millis) -> Rolled {
    let s = i128::from(start);
    let now = i128::from(now);
    let at = now.max(s);
    let k = div_floor(at - s, w);
    // `k * w <= at - s`, so nothing here overflows.
    let (start, prev, curr) = match k {
        0 => (s, prev, curr),
        1 => (s + w, curr, 0),
        _ => (s + k * w, 0, 0),
    };
    Rolled {
        start,
        prev,
        curr,
        elapsed: at - start,
        delay: at - now,
    }
}

impl Rolled {
    /// `curr + ceil(prev * (w - elapsed) / w)`.
    pub(super) fn estimate(&self, w: i128) -> u64 {
        let weighted = ceil_div(i128::from(self.prev).saturating_mul(w - self.elapsed), w);
        sat_u64(weighted.saturating_add(i128::from(self.curr)))
    }

    /// The first instant at which nothing counts, if something counts now.
    pub(super) fn end(&self, w: i128) -> Option<i128> {
        if self.curr > 0 {
            Some(self.start + 2 * w)
        } else if self.prev > 0 {
            Some(self.start + w)
        } else {
            None
        }
    }

    pub(super) fn seen(&self, w: i128, now: Millis) -> WindowSeen {
        WindowSeen {
            count: self.estimate(w),
            empty_in: self
                .end(w)
                .map_or(0, |end| clamp_i64(end - i128::from(now)).max(0)),
            shape: Shape::Sliding {
                prev: self.prev,
                curr: self.curr,
                elapsed: clamp_i64(self.elapsed),
                delay: clamp_i64(self.delay),
            },
        }
    }
}
