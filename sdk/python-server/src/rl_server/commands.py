"""The arguments of rl's commands, built and checked once for the sync and
asyncio clients: each builder returns a ``Command`` (the argument list and
the parser of its reply). Durations are seconds (int or float, at most
millisecond precision); a bad value raises ``ValueError`` naming the
argument before anything is sent."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Generic, List, Optional, Sequence, Tuple, TypeVar, Union

from . import decisions

T = TypeVar("T")
Arg = Union[str, int, bytes]
Seconds = Union[int, float]

MAX_POINTS = 10**15
MAX_SECONDS = 3153600000
PERIODS = ("DAY", "WEEK", "MONTH")


@dataclass(frozen=True)
class Command(Generic[T]):
    """One command: its arguments and the parser of its reply."""

    args: Tuple[Arg, ...]
    parse: Callable[[object], T]
    #: True for a command that changes nothing (a client may send it again)
    read_only: bool = False

    @property
    def key(self) -> Arg:
        """The command's first key (after the subcommand of RL.LEASE and RL.BOX)."""
        return self.args[2] if self.args[0] in ("RL.LEASE", "RL.BOX") else self.args[1]


def seconds(value: Seconds, name: str, zero: bool = False) -> str:
    """``value`` seconds in rl's duration grammar (at most 3 decimals)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(f"{name} must be seconds (a number), got {value!r}")
    ms = round(value * 1000)
    if abs(ms - value * 1000) > 1e-6 or ms < 0 or (ms == 0 and not zero) or ms > MAX_SECONDS * 1000:
        low = "at least 0" if zero else "greater than 0"
        raise ValueError(f"{name} must be seconds {low} up to {MAX_SECONDS}, "
                         f"with at most 3 decimals, got {value!r}")
    return f"{ms // 1000}.{ms % 1000:03d}" if ms % 1000 else str(ms // 1000)


def points(value: int, name: str, low: int = 1, high: int = MAX_POINTS) -> int:
    """An integer argument within [low, high]."""
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise ValueError(f"{name} must be an integer from {low} to {high}, got {value!r}")
    return value


@dataclass(frozen=True)
class Bucket:
    """A token bucket: ``capacity`` points, ``tokens`` refilled per ``period`` seconds."""

    key: str
    capacity: int
    tokens: int
    period: Seconds

    def args(self, prefix: str) -> List[Arg]:
        """key capacity tokens period, checked."""
        return [self.key, points(self.capacity, f"{prefix}capacity"),
                points(self.tokens, f"{prefix}tokens"), seconds(self.period, f"{prefix}period")]


@dataclass(frozen=True)
class Window:
    """At most ``limit`` points per ``window`` seconds."""

    key: str
    limit: int
    window: Seconds

    def args(self, prefix: str) -> List[Arg]:
        """key limit window, checked."""
        return [self.key, points(self.limit, f"{prefix}limit"), seconds(self.window, f"{prefix}window")]


@dataclass(frozen=True)
class Quota:
    """At most ``limit`` points per calendar ``period`` (DAY, WEEK or MONTH, UTC)."""

    key: str
    limit: int
    period: str

    def args(self, prefix: str) -> List[Arg]:
        """key limit period, checked."""
        if self.period.upper() not in PERIODS:
            raise ValueError(f"{prefix}period must be one of DAY, WEEK, MONTH, got {self.period!r}")
        return [self.key, points(self.limit, f"{prefix}limit"), self.period.upper()]


Limiter = Union[Bucket, Window, Quota]


@dataclass(frozen=True)
class Penalty:
    """The penalty box: ``threshold`` early retries within ``window`` seconds
    trip it; with ``every``, every refusal is a strike, early or not (a
    lockout)."""

    threshold: int
    window: Seconds
    #: box durations of levels 1, 2, 3 (0: manual); None: the server's 300 3600 86400
    box: Optional[Tuple[Seconds, Seconds, Seconds]] = None
    #: how long offenses are remembered; None: the server's 86400
    offenses: Optional[Seconds] = None
    #: every refusal is a strike (EVERY), not only an early retry
    every: bool = False

    def args(self) -> List[Arg]:
        """STRIKES [EVERY] [BOX] [OFFENSES], checked."""
        out: List[Arg] = ["STRIKES", points(self.threshold, "STRIKES threshold", 1, 10**9),
                          seconds(self.window, "STRIKES window")]
        if not isinstance(self.every, bool):
            raise ValueError(f"EVERY must be a bool, got {self.every!r}")
        if self.every:
            out.append("EVERY")
        if self.box is not None:
            if len(self.box) != 3:
                raise ValueError(f"BOX must be 3 durations, got {self.box!r}")
            out += ["BOX", *(seconds(d, "BOX duration", zero=True) for d in self.box)]
        if self.offenses is not None:
            out += ["OFFENSES", seconds(self.offenses, "OFFENSES ttl")]
        return out


def _limiter(name: str, first: Limiter, also: Sequence[Limiter], cost: Optional[int],
             penalty: Optional[Penalty], jitter: int, cost_high: int = MAX_POINTS) -> List[Arg]:
    if len(also) > 15:
        raise ValueError(f"ALSO may be given at most 15 times, got {len(also)}")
    for a in also:
        if type(a) is not type(first):
            raise ValueError(f"ALSO must be a {type(first).__name__} like the first, got {a!r}")
    args: List[Arg] = [name, *first.args("")]
    # 1 is rl's default: the common call sends two arguments fewer for Redis to parse
    if cost is not None and not (type(cost) is int and cost == 1):
        args += ["COST", points(cost, "COST", 0, cost_high)]
    for a in also:
        args += ["ALSO", *a.args("ALSO ")]
    if penalty is not None:
        args += penalty.args()
    if jitter:
        args += ["JITTER", points(jitter, "JITTER", 0, 100)]
    return args


def take(bucket: Bucket, *also: Bucket, cost: int = 1, penalty: Optional[Penalty] = None,
         jitter: int = 0, delay: Optional[Seconds] = None, debt: bool = False,
         refund: Optional[int] = None, partial: Optional[int] = None,
         reserve: Sequence[Tuple[int, int]] = ()) -> Command[decisions.Decision]:
    """RL.TAKE: ``cost`` points from every bucket, all-or-nothing. ``partial``
    (the MIN of PARTIAL) grants what fits down to it; ``refund`` gives points
    back instead of charging; ``reserve`` is (bucket index, percent) pairs."""
    args = _limiter("RL.TAKE", bucket, also, None if refund is not None else cost, penalty, jitter)
    if refund is not None:
        args += ["REFUND", points(refund, "REFUND")]
    if debt:
        args.append("DEBT")
    if partial is not None:
        args += ["PARTIAL", "MIN", points(partial, "PARTIAL MIN", 1, max(cost, 1))]
    for index, percent in reserve:
        args += ["RESERVE", points(index, "RESERVE index", 0, len(also)),
                 points(percent, "RESERVE percent", 0, 100)]
    if delay is not None:
        args += ["DELAY", seconds(delay, "DELAY max_wait")]
    return Command(tuple(args), decisions.decision)


def window(win: Window, *also: Window, cost: int = 1, mode: Optional[str] = None,
           penalty: Optional[Penalty] = None, jitter: int = 0,
           refund: Optional[int] = None) -> Command[decisions.Decision]:
    """RL.WINDOW: ``mode`` None (sliding window counter), "EXACT" (sliding log) or "FIXED"."""
    args = _limiter("RL.WINDOW", win, also, None if refund is not None else cost, penalty, jitter)
    if refund is not None:
        args += ["REFUND", points(refund, "REFUND")]
    if mode is not None:
        if mode.upper() not in ("EXACT", "FIXED"):
            raise ValueError(f"mode must be None, EXACT or FIXED, got {mode!r}")
        args.append(mode.upper())
    return Command(tuple(args), decisions.decision)


def quota(q: Quota, *also: Quota, cost: int = 1, peek: bool = False,
          penalty: Optional[Penalty] = None, jitter: int = 0,
          refund: Optional[int] = None) -> Command[decisions.Decision]:
    """RL.QUOTA: calendar quotas; ``peek`` says whether ``cost`` fits and writes nothing."""
    args = _limiter("RL.QUOTA", q, also, None if refund is not None else cost, penalty, jitter)
    if refund is not None:
        args += ["REFUND", points(refund, "REFUND")]
    if peek:
        args.append("PEEK")
    return Command(tuple(args), decisions.decision)


def distinct(key: str, member: str, limit: int, window_s: Seconds, peek: bool = False,
             trip: Optional[Tuple[int, Seconds]] = None) -> Command[decisions.Decision]:
    """RL.DISTINCT: distinct members seen on ``key`` in a sliding window;
    ``trip`` = (level, duration) trips the key's box above the limit."""
    args: List[Arg] = ["RL.DISTINCT", key, member, points(limit, "limit", 1, 10000),
                       seconds(window_s, "window")]
    if peek:
        args.append("PEEK")
    if trip is not None:
        args += ["TRIP", points(trip[0], "TRIP level", 1, 3), seconds(trip[1], "TRIP duration", zero=True)]
    return Command(tuple(args), decisions.decision)


def lease_acquire(key: str, max_leases: int, ttl: Seconds,
                  lease_id: Optional[str] = None) -> Command[decisions.Lease]:
    """RL.LEASE ACQUIRE: one of ``max_leases`` slots for ``ttl`` seconds."""
    args: List[Arg] = ["RL.LEASE", "ACQUIRE", key, points(max_leases, "max", 1, 1000), seconds(ttl, "ttl")]
    if lease_id is not None:
        if not 1 <= len(lease_id.encode()) <= 128:
            raise ValueError(f"ID must be 1 to 128 bytes, got {lease_id!r}")
        args += ["ID", lease_id]
    return Command(tuple(args), decisions.lease)


def lease_release(key: str, lease_id: str) -> Command[bool]:
    """RL.LEASE RELEASE: True when a live lease was removed."""
    return Command(("RL.LEASE", "RELEASE", key, lease_id), lambda r: decisions.flag(r, "RL.LEASE RELEASE"))


def lease_renew(key: str, lease_id: str, ttl: Seconds) -> Command[bool]:
    """RL.LEASE RENEW: True when the lease was live and now lasts ``ttl`` from now."""
    return Command(("RL.LEASE", "RENEW", key, lease_id, seconds(ttl, "ttl")),
                   lambda r: decisions.flag(r, "RL.LEASE RENEW"))


def lease_list(key: str) -> Command[Tuple[Tuple[str, int], ...]]:
    """RL.LEASE LIST: the live leases, (id, ms left)."""
    return Command(("RL.LEASE", "LIST", key), decisions.leases, read_only=True)


def box_status(key: str) -> Command[decisions.BoxStatus]:
    """RL.BOX STATUS (read-only)."""
    return Command(("RL.BOX", "STATUS", key), decisions.box_status, read_only=True)


def box_trip(key: str, level: int, duration: Seconds) -> Command[decisions.BoxStatus]:
    """RL.BOX TRIP: box ``key`` at ``level`` for ``duration`` seconds (0: manual)."""
    return Command(("RL.BOX", "TRIP", key, points(level, "level", 1, 3),
                    seconds(duration, "duration", zero=True)), decisions.box_status)


def box_release(key: str, forget: bool = False) -> Command[bool]:
    """RL.BOX RELEASE [FORGET]: True only when an active box was lifted."""
    args: Tuple[Arg, ...] = ("RL.BOX", "RELEASE", key) + (("FORGET",) if forget else ())
    return Command(args, lambda r: decisions.flag(r, "RL.BOX RELEASE"))


def throttle(key: str, max_burst: int, count: int, period: Seconds,
             quantity: int = 1) -> Command[decisions.Throttle]:
    """CL.THROTTLE (redis-cell's command and reply)."""
    return Command(("CL.THROTTLE", key, points(max_burst, "max_burst", 0, MAX_POINTS - 1),
                    points(count, "count"), seconds(period, "period"),
                    points(quantity, "quantity", 0)), decisions.throttle)
