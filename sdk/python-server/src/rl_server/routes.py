"""Per-route declarations of the ASGI middleware: what each route spends
and holds (buckets, windows, calendar quotas, a concurrency lease, a
per-resource lock), its cost, the penalty box, Idempotency-Key, shadow mode
and what happens when Redis fails. Checked when the middleware is made:
a bad value raises ``ValueError`` naming the option."""

from __future__ import annotations

import calendar
import inspect
import re
import time
from dataclasses import dataclass, field
from typing import Any, Awaitable, Callable, Dict, List, Mapping, Optional, Pattern, Sequence, Tuple, Union

from starlette.requests import Request

from . import commands
from .commands import Penalty, Seconds

#: a key: a template formatted with the route's path parameters and
#: ``client`` (the client's address), or a function of the request
Key = Union[str, Callable[[Request], str]]
#: a cost: points, or a function (sync or async) of the request
Cost = Union[int, Callable[[Request], Union[int, Awaitable[int]]]]

FAILURE_MODES = ("closed", "local")


@dataclass(frozen=True)
class Rate:
    """A token bucket: ``capacity`` points, ``tokens`` per ``period`` seconds."""

    name: str
    key: Key
    capacity: int
    tokens: int
    period: Seconds


@dataclass(frozen=True)
class Window:
    """At most ``limit`` points per ``window`` seconds; ``mode`` None (sliding
    window counter), "EXACT" or "FIXED"."""

    name: str
    key: Key
    limit: int
    window: Seconds
    mode: Optional[str] = None


@dataclass(frozen=True)
class Quota:
    """At most ``limit`` points per calendar DAY, WEEK or MONTH (UTC); refused with 403."""

    name: str
    key: Key
    limit: int
    period: str
    #: the upgrade_url member of its refusals
    upgrade_url: Optional[str] = None


@dataclass(frozen=True)
class Concurrency:
    """At most ``max`` requests at once, each holding a lease for the request
    (renewed every ``ttl``/3, released when the response ends or the client
    leaves); ``expected`` seconds is a request's usual length, for Retry-After."""

    name: str
    key: Key
    max: int
    ttl: Seconds = 60
    expected: Seconds = 1
    #: the status of a refusal: 429, or 409 for a per-resource lock
    status: int = 429


def Lock(name: str, key: Key, ttl: Seconds = 60, expected: Seconds = 1) -> Concurrency:
    """A per-resource mutual exclusion: one request at a time, a second one
    answered 409 with Retry-After at once (never queued)."""
    return Concurrency(name, key, 1, ttl, expected, status=409)


@dataclass(frozen=True)
class Route:
    """What one route spends and holds. Rates are one RL.TAKE (all-or-nothing
    with ALSO), windows one RL.WINDOW, quotas one RL.QUOTA; locks and leases are
    taken first, in order."""

    rates: Sequence[Rate] = ()
    windows: Sequence[Window] = ()
    quotas: Sequence[Quota] = ()
    leases: Sequence[Concurrency] = ()
    cost: Cost = 1
    #: the penalty box of the first limiter (the first rate, else window, else quota)
    penalty: Optional[Penalty] = None
    #: refuse requests without an Idempotency-Key header (400)
    idempotency_key: bool = False
    #: decide and log, never refuse
    shadow: bool = False
    #: Redis failed or slower than the timeout: "closed" (503) or "local"
    #: (an in-process limiter at the middleware's fallback_ratio, marked degraded)
    on_redis_failure: str = "closed"
    #: the unit of the points in headers and bodies
    unit: str = "requests"
    #: the quota_tier member of refusals
    tier: Optional[str] = None


def window_seconds(w: Union[Window, Quota, Rate], now: Optional[float] = None) -> float:
    """The ``w`` of a policy: a rate's period, a window's length, a quota period's length."""
    if isinstance(w, Rate):
        return float(w.period)
    if isinstance(w, Window):
        return float(w.window)
    p = w.period.upper()
    if p == "DAY":
        return 86400.0
    if p == "WEEK":
        return 7 * 86400.0
    t = time.gmtime(now)
    return calendar.monthrange(t.tm_year, t.tm_mon)[1] * 86400.0


def _check_key(key: Key, where: str) -> None:
    if not (isinstance(key, str) and key) and not callable(key):
        raise ValueError(f"{where}.key must be a non-empty template or a function of the request")


def check_route(name: str, r: Route) -> None:
    """Raises ValueError naming the first bad option of route ``name``."""
    w = f"routes[{name!r}]"
    if not isinstance(r, Route):
        raise ValueError(f"{w} must be a Route, got {r!r}")
    if not (r.rates or r.windows or r.quotas or r.leases or r.idempotency_key):
        raise ValueError(f"{w} declares nothing (rates, windows, quotas, leases or idempotency_key)")
    groups: Tuple[Tuple[str, Sequence[Union[Rate, Window, Quota]]], ...] = (
        ("rates", r.rates), ("windows", r.windows), ("quotas", r.quotas))
    for kind, items in groups:
        if len(items) > 16:
            raise ValueError(f"{w}.{kind} holds at most 16 limiters (one command with ALSO)")
        for i, item in enumerate(items):
            _check_key(item.key, f"{w}.{kind}[{i}]")
            try:
                if isinstance(item, Rate):
                    commands.Bucket("k", item.capacity, item.tokens, item.period).args("")
                elif isinstance(item, Window):
                    commands.window(commands.Window("k", item.limit, item.window), mode=item.mode)
                else:
                    commands.Quota("k", item.limit, item.period).args("")
            except ValueError as e:
                raise ValueError(f"{w}.{kind}[{i}] ({item.name}): {e}") from None
    for i, lease in enumerate(r.leases):
        _check_key(lease.key, f"{w}.leases[{i}]")
        try:
            commands.lease_acquire("k", lease.max, lease.ttl)
            commands.seconds(lease.expected, "expected")
        except ValueError as e:
            raise ValueError(f"{w}.leases[{i}] ({lease.name}): {e}") from None
        if lease.status not in (409, 429):
            raise ValueError(f"{w}.leases[{i}].status must be 409 or 429, got {lease.status!r}")
    if isinstance(r.cost, bool) or not (isinstance(r.cost, int) and r.cost >= 0 or callable(r.cost)):
        raise ValueError(f"{w}.cost must be points (an integer >= 0) or a function of the request")
    if r.penalty is not None:
        try:
            r.penalty.args()
        except ValueError as e:
            raise ValueError(f"{w}.penalty: {e}") from None
        if not (r.rates or r.windows or r.quotas):
            raise ValueError(f"{w}.penalty needs a rate, window or quota to apply to")
    if r.on_redis_failure not in FAILURE_MODES:
        raise ValueError(f"{w}.on_redis_failure must be 'closed' or 'local', got {r.on_redis_failure!r}")
    if not isinstance(r.unit, str) or not r.unit:
        raise ValueError(f"{w}.unit must be a non-empty string")


@dataclass
class CompiledRoute:
    """A declared route with its method and path pattern."""

    name: str
    method: Optional[str]
    pattern: Pattern[str]
    route: Route
    params: List[str] = field(default_factory=list)


def compile_routes(routes: Mapping[str, Route]) -> List[CompiledRoute]:
    """``"METHOD /template/{param}"`` (or ``"/template"``: any method) to patterns,
    each route checked; ``{param}`` matches one path segment."""
    out = []
    for name, r in routes.items():
        check_route(name, r)
        parts = name.split(None, 1)
        method, template = (parts[0].upper(), parts[1]) if len(parts) == 2 else (None, parts[0])
        if not template.startswith("/"):
            raise ValueError(f"routes[{name!r}]: the path must start with '/'")
        params = re.findall(r"{([A-Za-z_][A-Za-z0-9_]*)}", template)
        regex = "^" + re.sub(r"\\{([A-Za-z_][A-Za-z0-9_]*)\\}", r"(?P<\1>[^/]+)", re.escape(template)) + "$"
        out.append(CompiledRoute(name, method, re.compile(regex), r, params))
    return out


def match(routes: Sequence[CompiledRoute], method: str, path: str
          ) -> Optional[Tuple[CompiledRoute, Dict[str, str]]]:
    """The first declared route matching ``method`` and ``path``, with its
    parameters. A HEAD request with no HEAD route declared for its path
    matches as a GET (Starlette serves HEAD from a GET route: the endpoint
    runs in full)."""
    if method == "HEAD":
        for c in routes:
            m = c.pattern.match(path) if c.method == "HEAD" else None
            if m:
                return c, m.groupdict()
        method = "GET"
    for c in routes:
        if c.method is not None and c.method != method:
            continue
        m = c.pattern.match(path)
        if m:
            return c, m.groupdict()
    return None


def key_of(key: Key, request: Request, params: Mapping[str, str]) -> str:
    """A rule's key for this request."""
    if callable(key):
        return key(request)
    client = request.client.host if request.client else "unknown"
    return key.format(client=client, **params)


async def cost_of(cost: Cost, request: Request) -> int:
    """The request's cost (a function's result checked)."""
    if not callable(cost):
        return cost
    v = cost(request)
    if inspect.isawaitable(v):
        v = await v
    if isinstance(v, bool) or not isinstance(v, int) or v < 0:
        raise ValueError(f"a cost function returned {v!r}, not points (an integer >= 0)")
    return v


def keyed(items: Sequence[Any], request: Request, params: Mapping[str, str]) -> List[str]:
    """The keys of ``items`` for this request."""
    return [key_of(i.key, request, params) for i in items]
