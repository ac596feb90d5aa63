//! The wire form of the core's typed answers: the one place where a
//! [`Decision`] becomes the reply's 8 integers (and a redis-cell answer
//! its 5), with `-1` for "never" and "no strikes counted".

use std::os::raw::c_int;

use super::ffi::{reply_ints, Ctx};
use crate::core::cell::CellAnswer;
use crate::core::decision::{Decision, Span, Status};

/// The integer of a status on the wire.
pub fn status_code(status: Status) -> i64 {
    match status {
        Status::Allowed => 1,
        Status::Throttled => 0,
        Status::Boxed => -1,
        Status::Delayed => 2,
    }
}

/// A span in ms on the wire: `-1` for [`Span::Never`].
pub fn span_ms(span: Span) -> i64 {
    match span {
        Span::Ms(ms) => i64::try_from(ms).unwrap_or(i64::MAX),
        Span::Never => -1,
    }
}

fn int(v: u64) -> i64 {
    i64::try_from(v).unwrap_or(i64::MAX)
}

/// `[status, limit, remaining, reset_ms, retry_after_ms, box_level,
/// strikes_remaining, binding]`, in the reply's order (commands.md).
pub fn to_wire(d: &Decision) -> [i64; 8] {
    [
        status_code(d.status),
        int(d.limit),
        d.remaining,
        span_ms(d.reset),
        span_ms(d.retry_after),
        i64::from(d.box_level),
        d.strikes_remaining.map_or(-1, int),
        int(u64::try_from(d.binding).unwrap_or(u64::MAX)),
    ]
}

/// Reply with a limiter decision.
pub fn reply_decision(ctx: Ctx, d: &Decision) -> c_int {
    reply_ints(ctx, &to_wire(d))
}

/// Reply with the decision of a `PARTIAL` call: the 8 integers and a 9th,
/// `granted` (0 when refused or boxed).
pub fn reply_partial(ctx: Ctx, d: &Decision) -> c_int {
    let [a, b, c, e, f, g, h, i] = to_wire(d);
    reply_ints(ctx, &[a, b, c, e, f, g, h, i, int(d.granted.unwrap_or(0))])
}

/// `[limited, limit, remaining, retry_after_s, reset_after_s]`, as
/// redis-cell orders them (`retry_after_s` -1 when none applies).
pub fn cell_to_wire(a: &CellAnswer) -> [i64; 5] {
    [
        i64::from(a.limited),
        int(a.limit),
        a.remaining,
        a.retry_after_s.map_or(-1, int),
        int(a.reset_after_s),
    ]
}

/// Reply with a redis-cell answer.
pub fn reply_cell(ctx: Ctx, a: &CellAnswer) -> c_int {
    reply_ints(ctx, &cell_to_wire(a))
}
