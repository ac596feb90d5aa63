"""Typed decisions: what rl's replies say, as dataclasses instead of integer
lists. Every parser checks the reply's shape and raises ``ReplyError`` on
anything else (a module that is not loaded answers an error, not a list)."""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Optional, Sequence, Tuple


class ReplyError(Exception):
    """A reply that is not the one the command documents."""


class Status(str, enum.Enum):
    """The first integer of a limiter reply."""

    ALLOWED = "allowed"  #: 1: admitted, points taken
    THROTTLED = "throttled"  #: 0: refused, nothing taken
    BOXED = "boxed"  #: -1: the penalty box of the first key is active
    DELAYED = "delayed"  #: 2: admitted after ``retry_after_ms`` (DELAY)


_STATUS = {1: Status.ALLOWED, 0: Status.THROTTLED, -1: Status.BOXED, 2: Status.DELAYED}
#: the statuses that let the caller proceed (now, or after a DELAY's wait)
_ADMITTED = frozenset({Status.ALLOWED, Status.DELAYED})


@dataclass(frozen=True)
class Decision:
    """The reply of RL.TAKE, RL.WINDOW, RL.QUOTA and RL.DISTINCT."""

    status: Status
    #: capacity (or window / quota limit) of the binding bucket
    limit: int
    #: whole points left in the binding bucket (negative: a debt, with DEBT)
    remaining: int
    #: ms until the binding bucket is full (or the window empty) again; -1: a manual box
    reset_ms: int
    #: 0 when allowed; ms until the call fits, or until the box ends (-1: manual box)
    retry_after_ms: int
    #: 0, or the level (1..3) of the active box
    box_level: int
    #: strikes left before the box trips; None without STRIKES
    strikes_remaining: Optional[int]
    #: which bucket the reply describes: 0 the first key, i the i-th ALSO
    binding: int
    #: points granted by a PARTIAL call; None without PARTIAL
    granted: Optional[int] = None

    @property
    def allowed(self) -> bool:
        """True when the caller may proceed (now, or after the wait of a DELAY)."""
        return self.status in _ADMITTED

    @property
    def manual_box(self) -> bool:
        """True for a box that lasts until ``RL.BOX RELEASE`` (no time to come back)."""
        return self.status is Status.BOXED and self.retry_after_ms < 0


@dataclass(frozen=True)
class Lease:
    """The reply of ``RL.LEASE ACQUIRE``."""

    granted: bool
    #: the lease id (None when denied)
    lease_id: Optional[str]
    #: live leases on the key after the call
    in_use: int
    max: int
    #: when denied: ms until the earliest live lease expires (at least 1)
    retry_after_ms: int


@dataclass(frozen=True)
class BoxStatus:
    """The reply of ``RL.BOX STATUS`` and ``RL.BOX TRIP``."""

    #: 0 when no box is active
    level: int
    #: ms until the box ends; -1 a manual box; 0 no box
    ttl_ms: int
    offenses: int
    strikes: int

    @property
    def active(self) -> bool:
        """True while a box is active."""
        return self.level > 0


@dataclass(frozen=True)
class Throttle:
    """The reply of ``CL.THROTTLE`` (redis-cell's): durations in whole seconds."""

    limited: bool
    limit: int
    remaining: int
    #: seconds until the call would be allowed; None when allowed or never
    retry_after_s: Optional[int]
    reset_after_s: int


_INT_ONLY = {int}


def _ints(raw: object, counts: Tuple[int, ...], what: str) -> Sequence[int]:
    # the usual reply first, in one pass (``type(True)`` is ``bool``, not ``int``)
    if type(raw) is list and len(raw) in counts and set(map(type, raw)) == _INT_ONLY:
        return raw
    if not isinstance(raw, (list, tuple)) or len(raw) not in counts:
        raise ReplyError(f"{what}: expected {' or '.join(map(str, counts))} integers, got {raw!r}")
    if not all(isinstance(v, int) and not isinstance(v, bool) for v in raw):
        raise ReplyError(f"{what}: expected integers, got {raw!r}")
    return raw


def decision(raw: object) -> Decision:
    """A ``Decision`` from an 8-integer reply (9 with PARTIAL's ``granted``)."""
    v = _limiter_ints(raw)
    return Decision(_STATUS[v[0]], v[1], v[2], v[3], v[4], v[5], None if v[6] < 0 else v[6], v[7],
                    v[8] if len(v) == 9 else None)


def remaining(raw: object) -> int:
    """``decision(raw).remaining``, checked the same way, without building the
    ``Decision`` (the limits storage's fixed-window hit reads only this)."""
    return _limiter_ints(raw)[2]


def admitted(raw: object) -> bool:
    """``decision(raw).allowed``, checked the same way, without building the
    ``Decision`` (the limits storage's moving and sliding windows' hit)."""
    return _STATUS[_limiter_ints(raw)[0]] in _ADMITTED


def _limiter_ints(raw: object) -> Sequence[int]:
    v = _ints(raw, (8, 9), "limiter reply")
    if v[0] not in _STATUS:
        raise ReplyError(f"limiter reply: unknown status {v[0]}")
    return v


def _text(v: object) -> str:
    if isinstance(v, bytes):
        return v.decode("utf-8", "surrogateescape")
    if isinstance(v, str):
        return v
    raise ReplyError(f"expected a string, got {v!r}")


def lease(raw: object) -> Lease:
    """A ``Lease`` from ``[granted, id|nil, in_use, max, retry_after_ms]``."""
    if not isinstance(raw, (list, tuple)) or len(raw) != 5:
        raise ReplyError(f"RL.LEASE ACQUIRE: expected 5 items, got {raw!r}")
    granted, lid, in_use, mx, retry = raw
    nums = (granted, in_use, mx, retry)
    if not all(isinstance(n, int) for n in nums):
        raise ReplyError(f"RL.LEASE ACQUIRE: unexpected reply {raw!r}")
    return Lease(granted == 1, None if lid is None else _text(lid), in_use, mx, retry)


def flag(raw: object, what: str) -> bool:
    """True for the integer reply 1, False for 0."""
    if raw not in (0, 1) or isinstance(raw, bool):
        raise ReplyError(f"{what}: expected 0 or 1, got {raw!r}")
    return raw == 1


def leases(raw: object) -> Tuple[Tuple[str, int], ...]:
    """``RL.LEASE LIST``: (lease id, ms left) pairs, ordered by id."""
    if not isinstance(raw, (list, tuple)):
        raise ReplyError(f"RL.LEASE LIST: expected an array, got {raw!r}")
    out = []
    for pair in raw:
        if not isinstance(pair, (list, tuple)) or len(pair) != 2 or not isinstance(pair[1], int):
            raise ReplyError(f"RL.LEASE LIST: unexpected item {pair!r}")
        out.append((_text(pair[0]), pair[1]))
    return tuple(out)


def box_status(raw: object) -> BoxStatus:
    """A ``BoxStatus`` from ``[level, ttl_ms, offenses, strikes]``."""
    v = _ints(raw, (4,), "RL.BOX")
    return BoxStatus(*v)


def throttle(raw: object) -> Throttle:
    """A ``Throttle`` from ``[limited, limit, remaining, retry_after, reset_after]``."""
    v = _ints(raw, (5,), "CL.THROTTLE")
    return Throttle(v[0] == 1, v[1], v[2], None if v[3] < 0 else v[3], v[4])
